"""Structural validation of a loaded model: strict about what is broken, lenient about
what is merely untidy.

Broken (InvalidModelError / UnsupportedModelError): an opset or IR version the
installed onnx does not know, a node reading a name nothing defines, a malformed Scan,
anything else onnx.checker rejects. Untidy (a warning, the model is accepted): types
without a shape, which real exporters emit and onnxruntime runs, and which
onnx.checker rejects.
"""

from __future__ import annotations

import onnx

from scanopt.errors import InvalidModelError, UnsupportedModelError
from scanopt.protos import attribute_graphs, in_default_domain
from scanopt.scan_view import ScanView

MISSING_SHAPE = "Field 'shape' of 'type' is required but missing"


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's default-domain (ai.onnx) opset version, or None if it imports none."""
    for entry in model.opset_import:
        if in_default_domain(entry.domain):
            return entry.version
    return None


def validate_model(model: onnx.ModelProto, *, name: str = "model") -> list[str]:
    """Raise a one-line error naming ``name`` if the model is broken; return warnings."""
    try:
        _check_versions(model)
        _check_names_and_scans(model)
        return _check_with_onnx_checker(model)
    except (InvalidModelError, UnsupportedModelError) as exc:
        raise type(exc)(f"{name}: {exc}") from None


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

    def visit(graph: onnx.GraphProto, outer_names: set[str], outer_shapes: dict, where: str) -> None:
        shapes = dict(outer_shapes)
        for value in list(graph.input) + list(graph.value_info) + list(graph.output):
            if value.type.tensor_type.HasField("shape"):
                shapes[value.name] = [
                    d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                    for d in value.type.tensor_type.shape.dim
                ]
        for init in graph.initializer:
            shapes[init.name] = list(init.dims)
        defined = set(outer_names)
        defined.update(v.name for v in graph.input)
        defined.update(t.name for t in graph.initializer)
        defined.update(t.values.name for t in graph.sparse_initializer)
        for node in graph.node:
            defined.update(o for o in node.output if o)
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
                    visit(sub, defined, shapes, f"{where}{label}/{attr.name}: ")
        for out in graph.output:
            if out.name not in defined:
                raise InvalidModelError(f"{where}graph output '{out.name}' is not computed by any node")

    visit(model.graph, set(), {}, "")


def _check_with_onnx_checker(model: onnx.ModelProto) -> list[str]:
    """Run onnx.checker, forgiving only types that lack a shape."""
    if model.ByteSize() > 2**31 - 1:  # protobuf's limit: the checker cannot take it in memory
        return ["over 2 GB: onnx.checker skipped (scanopt's own structural checks ran)"]
    try:
        onnx.checker.check_model(model)
        return []
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        if MISSING_SHAPE not in first:
            raise InvalidModelError(f"onnx.checker rejects it: {first}") from None
    patched = onnx.ModelProto()
    patched.CopyFrom(model)
    _give_shapeless_types_a_shape(patched.graph)
    try:
        onnx.checker.check_model(patched)
    except onnx.checker.ValidationError as exc:
        raise InvalidModelError(f"onnx.checker rejects it: {str(exc).strip().splitlines()[0]}") from None
    return ["some values have a type without a shape (onnx.checker rejects that; onnxruntime accepts it)"]


def _give_shapeless_types_a_shape(graph: onnx.GraphProto) -> None:
    """On a throw-away copy only: an empty shape field satisfies the checker's field check."""
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        tensor_type = value.type.tensor_type
        if value.type.HasField("tensor_type") and not tensor_type.HasField("shape"):
            tensor_type.shape.SetInParent()
    for node in graph.node:
        for attr in node.attribute:
            for sub in attribute_graphs(attr):
                _give_shapeless_types_a_shape(sub)
