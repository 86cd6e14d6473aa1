"""The before/after table under the report: what a user compares first, in the layout onnxslim's
users know (one row per input, output and changed op type; the model's size; the time taken).

Sizes are the serialized size of each model with its weights (``serialized_size_bound``: no
copy of the weights is made to count them), so a model whose weights live in external files
compares like an inline one.
"""

from __future__ import annotations

import onnx

from scanopt.external_data import serialized_size_bound
from scanopt.report import count_ops
from scanopt.errors import printable_lines

ELEMENT_NAMES = {code: name.lower() for name, code in onnx.TensorProto.DataType.items()}


def table(original: onnx.ModelProto, optimized: onnx.ModelProto, seconds: float | None) -> list[str]:
    """Rows: each graph input and output (type and shape, before and after), each op type whose
    count changed and the total, the model's size, and the run's time."""
    rows = [("", "", "original", "optimized")]
    for kind, before, after in (("input", original.graph.input, optimized.graph.input),
                                ("output", original.graph.output, optimized.graph.output)):
        after_types = {v.name: _type(v) for v in after}
        for value in before:
            rows.append((kind, value.name, _type(value), after_types.get(value.name, "(missing)")))
    ops_before, ops_after = count_ops(original), count_ops(optimized)
    for op in sorted(set(ops_before) | set(ops_after)):
        if ops_before[op] != ops_after[op]:
            rows.append(("op", op, str(ops_before[op]), str(ops_after[op])))
    rows.append(("ops", "total", str(sum(ops_before.values())), str(sum(ops_after.values()))))
    rows.append(("size", "", _bytes(serialized_size_bound(original)), _bytes(serialized_size_bound(optimized))))
    if seconds is not None:
        rows.append(("time", "", "", f"{seconds:.2f} s"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return printable_lines(lines).splitlines()


def _type(value: onnx.ValueInfoProto) -> str:
    """``float32 [T, B, 3]``; a sequence, map or optional by its kind."""
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        return kind.removesuffix("_type") if kind else "?"
    tensor = value.type.tensor_type
    element = ELEMENT_NAMES.get(tensor.elem_type, "?")
    if element == "float":
        element = "float32"
    if not tensor.HasField("shape"):
        return f"{element} (any rank)"
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
    return f"{element} [{', '.join(dims)}]"


def _bytes(count: int) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"

