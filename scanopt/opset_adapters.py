"""scanopt's own op adapters, for the ops onnx.version_converter (onnx 1.23) converts wrongly.
They run on the model at its source opset, before the converter, at every graph level, and
write each such node in a form the converter cannot get wrong:

- **Upsample (opset 7/9) and Resize-10 → Resize-11+.** Upsample and Resize-10 sample
  ``asymmetric``ally (nearest: floor); Resize-11 added ``coordinate_transformation_mode``
  with default ``half_pixel`` (and ``nearest_mode`` ``round_prefer_floor``), and the
  converter's 10→11 adapter only inserts the ``roi`` input, so the values change. The node
  is written directly in the target's form with the modes spelled out, held in
  :data:`~scanopt.emit.HOLD_DOMAIN` (the converter leaves it alone; migration moves it back).
- **GroupNormalization-18 → opset 19 or 20.** onnx deprecates it from 19 and its successor
  (scale/bias per channel) comes only at 21, so the converter keeps a node the checker rejects;
  it is written out with Reshape/ReduceMean/Sqrt and a per-group affine instead.
- **Hardmax (opset < 13) → 13+.** Hardmax before 13 coerces its input to 2-D at ``axis``;
  from 13 it works on that one axis, and the converter bumps the version without adapting it
  (its Softmax and LogSoftmax adapters do). Each such Hardmax becomes Flatten(axis) →
  Hardmax(axis=1) → Reshape to the input's shape, which means the same at every opset.

Every adapter is proven by tests/test_upgrade_matrix.py, which runs the original and the
migrated model in onnxruntime at every nesting level.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from scanopt.emit import HOLD_DOMAIN
from scanopt.graph import NameAllocator
from scanopt.protos import in_default_domain, walk_proto_graphs


def adapt(model: onnx.ModelProto, source: int, target: int, names: set[str], *, types=None,
          outcomes: list | None = None) -> onnx.ModelProto:
    """``model`` (at ``source``) with every node an adapter handles for ``source`` → ``target``
    rewritten; the same object when none applies. ``names``: every name in the model.
    ``types``: a callable giving name -> onnx TypeProto of the model's values (asked only when
    an adapter that needs them applies). ``outcomes``: receives (graph path, node name, line)
    for each node an adapter that reports (LinearAttention) rewrote."""
    rules = [rule for rule, applies in _RULES if applies(source, target)]
    ops = {op for rule in rules for op in rule.ops}
    if not any(n.op_type in ops and in_default_domain(n.domain)
               for g in walk_proto_graphs(model.graph) for n in g.node):
        return model
    adapted = onnx.ModelProto()
    adapted.CopyFrom(model)
    allocator = NameAllocator.from_names(names)
    known = None
    for g in walk_proto_graphs(adapted.graph):
        nodes = []
        for node in g.node:
            rule = next((r for r in rules if node.op_type in r.ops), None)
            if rule is None or not in_default_domain(node.domain):
                nodes.append(node)
                continue
            if getattr(rule, "needs_types", False):
                if known is None:
                    known = types() if types is not None else {}
                new_nodes, weights, line = rule(node, source, target, allocator, known)
                if outcomes is not None:
                    outcomes.append(("" if g is adapted.graph else g.name, node.name or node.output[0], line))
            else:
                new_nodes, weights = rule(node, source, target, allocator.fresh)
            nodes += new_nodes
            g.initializer.extend(weights)
        del g.node[:]
        g.node.extend(nodes)
    if not any(o.domain == HOLD_DOMAIN for o in adapted.opset_import):
        adapted.opset_import.append(helper.make_opsetid(HOLD_DOMAIN, 1))
    return adapted


def _attr(node: onnx.NodeProto, name: str, default=None):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _resize_asymmetric(node, source, target, fresh):
    """Upsample / Resize-10 as a held Resize at ``target`` with their sampling spelled out."""
    mode = _attr(node, "mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    weights = []
    roi = fresh(f"{node.name or 'resize'}_roi")
    weights.append(numpy_helper.from_array(np.zeros([0], np.float32), roi))
    if len(node.input) > 1 and node.input[1]:
        scales = node.input[1]
    else:  # Upsample-7: scales is an attribute
        scales = fresh(f"{node.name or 'resize'}_scales")
        weights.append(numpy_helper.from_array(np.asarray(_attr(node, "scales"), np.float32), scales))
    attrs = {"mode": mode, "coordinate_transformation_mode": "asymmetric"}
    if mode == "nearest":
        attrs["nearest_mode"] = "floor"
    resize = helper.make_node("Resize", [node.input[0], roi, scales], list(node.output), name=node.name,
                              domain=HOLD_DOMAIN, doc_string=node.doc_string, **attrs)
    return [resize], weights


_resize_asymmetric.ops = {"Upsample", "Resize"}


def _hardmax_2d(node, source, target, fresh):
    axis = _attr(node, "axis", 1)
    x, y = node.input[0], node.output[0]
    base = node.name or "hardmax"
    flat, hard, shape = fresh(f"{x}_2d"), fresh(f"{y}_2d"), fresh(f"{x}_shape")
    return [
        helper.make_node("Flatten", [x], [flat], name=fresh(f"{base}_flatten"), axis=axis),
        helper.make_node("Hardmax", [flat], [hard], name=node.name, axis=1, doc_string=node.doc_string),
        helper.make_node("Shape", [x], [shape], name=fresh(f"{base}_shape")),
        helper.make_node("Reshape", [hard, shape], [y], name=fresh(f"{base}_reshape")),
    ], []


_hardmax_2d.ops = {"Hardmax"}

def _group_norm_decomposed(node, source, target, fresh):
    """GroupNormalization-18 (scale and bias per *group*) at opset 19 or 20, where onnx marks
    it deprecated and has no successor yet (21 changed scale/bias to per channel): written
    out as reshape to [N, G, -1], normalize over the last axis, per-group affine, reshape
    back. Held nodes in the target's form (ReduceMean takes ``axes`` as an input from 18)."""
    x, scale, bias = node.input[0], node.input[1], node.input[2]
    groups = _attr(node, "num_groups")
    eps = _attr(node, "epsilon", 1e-5)
    base = node.name or "group_norm"

    def held(op, inputs, **attrs):
        out = fresh(f"{base}_{op.lower()}")
        nodes.append(helper.make_node(op, inputs, [out], name=fresh(f"{base}_{op.lower()}"), domain=HOLD_DOMAIN, **attrs))
        return out

    def const(hint, array):
        name = fresh(f"{base}_{hint}")
        weights.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    nodes, weights = [], []
    grouped = held("Reshape", [x, const("grouped", np.array([0, groups, -1], np.int64))])
    last = const("axes", np.array([2], np.int64))
    mean = held("ReduceMean", [grouped, last], keepdims=1)
    centered = held("Sub", [grouped, mean])
    var = held("ReduceMean", [held("Mul", [centered, centered]), last], keepdims=1)
    # eps is cast to the input's type by CastLike, so float16/double inputs work too
    eps_t = held("CastLike", [const("epsilon", np.array(eps, np.float32)), x])
    normed = held("Div", [centered, held("Sqrt", [held("Add", [var, eps_t])])])
    per_group = const("per_group", np.array([groups, 1], np.int64))
    affine = held("Add", [held("Mul", [normed, held("Reshape", [scale, per_group])]), held("Reshape", [bias, per_group])])
    nodes.append(helper.make_node("Reshape", [affine, held("Shape", [x])], list(node.output), name=node.name,
                                  domain=HOLD_DOMAIN, doc_string=node.doc_string))
    return nodes, weights


_group_norm_decomposed.ops = {"GroupNormalization"}

def _linear_attention_scan(node, source, target, allocator, types):
    """LinearAttention (opset 27) below 27: the Scan form of scanopt.passes.linattn.to_scan,
    held at the target. A node it cannot write stops the migration with its reason."""
    import onnx_graphsurgeon as gs

    from scanopt.emit import Emitter
    from scanopt.errors import UnsupportedModelError
    from scanopt.passes.linattn.to_scan import NotLowered, Operand, lower
    from scanopt.rewrite import Builder, new_graph

    graph = new_graph(node.name or "linear_attention")
    operands = []
    for name in node.input:
        if not name:
            operands.append(None)
            continue
        dtype, shape = _type_of(types.get(name))
        operands.append(Operand(gs.Variable(name, dtype=dtype, shape=shape), dtype, shape))
    names = (list(node.output) + ["", ""])[:2]  # an output left out still has to be written somewhere
    outputs = [gs.Variable(name or allocator.fresh(f"{node.name or 'linear_attention'}_unused")) for name in names]
    prefix = f"{node.name}_" if node.name else ""
    e = Emitter(Builder(graph, allocator, prefix), target, domain=HOLD_DOMAIN)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    try:
        line = lower(e, operands, outputs, attrs)
    except NotLowered as exc:
        raise UnsupportedModelError(f"LinearAttention '{node.name or node.output[0]}' has no form below opset 27 "
                                    f"here: {exc}") from None
    graph.inputs = [op.tensor for op in operands if op is not None]
    graph.outputs = outputs
    exported = gs.export_onnx(graph, do_type_check=False)
    nodes = list(exported.graph.node)
    for new in nodes:
        if new.op_type in ("If", "Scan") and not new.name:
            new.name = allocator.fresh(prefix + new.op_type.lower())
    nodes[-1].doc_string = node.doc_string
    return nodes, list(exported.graph.initializer), line


_linear_attention_scan.ops = {"LinearAttention"}
_linear_attention_scan.needs_types = True


def _type_of(value: onnx.TypeProto | None):
    """(numpy dtype or None, shape list or None) of a tensor type."""
    if value is None or not value.HasField("tensor_type") or not value.tensor_type.elem_type:
        return None, None
    tensor = value.tensor_type
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    except Exception:  # noqa: BLE001 - a type numpy cannot hold
        return None, None
    if not tensor.HasField("shape"):
        return dtype, None
    shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
    return dtype, shape


# (adapter, applies(source, target)): Resize-10 and Upsample exist only below 11.
_RULES = [
    (_resize_asymmetric, lambda source, target: source < 11 <= target),
    (_hardmax_2d, lambda source, target: source < 13 <= target),
    (_group_norm_decomposed, lambda source, target: source < 19 <= target <= 20),
    (_linear_attention_scan, lambda source, target: target < 27 <= source),
]
