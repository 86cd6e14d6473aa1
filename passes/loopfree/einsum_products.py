"""Two-operand Einsums that are a batched matrix-vector or matrix-matrix product, as one MatMul.

onnxruntime runs Einsum through a general contraction (operand transposes, a batched GEMM and
the result's reshape) at a fixed cost per call: mamba-minimal's ``einsum("bdn,bn->bd", h, C_t)``
measured ~16 µs per call on [32, 1, 64] results inside linrec's two-pass Loops, the MatMul ~11
µs (its column reshaped once before the Loops): mamba-minimal's Scan alone, T = 1024, D = 64,
N = 16, 1.08-1.17x faster so (benchmarks/bench_linrec.py; README, the loop-free family). linrec's
one-pass forms (narrow states, one Einsum call over all steps) measured no difference (0.98-1.01x)
and keep it.

Proven from the equation alone (:func:`matmul_form`): explicit (``->``), two operands, no
ellipsis, no letter repeated within a term; the batch letters (in both operands and the
result) lead all three terms in the same order; after them one operand x ends with the one
contracted letter k, the other y starts with it, each keeps at most one free letter (x's row
m, y's column n, at least one of them), and the result is batch + m + n. Then x [..., (m), k]
@ y [..., k, (n)] is the Einsum's sum over k in another order (float rounding only): a vector
operand is made a row [..., 1, k] or a column [..., k, 1] and the axis squeezed off the product. The batch axes broadcast alike in both ops (size 1 against n; an operand without the
leading step axis of a lifted plan broadcasts over it as the lifted Einsum does), but Einsum
also broadcasts a contracted axis of size 1 and MatMul does not: k's length must be known and
equal on both sides. Everything else, dot products such as ``bdn,bdn->bd`` included (as many
1 x 1 GEMMs as there are rows), is left an Einsum.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from scanopt.shapes import einsum_terms


@dataclass(frozen=True)
class MatMulForm:
    """How x @ y computes the Einsum: ``swap`` when x is its second operand; ``row`` / ``column``
    when x / y is a vector (no free letter) to make a row / column; ``k_axis``: k's axis in each term of
    (first operand, second operand), counted from the end; ``ranks``: the terms' lengths."""

    swap: bool
    row: bool
    column: bool
    k_axis: tuple[int, int]
    ranks: tuple[int, int]


def matmul_form(equation: str) -> MatMulForm | None:
    """The MatMul computing ``equation``, or None when none is proven (see the module)."""
    parsed = einsum_terms(equation)
    if parsed is None:
        return None
    terms, result = parsed
    if len(terms) != 2 or not all(_letters(t) for t in terms) or not _letters(result):
        return None
    first, second = terms
    batch = [c for c in result if c in first and c in second]
    nb = len(batch)
    if not (first[:nb] == second[:nb] == result[:nb] == "".join(batch)):
        return None
    for x, y, swap in ((first, second, False), (second, first, True)):
        xr, yr, rest = x[nb:], y[nb:], result[nb:]
        if not xr or not yr or xr[-1] != yr[0]:
            continue
        row_letters, column_letters = xr[:-1], yr[1:]
        if len(row_letters) > 1 or len(column_letters) > 1 or rest != row_letters + column_letters or not rest:
            continue
        k_in_y = -1 if not column_letters else -2
        return MatMulForm(swap, not row_letters, not column_letters, (k_in_y, -1) if swap else (-1, k_in_y),
                          (len(first), len(second)))
    return None


def _letters(term: str) -> bool:
    """A term of distinct ASCII letters (the result may be empty: a scalar)."""
    return all(c.isascii() and c.isalpha() for c in term) and len(set(term)) == len(term)


def einsum_matmul(node: gs.Node, dim_of, rank_of) -> tuple[MatMulForm, int] | None:
    """(the form, k's length) for an Einsum node whose contracted length is proven equal on both
    operands (``dim_of(t, axis)``: t's static length on that negative axis, else None) and whose
    operands' ranks, where known (``rank_of(t)``: the rank or None), are their terms', else None."""
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        return None
    form = matmul_form(node.attrs.get("equation", ""))
    if form is None or any(rank_of(t) not in (None, r) for t, r in zip(node.inputs, form.ranks)):
        return None
    lengths = [dim_of(t, axis) for t, axis in zip(node.inputs, form.k_axis)]
    if lengths[0] is None or lengths[0] != lengths[1]:
        return None
    return form, lengths[0]


def emit_matmul(e, ins: list[gs.Tensor], form: MatMulForm, k: int, ranks: list[int | None]) -> list[gs.Tensor]:
    """x @ y, a vector operand made a row [..., 1, k] or a column [..., k, 1] and that axis
    squeezed off the product. ``ranks``: each operand's rank as emitted (a per-step one's with
    the step axis), None if unknown. Where known, the vector is reshaped to a constant target
    (0: the dim kept): in linrec's two-pass Loops a constant Reshape of a gathered row is done
    once on the whole input before the Loop (two_pass._hoist_reshapes), one node fewer per
    position; else it is unsqueezed."""
    x, y = ins[::-1] if form.swap else ins
    x_rank, y_rank = ranks[::-1] if form.swap else ranks
    if form.row:
        x = _as_matrix(e, x, x_rank, [1, k], -2)
    if form.column:
        y = _as_matrix(e, y, y_rank, [k, 1], -1)
    product = e.op("MatMul", [x, y])
    if form.column:
        return [e.squeeze(product, [-1])]
    if form.row:
        return [e.squeeze(product, [-2])]
    return [product]


def _as_matrix(e, vector: gs.Tensor, rank: int | None, tail: list[int], axis: int) -> gs.Tensor:
    """``vector`` [..., k] as [..., 1, k] or [..., k, 1] (``tail``; ``axis``: the new one)."""
    if rank is None:
        return e.unsqueeze(vector, [axis])
    return e.op("Reshape", [vector, e.ints("matrix", [0] * (rank - 1) + tail)])


@dataclass(frozen=True)
class ProductTerm:
    """One operand of an Einsum that sums nothing, laid out for a broadcasting Mul: transposed by
    ``perm`` (None: as it is) into the result's letter order, then unsqueezed at ``axes``."""

    perm: tuple[int, ...] | None
    axes: tuple[int, ...]


def product_terms(equation: str) -> list[list[tuple[int, ProductTerm]]] | None:
    """An Einsum that sums no letter (every operand letter is in the result: an outer or
    elementwise product, Mamba's ``bd,dn->bdn`` and ``bd,bn,bd->bdn``) as broadcasting Muls:
    groups of (operand index, its layout), the operands of one group sharing their letters
    (multiplied first, elementwise, on the smaller tensors), the groups then multiplied in
    order. Each operand is unsqueezed at every result letter it lacks, so all have the result's
    rank (a lifted per-step operand then broadcasts against the others with its step axis in
    front): a per-step ``bd`` against ``bn`` becomes [b, d, 1]·[b, 1, n], the outer product
    linrec's two-pass form emits as a K = 1 MatMul, and ``bd`` against ``dn`` [b, d, 1]·[1, d, n],
    a widening (module products). None when the
    equation is implicit, has an ellipsis, repeats a letter in a term, sums one, or the result
    is not every operand letter once. The values are the Einsum's exactly: one product per
    element, no sum."""
    parsed = einsum_terms(equation)
    if parsed is None:
        return None
    terms, result = parsed
    if not all(_letters(t) and t for t in terms) or not _letters(result):
        return None
    if set(result) != set("".join(terms)):
        return None
    groups: dict[frozenset, list[tuple[int, ProductTerm]]] = {}
    for k, term in enumerate(terms):
        ordered = sorted(term, key=result.index)
        perm = None if ordered == list(term) else tuple(term.index(c) for c in ordered)
        axes = tuple(a for a in range(len(result)) if result[a] not in term)
        groups.setdefault(frozenset(term), []).append((k, ProductTerm(perm, axes)))
    return list(groups.values())
