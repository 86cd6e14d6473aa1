"""Decayed linear attention in its matrix form: S' = γ·S + kᵀv, y = q·S' without materializing S.

The elementwise forms of :mod:`prefix_scan` would hold T matrix states [T, dk, dv]; for this
recurrence (RetNet, decayed linear attention) the chunked matmul form is the known fast one:
within a chunk of C steps y = ((Q·Kᵀ) ⊙ D)·V + (Q ⊙ γ^(i+1))·S_start with the masked decay
matrix D[i, j] = γ^(i−j) for i ≥ j (else 0), and the chunk states S_start composed across
chunks by the doubling of :mod:`prefix_scan` from U = (K ⊙ γ^(C−1−j))ᵀ·V.

Recognized: one matrix state [*batch, dk, dv] whose a is a step-invariant scalar γ (any shape
of ones) and whose b is an outer product of two per-step vectors (Einsum ``...i,...j->...ij``,
Mul or MatMul of Unsqueeze(k, -1) and Unsqueeze(v, -2)); every scan output is q·S' (Einsum
``...i,...ij->...j``, MatMul of a vector q and S', or Squeeze(MatMul(Unsqueeze(q, -2), S'), -2)).
The state may be stored transposed, [*batch, dv, dk]: S' = γ·S + vᵀk with every output S'·q
(Einsum ``...ij,...j->...i`` or MatMul of S' and a vector q); the form then runs on Sᵀ.
Powers of γ are repeated products (no log, no exp, no division).

A step never reads the future (issue 33, S2): the masked product is a Where (a Mul by the 0/1
mask made 0·inf = NaN of a later key), and the values enter the chunk products with their
non-finite entries zeroed (a masked score times a later inf is NaN too); a NaN or inf in
v_t[c] is put back as a NaN (0·x, summed causally by CumSum) in y[t:, c] and the final state's
column c, where the loop's state column is non-finite from step t on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.graph import constant_axes, identity_root
from scanopt.passes.loopfree.prefix_scan import doubling, merge_steps, split_steps
from scanopt.protos import in_default_domain


@dataclass(frozen=True)
class AttentionForm:
    keys: gs.Tensor  # k_t [*batch, dk] (body value)
    values: gs.Tensor  # v_t [*batch, dv]
    queries: tuple[gs.Tensor, ...]  # per scan output, q_t [*batch, dk]: the output is q_t · S'_t
    batch: int  # number of batch axes
    transposed: bool = False  # the state is stored [*batch, dv, dk] and read as S'·q


def find_attention(b_leaf: gs.Tensor, outputs, new_state: set[int], state_rank: int) -> AttentionForm | None:
    """The pattern of the module docstring (b given as its single leaf), else None."""
    nb = state_rank - 2
    if nb < 0:
        return None
    pair = _outer_product(b_leaf, state_rank)
    if pair is None:
        return None
    outputs = [identity_root(t) for t in outputs]
    queries = [_reads_through(y, new_state, state_rank) for y in outputs]
    if all(q is not None for q in queries):
        return AttentionForm(pair[0], pair[1], tuple(queries), nb)
    queries = [_reads_transposed(y, new_state, state_rank) for y in outputs]
    if all(q is not None for q in queries):
        return AttentionForm(pair[1], pair[0], tuple(queries), nb, transposed=True)
    return None


def _producer(t: gs.Tensor, op: str):
    node = t.inputs[0] if len(t.inputs) == 1 else None
    return node if node is not None and node.op == op and in_default_domain(node.domain) else None


def _unsqueezed(t: gs.Tensor, axis_from_end: int, rank: int):
    """The input of Unsqueeze(x, axis) producing ``t`` (of ``rank``) at ``axis`` = rank + axis_from_end."""
    node = _producer(t, "Unsqueeze")
    if node is None:
        return None
    axes = constant_axes(node)
    if axes is None or len(axes) != 1 or (axes[0] % rank) != rank + axis_from_end:
        return None
    return node.inputs[0]


def _einsum_terms(node) -> tuple[list[str], str] | None:
    equation = node.attrs.get("equation", "").replace(" ", "")
    if "->" not in equation or "." in equation:
        return None
    lhs, out = equation.split("->")
    return lhs.split(","), out


def _outer_product(t: gs.Tensor, rank: int):
    """(k, v) when ``t`` [*batch, dk, dv] is the outer product of k [*batch, dk] and v [*batch, dv]."""
    einsum = _producer(t, "Einsum")
    if einsum is not None:
        terms = _einsum_terms(einsum)
        if terms is None or len(terms[0]) != 2:
            return None
        (x, y), out = terms
        batch = out[:-2]
        if len(out) != rank or x != batch + out[-2] or y != batch + out[-1] or out[-2] == out[-1]:
            return None
        return einsum.inputs[0], einsum.inputs[1]
    for op in ("Mul", "MatMul"):
        node = _producer(t, op)
        if node is not None:
            k = _unsqueezed(node.inputs[0], -1, rank)
            v = _unsqueezed(node.inputs[1], -2, rank)
            if k is not None and v is not None:
                return k, v
    return None


def _reads_through(y: gs.Tensor, new_state: set[int], rank: int):
    """q when ``y`` [*batch, dv] is q [*batch, dk] times the new state [*batch, dk, dv]."""
    einsum = _producer(y, "Einsum")
    if einsum is not None:
        terms = _einsum_terms(einsum)
        if terms is None or len(terms[0]) != 2 or id(einsum.inputs[1]) not in new_state:
            return None
        (x, s), out = terms
        batch = s[:-2]
        if len(s) != rank or s[-1] == s[-2] or x != batch + s[-2] or out != batch + s[-1]:
            return None  # (s[-1] == s[-2]: the diagonal, not a product)
        return einsum.inputs[0]
    matmul = _producer(y, "MatMul")
    if matmul is not None and rank == 2 and id(matmul.inputs[1]) in new_state:
        return matmul.inputs[0]  # a vector q (rank checked by the caller's plan)
    squeeze = _producer(y, "Squeeze")
    if squeeze is not None:
        inner = squeeze.inputs[0]
        matmul = _producer(inner, "MatMul")
        axes = constant_axes(squeeze)
        if matmul is None or axes is None or len(axes) != 1 or axes[0] % rank != rank - 2:
            return None
        if id(matmul.inputs[1]) not in new_state:
            return None
        return _unsqueezed(matmul.inputs[0], -2, rank)
    return None


def _reads_transposed(y: gs.Tensor, new_state: set[int], rank: int):
    """q when ``y`` [*batch, dv] is the new state stored [*batch, dv, dk] times q [*batch, dk]."""
    einsum = _producer(y, "Einsum")
    if einsum is not None:
        terms = _einsum_terms(einsum)
        if terms is None or len(terms[0]) != 2 or id(einsum.inputs[0]) not in new_state:
            return None
        (s, x), out = terms
        batch = s[:-2]
        if len(s) != rank or s[-1] == s[-2] or x != batch + s[-1] or out != batch + s[-2]:
            return None
        return einsum.inputs[1]
    matmul = _producer(y, "MatMul")
    if matmul is not None and rank == 2 and id(matmul.inputs[0]) in new_state:
        return matmul.inputs[1]  # a vector q (rank checked by the caller's plan)
    return None


def emit_attention(e, gamma: gs.Tensor, keys, values, queries, s0, nb: int, steps: int, chunk: int, dtype):
    """([y per query [T, *batch, dv]], final state) of S' = γ S + kᵀv, y = q S'; ``steps``
    divisible by ``chunk``; keys/values/queries lifted [T, *batch, d]."""
    n = steps // chunk
    one, zero = np.ones([], dtype), np.zeros([], dtype)
    g = e.op("Reshape", [gamma, e.ints("scalar", [])])
    cumulative, _ = doubling(e, e.op("Expand", [g, e.ints("chunk", [chunk])]), None, 0, chunk, 1, one, zero)
    powers = e.op("Concat", [e.const("one", np.ones([1], dtype)), cumulative], axis=0)  # γ^0 .. γ^C
    i, j = np.meshgrid(np.arange(chunk), np.arange(chunk), indexing="ij")
    causal = e.const("causal", i >= j)
    decay = e.op("Where", [causal, e.op("Gather", [powers, e.ints("lag", np.maximum(i - j, 0))]),
                          e.const("zero", zero)])  # [C, C]
    key_weight = e.op("Gather", [powers, e.ints("to_end", [[chunk - 1 - c] for c in range(chunk)])])  # [C, 1]
    query_weight = e.op("Gather", [powers, e.ints("from_start", [[c + 1] for c in range(chunk)])])  # [C, 1]
    perm = list(range(2, 2 + nb)) + [0, 1, 2 + nb]  # [n, C, *b, d] -> [*b, n, C, d]
    swap = list(range(nb + 1)) + [nb + 2, nb + 1]

    def chunks(x):
        return e.op("Transpose", [split_steps(e, x, chunk)], perm=perm)

    flag = e.op("Mul", [values, e.const("zero", zero)])  # 0 where finite, NaN at a NaN or inf
    values = e.op("Where", [e.op("Equal", [flag, e.const("zero", zero)]), values, e.const("zero", zero)])
    k, v = chunks(keys), chunks(values)
    updates = e.op("MatMul", [e.op("Transpose", [e.op("Mul", [k, key_weight])], perm=swap), v])  # [*b, n, dk, dv]
    last = e.op("Gather", [powers, e.ints("chunk_index", [chunk])])
    a = e.op("Expand", [e.op("Reshape", [last, e.ints("scalar", [])]), e.ints("chunks", [1] * nb + [n, 1, 1])])
    a_cum, b_cum = doubling(e, a, updates, nb, n, nb + 3, one, zero)
    s0_row = e.unsqueeze(s0, [nb])
    ends = e.op("Add", [e.op("Mul", [a_cum, s0_row]), b_cum])  # the state after each chunk
    final = e.squeeze(e.slice(ends, [n - 1], [n], [nb]), [nb])
    final = e.op("Add", [final, e.unsqueeze(_sum_over_steps(e, flag), [nb])])  # [*b, 1, dv]
    poison = e.op("CumSum", [flag, e.const("axis", np.int64(0))])  # [T, *b, dv]: NaN from a bad value on
    starts = s0_row if n == 1 else e.op("Concat", [s0_row, e.slice(ends, [0], [n - 1], [nb])], axis=nb)
    k_t = e.op("Transpose", [k], perm=swap)
    back = [nb, nb + 1] + list(range(nb)) + [nb + 2]  # [*b, n, C, d] -> [n, C, *b, d]
    ys = []
    for q_steps in queries:
        q = chunks(q_steps)
        scores = e.op("Where", [causal, e.op("Mul", [e.op("MatMul", [q, k_t]), decay]),
                                e.const("zero", zero)])
        y = e.op("Add", [e.op("MatMul", [scores, v]), e.op("MatMul", [e.op("Mul", [q, query_weight]), starts])])
        y = e.op("Transpose", [y], perm=back)
        y = merge_steps(e, y)
        ys.append(e.op("Add", [y, poison]))
    return ys, final


def _sum_over_steps(e, x):
    if e.opset >= 13:
        return e.op("ReduceSum", [x, e.ints("axes", [0])], keepdims=0)
    return e.op("ReduceSum", [x], axes=[0], keepdims=0)
