"""A Scan over X reversed outside it is a Scan over X in the other direction, when the reversal
is provably whole: a Slice with step -1, or a ReverseSequence whose every length equals X's
length on the time axis (constant lengths equal to a static T, or lengths computed from
``Shape(X)`` at the time axis and broadcast, as TF converters write ``fill([batch], time)``).

With any other run-time lengths it is not: a Scan-9+ runs all T steps, so after each item's
length it goes on over the unreversed tail (its later states and outputs depend on it), which a
reverse native op with ``sequence_lens`` does not read. Such a Scan is fused forward over the
ReverseSequence's output instead, and the report says why it is not the reverse direction.
(A Scan-8, whose own ``sequence_lens`` would stop at the length, exists only at opset 8 and
ReverseSequence only from opset 10, so the two never meet in one model.)
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.graph import is_op, reverses_axis
from scanopt.passes.fuse.cuts import producer

# Ops that keep "every element equals v" (Expand/Tile repeat it, the rest re-lay or copy it).
_SAME_VALUE_OPS = ("Identity", "Expand", "Tile", "Reshape", "Squeeze", "Unsqueeze")
# Casts that keep a length: TF's lengths are int32 (tf2onnx casts Shape's int64 down and the
# lengths back up); every length below 2**31 survives them (a time axis that long would
# hold at least 2 GB per batch item and feature).
_LENGTH_CASTS = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
PARTIAL_NOTE = ("fused forward over ReverseSequence '{name}' (run-time lengths, not provably T: a Scan over it "
                "also runs the unreversed tail past each length, a reverse op with sequence_lens would not)")


def reversed_source(x: gs.Tensor, axis: int, rank: int, ctx, folder) -> tuple[gs.Tensor | None, str | None]:
    """(X, None) when ``x`` is X reversed whole along ``axis``; else (None, a note for the report
    when ``x`` is a ReverseSequence on that axis whose lengths may be shorter than T)."""
    node = producer(x)
    if node is None:
        return None, None
    if reverses_axis(node, axis, rank, ctx.opset):
        return node.inputs[0], None
    if not is_op(node, "ReverseSequence") or node.attrs.get("time_axis", 0) != axis or folder is None:
        return None, None
    data, lens = node.inputs[0], node.inputs[1]
    value, shape = folder.value(lens), ctx.shapes.shape(data)
    length = shape[axis] if shape and len(shape) == rank else None
    if value is not None:
        whole = isinstance(length, int) and value.size > 0 and bool(np.all(value == length))
    else:
        whole = _is_length_of(lens, data, axis, rank, folder)
    if whole:
        return data, None
    return None, PARTIAL_NOTE.format(name=node.name or x.name)


def _is_length_of(t: gs.Tensor, data: gs.Tensor, axis: int, rank: int, folder) -> bool:
    """True when every element of ``t`` is ``data``'s size on ``axis``, by construction:
    Shape(data)[axis] (Gather, Slice or Shape's start/end) passed through ops that keep
    "every element equals v"."""
    node = producer(t)
    for _ in range(32):
        if node is None:
            return False
        if is_op(node, "Cast"):
            if node.attrs.get("to") not in _LENGTH_CASTS:
                return False
        elif is_op(node, "Mul") or is_op(node, "Add"):  # fill as ones(B) * T or zeros(B) + T
            other = _beside_filler(node, 1 if is_op(node, "Mul") else 0, folder)
            if other is None:
                return False
            node = producer(other)
            continue
        elif not any(is_op(node, op) for op in _SAME_VALUE_OPS):
            break
        node = producer(node.inputs[0])
    if node is None:
        return False
    if is_op(node, "Shape"):  # Shape(data, start=axis, end=axis + 1)
        start, end = node.attrs.get("start", 0), node.attrs.get("end")
        return node.inputs[0] is data and start % rank == axis and end is not None and end == start + 1
    index = None
    if is_op(node, "Gather") and node.attrs.get("axis", 0) == 0:
        index = folder.value(node.inputs[1])
        index = int(index.reshape(-1)[0]) % rank if index is not None and index.size == 1 else None
    elif is_op(node, "Slice") and len(node.inputs) >= 3:
        bounds = [folder.value(v) for v in node.inputs[1:3]]
        steps = folder.value(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4].name else np.array([1])
        if all(b is not None and b.size == 1 for b in bounds) and steps is not None and int(steps.reshape(-1)[0]) == 1:
            start, stop = (int(b.reshape(-1)[0]) for b in bounds)
            index = start % rank if stop == start % rank + 1 else None
    shape_node = producer(node.inputs[0]) if index is not None else None
    while shape_node is not None and is_op(shape_node, "Cast") and shape_node.attrs.get("to") in _LENGTH_CASTS:
        shape_node = producer(shape_node.inputs[0])
    return (shape_node is not None and is_op(shape_node, "Shape") and shape_node.inputs[0] is data
            and not shape_node.attrs.get("start", 0) and shape_node.attrs.get("end") is None and index == axis)


def _beside_filler(node: gs.Node, neutral: int, folder) -> gs.Tensor | None:
    """The operand of a binary Mul/Add whose other operand is all ``neutral`` (1 for Mul, 0 for
    Add): a constant, or ConstantOfShape of that value. Broadcasting it then leaves every
    element of the result equal to the kept operand's one value."""
    if len(node.inputs) != 2:
        return None
    for keep, filler in ((0, 1), (1, 0)):
        value = folder.value(node.inputs[filler])
        if value is None:
            source = producer(node.inputs[filler])
            if source is not None and is_op(source, "ConstantOfShape"):
                attr = source.attrs.get("value")
                value = np.zeros(1) if attr is None else np.asarray(getattr(attr, "values", attr))
        if value is not None and value.size > 0 and bool(np.all(value == neutral)):
            return node.inputs[keep]
    return None
