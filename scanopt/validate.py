"""Structural validation of a loaded model: strict about what is broken, lenient about
what is merely untidy.

Broken (InvalidModelError / UnsupportedModelError): an opset or IR version the
installed onnx does not know, two different versions imported for one domain, a node
reading a name nothing defines, a cycle, a malformed Scan, anything else onnx.checker
rejects. Untidy (a warning naming the values, the model is accepted and kept as it is):
what real exporters write and onnxruntime runs — value_info or graph outputs without a
type (onnxscript), types without a shape (skl2onnx), value_info for values nothing
computes, nodes out of topological order, the same opset imported twice. onnx.checker
then runs on a tidied throw-away copy, so everything else it checks still holds.
"""

from __future__ import annotations

import onnx
from google.protobuf.descriptor import FieldDescriptor
from onnx import TensorProto as TP

from scanopt.errors import InvalidModelError, UnsupportedModelError, printable
from scanopt.external_data import has_marks, hollow_copy
from scanopt.protos import (
    attribute_graphs, defined_names, in_default_domain, outer_names_by_graph, topological_order, walk_proto_graphs,
)
from scanopt.scan_view import ScanView

def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's default-domain (ai.onnx) opset version, or None if it imports none."""
    for entry in model.opset_import:
        if in_default_domain(entry.domain):
            return entry.version
    return None


def validate_model(model: onnx.ModelProto, *, name: str = "model", serialized: bytes | None = None) -> list[str]:
    """Raise a one-line error naming ``name`` if the model is broken; return warnings.
    ``serialized``: the bytes ``model`` was parsed from, when the caller has them (and
    they hold the whole model, no external data): a tidy model is then checked as read,
    without serializing it again."""
    try:
        _check_versions(model)
        _check_fields(model)
        warnings = _check_opset_imports(model)
        _check_names_and_scans(model)
        warnings += _check_untidy_values(model)
        warnings += _check_node_order(model)
        untidy = bool(warnings)
        warnings += _scans_in_functions(model)
        return warnings + _check_with_onnx_checker(model, untidy, serialized)
    except (InvalidModelError, UnsupportedModelError) as exc:
        raise type(exc)(f"{name}: {exc}") from None


def _scans_in_functions(model: onnx.ModelProto) -> list[str]:
    """Name the model-local functions holding Scans rather than report "no Scan nodes" (inspect
    lists the main graph and its bodies; optimize handles functions, scanopt.functions)."""

    def has_scan(nodes) -> bool:
        return any(n.op_type == "Scan" or any(has_scan(a.g.node) for a in n.attribute if a.type == onnx.AttributeProto.GRAPH)
                   for n in nodes)

    names = [f"{f.domain}.{f.name}" if f.domain else f.name for f in model.functions if has_scan(f.node)]
    if not names:
        return []
    return [f"Scan nodes inside model-local function(s) {', '.join(repr(n) for n in names)}: optimize inlines a "
            "function called once and rewrites the body of one called more often in place (for a CUDA or "
            "TensorRT provider it inlines every one of them: scanopt.cuda_shapes)"]


def _check_versions(model: onnx.ModelProto) -> None:
    if model.ir_version > onnx.IR_VERSION:
        raise UnsupportedModelError(
            f"IR version {model.ir_version} is newer than the installed onnx supports ({onnx.IR_VERSION})"
        )
    newest = onnx.defs.onnx_opset_version()
    opset = default_opset(model)
    if opset is not None and not 1 <= opset <= newest:
        raise UnsupportedModelError(f"unsupported opset {opset} (the installed onnx knows 1..{newest})")


_KNOWN_DTYPES = frozenset(onnx.TensorProto.DataType.values())
_DTYPE_FIELDS = {("TypeProto.Tensor", "elem_type"), ("TypeProto.SparseTensor", "elem_type"), ("TensorProto", "data_type")}
_STRING = FieldDescriptor.TYPE_STRING
_MESSAGE = FieldDescriptor.TYPE_MESSAGE


def _check_fields(model: onnx.ModelProto) -> None:
    """What protobuf parses but nothing downstream can take (hostile or damaged bytes):
    a string field or string attribute that is not UTF-8 (protobuf hands the one over as
    bytes; onnx-graphsurgeon decodes the other), a data type
    number onnx does not know, a negative dim, a small tensor whose data does not fill its
    dims. One walk over every message, fields that hold tensor data never read (reading
    raw_data copies it); a message is named by the nearest named one above it."""
    stack: list[tuple[object, str]] = [(model, "")]
    while stack:
        message, where = stack.pop()
        kind = message.DESCRIPTOR.full_name.removeprefix("onnx.")
        name = getattr(message, "name", None) if kind in _NAMED else None
        if isinstance(name, str) and name:
            where = f"{_NAMED[kind]} '{printable(name)}': "
        if kind == "TensorProto":
            _check_tensor_size(message, where)
        for field, value in _fields(message, kind):
            if field.type == _MESSAGE:
                if kind == "ValueInfoProto" and field.name == "type" and value.WhichOneof("value") in _UNSUPPORTED_TYPES:
                    raise UnsupportedModelError(
                        f"{where}is declared with {value.WhichOneof('value').replace('_', ' ')}; scanopt handles tensor, "
                        "sequence and sparse tensor values"
                    )
                if not _repeated(field):
                    stack.append((value, where))
                else:
                    items = value.values() if field.message_type.GetOptions().map_entry else value
                    stack.extend((item, where) for item in items)
            elif field.type == _STRING:
                for text in value if _repeated(field) else (value,):
                    if not isinstance(text, str):
                        raise InvalidModelError(f"{where}{kind}.{field.name} '{printable(text)}' is not valid UTF-8")
            elif kind == "AttributeProto" and field.name in ("s", "strings"):  # bytes fields, read as text
                for data in value if _repeated(field) else (value,):
                    try:
                        data.decode("utf-8")
                    except UnicodeDecodeError:
                        raise InvalidModelError(f"{where}attribute '{printable(message.name)}' holds a string that is "
                                                f"not valid UTF-8 ('{printable(data)}')") from None
            elif (kind, field.name) in _DTYPE_FIELDS and value not in _KNOWN_DTYPES:
                raise InvalidModelError(f"{where}data type {value} is not one onnx knows")
            elif kind == "TensorShapeProto.Dimension" and field.name == "dim_value" and value < 0:
                raise InvalidModelError(f"{where}declares a negative dim ({value})")
            elif kind == "TensorProto" and field.name == "dims" and any(d < 0 for d in value):
                raise InvalidModelError(f"{where}has a negative dim ({list(value)})")


_DATA_FIELDS = frozenset({"raw_data", "string_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"})


def _fields(message, kind: str):
    """``message.ListFields()``, without a tensor's data fields (ListFields would copy raw_data)."""
    if kind != "TensorProto":
        yield from message.ListFields()
        return
    for field in message.DESCRIPTOR.fields:
        if field.name in _DATA_FIELDS:
            continue
        value = getattr(message, field.name)
        if (len(value) if _repeated(field) else message.HasField(field.name)):
            yield field, value


TP_ = onnx.TensorProto
# Bytes per element in raw_data, and the typed field with its entries per element, for the
# types whose elements are whole bytes (sub-byte types are packed: not checked).
_ELEMENT = {
    TP_.FLOAT: (4, "float_data", 1), TP_.COMPLEX64: (8, "float_data", 2), TP_.DOUBLE: (8, "double_data", 1),
    TP_.COMPLEX128: (16, "double_data", 2), TP_.INT64: (8, "int64_data", 1), TP_.UINT64: (8, "uint64_data", 1),
    TP_.UINT32: (4, "uint64_data", 1), TP_.INT32: (4, "int32_data", 1), TP_.INT16: (2, "int32_data", 1),
    TP_.UINT16: (2, "int32_data", 1), TP_.INT8: (1, "int32_data", 1), TP_.UINT8: (1, "int32_data", 1),
    TP_.BOOL: (1, "int32_data", 1), TP_.FLOAT16: (2, "int32_data", 1), TP_.BFLOAT16: (2, "int32_data", 1),
}
# raw_data is measured only up to this size: reading it copies the bytes.
_MEASURED_RAW_BYTES = 1 << 20


def _check_tensor_size(tensor: onnx.TensorProto, where: str) -> None:
    """A tensor's data must fill its dims exactly (numpy_helper would fail to reshape it deep
    inside a pass). External data is checked where it is read."""
    element = _ELEMENT.get(tensor.data_type)
    if element is None or tensor.data_location == TP_.EXTERNAL or len(tensor.external_data):
        return
    if any(d < 0 for d in tensor.dims):
        return  # refused by the dims check
    count = 1
    for d in tensor.dims:
        count *= d
    size, field, per = element
    if tensor.HasField("raw_data"):
        if count * size > _MEASURED_RAW_BYTES:
            return
        have, want, unit = len(tensor.raw_data), count * size, "bytes"
    else:
        have, want, unit = len(getattr(tensor, field)), count * per, f"{field} entries"
    if have != want:
        raise InvalidModelError(f"{where}its data holds {have} {unit}, but dims {list(tensor.dims)} need {want}")


def _repeated(field: FieldDescriptor) -> bool:
    """protobuf 7 has ``is_repeated`` and no ``label``; releases before 5.x the reverse."""
    flag = getattr(field, "is_repeated", None)
    return flag if flag is not None else field.label == FieldDescriptor.LABEL_REPEATED


_UNSUPPORTED_TYPES = ("optional_type", "map_type", "opaque_type")
_NAMED = {"ValueInfoProto": "value", "NodeProto": "node", "TensorProto": "tensor", "GraphProto": "graph",
          "AttributeProto": "attribute", "FunctionProto": "function"}


def _check_names_and_scans(model: onnx.ModelProto) -> None:
    opset = default_opset(model)
    # What the enclosing levels define and declare, as one scope each level adds to and
    # takes back from: each level costs its own size, not a copy of everything above it.
    defined: dict[str, int] = {}  # name -> how many levels in scope define it
    declared: dict[str, tuple[int, list | None]] = {}  # name -> (elem_type or 0, shape or None)

    def shape_of(name: str) -> list | None:
        return declared.get(name, (0, None))[1]

    def visit(graph: onnx.GraphProto, where: str) -> None:
        shadowed: dict[str, object] = {}  # name -> its declaration in the enclosing levels

        def declare(name: str, dtype: int, shape: list | None) -> None:
            if name in shadowed:  # declared before at this level too: what each says adds up
                old_dtype, old_shape = declared[name]
            else:
                shadowed[name] = declared.get(name, _UNDECLARED)
                old_dtype, old_shape = 0, None
            declared[name] = (dtype or old_dtype, shape if shape is not None else old_shape)

        for value in list(graph.input) + list(graph.value_info) + list(graph.output):
            tensor_type = value.type.tensor_type
            declare(value.name, tensor_type.elem_type, _declared_shape(value))
        for init in graph.initializer:
            declare(init.name, init.data_type, list(init.dims))
        local = defined_names(graph)
        for name in local:
            defined[name] = defined.get(name, 0) + 1
        for node in graph.node:
            label = node.name or node.op_type
            for inp in node.input:
                if inp and inp not in defined:
                    raise InvalidModelError(f"{where}node '{label}' reads '{inp}', which nothing defines")
            if node.op_type == "Scan" and in_default_domain(node.domain):
                if opset is None:
                    raise InvalidModelError(f"{where}Scan node '{label}' but the model imports no ai.onnx opset")
                _check_scan_attribute_types(node, opset, label, where)
                view = ScanView.from_proto(node, opset, shape_of)
                _check_body_declarations(node, view, declared, f"{where}Scan node '{label}'")
            elif node.op_type == "Loop" and in_default_domain(node.domain):
                _check_loop_declarations(node, declared, f"{where}Loop node '{label}'")
            elif node.op_type == "Split":
                _check_split_outputs(node, opset, f"{where}Split node '{label}'")
            for attr in node.attribute:
                for sub in attribute_graphs(attr):
                    visit(sub, f"{where}{label}/{attr.name}: ")
        for out in graph.output:
            if out.name not in defined:
                raise InvalidModelError(f"{where}graph output '{out.name}' is not computed by any node")
        for name in local:
            defined[name] -= 1
            if not defined[name]:
                del defined[name]
        for name, before in shadowed.items():
            if before is _UNDECLARED:
                del declared[name]
            else:
                declared[name] = before

    visit(model.graph, "")
    for function in model.functions:
        own = next((o.version for o in function.opset_import if in_default_domain(o.domain)), opset)
        for graph in [function, *(g for n in function.node for a in n.attribute for top in attribute_graphs(a)
                                  for g in walk_proto_graphs(top))]:
            for node in graph.node:
                if node.op_type == "Split":
                    _check_split_outputs(node, own, f"function '{function.name}': Split node '{node.name or 'Split'}'")


_UNDECLARED = object()


def _check_split_outputs(node: onnx.NodeProto, opset: int | None, label: str) -> None:
    """Split-18's ``num_outputs`` is its number of outputs: with more outputs than that, onnx's
    shape inference and onnxruntime index past the sizes they computed and abort the process
    (a libstdc++ assertion), so the model is refused here, before either runs."""
    if not in_default_domain(node.domain) or (opset or 0) < 18:
        return
    count = next((a for a in node.attribute if a.name == "num_outputs"), None)
    if count is not None and count.type == onnx.AttributeProto.INT and count.i != len(node.output):
        raise InvalidModelError(f"{label} has {len(node.output)} outputs but num_outputs = {count.i}")


def _declared_shape(value: onnx.ValueInfoProto) -> list | None:
    """A value's declared dims (ints, dim names, None for unknown), None without a shape."""
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim]


def _check_body_declarations(node: onnx.NodeProto, view: ScanView, declared: dict, label: str) -> None:
    """A Scan body's declarations against what the outer graph declares, by Scan's contract:
    a state as the outer initial state (Scan-8: without the batch axis), a scan input as the
    outer tensor without its scan axis (Scan-8: without batch and sequence axes), a body
    state output as the state input. Strict on contradictions (another dtype, another rank,
    another static dim); silent where either side leaves it open (no type, no shape, a dim
    name or an unknown dim) — onnx.checker's full check and strict shape inference reject
    the first, onnxruntime runs the second."""
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    if body is None:
        return
    n = view.num_states
    outer = list(view.initial_states) + list(view.scan_inputs)
    for i, (outer_name, inner) in enumerate(zip(outer, body.input)):
        dtype, shape = declared.get(outer_name, (0, None))
        if shape is not None and view.batched:
            shape = shape[1:] if i < n else shape[2:]
        elif shape is not None and i >= n:
            axis = view.input_axes[i - n]
            shape = shape[:axis] + shape[axis + 1:] if 0 <= axis < len(shape) else None
        what = "state" if i < n else "scan input"
        _compare(f"{label}: body input '{printable(inner.name)}'",
                 f"the outer {what} '{printable(outer_name)}' gives it", dtype, shape, inner)
    for i in range(min(n, len(body.output))):
        state = body.input[i]
        _compare(f"{label}: body state output '{printable(body.output[i].name)}'",
                 f"its state input '{printable(state.name)}' is", state.type.tensor_type.elem_type,
                 _declared_shape(state), body.output[i])


def _check_loop_declarations(node: onnx.NodeProto, declared: dict, label: str) -> None:
    """A Loop body's counts (2 + N inputs, 1 + N + K outputs for N loop-carried values and
    N + K Loop outputs: onnx's Loop inference, which onnxruntime runs on load, refuses
    anything else) and dtypes: iteration number int64, condition bool, each loop-carried value
    as its outer initial value (shapes may change from one iteration to the next: not checked)."""
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    if body is None:
        return
    carried = len(node.input) - 2
    if carried < 0:
        raise InvalidModelError(f"{label} has {len(node.input)} inputs; it needs at least 2 (M and cond, each may be '')")
    if len(body.input) != len(node.input):
        raise InvalidModelError(f"{label}: body has {len(body.input)} inputs; expected 2 + N = 2 + {carried} = "
                                f"{len(node.input)} (the iteration number, the condition, each loop-carried value)")
    if len(node.output) < carried:
        raise InvalidModelError(f"{label} has {len(node.output)} outputs for {carried} loop-carried values")
    if len(body.output) != 1 + len(node.output):
        raise InvalidModelError(f"{label}: body has {len(body.output)} outputs; expected 1 + {len(node.output)} = "
                                f"{1 + len(node.output)} (the condition, then one per output of the Loop)")
    fixed = [(TP.INT64, "the iteration number is"), (TP.BOOL, "the loop condition is")]
    for i, inner in enumerate(body.input):
        if i < 2:
            dtype, source = fixed[i]
        elif i < len(node.input):
            dtype, source = declared.get(node.input[i], (0, None))[0], f"the outer value '{printable(node.input[i])}' is"
        else:
            break
        _compare(f"{label}: body input '{printable(inner.name)}'", source, dtype, None, inner)


def _compare(subject: str, source: str, dtype: int, shape: list | None, inner: onnx.ValueInfoProto) -> None:
    inner_dtype = inner.type.tensor_type.elem_type
    if dtype and inner_dtype and dtype != inner_dtype:
        raise InvalidModelError(f"{subject} is declared {_dtype_name(inner_dtype)} but {source} {_dtype_name(dtype)}")
    inner_shape = _declared_shape(inner)
    if shape is None or inner_shape is None:
        return
    if len(shape) != len(inner_shape) or any(
        isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(shape, inner_shape)
    ):
        raise InvalidModelError(f"{subject} is declared with shape {_dims(inner_shape)} but {source} {_dims(shape)}")


def _dtype_name(dtype: int) -> str:
    return onnx.TensorProto.DataType.Name(dtype).lower()


def _dims(shape: list) -> str:
    return "[" + ", ".join("?" if d is None else printable(d) for d in shape) + "]"


def _check_scan_attribute_types(node: onnx.NodeProto, opset: int, label: str, where: str) -> None:
    """Each attribute of a Scan has the type its schema gives (checked before the Scan is read;
    onnx.checker, which checks every node's, runs later)."""
    schema = onnx.defs.get_schema("Scan", opset)
    for attr in node.attribute:
        wanted = schema.attributes.get(attr.name)
        if wanted is not None and attr.type != wanted.type:
            got = onnx.AttributeProto.AttributeType.Name(attr.type) if attr.type in _ATTRIBUTE_TYPES else str(attr.type)
            raise InvalidModelError(
                f"{where}Scan node '{printable(label)}': attribute '{printable(attr.name)}' is of type {got}, "
                f"not {onnx.AttributeProto.AttributeType.Name(wanted.type)}"
            )


_ATTRIBUTE_TYPES = frozenset(onnx.AttributeProto.AttributeType.values())


def _check_opset_imports(model: onnx.ModelProto) -> list[str]:
    versions: dict[str, list[int]] = {}
    for entry in model.opset_import:
        domain = "ai.onnx" if in_default_domain(entry.domain) else entry.domain
        versions.setdefault(domain, []).append(entry.version)
    warnings = []
    for domain, found in versions.items():
        if len(set(found)) > 1:
            raise InvalidModelError(f"imports domain {domain} at several opsets ({', '.join(map(str, found))})")
        if len(found) > 1:
            warnings.append(f"imports domain {domain} (opset {found[0]}) {len(found)} times")
    return warnings


def _graph_label(graph: onnx.GraphProto, top: onnx.GraphProto) -> str:
    return "the main graph" if graph is top else f"body '{graph.name}'"


def _check_untidy_values(model: onnx.ModelProto) -> list[str]:
    """Values declared without a type, and value_info for values nothing computes."""
    untyped, unused = [], []
    for graph in walk_proto_graphs(model.graph):
        computed = defined_names(graph)
        for value in list(graph.input) + list(graph.output) + list(graph.value_info):
            if not value.HasField("type"):
                untyped.append(value.name)
        unused += [v.name for v in graph.value_info if v.name not in computed]
    warnings = []
    if untyped:
        warnings.append(f"values declared without a type: {_listed(untyped)} (onnx.checker rejects that; onnxruntime accepts it)")
    if unused:
        warnings.append(f"value_info for values nothing computes: {_listed(unused)} (ignored)")
    return warnings


def _check_node_order(model: onnx.ModelProto) -> list[str]:
    """A cycle is broken; nodes merely out of order are untidy (onnxruntime sorts them)."""
    unsorted = []
    captures = outer_names_by_graph(model.graph)
    for graph in walk_proto_graphs(model.graph):
        order, cycle = topological_order(graph, captures)
        where = _graph_label(graph, model.graph)
        if cycle:
            raise InvalidModelError(f"{where} has a cycle: " + ", ".join(cycle))
        if order != sorted(order):
            unsorted.append(where)
    if unsorted:
        return [f"nodes out of topological order in {_listed(unsorted, quote=False)} (onnx.checker rejects that, onnxruntime too inside a body; scanopt writes them sorted)"]
    return []


def sort_nodes(model: onnx.ModelProto) -> bool:
    """Put every graph's nodes (bodies included) in topological order, in place, keeping
    the order of nodes that are already in order. True if any graph changed. Call after
    :func:`validate_model` (which refuses cycles)."""
    changed = False
    captures = outer_names_by_graph(model.graph)  # a re-sorted level's bodies are copies: looked up anew
    for graph in walk_proto_graphs(model.graph):
        order, _ = topological_order(graph, captures)
        if order != sorted(order):
            nodes = [onnx.NodeProto() for _ in order]
            for target, index in zip(nodes, order):
                target.CopyFrom(graph.node[index])
            del graph.node[:]
            graph.node.extend(nodes)
            changed = True
    return changed


def _listed(names: list[str], *, quote: bool = True, most: int = 8) -> str:
    shown = [f"'{n}'" if quote else n for n in dict.fromkeys(names)]
    more = len(shown) - most
    return ", ".join(shown[:most]) + (f" and {more} more" if more > 0 else "")


def _check_with_onnx_checker(model: onnx.ModelProto, untidy: bool, serialized: bytes | None = None) -> list[str]:
    """Run onnx.checker on a copy with the untidy things above tidied, forgiving also
    types that lack a shape. A tidy model is checked as it is: no copy, and serialized
    once at most (the size check and the checker share the bytes)."""
    shapeless = [v.name for v in _shapeless_values(model.graph)]
    target = model
    if untidy or shapeless or serialized is None or has_marks(model):
        # big weights are not copied, serialized or checked (weights left in their file,
        # scanopt.external_data: the checker could not find them anyway)
        target = hollow_copy(model)
        sort_nodes(target)
        _tidy_for_checker(target)
        for value in _shapeless_values(target.graph):  # an empty shape satisfies the checker's field check
            value.type.tensor_type.shape.SetInParent()
        serialized = None
    if serialized is None:
        try:
            serialized = target.SerializeToString()
        except Exception:  # noqa: BLE001 - over protobuf's 2 GB limit: the checker cannot take it in memory
            return [_TOO_LARGE]
    if len(serialized) > 2**31 - 1:
        return [_TOO_LARGE]
    try:
        onnx.checker.check_model(serialized)
    except onnx.checker.ValidationError as exc:
        raise InvalidModelError(f"onnx.checker rejects it: {_one_line(exc)}") from None
    if shapeless:
        return [f"values with a type but no shape: {_listed(shapeless)} (onnx.checker rejects that; onnxruntime accepts it)"]
    return []


_TOO_LARGE = "over 2 GB: onnx.checker skipped (scanopt's own structural checks ran)"


def _one_line(exc: Exception) -> str:
    """The checker's whole message on one line (its first line can stop mid-sentence)."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip() and not line.startswith("==>")) or type(exc).__name__


def _tidy_for_checker(model: onnx.ModelProto) -> None:
    """On a throw-away copy only: one import per domain, typeless values given
    a placeholder type, value_info of values nothing computes dropped."""
    seen, imports = set(), []
    for entry in model.opset_import:
        domain = "" if in_default_domain(entry.domain) else entry.domain
        if domain not in seen:
            seen.add(domain)
            imports.append(entry)
    if len(imports) != len(model.opset_import):
        kept = [onnx.OperatorSetIdProto(domain=e.domain, version=e.version) for e in imports]
        del model.opset_import[:]
        model.opset_import.extend(kept)
    for graph in walk_proto_graphs(model.graph):
        computed = defined_names(graph)
        kept_info = [v for v in graph.value_info if v.HasField("type") and v.name in computed]
        if len(kept_info) != len(graph.value_info):
            kept_copies = [onnx.ValueInfoProto() for _ in kept_info]
            for target, value in zip(kept_copies, kept_info):
                target.CopyFrom(value)
            del graph.value_info[:]
            graph.value_info.extend(kept_copies)
        for value in list(graph.input) + list(graph.output):
            if not value.HasField("type"):
                value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
                value.type.tensor_type.shape.SetInParent()


def _shapeless_values(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Declared values with a tensor type but no shape field, at every level."""
    found = []
    for g in walk_proto_graphs(graph):
        for value in list(g.input) + list(g.output) + list(g.value_info):
            if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape"):
                found.append(value)
    return found
