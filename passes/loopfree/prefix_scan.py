"""Loop-free forms of h_t = a_t ⊙ h_{t-1} + b_t over a whole sequence (axis 0, processing order).

- sums (a = 1): ``h0 + CumSum(B)``; products (b = 0) at opsets that have CumProd (26+):
  ``h0 ⊙ CumProd(A)``.
- the general case (and products, b = 0): a chunked parallel scan. The padded sequence is cut
  into chunks of C steps; within each chunk a log-depth doubling (Hillis-Steele) composes the
  pairs (a, b) ∘ (a', b') = (a·a', a·b' + b) so that every position holds the product of the
  a's and the scan of the b's from the chunk start; the chunks' last pairs are composed the
  same way (a second, short doubling over T/C chunks) into each chunk's starting state, and
  h = A_chunk ⊙ h_start + B_chunk.

Numerics: only products and sums of the a's and b's, the ones the loop forms, in another
association order: no log or exp, no division (the closed form Πa·(h0 + Σ b/Πa) divides by
products that underflow and is not used). Padding steps are the identity pair (1, 0) at the
end, so they change nothing before them.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.emit import INT64_MAX, Emitter
from scanopt.rewrite import Builder, new_graph


def cumulative_sum(e: Emitter, h0: gs.Tensor, b: gs.Tensor) -> gs.Tensor:
    """h_t = h0 + b_1 + ... + b_t for ``b`` [T, ...] (padded to the state's rank + 1)."""
    return e.op("Add", [e.unsqueeze(h0, [0]), e.op("CumSum", [b, e.const("axis", np.int64(0))])])


def cumulative_product(e: Emitter, h0: gs.Tensor, a: gs.Tensor) -> tuple[gs.Tensor, gs.Tensor]:
    """(H [T, ...], final state) of h_t = a_t ⊙ h_{t-1} for ``a`` [T, ...]: one CumProd (opset
    26+; callers probe it) over [h0; a], h0 the first factor, so every product is the loop's in
    the loop's order: h0 ⊙ CumProd(a) made 0 ⊙ inf = NaN where a product of the a's overflows
    and h0 is 0 (the loop stays 0). The final state is the last row (h0 at zero steps)."""
    steps = e.op("Slice", [e.op("Shape", [a]), e.ints("start", [0]), e.ints("end", [1])])  # [T]
    full = e.op("Concat", [steps, e.op("Shape", [h0])], axis=0)
    rows = e.op("CumProd", [e.op("Concat", [e.unsqueeze(h0, [0]), e.op("Expand", [a, full])], axis=0),
                            e.const("axis", np.int64(0))])
    h = e.op("Slice", [rows, e.ints("start", [1]), e.ints("end", [INT64_MAX]), e.ints("axes", [0])])
    last = e.op("Slice", [rows, e.ints("start", [-1]), e.ints("end", [INT64_MAX]), e.ints("axes", [0])])
    return h, e.squeeze(last, [0])


def chunked_scan(e: Emitter, h0: gs.Tensor, a: gs.Tensor, b: gs.Tensor | None, rank: int, steps: int,
                 chunk: int, dtype: np.dtype) -> tuple[gs.Tensor, gs.Tensor]:
    """(H [T, ...state], final state) of h_t = a_t ⊙ h_{t-1} + b_t; ``a`` and ``b`` are [T, ...]
    of rank ``rank`` + 1 (broadcasting to the state), ``b`` None for 0; ``steps`` = T (static)."""
    chunk = max(1, min(chunk, steps))
    count = math.ceil(steps / chunk)
    padding = count * chunk - steps
    one, zero = np.ones([], dtype), np.zeros([], dtype)
    if padding:
        a = _pad_end(e, a, padding, rank + 1, one)
        b = None if b is None else _pad_end(e, b, padding, rank + 1, zero)
    a = split_steps(e, a, chunk)  # [count, chunk, ...]
    b = None if b is None else split_steps(e, b, chunk)
    a, b = doubling(e, a, b, 1, chunk, rank + 2, one, zero)
    last_a = e.squeeze(e.slice(a, [chunk - 1], [chunk], [1]), [1])  # [count, ...]
    last_b = None if b is None else e.squeeze(e.slice(b, [chunk - 1], [chunk], [1]), [1])
    ca, cb = doubling(e, last_a, last_b, 0, count, rank + 1, one, zero)
    h0_row = e.unsqueeze(h0, [0])
    ends = e.op("Mul", [ca, h0_row])
    if cb is not None:
        ends = e.op("Add", [ends, cb])  # the state after each chunk [count, ...state]
    final = e.squeeze(e.slice(ends, [count - 1], [count], [0]), [0])
    starts = h0_row if count == 1 else e.op("Concat", [h0_row, e.slice(ends, [0], [count - 1], [0])], axis=0)
    h = e.op("Mul", [a, e.unsqueeze(starts, [1])])
    if b is not None:
        h = e.op("Add", [h, b])
    h = merge_steps(e, h)
    if padding:
        h = e.slice(h, [0], [steps], [0])
    return h, final


def chunk_loop_scan(e: Emitter, h0: gs.Tensor, a: gs.Tensor, b: gs.Tensor | None, rank: int, steps: int,
                    chunk: int, dtype: np.dtype, steady_rank: int | None = None) -> tuple[gs.Tensor, gs.Tensor]:
    """Like :func:`chunked_scan`, but within chunks a loop over the C positions runs every
    chunk at once (state [T/C, ...]): C iterations instead of T, each one wide, two passes
    over the data instead of 2·log2(C) shifted copies. ``b`` None for 0.

    ``steady_rank`` given: ``a`` is the same at every step (a learned decay), of that rank and
    not stacked over steps; the loop reads it as it is and the products within a chunk are
    its powers a, a², ..., a^C, computed once on [C, ...a] instead of tracked per chunk."""
    chunk = max(1, min(chunk, steps))
    count = math.ceil(steps / chunk)
    padding = count * chunk - steps
    one, zero = np.ones([], dtype), np.zeros([], dtype)
    steady = steady_rank is not None
    if b is None:
        b = e.op("Mul", [a if not steady else e.unsqueeze(a, [0]), e.const("zero", zero)])  # products: b = 0
    if padding:
        a = a if steady else _pad_end(e, a, padding, rank + 1, one)
        b = _pad_end(e, b, padding, rank + 1, zero)
    major = [1, 0] + list(range(2, rank + 2))  # [count, chunk, ...] <-> [chunk, count, ...]
    a = a if steady else e.op("Transpose", [split_steps(e, a, chunk)], perm=major)  # [chunk, count, ...]
    b = e.op("Transpose", [split_steps(e, b, chunk)], perm=major)
    rows = e.ints("count", [count])
    state_shape = e.op("Concat", [rows, e.op("Shape", [h0])], axis=0)
    if count == 1:  # one chunk: the loop itself, from h0, on the lifted a and b
        local, = _position_scan(e, a, b, e.unsqueeze(h0, [0]), None, rank, dtype, chunk, steady)
        h = e.squeeze(local, [1])
        final = e.squeeze(e.slice(h, [steps - 1], [steps], [0]), [0])
        return (h if not padding else e.slice(h, [0], [steps], [0])), final
    zeros = e.op("ConstantOfShape", [state_shape], value=gs.Constant(e.b.names.fresh("zero"), np.zeros([1], dtype)))
    if steady:
        local, = _position_scan(e, a, b, zeros, None, rank, dtype, chunk, True)
        powers = e.op("Expand", [e.unsqueeze(a, [0]), e.ints("chunk", [chunk] + [1] * steady_rank)])
        powers, _ = doubling(e, powers, None, 0, chunk, steady_rank + 1, one, zero)  # a^(c+1) [C, ...a]
        prod = e.unsqueeze(powers, list(range(1, 2 + rank - steady_rank)))  # [C, 1, ...] of rank + 2
        last_a = e.op("Expand", [e.squeeze(e.slice(prod, [chunk - 1], [chunk], [0]), [0]),
                                 e.ints("count", [count] + [1] * rank)])
    else:
        a_shape = e.op("Shape", [a])
        ones = e.op("ConstantOfShape", [e.slice(a_shape, [1], [INT64_MAX], [0])],
                    value=gs.Constant(e.b.names.fresh("one"), np.ones([1], dtype)))
        local, prod = _position_scan(e, a, b, zeros, ones, rank, dtype, chunk, False)
        last_a = e.squeeze(e.slice(prod, [chunk - 1], [chunk], [0]), [0])  # [count, ...]
    last_b = e.squeeze(e.slice(local, [chunk - 1], [chunk], [0]), [0])
    starts, final = chunk_starts(e, last_a, last_b, h0, count, rank, dtype)
    h = e.op("Add", [e.op("Mul", [prod, e.unsqueeze(starts, [0])]), local])  # [chunk, count, ...]
    h = e.op("Transpose", [h], perm=major)
    h = merge_steps(e, h)
    if padding:
        h = e.slice(h, [0], [steps], [0])
        if steady:  # the padding steps applied the steady a: the last real step holds the final state
            final = e.squeeze(e.slice(h, [steps - 1], [steps], [0]), [0])
    return h, final


def chunk_starts(e: Emitter, last_a, last_b, h0, count: int, rank: int, dtype) -> tuple[gs.Tensor, gs.Tensor]:
    """(the state before each chunk [count, ...], the final state) from each chunk's (Π a, local
    state from zero) at its end, [count, ...] (count >= 2, static): composed by doubling."""
    ca, cb = doubling(e, last_a, last_b, 0, count, rank + 1, np.ones([], dtype), np.zeros([], dtype))
    h0_row = e.unsqueeze(h0, [0])
    ends = e.op("Add", [e.op("Mul", [ca, h0_row]), cb])  # the state after each chunk
    final = e.squeeze(e.slice(ends, [count - 1], [count], [0]), [0])
    return e.op("Concat", [h0_row, e.slice(ends, [0], [count - 1], [0])], axis=0), final


def _position_scan(e: Emitter, a, b, start, ones, rank: int, dtype, chunk: int, steady: bool):
    """A Loop over the positions (axis 0) of a, b [chunk, count, ...]: h = a ⊙ h + b from
    ``start`` and, when ``ones`` is given, the running product of the a's; both stacked
    [chunk, count, ...] (``steady``: ``a`` is one value for every step, read as it is). A Loop,
    not a Scan: the passes rewrite Scans, and this loop is the chosen form."""
    _, stacked = carry_loop(e, a, b, start, ones, rank + 1, dtype, e.const("positions", np.int64(chunk)), steady)
    return stacked


def carry_loop(e: Emitter, a, b, start, ones, width: int, dtype, length, steady: bool, before: bool = False):
    """(final states, stacked states) of a Loop of ``length`` iterations over axis 0 of a and b:
    h = a ⊙ h + b (and p = a ⊙ p when ``ones`` is given); stacked after each update, or the
    state before it when ``before``."""
    body = new_graph(e.b.names.fresh("chunk_positions"))
    inner = Emitter(Builder(body, e.b.names), e.opset)
    step = gs.Variable(e.b.names.fresh("position"), dtype=np.int64, shape=[])
    cond = gs.Variable(e.b.names.fresh("cond"), dtype=np.bool_, shape=[])
    h_in = gs.Variable(e.b.names.fresh("h"), dtype=dtype, shape=[None] * width)
    p_in = gs.Variable(e.b.names.fresh("p"), dtype=dtype, shape=[None] * width) if ones is not None else None
    a_t = a if steady else inner.op("Gather", [a, step], axis=0)
    b_t = inner.op("Gather", [b, step], axis=0)
    h_out = inner.op("Add", [inner.op("Mul", [a_t, h_in]), b_t], dtype=dtype, shape=[None] * width)
    outs = [h_out]
    if p_in is not None:
        outs.append(inner.op("Mul", [a_t, p_in], dtype=dtype, shape=[None] * width))
    kept = [h_in] if before else outs
    copies = [inner.op("Identity", [t], dtype=dtype, shape=[None] * width) for t in kept]
    cond_out = inner.op("Identity", [cond], dtype=np.bool_, shape=[])
    body.inputs = [step, cond, h_in] + ([p_in] if p_in is not None else [])
    body.outputs = [cond_out] + outs + copies
    states = [start] + ([ones] if ones is not None else [])
    results = e.op("Loop", [length, gs.Variable.empty()] + states, n_outputs=len(states) + len(copies), body=body)
    results = results if isinstance(results, list) else [results]
    return results[:len(states)], results[len(states):]


def chunk_loop_scan_symbolic(e: Emitter, h0: gs.Tensor, a: gs.Tensor, b: gs.Tensor | None, rank: int, chunk: int,
                             dtype: np.dtype, steady_rank: int | None = None) -> tuple[gs.Tensor, gs.Tensor]:
    """:func:`chunk_loop_scan` for a length known only at run time: padding and the chunk count
    are computed, and the state is carried across chunks by a Loop over them (the doubling
    across chunks needs their count). Zero steps give h0."""
    one, zero = np.ones([], dtype), np.zeros([], dtype)
    steady = steady_rank is not None
    if b is None:
        b = e.op("Mul", [a if not steady else e.unsqueeze(a, [0]), e.const("zero", zero)])
    steps = e.slice(e.op("Shape", [b]), [0], [1], [0])  # int64 [1]
    size = e.ints("chunk", [chunk])
    padding = e.op("Mod", [e.op("Sub", [size, e.op("Mod", [steps, size])]), size])
    pads = e.op("Concat", [e.ints("before", [0] * (rank + 1)), padding, e.ints("after", [0] * rank)], axis=0)
    major = [1, 0] + list(range(2, rank + 2))
    if not steady:
        a = e.op("Transpose", [split_steps(e, e.op("Pad", [a, pads, e.const("one", one)]), chunk)], perm=major)
    b = e.op("Transpose", [split_steps(e, e.op("Pad", [b, pads, e.const("zero", zero)]), chunk)], perm=major)
    count = e.slice(e.op("Shape", [b]), [1], [2], [0])  # int64 [1]
    zeros = e.op("ConstantOfShape", [e.op("Concat", [count, e.op("Shape", [h0])], axis=0)],
                 value=gs.Constant(e.b.names.fresh("zero"), np.zeros([1], dtype)))
    if steady:
        local, = _position_scan(e, a, b, zeros, None, rank, dtype, chunk, True)
        powers = e.op("Expand", [e.unsqueeze(a, [0]), e.ints("chunk", [chunk] + [1] * steady_rank)])
        powers, _ = doubling(e, powers, None, 0, chunk, steady_rank + 1, one, zero)
        prod = e.unsqueeze(powers, list(range(1, 2 + rank - steady_rank)))  # [C, 1, ...] of rank + 2
        last_a = e.op("Expand", [e.squeeze(e.slice(prod, [chunk - 1], [chunk], [0]), [0]),
                                 e.op("Concat", [count, e.ints("ones", [1] * rank)], axis=0)])
    else:
        ones = e.op("ConstantOfShape", [e.slice(e.op("Shape", [a]), [1], [INT64_MAX], [0])],
                    value=gs.Constant(e.b.names.fresh("one"), np.ones([1], dtype)))
        local, prod = _position_scan(e, a, b, zeros, ones, rank, dtype, chunk, False)
        last_a = e.squeeze(e.slice(prod, [chunk - 1], [chunk], [0]), [0])  # [count, ...]
    last_b = e.squeeze(e.slice(local, [chunk - 1], [chunk], [0]), [0])
    trips = e.op("Reshape", [count, e.ints("scalar", [])])
    _, (starts,) = carry_loop(e, last_a, last_b, h0, None, rank, dtype, trips, False, before=True)
    # [count, ...state]: onnxruntime gives a zero-iteration Loop's stacked output shape [0]
    starts = reshape(e, starts, e.op("Concat", [count, e.op("Shape", [h0])], axis=0))
    h = e.op("Add", [e.op("Mul", [prod, e.unsqueeze(starts, [0])]), local])  # [chunk, count, ...]
    h = e.op("Transpose", [h], perm=major)
    h = merge_steps(e, h)
    h = e.op("Slice", [h, e.ints("zero", [0]), steps, e.ints("axes", [0])])
    # the last real step, or h0 when there is none
    last = e.op("Concat", [e.unsqueeze(h0, [0]), e.slice(h, [-1], [INT64_MAX], [0])], axis=0)
    return h, e.squeeze(e.slice(last, [-1], [INT64_MAX], [0]), [0])


def _pad_end(e: Emitter, x: gs.Tensor, count: int, rank: int, value: np.ndarray) -> gs.Tensor:
    pads = [0] * rank + [count] + [0] * (rank - 1)
    return e.op("Pad", [x, e.ints("pads", pads), e.const("pad_value", value)])


def split_steps(e: Emitter, x: gs.Tensor, chunk: int) -> gs.Tensor:
    """[T, ...] -> [T / chunk, chunk, ...]."""
    shape = e.op("Shape", [x])
    tail = e.slice(shape, [1], [INT64_MAX], [0])
    if e.opset < 14:
        return e.op("Reshape", [x, e.op("Concat", [e.ints("chunks", [-1, chunk]), tail], axis=0)])
    count = e.op("Div", [e.slice(shape, [0], [1], [0]), e.ints("chunk", [chunk])])
    return reshape(e, x, e.op("Concat", [count, e.ints("chunk", [chunk]), tail], axis=0))


def merge_steps(e: Emitter, x: gs.Tensor) -> gs.Tensor:
    """[K, C, ...] -> [K·C, ...]."""
    shape = e.op("Shape", [x])
    tail = e.slice(shape, [2], [INT64_MAX], [0])
    if e.opset < 14:
        return e.op("Reshape", [x, e.op("Concat", [e.ints("steps", [-1]), tail], axis=0)])
    steps = e.op("ReduceProd", [e.slice(shape, [0], [2], [0])], keepdims=1)
    return reshape(e, x, e.op("Concat", [steps, tail], axis=0))


def reshape(e: Emitter, x: gs.Tensor, shape: gs.Tensor) -> gs.Tensor:
    """Reshape to ``shape`` (no -1) taking a 0 in it as a 0 (opset 14+: allowzero), not as
    "the input's dim here": an empty batch keeps its shape (issue 33, S5). Before opset 14 a
    0 copies the input's dim, which is right only where the dims line up."""
    if e.opset < 14:
        return e.op("Reshape", [x, shape])
    return e.op("Reshape", [x, shape], allowzero=1)


def doubling(e: Emitter, a, b, axis: int, length: int, rank: int, one, zero):
    """Inclusive scan of the pairs along ``axis`` (static ``length``): after it, position i
    holds the composition of positions 0..i. log2(length) rounds of shift-and-compose."""
    shift = 1
    while shift < length:
        a_prev = _shifted(e, a, axis, shift, length, rank, one)
        if b is not None:
            b_prev = _shifted(e, b, axis, shift, length, rank, zero)
            b = e.op("Add", [e.op("Mul", [a, b_prev]), b])
        a = e.op("Mul", [a, a_prev])
        shift *= 2
    return a, b


def _shifted(e: Emitter, x, axis: int, shift: int, length: int, rank: int, value) -> gs.Tensor:
    """``x`` moved ``shift`` positions later along ``axis``, the identity element in front."""
    kept = e.slice(x, [0], [length - shift], [axis])
    pads = [0] * (2 * rank)
    pads[axis] = shift
    return e.op("Pad", [kept, e.ints("pads", pads), e.const("pad_value", value)])
