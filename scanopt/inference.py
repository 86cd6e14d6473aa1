"""onnx shape inference, bounded in time and memory by the model's size.

onnx's inference, with data propagation, does work that follows the numbers a model
declares (a 300-byte model declaring a dim of 10**12 made it run for minutes and take every
byte it was allowed) and the number of bodies in one graph (it copies the enclosing type
map into every body it infers: quadratic in the Scans of a graph). :func:`bounded_inference`
keeps both in proportion to the model; :mod:`scanopt.shapes` asks it.
"""

from __future__ import annotations

import onnx

from scanopt.protos import attribute_graphs, copy_fields, in_default_domain, outer_names_by_graph, walk_proto_graphs

# Bounds that keep onnx shape inference's time and memory in proportion to the model's
# size, whatever numbers it declares (a 300-byte model declaring a dim of 10**12 made it
# run for minutes and take every byte it was allowed):
# - a declared dim above DIM_LIMIT reaches inference as a symbol and comes back as the
#   number (inference does arithmetic on dims in int64: products of such dims overflow);
# - data propagation tracks the elements of a 1-D value through Add, Cast, Concat... one
#   TensorShapeProto dim each, and for a value it has no data for, it makes one unknown
#   element per declared length. An input of such an op whose length is unknown or above
#   SHAPE_DATA_LIMIT (shapes have a handful of elements) reaches it through a barrier: a
#   fresh value of the same type with the length unknown.
DIM_LIMIT = 2**31 - 1
SHAPE_DATA_LIMIT = 1024
_HUGE = "\0scanopt-huge-"  # prefix of the symbols standing for huge dims (NUL: no model's own)
_BARRIER = "\0scanopt-barrier-"
_READS_TYPES_ONLY = {"Shape", "Size"}  # data propagators that never ask for their input's data


def bounded_inference(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx shape inference (lenient, with data propagation) of ``model`` within the bounds
    above. Costs a first pass without data propagation (which allocates nothing by value)
    to learn the lengths of the 1-D values data propagation would look into; a model whose
    values data propagation has nothing to start from (no Shape or Size, no constant read
    by a propagating node: Scan bodies of arithmetic) has that pass only."""
    work, huge = _huge_dims_symbolic(model)
    plain = _infer(work, data_prop=False)
    constants = _constant_names(work)
    if not _data_to_propagate(work, constants):
        return _restore_huge(plain, huge)
    lengths = _known_types(plain)
    barriers = _barrier_inputs(work, lengths, constants)
    if barriers:
        work = _with_barriers(work, barriers, lengths)
    inferred = _infer(work, data_prop=True, shape_like=_shape_like(lengths))
    if barriers:
        kept = [v for v in inferred.graph.input if not v.name.startswith(_BARRIER)]
        del inferred.graph.input[:]
        inferred.graph.input.extend(kept)
        _fill_known_dims(inferred, lengths)  # what the barriers hid from the values after them
    return _restore_huge(inferred, huge)


# Nodes with bodies per piece of a top graph inferred apart (:func:`_infer`).
PIECE_BODIES = 64


def _infer(model: onnx.ModelProto, *, data_prop: bool, shape_like: set[str] = frozenset()) -> onnx.ModelProto:
    """onnx shape inference (lenient) of ``model``; a top graph holding more than
    PIECE_BODIES nodes with bodies in pieces of that many. onnx copies the enclosing graph's
    whole type map into every body it infers (``ShapeInferenceImplBase`` takes it by value):
    quadratic in the Scans of one graph (32 s at 5,000), where each piece's bodies see only
    the piece and what it reads."""
    if sum(1 for node in model.graph.node if _has_body(node)) <= PIECE_BODIES:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=data_prop)
    return _infer_in_pieces(model, data_prop, shape_like)


def _has_body(node: onnx.NodeProto) -> bool:
    return any(attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for attr in node.attribute)


def _shape_like(types: dict[str, onnx.TypeProto]) -> set[str]:
    """Integer values of rank 0 or 1: what data propagation carries elements of."""
    ints = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
    return {name for name, t in types.items() if t.HasField("tensor_type") and t.tensor_type.elem_type in ints
            and t.tensor_type.HasField("shape") and len(t.tensor_type.shape.dim) <= 1}


def _pieces(nodes: list[onnx.NodeProto]) -> list[tuple[int, int]]:
    """[start, end) of consecutive nodes holding PIECE_BODIES nodes with bodies each."""
    pieces, start, count = [], 0, 0
    for i, node in enumerate(nodes):
        if _has_body(node):
            count += 1
            if count == PIECE_BODIES:
                pieces.append((start, i + 1))
                start, count = i + 1, 0
    if start < len(nodes):
        pieces.append((start, len(nodes)))
    return pieces


def _infer_in_pieces(model: onnx.ModelProto, data_prop: bool, shape_like: set[str]) -> onnx.ModelProto:
    """Each piece is inferred as a model of its own: its nodes, the values it reads as typed
    inputs (types inferred by the pieces before it) and the initializers it reads. Constant
    nodes of earlier pieces, and with data propagation the shape arithmetic (``shape_like``
    values computed without bodies) its reads come from, are repeated in it, so shapes
    computed from constants and Shape chains reach it as they would in one inference.
    Symbols a piece's inference makes up are renamed per piece (each names its own
    ``unk__N``). Answers a model of the same structure with every graph inferred."""
    graph = model.graph
    nodes = list(graph.node)
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    initializers = {t.name: t for t in graph.initializer}
    declared: dict[str, onnx.ValueInfoProto] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        declared.setdefault(value.name, value)
    outputs = {v.name for v in graph.output}
    graph_inputs = {v.name for v in graph.input}
    known: dict[str, onnx.ValueInfoProto] = {}
    inferred_nodes: list[onnx.NodeProto] = []
    for k, (start, end) in enumerate(_pieces(nodes)):
        own = nodes[start:end]
        produced = {name for node in own for name in node.output if name}
        reads = [name for name in _reads(own) if name not in produced]
        repeated = _repeated_producers(nodes, producer, reads, start, data_prop, shape_like)
        repeated_out = {name for node in repeated for name in node.output if name}
        piece = onnx.ModelProto()
        copy_fields(model, piece, skip=("graph",))
        piece.graph.name = graph.name
        for name in dict.fromkeys([*reads, *(x for node in repeated for x in node.input if x)]):
            if name in produced or name in repeated_out:
                continue
            if name in initializers:  # and an input too where the model lists it (IR 3 reads only those)
                piece.graph.initializer.append(initializers[name])
            if name not in initializers or name in graph_inputs:
                piece.graph.input.append(known.get(name) or declared.get(name) or onnx.ValueInfoProto(name=name))
        piece.graph.node.extend(repeated + own)
        piece.graph.value_info.extend(declared[n] for n in produced if n in declared and n not in outputs)
        piece.graph.output.extend(declared[n] for n in produced if n in outputs)
        symbols = _symbols(piece)
        inferred = onnx.shape_inference.infer_shapes(piece, strict_mode=False, data_prop=data_prop)
        _rename_symbols_not_in(inferred, symbols, f"_{k}")
        for value in [*inferred.graph.value_info, *inferred.graph.output]:
            if value.name in produced:
                known[value.name] = value
        inferred_nodes.extend(inferred.graph.node[len(repeated):])
    result = onnx.ModelProto()
    copy_fields(model, result, skip=("graph",))
    copy_fields(graph, result.graph, skip=("node", "value_info", "output"))
    result.graph.node.extend(inferred_nodes)
    result.graph.output.extend(known.get(v.name, v) for v in graph.output)
    result.graph.value_info.extend(v for name, v in known.items() if name not in outputs)
    return result


def _reads(nodes: list[onnx.NodeProto]) -> list[str]:
    """Names ``nodes`` read, their bodies' outer-scope reads included, in order of first use."""
    reads: dict[str, None] = {}
    for node in nodes:
        reads.update(dict.fromkeys(name for name in node.input if name))
        for attr in node.attribute:
            for sub in attribute_graphs(attr):
                reads.update(dict.fromkeys(outer_names_by_graph(sub)[id(sub)][1]))
    return list(reads)


def _repeated_producers(nodes, producer, reads, start, data_prop, shape_like) -> list[onnx.NodeProto]:
    """The nodes before ``start`` (no bodies) whose values a piece needs as values, not only
    as types: Constants, and with data propagation the shape arithmetic, transitively."""
    taken: set[int] = set()
    stack = [name for name in reads if producer.get(name, start) < start]
    while stack:
        i = producer[stack.pop()]
        node = nodes[i]
        if i in taken or _has_body(node):
            continue
        if node.op_type == "Constant" or (data_prop and all(o in shape_like for o in node.output if o)):
            taken.add(i)
            stack.extend(name for name in node.input if producer.get(name, start) < start)
    return [nodes[i] for i in sorted(taken)]


def _symbols(model: onnx.ModelProto) -> set[str]:
    return {d.dim_param for g in walk_proto_graphs(model.graph) for v in _declared_values(g)
            if v.type.HasField("tensor_type") for d in v.type.tensor_type.shape.dim if d.dim_param}


def _rename_symbols_not_in(model: onnx.ModelProto, symbols: set[str], suffix: str) -> None:
    for g in walk_proto_graphs(model.graph):
        for v in _declared_values(g):
            for d in v.type.tensor_type.shape.dim if v.type.HasField("tensor_type") else ():
                if d.dim_param and d.dim_param not in symbols:
                    d.dim_param += suffix


def _declared_values(graph: onnx.GraphProto):
    return [*graph.input, *graph.output, *graph.value_info]


def _huge_dims_symbolic(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """``model``, or a copy in which every declared dim above DIM_LIMIT is a symbol."""
    def huge(m):
        return [d for g in walk_proto_graphs(m.graph) for v in _declared_values(g) if v.type.HasField("tensor_type")
                for d in v.type.tensor_type.shape.dim if d.HasField("dim_value") and d.dim_value > DIM_LIMIT]

    if not huge(model):
        return model, False
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for dim in huge(copy):
        dim.dim_param = f"{_HUGE}{dim.dim_value}"  # clears dim_value (a oneof)
    return copy, True


def _restore_huge(inferred: onnx.ModelProto, huge: bool) -> onnx.ModelProto:
    if huge:
        for g in walk_proto_graphs(inferred.graph):
            for v in _declared_values(g):
                for dim in v.type.tensor_type.shape.dim if v.type.HasField("tensor_type") else ():
                    if dim.dim_param.startswith(_HUGE):
                        dim.dim_value = int(dim.dim_param[len(_HUGE):])
    return inferred


_DATA_OPS: dict[tuple[str, int], bool] = {}


def _propagates_data(node: onnx.NodeProto, model: onnx.ModelProto) -> bool:
    """True if onnx's data propagation looks at the data of ``node``'s inputs."""
    if not in_default_domain(node.domain) or node.op_type in _READS_TYPES_ONLY:
        return False
    opset = next((o.version for o in model.opset_import if in_default_domain(o.domain)), 0)
    key = (node.op_type, opset)
    if key not in _DATA_OPS:
        try:
            schema = onnx.defs.get_schema(node.op_type, opset)
            _DATA_OPS[key] = bool(getattr(schema, "has_data_propagation_function", True))
        except Exception:  # noqa: BLE001 - unknown op or opset: onnx propagates nothing through it
            _DATA_OPS[key] = False
    return _DATA_OPS[key]


def _known_types(inferred: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    types: dict[str, onnx.TypeProto] = {}
    for g in walk_proto_graphs(inferred.graph):
        for v in _declared_values(g):
            types.setdefault(v.name, v.type)
    return types


def _short(type_proto: onnx.TypeProto | None) -> bool:
    """A known shape that is not 1-D, or 1-D of a known length up to SHAPE_DATA_LIMIT."""
    if type_proto is None or not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return False
    dims = type_proto.tensor_type.shape.dim
    return len(dims) != 1 or (dims[0].HasField("dim_value") and dims[0].dim_value <= SHAPE_DATA_LIMIT)


def _constant_names(model: onnx.ModelProto) -> set[str]:
    """Initializers and Constant outputs at every level: values whose data is in the model."""
    names = {t.name for g in walk_proto_graphs(model.graph) for t in g.initializer}
    names.update(n.output[0] for g in walk_proto_graphs(model.graph) for n in g.node
                 if n.op_type == "Constant" and in_default_domain(n.domain) and n.output)
    return names


def _data_to_propagate(model: onnx.ModelProto, constants: set[str]) -> bool:
    """Data propagation knows elements only from Shape, Size and constants; without them it
    adds nothing to what inference without it finds (lengths it knows already)."""
    return any((in_default_domain(node.domain) and node.op_type in _READS_TYPES_ONLY)
               or (_propagates_data(node, model) and any(name in constants for name in node.input))
               for g in walk_proto_graphs(model.graph) for node in g.node)


def _barrier_inputs(model: onnx.ModelProto, types: dict[str, onnx.TypeProto], constants: set[str]) -> set[str]:
    """Inputs of data-propagating nodes whose length may be unbounded; constants excluded
    (their data is there, bytes for elements)."""
    return {name for g in walk_proto_graphs(model.graph) for node in g.node if _propagates_data(node, model)
            for name in node.input if name and name not in constants and not _short(types.get(name))}


def _with_barriers(model: onnx.ModelProto, names: set[str], types: dict[str, onnx.TypeProto]) -> onnx.ModelProto:
    """A copy of ``model`` whose data-propagating nodes read each of ``names`` through a
    barrier: a top-level input (visible at every level) of its type, length unknown."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    fresh = {name: f"{_BARRIER}{k}" for k, name in enumerate(sorted(names))}
    for g in walk_proto_graphs(copy.graph):
        for node in g.node:
            if _propagates_data(node, copy):
                for i, name in enumerate(node.input):
                    if name in fresh:
                        node.input[i] = fresh[name]
    for name, barrier in fresh.items():
        value = copy.graph.input.add(name=barrier)
        known = types.get(name)
        if known is not None and known.HasField("tensor_type"):
            value.type.tensor_type.elem_type = known.tensor_type.elem_type
            shape = known.tensor_type.shape
            if known.tensor_type.HasField("shape"):
                value.type.tensor_type.shape.dim.extend(onnx.TensorShapeProto.Dimension() for _ in shape.dim)
        else:
            value.type.tensor_type.elem_type = onnx.TensorProto.UNDEFINED
    return copy


def _fill_known_dims(inferred: onnx.ModelProto, types: dict[str, onnx.TypeProto]) -> None:
    """Dims the first pass knew that the second lost behind a barrier (the second only adds
    knowledge elsewhere): values, and the huge dims' symbols. Not its other symbols: each
    pass names its own."""
    for g in walk_proto_graphs(inferred.graph):
        for v in _declared_values(g):
            known = types.get(v.name)
            if known is None or not known.HasField("tensor_type") or not known.tensor_type.HasField("shape"):
                continue
            target = v.type.tensor_type
            if not target.HasField("shape"):
                target.shape.dim.extend(onnx.TensorShapeProto.Dimension() for _ in known.tensor_type.shape.dim)
            if len(target.shape.dim) != len(known.tensor_type.shape.dim):
                continue
            for mine, theirs in zip(target.shape.dim, known.tensor_type.shape.dim):
                if not mine.HasField("dim_value") and (theirs.HasField("dim_value") or theirs.dim_param.startswith(_HUGE)):
                    mine.CopyFrom(theirs)
