"""Layout-preserving nodes: ops that leave every last-axis row of a value where it was, so the
fuse algebra (which works on the last axis, broadcasting over the leading ones) reads through
them. TF1 and hand-written cells put such nodes between ``Concat([x, h])`` and its MatMul
(``Unsqueeze`` to a row and ``Squeeze`` back, ``Reshape`` to ``[1, I+H]``, ``Identity``).

A node keeps the layout when it is an Identity, a Cast to the dtype it already has, an
Unsqueeze/Squeeze that leaves the last axis alone, a Flatten at the last axis, or a Reshape
whose target keeps the last dimension (same size, known on both sides: row-major order then
keeps each row whole and in order). Anything else is a leaf of the algebra.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.graph import dtype_of, is_op
from scanopt.passes.fuse.cuts import producer
from scanopt.passes.fuse.poly import NoMatch, Poly, add, leaf, matmul

LAYOUT_OPS = ("Identity", "Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten")


def keeps_rows(alg, node: gs.Node, width: int | None = None) -> str | None:
    """None when ``node`` keeps every last-axis row of its data input, else why not.
    ``width`` is the data's last dimension when the caller knows it (a Reshape needs it)."""
    op = node.op
    if not any(is_op(node, o) for o in LAYOUT_OPS) or not node.inputs:
        return f"{op} is not a layout-preserving op"
    data = node.inputs[0]
    if op == "Identity":
        return None
    if op == "Cast":
        src = _dtype(alg, data)
        to = node.attrs.get("to")
        if src is None or to is None or np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(to))) != src:
            return f"Cast '{node.name}' changes the dtype (or the source dtype is unknown)"
        return None
    if op in ("Unsqueeze", "Squeeze"):
        axes = node.attrs.get("axes")
        if axes is None and len(node.inputs) > 1 and node.inputs[1].name:
            axes = alg.const(node.inputs[1])
        rank = alg._rank(node.outputs[0] if op == "Unsqueeze" else data)
        if axes is None or rank is None:
            return f"{op} '{node.name}' has unknown axes or rank"
        if rank - 1 in [int(a) % rank for a in np.asarray(axes).reshape(-1)]:
            return f"{op} '{node.name}' changes the last axis"
        return None
    if op == "Flatten":
        rank = alg._rank(data)
        axis = int(node.attrs.get("axis", 1))
        # [d0.., d_axis..] -> [prod(d0..), prod(d_axis..)]: the last axis is kept only at axis = rank - 1
        if rank is None or rank < 1 or (axis + rank if axis < 0 else axis) != rank - 1:
            return f"Flatten '{node.name}' does not keep the last axis"
        return None
    target = alg.const(node.inputs[1]) if len(node.inputs) > 1 else None
    if target is None or target.ndim != 1 or target.size == 0:
        return f"Reshape '{node.name}' has no constant target shape"
    last = int(target[-1])
    known = width if width is not None else _declared_last(data)
    if last == 0 and not node.attrs.get("allowzero", 0):  # copies the data's dim at that index
        rank = alg._rank(data)
        return None if rank == target.size else f"Reshape '{node.name}' copies a dim other than the last"
    if last <= 0 or known is None or last != known:
        return (f"Reshape '{node.name}' to {[int(v) for v in target]} does not provably keep the last "
                f"dimension ({known if known is not None else 'unknown'})")
    return None


def layout_rank(alg, node: gs.Node, depth: int) -> int | None:
    """The rank a layout op's output has, derived from its data's rank (for a Squeeze with
    axes) or its target (Reshape, Flatten); None when unknown."""
    if node.op == "Reshape":
        target = alg.const(node.inputs[1]) if len(node.inputs) > 1 else None
        return None if target is None else int(target.size)
    if node.op == "Flatten":
        return 2
    if node.op in ("Identity", "Cast"):
        return alg._rank(node.inputs[0], depth + 1)
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1].name:
        axes = alg.const(node.inputs[1])
    rank = alg._rank(node.inputs[0], depth + 1)
    if axes is None or rank is None:
        return None
    return rank + (1 if node.op == "Unsqueeze" else -1) * int(np.asarray(axes).size)


def runtime_matrix(alg, tensor: gs.Tensor) -> tuple[gs.Tensor, bool] | None:
    """(the run-time matrix, whether it is transposed) when ``tensor`` is a value the body reads but
    does not compute (a graph input, an invariant state), maybe behind Identity or a 2-D Transpose
    in the body (PyTorch's [out, in] weights transposed where they are used)."""
    flip = False
    for _ in range(16):
        if alg.is_runtime(tensor):
            return (tensor, flip) if alg._rank(tensor) == 2 else None
        node = producer(tensor)
        if node is None or not node.inputs:
            return None
        if is_op(node, "Transpose") and list(node.attrs.get("perm", [1, 0])) == [1, 0]:
            flip = not flip
        elif not is_op(node, "Identity"):
            return None
        tensor = node.inputs[0]
    return None


def through_layout(alg, tensor: gs.Tensor, width: int | None = None) -> tuple[gs.Tensor, bool]:
    """(the value ``tensor`` is a re-layout of, whether a Reshape/Flatten was passed) following
    layout-preserving nodes back; ``width`` is the last dimension at ``tensor``."""
    reshaped, seen = False, 0
    node = producer(tensor)
    while node is not None and seen < 64 and keeps_rows(alg, node, width) is None:
        reshaped |= node.op in ("Reshape", "Flatten")
        tensor, seen = node.inputs[0], seen + 1
        node = producer(tensor)
    return tensor, reshaped


def last_axis_concat(alg, tensor: gs.Tensor, width: int | None = None) -> tuple[gs.Node | None, bool]:
    """(the last-axis Concat ``tensor`` re-lays, whether a Reshape/Flatten was passed) or (None, _)."""
    cat, reshaped = through_layout(alg, tensor, width)
    src = producer(cat)
    if src is not None and is_op(src, "Concat") and alg.is_last_axis(cat, src.attrs.get("axis", 0)):
        return src, reshaped
    return None, reshaped


def concat_matmul(alg, src, w, infer: bool) -> Poly:
    """``Concat(pieces, last axis)·W`` as ``Σ piece·W[rows of the piece]``; one unknown piece
    width is what the weight's rows leave, unless a Reshape on the way made the rows the
    weight sees differ from the Concat's (then every width must be known)."""
    polys = [alg.value(piece) for piece in src.inputs]
    sizes = [_piece_width(piece, p) for piece, p in zip(src.inputs, polys)]
    if infer and sizes.count(None) == 1:  # the weight's rows tell the one unknown width
        sizes[sizes.index(None)] = w.shape[0] - sum(s for s in sizes if s is not None)
    if None in sizes:
        unknown = ", ".join(f"'{t.name}'" for t, s in zip(src.inputs, sizes) if s is None)
        raise NoMatch(f"the widths of {unknown} in Concat '{src.name}' are unknown")
    parts, start = [], 0
    for p, size in zip(polys, sizes):
        parts.append(matmul(p, w[start:start + size]))
        start += size
    if start != w.shape[0]:
        raise NoMatch(f"Concat '{src.name}' width {start} does not match weight rows {w.shape[0]}")
    return add(*parts)


def _piece_width(tensor, p: Poly) -> int | None:
    declared = _declared_last(tensor)
    return declared if declared is not None else p.width()


def same_rows(alg, node: gs.Node, out: gs.Tensor):
    """Algebra handler: a layout-preserving node computes the same polynomial as its data."""
    data = node.inputs[0]
    why = keeps_rows(alg, node, _declared_last(data) or _width(alg, data))
    if why is not None:
        if node.op in ("Cast", "Reshape", "Flatten"):  # another value: a leaf, as gates read it
            return leaf(out)
        raise NoMatch(why)
    return alg.value(data)


def _width(alg, tensor):
    try:
        return alg.value(tensor).width()
    except NoMatch:
        return None


_DTYPE_KEEPING = {"Identity", "Concat", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Add", "Sub", "Mul", "Neg",
                  "MatMul", "Gemm", "Split", "Slice", "Tanh", "Sigmoid", "Relu", "Transpose"}


def _dtype(alg, tensor: gs.Tensor) -> np.dtype | None:
    """A value's dtype: declared, a constant's, or that of the first input of the ops that keep
    it (bodies rarely declare intermediate values)."""
    for _ in range(64):
        found = dtype_of(tensor)
        if found is not None:
            return found
        value = alg.const(tensor)
        if value is not None:
            return value.dtype
        node = producer(tensor)
        if node is None or not node.inputs:
            return None
        if is_op(node, "Cast"):
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(node.attrs["to"])))
        if node.op not in _DTYPE_KEEPING or not is_op(node, node.op):
            return None
        tensor = node.inputs[0]
    return None


def _declared_last(tensor: gs.Tensor) -> int | None:
    shape = tensor.shape
    return shape[-1] if shape and isinstance(shape[-1], int) else None

