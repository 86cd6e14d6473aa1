"""Gates stacked on a leading axis: ``x @ W`` with a constant W [G, I, H] (per-gate weights
stacked on a leading gate axis, the PyTorch ``x @ self.W.transpose(1, 2)`` form) plus biases
[G, 1, H], read one gate at a time with ``Gather(axis=0, scalar k)`` (``gx[k]``) or a
``Split`` on axis 0 then ``Squeeze`` of that axis (``gx.unbind(0)``).

Broadcasting puts W's leading axis first in the product ([G, B, H], or [G, H] for a vector x),
so entry k of the stack is ``x @ W[k]`` plus entry k of each stacked operand (an operand of
lower rank broadcasts: every gate reads it whole). The algebra reads entry k as that
polynomial; anything else on the way (a product of two stacks, a Transpose of the stack) is
declined with the op it stopped at.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.graph import is_op
from scanopt.passes.fuse.cuts import producer
from scanopt.passes.fuse.poly import NoMatch, Poly, add, matmul, mul, scale


def picked(alg, node: gs.Node) -> tuple[gs.Tensor, int] | None:
    """(stacked value, k) when ``node`` takes entry k of its data's leading axis as a value of one
    rank less: ``Gather(v, k, axis=0)`` with a constant scalar k, or ``Squeeze(Split(v, axis=0)[k],
    axes=[0])`` where that Split output is one entry wide; else None."""
    if is_op(node, "Gather"):
        data, rank = node.inputs[0], alg._rank(node.inputs[0])
        index = alg.const(node.inputs[1]) if len(node.inputs) > 1 else None
        if rank is None or index is None or index.ndim != 0 or int(node.attrs.get("axis", 0)) % rank != 0:
            return None
        return data, int(index)
    if is_op(node, "Squeeze"):
        axes = node.attrs.get("axes")
        if axes is None and len(node.inputs) > 1 and node.inputs[1].name:
            axes = alg.const(node.inputs[1])
        split = producer(node.inputs[0])
        if axes is None or split is None or not is_op(split, "Split"):
            return None
        data, rank = split.inputs[0], alg._rank(split.inputs[0])
        if rank is None or [int(a) % rank for a in np.asarray(axes).reshape(-1)] != [0] \
                or int(split.attrs.get("axis", 0)) % rank != 0:
            return None
        sizes = split.attrs.get("split")
        if sizes is None and len(split.inputs) > 1 and split.inputs[1].name:
            sizes = alg.const(split.inputs[1])
        index = next(i for i, t in enumerate(split.outputs) if t is node.inputs[0])
        if sizes is None:  # equal parts: one entry each exactly when the stack has one entry per output
            if _leading(alg, data) != len(split.outputs):
                return None
            return data, index
        sizes = [int(s) for s in np.asarray(sizes).reshape(-1)]
        if len(sizes) != len(split.outputs) or sizes[index] != 1:
            return None
        return data, sum(sizes[:index])
    return None


def entry(alg, tensor: gs.Tensor, k: int) -> Poly:
    """The polynomial entry k of ``tensor``'s leading axis computes, or NoMatch."""
    rank = alg._rank(tensor)
    if rank is None or rank < 2:
        raise NoMatch(f"'{tensor.name}' is read along a leading gate axis of unknown rank")
    if k < 0:
        size = _leading(alg, tensor)
        if size is None:
            raise NoMatch(f"'{tensor.name}' is read at index {k} of a leading axis of unknown size")
        k += size
    return _entry(alg, tensor, k, rank)


def _entry(alg, tensor: gs.Tensor, k: int, rank: int) -> Poly:
    own = alg._rank(tensor)
    if own is not None and own < rank:  # broadcast along the gate axis: every gate reads it whole
        return alg.value(tensor)
    value = alg.const(tensor)
    if value is not None:
        if value.ndim < rank:
            return alg.value(tensor)
        return alg._constant(tensor, value[k if value.shape[0] > 1 else 0])
    node = producer(tensor)
    if own is None or node is None or not is_op(node, node.op):
        raise NoMatch(f"'{tensor.name}' is read along a leading gate axis, but its rank or producer is unknown")
    if node.op == "Identity":
        return _entry(alg, node.inputs[0], k, rank)
    if node.op in ("Add", "Sum"):
        return add(*(_entry(alg, t, k, rank) for t in node.inputs))
    if node.op == "Sub":
        return add(_entry(alg, node.inputs[0], k, rank), scale(_entry(alg, node.inputs[1], k, rank), -1.0))
    if node.op == "Mul":
        return mul(_entry(alg, node.inputs[0], k, rank), _entry(alg, node.inputs[1], k, rank))
    if node.op == "MatMul":
        a, b = node.inputs
        w, a_rank = alg.const(b), alg._rank(a)
        if w is not None and w.dtype.kind == "f" and w.ndim == 3 and a_rank in (1, 2) and alg.const(a) is None:
            return matmul(alg.value(a), w[k if w.shape[0] > 1 else 0].astype(np.float64))
    raise NoMatch(f"'{tensor.name}' ({node.op} output) is read along a leading gate axis; fuse reads a stack of "
                  "gates only as x @ W[G, I, H] plus stacked constants")


def _leading(alg, tensor: gs.Tensor, depth: int = 0) -> int | None:
    """The size of the leading (gate) axis a stack expression gets from its constants, or None."""
    value = alg.const(tensor)
    if value is not None:
        return value.shape[0] if value.ndim else None
    node = producer(tensor)
    if node is None or depth > 16 or node.op not in ("Identity", "Add", "Sum", "Sub", "Mul", "MatMul"):
        return None
    if node.op == "MatMul":
        w = alg.const(node.inputs[1])
        return w.shape[0] if w is not None and w.ndim == 3 else None
    sizes = {_leading(alg, t, depth + 1) for t in node.inputs if alg._rank(t) == alg._rank(tensor)} - {None, 1}
    return sizes.pop() if len(sizes) == 1 else None
