"""Round-trips between onnx.ModelProto and onnx-graphsurgeon, keeping what gs drops.

onnx-graphsurgeon is scanopt's IR for rewriting, but its exporter forgets the model's
metadata, node doc strings and functions it did not import, copies every outer-scope
initializer a body reads into that body (duplicating weights), and writes value_info
for outer values inside bodies. :func:`import_model` tags what it needs to undo that,
and :func:`export_model` restores it, so an exported model differs from its input only
where a pass rewrote it.
"""

from __future__ import annotations

from collections import ChainMap
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues
from onnx_graphsurgeon.logger import G_LOGGER
from onnx_graphsurgeon.util import misc as gs_misc

from scanopt.external_data import as_array, source
from scanopt.placement import sink_branch_initializers
from scanopt.protos import walk_proto_graphs

G_LOGGER.severity = G_LOGGER.ERROR

# Attribute names scanopt sets on gs objects.
OWNER = "_scanopt_owner"  # on a gs.Constant: the gs.Graph whose initializer list held it
NODE_EXTRAS = "_scanopt_node_extras"  # on a gs.Node: (doc_string, metadata_props) gs drops
ORDER = "_scanopt_initializer_order"  # on the top gs.Graph: initializer name -> position
VALUE_METADATA = "_scanopt_value_metadata"  # on the top gs.Graph: value name -> metadata_props
GRAPH_METADATA = "_scanopt_graph_metadata"  # on each gs.Graph: its GraphProto.metadata_props
VALUE_INFO = "_scanopt_value_info"  # on each gs.Graph: its original value_info entries
EMPTY_LISTS = "_scanopt_empty_lists"  # on a gs.Node: {attribute name: AttributeProto type} of its empty list attributes
EXTERNAL = "_scanopt_external"  # on the top gs.Graph: [(gs.Constant, ExternalValues)] of weights left in their file


class ExternalValues(LazyValues):
    """The values of an initializer whose bytes stay in their file (scanopt.external_data):
    loading memory-maps the file, and export writes the reference back unchanged."""

    def __init__(self, tensor: onnx.TensorProto):
        super().__init__(tensor)
        self.array = None  # what load() gave out: while a Constant still holds it, the reference stands

    def load(self):
        if self.array is None:
            self.array = as_array(self.tensor)
        return self.array


def import_model(model: onnx.ModelProto) -> gs.Graph:
    """Import ``model`` into onnx-graphsurgeon, tagging initializer owners and doc strings."""
    with _scoped_tensor_maps():
        graph = gs.import_onnx(model)
    pairs = list(_paired_graphs(model.graph, graph))
    # An outer initializer read only inside a body is among the body's tensors, not
    # its owner's, so look names up across every level.
    tensors = {}
    for _, gs_graph, _ in reversed(pairs):
        tensors.update(gs_graph.tensors())
    order: dict[str, int] = {}
    value_metadata: dict[str, list] = {}
    for proto_graph, gs_graph, _ in pairs:
        # gs keeps the model's own opset_import list and appends the domains of new nodes to it
        # on export: give it copies, or the caller's proto gains them (ai.scanopt.hold).
        if gs_graph.import_domains is not None:
            gs_graph.import_domains = [onnx.helper.make_opsetid(o.domain, o.version) for o in gs_graph.import_domains]
        setattr(gs_graph, GRAPH_METADATA, list(proto_graph.metadata_props))
        setattr(gs_graph, VALUE_INFO, list(proto_graph.value_info))
        for value in list(proto_graph.input) + list(proto_graph.output) + list(proto_graph.value_info):
            if len(value.metadata_props):
                value_metadata.setdefault(value.name, list(value.metadata_props))
        for init in list(proto_graph.initializer) + [s.values for s in proto_graph.sparse_initializer]:
            order.setdefault(init.name, len(order))
            tensor = tensors.get(init.name)
            if isinstance(tensor, gs.Constant):
                setattr(tensor, OWNER, gs_graph)
        for proto_node, gs_node in zip(proto_graph.node, gs_graph.nodes):
            if proto_node.doc_string or len(proto_node.metadata_props):
                setattr(gs_node, NODE_EXTRAS, (proto_node.doc_string, list(proto_node.metadata_props)))
            empty = {a.name: a.type for a in proto_node.attribute if a.type in _LIST_TYPES and not _list_of(a)}
            if empty:
                setattr(gs_node, EMPTY_LISTS, empty)
    setattr(graph, ORDER, order)
    setattr(graph, VALUE_METADATA, value_metadata)
    setattr(graph, EXTERNAL, _defer_external_values(gs_graph for _, gs_graph, _ in pairs))
    _open_dtypes_as_none(gs_graph for _, gs_graph, _ in pairs)
    return graph


def _open_dtypes_as_none(graphs) -> None:
    """A value whose type leaves the dtype open (elem_type 0, or a type field with nothing
    in it) is one gs records with dtype 0 or an empty message; scanopt's helpers know
    "no dtype" as None, as for a value declared without a type."""
    for graph in graphs:
        for tensor in graph.tensors().values():
            if tensor.dtype is not None and not isinstance(tensor, gs.Constant) and _left_open(tensor.dtype):
                tensor.dtype = None


_ONNX_DTYPES = frozenset(onnx.helper.get_all_tensor_dtypes()) - {onnx.TensorProto.UNDEFINED}


def _left_open(dtype) -> bool:
    """gs keeps an ONNX dtype number where numpy has no dtype (bfloat16): that one is known."""
    if isinstance(dtype, int):
        return dtype not in _ONNX_DTYPES
    try:
        np.dtype(dtype)
    except TypeError:
        return True
    return False


def _defer_external_values(graphs) -> list:
    """Give every initializer whose bytes are in a file values read only on demand (gs's
    own LazyValues would read the file relative to the working directory). Every level's
    tensors: two bodies may each hold their own tensor of one name."""
    deferred = []
    seen = set()
    for tensor in (t for g in graphs for t in g.tensors().values()):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        lazy = getattr(tensor, "_values", None)
        if isinstance(tensor, gs.Constant) and type(lazy) is LazyValues and source(lazy.tensor) is not None:
            tensor._values = ExternalValues(lazy.tensor)
            deferred.append((tensor, tensor._values))
    return deferred


def _restore_external_values(graph: gs.Graph) -> None:
    """A Constant whose values a pass read but did not replace exports as its file
    reference again, not as an inline copy of the bytes."""
    for constant, lazy in vars(graph).get(EXTERNAL, []):
        if lazy.array is not None and constant._values is lazy.array:
            constant._values = lazy


class _Scope(ChainMap):
    """gs's view of the enclosing graphs' tensors while it imports a body. gs treats it as
    read-only, so its copy is itself."""

    def __copy__(self):
        return self


def _scope(outer, inner) -> _Scope:
    return _Scope(inner, *(outer.maps if isinstance(outer, ChainMap) else [outer]))


@contextmanager
def _scoped_tensor_maps():
    """gs copies every enclosing graph's tensor map into each body it imports (quadratic
    in the number of bodies); chain the maps instead (same lookups, inner names first)."""
    combine = gs_misc.combine_dicts
    gs_misc.combine_dicts = _scope
    try:
        yield
    finally:
        gs_misc.combine_dicts = combine


def export_model(graph: gs.Graph, original: onnx.ModelProto) -> onnx.ModelProto:
    """Export ``graph`` and give it back everything of ``original`` that gs does not keep."""
    _restore_external_values(graph)
    _type_untyped_values(graph)
    held = _hold_empty_lists(graph)
    try:
        model = gs.export_onnx(graph, do_type_check=False)
    finally:
        for node, values in held:
            node.attrs.update(values)
    _place_initializers(model.graph, graph)
    # vars(): gs.Graph.__getattr__ logs every missing attribute as an error.
    order = vars(graph).get(ORDER, {})
    value_metadata = vars(graph).get(VALUE_METADATA, {})
    for proto_graph, gs_graph, _ in _paired_graphs(model.graph, graph):
        proto_graph.metadata_props.extend(vars(gs_graph).get(GRAPH_METADATA, []))
        _restore_value_info(proto_graph, vars(gs_graph).get(VALUE_INFO, []))
        for value in list(proto_graph.input) + list(proto_graph.output) + list(proto_graph.value_info):
            if not len(value.metadata_props):
                value.metadata_props.extend(value_metadata.get(value.name, []))
        # Original initializers in their original order, new ones after them.
        ranked = sorted(proto_graph.initializer, key=lambda t: order.get(t.name, len(order)))
        if [t.name for t in ranked] != [t.name for t in proto_graph.initializer]:
            _replace_repeated(proto_graph.initializer, ranked, force=True)
        for proto_node, gs_node in zip(proto_graph.node, gs_graph.nodes):
            doc, metadata = getattr(gs_node, NODE_EXTRAS, ("", []))
            if doc:
                proto_node.doc_string = doc
            proto_node.metadata_props.extend(metadata)
            held_types = getattr(gs_node, HELD, None)
            if held_types:
                proto_node.attribute.extend(onnx.AttributeProto(name=n, type=t) for n, t in held_types.items())
                delattr(gs_node, HELD)
    _restore_initializer_inputs(model.graph, original.graph)
    _restore_non_tensor_types(model.graph, original.graph)
    _copy_model_fields(original, model)
    sink_branch_initializers(model.graph)  # where onnxruntime prepacks them (scanopt.placement)
    _raise_ir_for_free_initializers(model)
    return model


# IR 3 requires every initializer to be a graph input as well (a default value for it).
FIRST_IR_WITH_FREE_INITIALIZERS = 4


def _raise_ir_for_free_initializers(model: onnx.ModelProto) -> None:
    """Below IR 4 an initializer must also be an input of its graph, and a pass's new weights
    (unrolled step indices, fused gates, hoisted values) are not: such a model is written
    as IR 4, the one change of IR version a rewrite needs (as migration does). Making them
    inputs would add inputs to the model's signature, or to a Scan body whose input count
    is fixed; Constant nodes cannot hold integers before opset 9."""
    if model.ir_version >= FIRST_IR_WITH_FREE_INITIALIZERS:
        return
    for graph in walk_proto_graphs(model.graph):
        inputs = {v.name for v in graph.input}
        if any(t.name not in inputs for t in graph.initializer) or any(
            t.values.name not in inputs for t in graph.sparse_initializer
        ):
            model.ir_version = FIRST_IR_WITH_FREE_INITIALIZERS
            return


def _restore_initializer_inputs(proto: onnx.GraphProto, original: onnx.GraphProto) -> None:
    """gs drops graph inputs that are also initializers (IR 3 requires them, e.g. onnx's
    backend test models, and tf2onnx's opset-8 output lists them); put back each one, in
    its place. Such an input is part of the interface (a caller may feed it), so one a
    rewrite left unread comes back with its original initializer as the default."""
    present = {v.name for v in proto.input}
    weights = {t.name for t in proto.initializer}
    original_weights = {t.name: t for t in original.initializer}
    if all(v.name in present or v.name not in original_weights for v in original.input):
        return
    for v in original.input:
        if v.name not in present and v.name not in weights and v.name in original_weights:
            proto.initializer.append(original_weights[v.name])
            weights.add(v.name)
    current = {v.name: v for v in proto.input}
    restored = [current.get(v.name, v) for v in original.input if v.name in present or v.name in weights]
    restored += [v for v in proto.input if v.name not in {r.name for r in restored}]
    _replace_repeated(proto.input, restored, force=True)


_LIST_TYPES = frozenset((onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS, onnx.AttributeProto.STRINGS,
                         onnx.AttributeProto.TENSORS, onnx.AttributeProto.GRAPHS, onnx.AttributeProto.SPARSE_TENSORS,
                         onnx.AttributeProto.TYPE_PROTOS))
HELD = "_scanopt_held_empty_lists"  # on a gs.Node during an export: {name: type} to add back


def _list_of(attr: onnx.AttributeProto) -> list:
    return list(onnx.helper.get_attribute_value(attr))


def _hold_empty_lists(graph: gs.Graph) -> list:
    """Take every empty list attribute off its node for gs's export, which cannot tell an
    empty list's type (onnx.helper.make_attribute raises on one: an empty Transpose.perm
    found by the structure fuzzer); export_model adds each back with the type it was
    imported with (INTS for one a pass made). Returns [(node, taken)] to restore."""
    held = []
    stack = [graph]
    while stack:
        current = stack.pop()
        for node in current.nodes:
            empty = {k: v for k, v in node.attrs.items() if isinstance(v, (list, tuple)) and not len(v)}
            if empty:
                known = getattr(node, EMPTY_LISTS, {})
                setattr(node, HELD, {k: known.get(k, onnx.AttributeProto.INTS) for k in empty})
                for k in empty:
                    del node.attrs[k]
                held.append((node, empty))
            for value in node.attrs.values():
                if isinstance(value, gs.Graph):
                    stack.append(value)
                elif isinstance(value, (list, tuple)):
                    stack.extend(v for v in value if isinstance(v, gs.Graph))
    return held


def _type_untyped_values(graph: gs.Graph) -> None:
    """A value the model declares with an empty type (no tensor, sequence or map kind: gs
    imports ``type`` None) is exported as a tensor of the dtype a pass has since given it, or
    with no type at all (gs's exporter has no case for a dtype without a kind: a traceback
    found by the fuzzer on a body output whose type was cut)."""
    stack = [graph]
    while stack:
        current = stack.pop()
        for tensor in current.tensors().values():
            if isinstance(tensor, gs.Variable) and getattr(tensor, "type", "tensor_type") is None:
                if tensor.dtype is None or tensor.dtype == "":
                    tensor.dtype = None
                else:
                    tensor.type = "tensor_type"
        for node in current.nodes:
            stack.extend(value for value in node.attrs.values() if isinstance(value, gs.Graph))


def _restore_non_tensor_types(proto: onnx.GraphProto, original: onnx.GraphProto) -> None:
    """gs knows tensors only: it exports a graph input or output of a sequence, map or
    optional type (skl2onnx's ZipMap output is ``seq(map(int64, tensor(float)))``) as a
    tensor of undefined element type, which onnxruntime refuses ("Invalid tensor data type
    0"). Give each such value, where it is still an input or output, its original type."""
    types = {v.name: v.type for v in list(original.input) + list(original.output)
             if v.HasField("type") and not v.type.HasField("tensor_type")}
    if not types:
        return
    for value in list(proto.input) + list(proto.output):
        if value.name in types:
            value.type.CopyFrom(types[value.name])


def _paired_graphs(
    proto: onnx.GraphProto, graph: gs.Graph, chain: tuple = ()
) -> Iterator[tuple[onnx.GraphProto, gs.Graph, tuple]]:
    """Walk a GraphProto and its gs.Graph in step, subgraphs included, pre-order.

    Yields (proto, gs graph, chain of enclosing (proto, gs graph) pairs, outermost
    first). gs keeps node order and attribute order on import and export, so the i-th
    node and its graph attributes correspond on both sides.
    """
    yield proto, graph, chain
    inner = chain + ((proto, graph),)
    for proto_node, gs_node in zip(proto.node, graph.nodes):
        for attr in proto_node.attribute:
            value = gs_node.attrs.get(attr.name)
            if attr.type == onnx.AttributeProto.GRAPH and isinstance(value, gs.Graph):
                yield from _paired_graphs(attr.g, value, inner)
            elif attr.type == onnx.AttributeProto.GRAPHS and isinstance(value, (list, tuple)):
                for sub_proto, sub_graph in zip(attr.graphs, value):
                    yield from _paired_graphs(sub_proto, sub_graph, inner)


def _place_initializers(top: onnx.GraphProto, graph: gs.Graph) -> None:
    """Move each initializer back to the graph that owned it and drop gs's copies.

    An initializer tagged with an owner that encloses the graph gs put it in goes to the
    owner (once); an untagged one (made by a pass) stays where gs put it unless an
    enclosing graph already has it. value_info that gs wrote inside a body for values
    of an enclosing graph is dropped.
    """
    for proto, gs_graph, chain in _paired_graphs(top, graph):
        if not chain:
            continue
        tensors = gs_graph.tensors()
        outer_defined = set().union(*(_defined_names(p) for p, _ in chain))
        kept = []
        for init in proto.initializer:
            owner = getattr(tensors.get(init.name), OWNER, None)
            target = next((p for p, g in chain if g is owner), None)
            if target is not None:
                if init.name not in {i.name for i in target.initializer}:
                    target.initializer.append(init)
            elif init.name not in outer_defined:
                kept.append(init)
        _replace_repeated(proto.initializer, kept)
        _replace_repeated(proto.value_info, [v for v in proto.value_info if v.name not in outer_defined])


def _replace_repeated(field, items: list, force: bool = False) -> None:
    if force or len(items) != len(field):
        items = list(items)
        del field[:]
        field.extend(items)


def _restore_value_info(proto: onnx.GraphProto, original: list[onnx.ValueInfoProto]) -> None:
    """Put value_info back in its original order and re-add entries gs drops.

    gs writes value_info only for non-constant values it knows a type for, which is
    where passes record new or changed types, so its entries win. It drops entries for
    initializers (PyTorch lists every weight there); those are re-added when the
    initializer is still here with the same dims.
    """
    exported = {v.name: v for v in proto.value_info}
    dims = {t.name: list(t.dims) for t in proto.initializer}
    ordered = []
    for value in original:
        if value.name in exported:
            ordered.append(exported.pop(value.name))
        elif value.name in dims and _declared_dims(value) in (None, dims[value.name]):
            ordered.append(value)
    ordered.extend(exported.values())
    if [v.name for v in ordered] != [v.name for v in proto.value_info] or len(ordered) != len(proto.value_info):
        _replace_repeated(proto.value_info, ordered, force=True)


def _declared_dims(value: onnx.ValueInfoProto) -> list | None:
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]


def _defined_names(graph: onnx.GraphProto) -> set[str]:
    names = {v.name for v in graph.input}
    names.update(i.name for i in graph.initializer)
    names.update(o for n in graph.node for o in n.output if o)
    return names


def _copy_model_fields(original: onnx.ModelProto, model: onnx.ModelProto) -> None:
    """Model-level fields come from the original: versions, producer, metadata, functions."""
    model.ir_version = original.ir_version
    known = {(o.domain or "ai.onnx") for o in original.opset_import}
    added = [o for o in model.opset_import if (o.domain or "ai.onnx") not in known]
    del model.opset_import[:]
    model.opset_import.extend(original.opset_import)
    model.opset_import.extend(added)
    for field in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
        _copy_scalar_field(original, model, field)
    del model.metadata_props[:]
    model.metadata_props.extend(original.metadata_props)
    del model.functions[:]
    model.functions.extend(original.functions)
    del model.training_info[:]
    model.training_info.extend(original.training_info)
    for field in ("doc_string", "name"):
        _copy_scalar_field(original.graph, model.graph, field)


def _copy_scalar_field(source, target, field: str) -> None:
    """Copy a proto2 scalar field, keeping it unset where the source left it unset."""
    if source.HasField(field):
        setattr(target, field, getattr(source, field))
    else:
        target.ClearField(field)
