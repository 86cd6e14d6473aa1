"""A Scan's widening per-step producers taken into its body, for linrec's selective scans.

Real selective scans (mamba-minimal's ``selective_scan``, Hugging Face's ``slow_forward``,
mamba.py) compute deltaA = exp(Δ ⊗ A) and deltaB_u = Δ ⊙ x ⊗ B for every step before the
loop, [B, L, D, N] tensors N times the data of Δ and x, and the loop reads them a step at a
time. Moved into the body, the widening happens per step, and linrec's two-pass form computes
it inside its chunk Loops on [K, ...] slices: the wide tensors are never written or permuted
(bench_linrec ``mamba_minimal_model``).

What moves: the ops that widen per step (the output holds more elements per step than the
inputs that vary with it, like Einsum 'bld,dn->bldn') and the view and elementwise ops between
them and the Scan, each only where the Scan (or another moved op) is its sole reader. Each op
is moved with its step axis taken out: Transpose's perm, Einsum's letter, Unsqueeze/Squeeze
axes, broadcasting operands aligned (one broadcast along the steps is squeezed). What feeds
them from outside becomes a scan input on its own step axis, or an outer value when it does not
vary with the step. Nothing here touches the graph until :func:`install`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.clone import clone_graph
from scanopt.emit import Emitter
from scanopt.passes.loopfree.einsum_products import product_terms
from scanopt.graph import GraphLevel, constant_axes, node_position, remove_node, walk_graphs
from scanopt.rewrite import Builder, is_graph_output, rebind_outputs, replace_all_uses
from scanopt.scan_view import ScanView
from scanopt.shapes import ELEMENTWISE, SHAPE_PRESERVING, einsum_terms

# The most producers one Scan takes in: the walk stops there, so a long exclusive chain above a
# Scan costs a bounded search (the widening ops sit right above the Scan in every export seen).
MAX_MOVED = 64


@dataclass
class Moved:
    """One producer taken into the body: the per-step axis of each input (None: read whole,
    from the outer scope), the attributes it takes there, and inputs it reads instead."""
    node: gs.Node
    axes: list  # per input: its step axis, or None
    attrs: dict
    squeeze: dict = field(default_factory=dict)  # input index -> axis to squeeze (broadcast along the steps)
    view_axes: list | None = None  # Unsqueeze/Squeeze: the axes in the body (the step axis taken out)
    out_axis: int = 0  # the output's step axis


@dataclass
class Absorption:
    """What :func:`build` takes into a Scan: ``moved`` in graph order, the scan input slots they
    replace, and the outer values that become scan inputs (tensor, step axis)."""
    moved: list[Moved]
    slots: list[int]
    leaves: list[tuple[gs.Tensor, int]]


def absorption(node: gs.Node, view: ScanView, level: GraphLevel, shapes) -> Absorption | None:
    """The widening producers of ``node``'s scan inputs that can move into its body, or None."""
    graph, n = level.graph, view.num_states
    if view.batched:
        return None
    axis_of: dict[int, int] = {}
    slots: dict[int, int] = {}
    for j in range(view.num_scan_inputs):
        t = node.inputs[n + j]
        axis = view.input_axes[j]
        if view.input_directions[j] or axis < 0 or not t.name or sum(x is t for x in node.inputs) != 1:
            continue
        axis_of[id(t)], slots[id(t)] = axis, j
    if not axis_of:
        return None
    present = {id(nd) for nd in graph.nodes}
    moved: dict[int, Moved] = {}
    pending = [node.inputs[n + j] for j in slots.values()]
    decided: set[int] = set()
    changed = True
    while changed and len(moved) < MAX_MOVED:  # a value moves once every reader of it has (the graph's order is not relied on)
        changed = False
        for t in list(pending):
            if id(t) in decided:
                continue
            producer = t.inputs[0] if len(t.inputs) == 1 else None
            rule = None
            if producer is not None and id(producer) in present and not is_graph_output(t, graph):
                rule = _step_rule(producer, axis_of[id(t)], shapes)
            if rule is None:
                decided.add(id(t))  # scanned as it is
                continue
            scanned = id(t) in slots  # the Scan may read its own inputs (once each), nothing else moved
            if any(id(c) not in moved and not (scanned and c is node) for c in t.outputs):
                continue  # read elsewhere (for now: a reader may still move)
            decided.add(id(t))
            changed = True
            rule.out_axis = axis_of[id(t)]
            moved[id(producer)] = rule
            for x, axis in zip(producer.inputs, rule.axes):
                if axis is None:
                    continue
                if axis_of.setdefault(id(x), axis) != axis:
                    return None  # one value on two step axes
                if all(x is not y for y in pending):
                    pending.append(x)
    order = _producers_first(moved)
    kept = _widening_paths(order, shapes)
    if not kept:
        return None
    kept_ids = {id(m.node) for m in kept}
    for m in kept:  # a moved value must be read per step by every moved reader
        for x, axis in zip(m.node.inputs, m.axes):
            if x.inputs and id(x.inputs[0]) in kept_ids and axis is None:
                return None
    replaced = [j for j in slots.values() if node.inputs[n + j].inputs and id(node.inputs[n + j].inputs[0]) in kept_ids]
    leaves: dict[tuple[int, int], tuple[gs.Tensor, int]] = {}
    for m in kept:
        for x, axis in zip(m.node.inputs, m.axes):
            if axis is not None and not (x.inputs and id(x.inputs[0]) in kept_ids):
                leaves.setdefault((id(x), axis), (x, axis))
    return Absorption(kept, sorted(replaced), list(leaves.values()))


def _producers_first(moved: dict[int, Moved]) -> list[Moved]:
    """The moved ops in an order where each comes after the moved ops it reads."""
    order: list[Moved] = []
    placed: set[int] = set()

    def place(m: Moved) -> None:
        if id(m.node) in placed:
            return
        placed.add(id(m.node))
        for x in m.node.inputs:
            if x.inputs and id(x.inputs[0]) in moved:
                place(moved[id(x.inputs[0])])
        order.append(m)

    for m in moved.values():
        place(m)
    return order


VIEWS = frozenset(("Identity", "Squeeze", "Transpose", "Unsqueeze"))


def _widening_paths(order: list[Moved], shapes) -> list[Moved]:
    """The moved ops worth moving: those that widen per step, those reading what they make
    (views and elementwise ops down to the Scan), and the views and unary ops feeding only those
    (an operand unsqueezed outside is unsqueezed in the steps, where linrec reads the product it
    forms; a Softplus of Δ is lifted over all steps by linrec, in its faster form). Any other op
    stays outside."""
    useful: set[int] = set()
    for m in order:
        ins = [x for x, axis in zip(m.node.inputs, m.axes) if axis is not None]
        if any(x.inputs and id(x.inputs[0]) in useful for x in ins) or _widens(m, shapes):
            useful.add(id(m.node))
    for m in reversed(order):
        readers = m.node.outputs[0].outputs
        if (m.node.op in VIEWS or m.node.op in SHAPE_PRESERVING) and readers and all(id(r) in useful for r in readers):
            useful.add(id(m.node))
    return [m for m in order if id(m.node) in useful]


def _widens(m: Moved, shapes) -> bool:
    out = m.node.outputs[0]
    out_elements = _per_step_elements(shapes.shape(out), m.out_axis)
    in_elements = [_per_step_elements(shapes.shape(x), axis) for x, axis in zip(m.node.inputs, m.axes)
                   if axis is not None]
    if out_elements is None or any(e is None for e in in_elements):
        return False
    return out_elements > sum(in_elements)


def _per_step_elements(shape, axis) -> int | None:
    """Elements per step (symbolic dims counted as 1), None when the rank is unknown."""
    if shape is None or axis is None or axis >= len(shape):
        return None
    return int(np.prod([d if isinstance(d, (int, np.integer)) and d > 0 else 1
                        for k, d in enumerate(shape) if k != axis], dtype=np.int64))


def _step_rule(p: gs.Node, axis: int, shapes) -> Moved | None:
    """How ``p`` runs on one step when its output's step axis is ``axis``, or None."""
    if p.domain not in ("", "ai.onnx", None) or len(p.outputs) != 1:
        return None
    out_shape = shapes.shape(p.outputs[0])
    if out_shape is None or axis >= len(out_shape):
        return None
    rank = len(out_shape)
    attrs = dict(p.attrs)
    if p.op in SHAPE_PRESERVING:  # Clip's bounds, CastLike's target: read whole
        return Moved(p, [axis] + [None] * (len(p.inputs) - 1), attrs)
    if p.op in ELEMENTWISE:
        return _broadcasting(p, axis, out_shape, attrs, shapes)
    if p.op == "Transpose":
        perm = [int(a) for a in attrs.get("perm", range(rank - 1, -1, -1))]
        if sorted(perm) != list(range(rank)):
            return None  # not a permutation of the output's axes (the model is wrong, or the shape)
        source = perm[axis]
        attrs["perm"] = [a - (a > source) for k, a in enumerate(perm) if k != axis]
        return Moved(p, [source], attrs)
    if p.op == "Einsum":
        return _einsum(p, axis, attrs)
    if p.op in ("Unsqueeze", "Squeeze"):
        return _unsqueeze_squeeze(p, axis, rank, shapes)
    return None


def _broadcasting(p: gs.Node, axis: int, out_shape, attrs, shapes) -> Moved | None:
    """Inputs aligned from the right: one covering the step axis with the output's length varies
    per step there; one with length 1 there broadcasts along the steps (squeezed in the body);
    one not reaching it is read whole."""
    rank, steps = len(out_shape), out_shape[axis]
    axes, squeeze = [], {}
    for k, x in enumerate(p.inputs):
        shape = shapes.shape(x)
        if shape is None:
            return None
        at = axis - (rank - len(shape))
        if at < 0:
            axes.append(None)
            continue
        dim = shape[at]
        if dim == steps and (isinstance(dim, str) or (isinstance(dim, (int, np.integer)) and dim > 0)):
            axes.append(at)
        elif isinstance(dim, (int, np.integer)) and dim == 1:
            axes.append(None)
            squeeze[k] = at
        else:
            return None  # unknown: per step or broadcast along the steps
    if all(a is None for a in axes):
        return None
    return Moved(p, axes, attrs, squeeze=squeeze)


def _einsum(p: gs.Node, axis: int, attrs) -> Moved | None:
    parsed = einsum_terms(attrs.get("equation"))
    if parsed is None:
        return None
    terms, out = parsed
    if len(terms) != len(p.inputs) or axis >= len(out):
        return None
    letter = out[axis]
    axes = []
    for term in terms:
        if term.count(letter) > 1:
            return None
        axes.append(term.index(letter) if letter in term else None)
    attrs["equation"] = ",".join(term.replace(letter, "") for term in terms) + "->" + out.replace(letter, "")
    return Moved(p, axes, attrs)


def _unsqueeze_squeeze(p: gs.Node, axis: int, rank: int, shapes) -> Moved | None:
    given = constant_axes(p)
    if given is None:
        return None
    if p.op == "Unsqueeze":
        added = sorted(a + rank if a < 0 else a for a in given)
        if axis in added:
            return None
        source = axis - sum(a < axis for a in added)
        body_axes = [a - (a > axis) for a in added]
    else:
        in_rank = shapes.rank(p.inputs[0])
        if in_rank is None:
            return None
        removed = sorted(a + in_rank if a < 0 else a for a in given)
        source = [a for a in range(in_rank) if a not in removed][axis]
        body_axes = [a - (a > source) for a in removed]
    return Moved(p, [source] + [None] * (len(p.inputs) - 1), {}, view_axes=body_axes)


def build(node: gs.Node, view: ScanView, found: Absorption, shapes, names, opset: int) -> gs.Node:
    """A new Scan (not in any graph) computing what ``node`` does with ``found`` moved into its
    body. Until :func:`install`, its nodes still read outer values: :func:`discard` it if unused."""
    n = view.num_states
    body = clone_graph(node.attrs["body"], names)
    moved_ids = {id(m.node) for m in found.moved}
    step_inputs = {}
    for x, axis in found.leaves:
        shape = shapes.shape(x)
        step_inputs[(id(x), axis)] = gs.Variable(names.fresh(f"{x.name}_step"), dtype=shapes.dtype(x),
                                                 shape=None if shape is None else _without(shape, axis))
    made: dict[int, gs.Tensor] = {}
    before = len(body.nodes)
    e = Emitter(Builder(body, names, prefix="step_"), opset)
    for m in found.moved:
        inputs = []
        for k, (x, axis) in enumerate(zip(m.node.inputs, m.axes)):
            if axis is None:
                squeezed = k in m.squeeze
                inputs.append(e.squeeze(x, [m.squeeze[k]], dtype=shapes.dtype(x),
                                        shape=_without(shapes.shape(x), m.squeeze[k])) if squeezed else x)
            elif x.inputs and id(x.inputs[0]) in moved_ids:
                inputs.append(made[id(x)])
            else:
                inputs.append(step_inputs[(id(x), axis)])
        out = m.node.outputs[0]
        shape = shapes.shape(out)
        shape = None if shape is None else _without(shape, m.out_axis)
        groups = product_terms(m.attrs["equation"]) if m.node.op == "Einsum" else None
        if m.view_axes is not None:  # Emitter writes the axes as an attribute or an input, by opset
            emit_view = e.unsqueeze if m.node.op == "Unsqueeze" else e.squeeze
            made[id(out)] = emit_view(inputs[0], m.view_axes, dtype=shapes.dtype(out), shape=shape)
        elif m.node.op == "Transpose" and m.attrs["perm"] == sorted(m.attrs["perm"]):
            made[id(out)] = inputs[0]  # the step axis was the one moved (exporters' permute to the front)
        elif groups is not None:
            operand_shapes = [x.shape if x.shape is not None else shapes.shape(x) for x in inputs]
            made[id(out)] = _products(e, groups, inputs, operand_shapes, m.attrs["equation"], shapes.dtype(out))
        else:
            made[id(out)] = e.op(m.node.op, inputs, dtype=shapes.dtype(out), shape=shape, **m.attrs)
    body.nodes[:] = body.nodes[before:] + body.nodes[:before]  # what the body's nodes read comes first
    kept = [j for j in range(view.num_scan_inputs) if j not in found.slots]
    for j in found.slots:
        replace_all_uses(body.inputs[n + j], made[id(node.inputs[n + j])], body)
    body.inputs = body.inputs[:n] + [body.inputs[n + j] for j in kept] + list(step_inputs.values())
    attrs = dict(node.attrs)
    attrs["body"] = body
    attrs["num_scan_inputs"] = len(kept) + len(found.leaves)
    attrs["scan_input_axes"] = [view.input_axes[j] for j in kept] + [axis for _, axis in found.leaves]
    attrs["scan_input_directions"] = [view.input_directions[j] for j in kept] + [0] * len(found.leaves)
    outputs = [gs.Variable(names.fresh(f"{t.name}_absorbed"), dtype=shapes.dtype(t), shape=shapes.shape(t))
               for t in node.outputs]
    return gs.Node("Scan", name=names.fresh(f"{node.name or 'scan'}_absorbed"), attrs=attrs,
                   inputs=list(node.inputs[:n]) + [node.inputs[n + j] for j in kept] + [x for x, _ in found.leaves],
                   outputs=outputs)


def _products(e: Emitter, groups, inputs, operand_shapes, equation: str, dtype) -> gs.Variable:
    """An Einsum that sums nothing as broadcasting Muls (einsum_products.product_terms): the
    forms linrec's two-pass steps emit as MatMuls, where onnxruntime's Einsum runs a general
    contraction per call (mamba-minimal's whole export at T = 1024: 13.96 ms with the Einsums kept
    in its Loops, 3.72 ms as products; README, module absorb). Every value made is declared with the dims the operands give
    (linrec plans by rank)."""
    terms, result = einsum_terms(equation)
    dims: dict[str, object] = {}
    for term, shape in zip(terms, operand_shapes):
        for c, d in zip(term, shape or [None] * len(term)):
            if isinstance(d, (int, np.integer)) and d != 1 or dims.get(c) is None:
                dims[c] = d
    factors = []
    for group in groups:
        value = None
        letters = sorted(terms[group[0][0]], key=result.index)
        for k, term in group:
            laid_out = [dims[c] for c in letters]
            x = inputs[k] if term.perm is None else e.op("Transpose", [inputs[k]], perm=list(term.perm), dtype=dtype,
                                                         shape=laid_out)
            value = x if value is None else e.op("Mul", [value, x], dtype=dtype, shape=laid_out)
        axes = list(group[0][1].axes)
        if axes:
            value = e.unsqueeze(value, axes, dtype=dtype, shape=[dims[c] if c in letters else 1 for c in result])
        factors.append(value)
    full = [dims[c] for c in result]
    product = factors[0]
    for value in factors[1:]:
        product = e.op("Mul", [product, value], dtype=dtype, shape=full)
    if len(factors) == 1:  # one group: an elementwise product or a view; declared as the result
        product = e.op("Identity", [product], dtype=dtype, shape=full)
    return product


def _without(shape, axis: int) -> list:
    return [d for k, d in enumerate(shape) if k != axis]


def discard(scan: gs.Node) -> None:
    """Unhook an uninstalled :func:`build` result from the tensors it reads (gs records readers)."""
    for level in walk_graphs(scan.attrs["body"]):
        for nd in level.graph.nodes:
            nd.inputs.clear()
            nd.outputs.clear()
    scan.inputs.clear()
    scan.outputs.clear()


def install(scan: gs.Node, node: gs.Node, found: Absorption, graph: gs.Graph) -> None:
    """Put ``scan`` where ``node`` stands, writing its outputs, and drop the producers it took in."""
    graph.nodes.insert(node_position(graph, node), scan)
    rebind_outputs(node, list(scan.outputs), graph)
    for m in reversed(found.moved):
        m.node.inputs.clear()
        m.node.outputs.clear()
        remove_node(graph, m.node)
