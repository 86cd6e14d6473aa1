"""Loop-free forms of h_t = a_t ⊙ h_{t-1} + b_t over a whole sequence (axis 0, processing order).

- sums (a = 1): ``h0 + CumSum(B)``.
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


def cumulative_sum(e: Emitter, h0: gs.Tensor, b: gs.Tensor) -> gs.Tensor:
    """h_t = h0 + b_1 + ... + b_t for ``b`` [T, ...] (padded to the state's rank + 1)."""
    return e.op("Add", [e.unsqueeze(h0, [0]), e.op("CumSum", [b, e.const("axis", np.int64(0))])])


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
    a = _split_steps(e, a, chunk)  # [count, chunk, ...]
    b = None if b is None else _split_steps(e, b, chunk)
    a, b = _doubling(e, a, b, 1, chunk, rank + 2, one, zero)
    last_a = e.squeeze(e.slice(a, [chunk - 1], [chunk], [1]), [1])  # [count, ...]
    last_b = None if b is None else e.squeeze(e.slice(b, [chunk - 1], [chunk], [1]), [1])
    ca, cb = _doubling(e, last_a, last_b, 0, count, rank + 1, one, zero)
    h0_row = e.unsqueeze(h0, [0])
    ends = e.op("Mul", [ca, h0_row])
    if cb is not None:
        ends = e.op("Add", [ends, cb])  # the state after each chunk [count, ...state]
    final = e.squeeze(e.slice(ends, [count - 1], [count], [0]), [0])
    starts = h0_row if count == 1 else e.op("Concat", [h0_row, e.slice(ends, [0], [count - 1], [0])], axis=0)
    h = e.op("Mul", [a, e.unsqueeze(starts, [1])])
    if b is not None:
        h = e.op("Add", [h, b])
    tail = e.slice(e.op("Shape", [h]), [2], [INT64_MAX], [0])
    h = e.op("Reshape", [h, e.op("Concat", [e.ints("steps", [-1]), tail], axis=0)])
    if padding:
        h = e.slice(h, [0], [steps], [0])
    return h, final


def _pad_end(e: Emitter, x: gs.Tensor, count: int, rank: int, value: np.ndarray) -> gs.Tensor:
    pads = [0] * rank + [count] + [0] * (rank - 1)
    return e.op("Pad", [x, e.ints("pads", pads), e.const("pad_value", value)])


def _split_steps(e: Emitter, x: gs.Tensor, chunk: int) -> gs.Tensor:
    """[T, ...] -> [T / chunk, chunk, ...]."""
    tail = e.slice(e.op("Shape", [x]), [1], [INT64_MAX], [0])
    return e.op("Reshape", [x, e.op("Concat", [e.ints("chunks", [-1, chunk]), tail], axis=0)])


def _doubling(e: Emitter, a, b, axis: int, length: int, rank: int, one, zero):
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
