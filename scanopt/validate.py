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

from scanopt.errors import InvalidModelError, UnsupportedModelError
from scanopt.external_data import has_marks, hollow
from scanopt.protos import attribute_graphs, in_default_domain, outer_names_by_graph, topological_order, walk_proto_graphs
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
            "function called once and rewrites the body of one called more often in place"]


def _check_versions(model: onnx.ModelProto) -> None:
    if model.ir_version > onnx.IR_VERSION:
        raise UnsupportedModelError(
            f"IR version {model.ir_version} is newer than the installed onnx supports ({onnx.IR_VERSION})"
        )
    newest = onnx.defs.onnx_opset_version()
    opset = default_opset(model)
    if opset is not None and not 1 <= opset <= newest:
        raise UnsupportedModelError(f"unsupported opset {opset} (the installed onnx knows 1..{newest})")


def _check_names_and_scans(model: onnx.ModelProto) -> None:
    opset = default_opset(model)
    # What the enclosing levels define and declare, as one scope each level adds to and
    # takes back from: each level costs its own size, not a copy of everything above it.
    defined: dict[str, int] = {}  # name -> how many levels in scope define it
    shapes: dict[str, list] = {}

    def visit(graph: onnx.GraphProto, where: str) -> None:
        shadowed: dict[str, object] = {}  # name -> its shape in the enclosing levels

        def declare(name: str, shape: list) -> None:
            if name not in shadowed:
                shadowed[name] = shapes.get(name, _UNDECLARED)
            shapes[name] = shape

        for value in list(graph.input) + list(graph.value_info) + list(graph.output):
            if value.type.tensor_type.HasField("shape"):
                declare(value.name, [
                    d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                    for d in value.type.tensor_type.shape.dim
                ])
        for init in graph.initializer:
            declare(init.name, list(init.dims))
        local = {v.name for v in graph.input} | {t.name for t in graph.initializer}
        local |= {t.values.name for t in graph.sparse_initializer}
        local |= {o for node in graph.node for o in node.output if o}
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
                ScanView.from_proto(node, opset, shapes.get)
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
        for name, shape in shadowed.items():
            if shape is _UNDECLARED:
                del shapes[name]
            else:
                shapes[name] = shape

    visit(model.graph, "")


_UNDECLARED = object()


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
        computed = {o for n in graph.node for o in n.output if o} | {v.name for v in graph.input}
        computed |= {i.name for i in graph.initializer}
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
    if untidy or shapeless or has_marks(model):
        if model.ByteSize() > 2**31 - 1:  # before a copy of it is made
            return [_TOO_LARGE]
        target = onnx.ModelProto()
        target.CopyFrom(model)
        hollow(target)  # weights left in their file (scanopt.external_data): the checker cannot find it
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
        computed = {o for n in graph.node for o in n.output if o} | {v.name for v in graph.input}
        computed |= {i.name for i in graph.initializer}
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
