"""Three products a selective scan's body writes as broadcast Muls, emitted with MatMuls.

onnxruntime's Mul is slow when an operand broadcasts along the innermost axis (one op over 1M
floats, one thread: the outer product [T, D, 1]·[T, 1, N] 0.81 ms; as a MatMul with K = 1,
0.23 ms), and a Mul then a ReduceSum over the last axis reads the product twice. So, for the
lifted plan steps of linrec's two-pass form:

- outer product: ``Mul(Unsqueeze(u, last), Unsqueeze(v, second to last))`` of equal per-step
  rank is ``MatMul`` of the same operands: x [..., M, 1] @ y [..., 1, N], one product per element
  (K = 1), so the values are the Mul's exactly; batch axes broadcast alike in both.
- contraction: ``ReduceSum(Mul(p, q), last axis)`` with q = Unsqueeze(..., second to last) of
  shape [..., 1, N], p [..., M, N] (N static and equal on both sides, proven from the shapes the
  caller knows), the Mul read by nothing else, is ``MatMul(p, qᵀ)`` [..., M, 1] (squeezed
  without keepdims): the same sum in another order (float rounding only).
- any other Mul with a per-step operand unsqueezed on its last axis, x [..., M, 1] (Δ ⊗ A):
  x is first repeated to the other operand's last dim N as x @ ones [1, N] (exact: x·1), so the
  Mul no longer broadcasts innermost ([T, D, 1]·[D, N]: 0.72 ms; 0.08 + 0.17 ms so).
- a two-operand Einsum that is a batched matrix-vector or matrix-matrix product (mamba-minimal's
  ``bdn,bn->bd``): one MatMul (module :mod:`einsum_products`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.emit import INT64_MAX
from scanopt.passes.loopfree.einsum_products import einsum_matmul, emit_matmul
from scanopt.graph import constant_value
from scanopt.protos import in_default_domain


@dataclass
class Fused:
    """A plan step standing for two body nodes (Mul then ReduceSum): what emit_nodes reads."""

    op: str
    inputs: list
    outputs: list


def as_matmuls(steps, rank_of, last_dim_of, keep: set[int], dtype) -> list:
    """``steps`` with the products above emitted as MatMuls. ``rank_of(t)``: a body value's
    per-step rank and whether it is per step; ``last_dim_of(t)``: its last dim if static, else
    None; ``keep``: id() of values read outside ``steps`` (not fused away); ``dtype``: the
    state's (float32 or float64), that of the products."""
    out = []
    dropped: set[int] = set()
    producer = {id(t): (k, node) for k, (node, _) in enumerate(steps) for t in node.outputs}
    for node, emit in steps:
        if _is(node, "Mul") and _outer(node, rank_of) is not None:
            swap = _outer(node, rank_of)
            out.append((node, lambda e, ins, swap=swap: [e.op("MatMul", ins[::-1] if swap else ins)]))
            continue
        found = einsum_matmul(node, lambda t, axis: _dim_of(t, axis, last_dim_of),
                              lambda t: rank_of(t)[0]) if _is(node, "Einsum") else None
        if found is not None:
            ranks = [_lifted_rank(t, rank_of) for t in node.inputs]
            out.append((node, lambda e, ins, found=found, ranks=ranks: emit_matmul(e, ins, *found, ranks)))
            continue
        widened = _widened(node, rank_of)
        if widened is not None:
            width = last_dim_of(node.inputs[1 - widened])
            out.append((node, lambda e, ins, k=widened, width=width:
                        [e.op("Mul", [_widen(e, ins[k], ins[1 - k], dtype, width), ins[1 - k]])]))
            continue
        fused = _contraction(node, producer, rank_of, last_dim_of, keep)
        if fused is not None:
            mul, p, q, keepdims = fused
            dropped.add(id(mul))
            out.append((Fused("MatMul", [p, q], list(node.outputs)),
                        lambda e, ins, keepdims=keepdims, n=last_dim_of(q), r=_lifted_rank(q, rank_of):
                        _read(e, ins, keepdims, n, r)))
            continue
        out.append((node, emit))
    return [(node, emit) for node, emit in out if id(node) not in dropped]


def _lifted_rank(t: gs.Tensor, rank_of) -> int | None:
    """t's rank as emitted: a per-step value's with the step axis (a Loop's chunk axis) in front."""
    rank, per_step = rank_of(t)
    return None if rank is None else rank + (1 if per_step else 0)


def _dim_of(t: gs.Tensor, axis: int, last_dim_of) -> int | None:
    """t's static length on a negative ``axis``: the caller's for the last, t's declared shape
    for the others (None when not known)."""
    if axis == -1:
        return last_dim_of(t)
    shape = t.shape
    dim = shape[axis] if shape is not None and len(shape) >= -axis else None
    return int(dim) if isinstance(dim, (int, np.integer)) else None


def _read(e, ins, keepdims: bool, n: int | None, rank: int) -> list[gs.Tensor]:
    """p @ qᵀ; q [..., 1, N] turned [..., N, 1] by a Reshape (the axis moved is 1 long): as a
    Transpose onnxruntime fuses it into a FusedMatMul that runs this matrix-vector product at
    about half the speed (32 × [64, 16]·[16]: 22.5 against 13.4 µs). The target is a constant
    [0, ..., 0, N, 1] (0: the dim kept) where N is static: inside the two-pass Loops the
    run-time Shape, Slices and Concat were five more nodes per position."""
    p, q = ins
    if n is not None:
        product = e.op("MatMul", [p, e.op("Reshape", [q, e.ints("column", [0] * (rank - 2) + [n, 1])])])
        return [product if keepdims else e.squeeze(product, [-1])]
    shape = e.op("Shape", [q])
    column = e.op("Concat", [e.slice(shape, [0], [-2], [0]), e.slice(shape, [-1], [INT64_MAX], [0]),
                             e.ints("one", [1])], axis=0)
    product = e.op("MatMul", [p, e.op("Reshape", [q, column])])
    return [product if keepdims else e.squeeze(product, [-1])]


def _widen(e, x: gs.Tensor, other: gs.Tensor, dtype, n: int | None) -> gs.Tensor:
    """x [..., M, 1] repeated to [..., M, N], N the last dim of ``other``: x @ ones [1, N] (a
    constant where N is static; else made from ``other``'s shape at run time)."""
    if n is not None:
        return e.op("MatMul", [x, e.const("ones", np.ones([1, n], dtype))])
    width = e.slice(e.op("Shape", [other]), [-1], [INT64_MAX], [0])
    ones = e.op("ConstantOfShape", [e.op("Concat", [e.ints("one", [1]), width], axis=0)],
                value=gs.Constant(e.b.names.fresh("one"), np.ones([1], dtype)))
    return e.op("MatMul", [x, ones])


def _widened(node, rank_of) -> int | None:
    """For Mul(x, y) with one operand per step and unsqueezed on its last axis (x [..., M, 1]),
    the other of rank >= 1: that operand's index, else None."""
    if not _is(node, "Mul") or len(node.inputs) != 2:
        return None
    for k, t in enumerate(node.inputs):
        rank, per_step = rank_of(t)
        other = rank_of(node.inputs[1 - k])[0]
        if per_step and rank is not None and rank >= 2 and other and rank - 1 in unsqueezed_axes(t, rank):
            return k
    return None


def _is(node, op: str) -> bool:
    return isinstance(node, gs.Node) and node.op == op and in_default_domain(node.domain)


def _outer(node: gs.Node, rank_of) -> bool | None:
    """For Mul(x, y): False when x @ y computes it, True when y @ x does, else None."""
    x, y = node.inputs
    (rx, sx), (ry, sy) = rank_of(x), rank_of(y)
    if rx is None or rx != ry or rx < 2 or not (sx and sy):
        return None
    if rx - 1 in unsqueezed_axes(x, rx) and rx - 2 in unsqueezed_axes(y, ry):
        return False
    if rx - 2 in unsqueezed_axes(x, rx) and rx - 1 in unsqueezed_axes(y, ry):
        return True
    return None


def _contraction(node, producer, rank_of, last_dim_of, keep):
    """(the Mul, p, q, keepdims) when ``node`` is such a ReduceSum, else None."""
    if not _is(node, "ReduceSum") or not node.inputs or id(node.inputs[0]) not in producer:
        return None
    summed = node.inputs[0]
    _, mul = producer[id(summed)]
    rank, per_step = rank_of(summed)
    if not _is(mul, "Mul") or rank is None or rank < 2 or id(summed) in keep or len(summed.outputs) != 1:
        return None
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1].name:
        value = constant_value(node.inputs[1])
        axes = None if value is None else [int(a) for a in value.reshape(-1)]
    if axes is None or [a % rank for a in axes] != [rank - 1]:
        return None
    for p, q in (mul.inputs, mul.inputs[::-1]):
        n_p, n_q = last_dim_of(p), last_dim_of(q)
        if (rank_of(p)[0] == rank_of(q)[0] == rank and rank - 2 in unsqueezed_axes(q, rank)
                and rank - 1 not in unsqueezed_axes(q, rank) and n_p is not None and n_p == n_q):
            return mul, p, q, bool(node.attrs.get("keepdims", 1))
    return None


def unsqueezed_axes(t: gs.Tensor, rank: int) -> set[int]:
    """The axes (counted on ``t``'s per-step rank) an Unsqueeze producing ``t`` inserted."""
    node = t.inputs[0] if len(t.inputs) == 1 else None
    if not _is(node, "Unsqueeze"):
        return set()
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1:
        value = constant_value(node.inputs[1])
        axes = None if value is None else [int(a) for a in value.reshape(-1)]
    return set() if axes is None else {a % rank for a in axes}
