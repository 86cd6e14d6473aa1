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

A length known only at run time: the steps are read by position [C, K, ...] with one Gather
(the last chunk's tail repeats step T - 1, whose states no output reads), the chunk starts
carried by a Scan over the K chunk ends, and the states read back in step order by one more
Gather (:func:`by_position`, :class:`ByPosition`); a decay the same at every step takes two
passes, the second the loop's own steps from each chunk's start
(:func:`steady_two_pass_symbolic`).
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
                             dtype: np.dtype) -> "ByPosition":
    """:func:`chunk_loop_scan` for a length known only at run time and ``a`` [T, ...] stacked
    over steps (``b`` None for 0): the steps by position [C, K, ...] (one Gather each of a and
    b, :func:`by_position`), a Scan over the C positions (every chunk at once: the local state
    from zero and Π a), the chunk starts (:func:`chunk_starts_symbolic`) and h = Π a ⊙ start +
    local by position, which the caller reads back in step order (:meth:`ByPosition.assemble`)
    and checks at every step (a running product within a chunk may overflow where the loop's
    state does not). Zero steps give h0."""
    if b is None:
        b = e.op("Mul", [a, e.const("zero", np.zeros([], dtype))])
    index, steps, count = by_position(e, b, chunk)
    a = e.op("Gather", [a, index], axis=0)  # [C, K, ...]
    b = e.op("Gather", [b, index], axis=0)
    zeros = e.op("ConstantOfShape", [e.op("Concat", [count, e.op("Shape", [h0])], axis=0)],
                 value=gs.Constant(e.b.names.fresh("zero"), np.zeros([1], dtype)))
    ones = e.op("ConstantOfShape", [e.slice(e.op("Shape", [a]), [1], [INT64_MAX], [0])],
                value=gs.Constant(e.b.names.fresh("one"), np.ones([1], dtype)))
    _, (local, prod) = state_scan(e, zeros, b, a, rank + 1, dtype, scanned=True, ones=ones)
    last_a = e.squeeze(e.slice(prod, [-1], [INT64_MAX], [0]), [0])  # [K, ...]
    last_b = e.squeeze(e.slice(local, [-1], [INT64_MAX], [0]), [0])
    starts = chunk_starts_symbolic(e, h0, last_a, last_b, count, rank, dtype, scanned=True)
    stacked = e.op("Add", [e.op("Mul", [prod, e.unsqueeze(starts, [0])]), local])  # [C, K, ...]
    return ByPosition(stacked, None, steps, count, chunk, h0)


def steady_two_pass_symbolic(e: Emitter, h0: gs.Tensor, a: gs.Tensor, b: gs.Tensor, rank: int, chunk: int,
                             dtype: np.dtype, steady_rank: int) -> "ByPosition":
    """h_t = a ⊙ h_{t-1} + b_t for a length known only at run time and ``a`` the same at every
    step (a learned decay, of rank ``steady_rank``, not stacked; ``b`` [T, ...] of rank
    ``rank`` + 1), in two passes over the chunks, with no padding copy and no transpose:

    - the steps by position, [C, K, ...]: one Gather of b's rows (:func:`by_position`);
    - each chunk's state at its end from zero, Σ_c a^(C-1-c) ⊙ b_c: one Mul and one ReduceSum
      (the weights a^(C-1-c) and A = a^C by doubling on [C, ...a], once per run);
    - the chunk starts s_{k+1} = A ⊙ s_k + end_k, s_0 = h0 (:func:`chunk_starts_symbolic`);
    - the states: a Scan over the C positions, every chunk at once, h = a ⊙ h + b from the
      starts: the loop's own steps from each chunk's start.

    A state of the second pass that is ±inf or NaN stays so to its chunk's end (a·inf + b is
    ±inf or NaN, NaN stays NaN), so ``ends`` (each chunk's last state) is finite exactly when
    every state is, the chunk starts included: the one check the form needs, on K rows."""
    one, zero = np.ones([], dtype), np.zeros([], dtype)
    index, steps, count = by_position(e, b, chunk)
    steps_by_position = e.op("Gather", [b, index], axis=0)  # [C, K, ...]
    powers = e.op("Expand", [e.unsqueeze(a, [0]), e.ints("chunk", [chunk] + [1] * steady_rank)])
    powers, _ = doubling(e, powers, None, 0, chunk, steady_rank + 1, one, zero)  # a^(c+1) [C, ...a]
    decay = e.squeeze(e.slice(powers, [chunk - 1], [chunk], [0]), [0])  # a^C
    ones = e.unsqueeze(e.op("Expand", [e.const("one", one), e.op("Shape", [a])]), [0])
    if chunk == 1:
        weights = ones
    else:  # a^(C-1-c): a^(C-1), ..., a, 1
        earlier = e.op("Slice", [powers, e.ints("start", [chunk - 2]), e.ints("end", [-chunk - 1]), e.ints("axes", [0]),
                                 e.ints("steps", [-1])])
        weights = e.op("Concat", [earlier, ones], axis=0)
    weights = e.unsqueeze(weights, list(range(1, 2 + rank - steady_rank)))  # [C, 1, ...] of rank + 2
    # not expanded to [C, K, ...] first, though onnxruntime's Mul is faster on equal shapes
    # (42 us against 55 us alone): interleaved with the loop, the extra buffer made the form
    # 2-4% slower (EMA H=128, T = 1024-2048)
    weighted = e.op("Mul", [steps_by_position, weights])
    local = e.op("ReduceSum", [weighted, e.ints("axes", [0])], keepdims=0) if e.opset >= 13 else \
        e.op("ReduceSum", [weighted], axes=[0], keepdims=0)  # [K, ...]: each chunk's end from zero
    # the decays at the states' shapes (h0's, [K, ...] by position), once: the Scans' Mul then
    # multiplies equal shapes (the positions Scan, EMA H=128 T=1024: 0.11 ms against 0.17 ms)
    decay = e.op("Expand", [decay, e.op("Shape", [h0])])
    starts = chunk_starts_symbolic(e, h0, decay, local, count, rank, dtype, scanned=False)
    a = e.op("Expand", [a, e.op("Shape", [starts])])
    (ends,), (stacked,) = state_scan(e, starts, steps_by_position, a, rank + 1, dtype)
    return ByPosition(stacked, ends, steps, count, chunk, h0)


def by_position(e: Emitter, x: gs.Tensor, chunk: int) -> tuple[gs.Tensor, gs.Tensor, gs.Tensor]:
    """(index [C, K], T, K (int64 [1] each)) to read the rows of ``x`` [T, ...] by position:
    position c of chunk k reads step k·C + c, K = ceil(T / C); the last chunk's positions past
    T - 1 read row T - 1 (their states reach no output: the states are read back up to step
    T - 1, and the last chunk's end starts no chunk). One Gather with it replaces a Pad, a
    Reshape and a Transpose."""
    steps = e.slice(e.op("Shape", [x]), [0], [1], [0])  # int64 [1]
    size = e.const("chunk", np.int64(chunk))
    count = e.op("Div", [e.op("Add", [steps, e.ints("chunk_less_one", [chunk - 1])]), e.ints("chunk", [chunk])])
    firsts = e.op("Range", [e.const("zero", np.int64(0)), e.op("Mul", [_scalar(e, count), size]), size])  # [K]: k·C
    index = e.op("Add", [e.const("positions", np.arange(chunk, dtype=np.int64)[:, None]), e.unsqueeze(firsts, [0])])
    last = e.op("Sub", [_scalar(e, steps), e.const("one", np.int64(1))])
    return e.op("Where", [e.op("Less", [index, _scalar(e, steps)]), index, last]), steps, count


def chunk_starts_symbolic(e: Emitter, h0, decays, ends, count, rank: int, dtype, scanned: bool) -> gs.Tensor:
    """The state before each chunk [K, ...state]: s_{k+1} = decay_k ⊙ s_k + end_k from h0, by a
    Scan over the K chunks; ``ends`` [K, ...] each chunk's state at its end from zero,
    ``decays`` [K, ...] its Π a where ``scanned``, else one value for every chunk. The Scan
    gets one row more (a zero end, a decay of 1) so that it runs at least once: onnxruntime
    refuses a zero-step Scan."""
    def one_more(x, value):
        tail = e.slice(e.op("Shape", [x]), [1], [INT64_MAX], [0])
        row = e.op("ConstantOfShape", [e.op("Concat", [e.ints("one", [1]), tail], axis=0)],
                   value=gs.Constant(e.b.names.fresh("fill"), np.full([1], value, dtype)))
        return e.op("Concat", [x, row], axis=0)

    _, (starts,) = state_scan(e, h0, one_more(ends, 0), one_more(decays, 1) if scanned else decays, rank, dtype,
                              scanned=scanned, before=True)
    return e.op("Slice", [starts, e.ints("zero", [0]), count, e.ints("axes", [0])])


class ByPosition:
    """A symbolic-length form's states by position, ``stacked`` [C, K, ...state] (position c of
    chunk k: step k·C + c; the last chunk's positions past T - 1 hold values no output reads),
    and how to read them back as [T, ...state] (:meth:`assemble`); ``ends`` [K, ...state],
    where the form's check reads them (None: the check reads every step)."""

    def __init__(self, stacked, ends, steps, count, chunk: int, h0):
        self.stacked, self.ends, self.steps, self.count, self.chunk, self.h0 = stacked, ends, steps, count, chunk, h0

    def assemble(self, e: Emitter) -> tuple[gs.Tensor, gs.Tensor]:
        """(h [T, ...state], the final state: h's last row, h0 for zero steps): one Gather of
        the rows in step order (opset 14+: from the [C·K, ...] view; before, a GatherND, since
        Reshape there reads a 0 of an empty batch as "copy the dim")."""
        t = e.arange(self.steps)  # [T]
        size = e.const("chunk", np.int64(self.chunk))
        position, chunk = e.op("Mod", [t, size]), e.op("Div", [t, size])
        if e.opset >= 14:
            rows = e.op("Mul", [self.count, e.ints("chunk", [self.chunk])])  # [1]: C·K
            flat = reshape(e, self.stacked, e.op("Concat", [rows, e.op("Shape", [self.h0])], axis=0))
            index = e.op("Add", [e.op("Mul", [position, _scalar(e, self.count)]), chunk])
            h = e.op("Gather", [flat, index], axis=0)
        else:
            index = e.op("Concat", [e.unsqueeze(position, [1]), e.unsqueeze(chunk, [1])], axis=1)  # [T, 2]
            h = e.op("GatherND", [self.stacked, index])
        last = e.op("Concat", [e.unsqueeze(self.h0, [0]), e.slice(h, [-1], [INT64_MAX], [0])], axis=0)
        return h, e.squeeze(e.slice(last, [-1], [INT64_MAX], [0]), [0])


def state_scan(e: Emitter, start, rows, decay, width: int, dtype, *, scanned: bool = False, ones=None,
               before: bool = False):
    """((final states), (stacked states)) of a Scan over axis 0 of ``rows``: h = decay ⊙ h + row
    from ``start``, and with ``ones`` given also p = decay ⊙ p from it (Π decay); ``decay``
    scanned with the rows where ``scanned``, else read from the outer scope. Stacked after
    each update, or h before it where ``before``. A fixed body the passes leave alone (the
    caller marks the Scan chosen): a Scan, not a Loop, so there is no trip count, per-step
    Gather or loop_to_scan's cut of the scanned inputs."""
    names = e.b.names
    body = new_graph(names.fresh("chunk_steps"))
    inner = Emitter(Builder(body, names), e.opset)
    shape = [None] * width
    h_in = gs.Variable(names.fresh("h"), dtype=dtype, shape=shape)
    p_in = gs.Variable(names.fresh("p"), dtype=dtype, shape=shape) if ones is not None else None
    row = gs.Variable(names.fresh("row"), dtype=dtype, shape=shape)
    a_t = gs.Variable(names.fresh("decay"), dtype=dtype, shape=shape) if scanned else decay
    h_out = inner.op("Add", [inner.op("Mul", [a_t, h_in]), row], dtype=dtype, shape=shape)
    states = [h_out] + ([inner.op("Mul", [a_t, p_in], dtype=dtype, shape=shape)] if p_in is not None else [])
    kept = [h_in] if before else states
    copies = [inner.op("Identity", [t], dtype=dtype, shape=shape) for t in kept]
    body.inputs = [h_in] + ([p_in] if p_in is not None else []) + [row] + ([a_t] if scanned else [])
    body.outputs = states + copies
    inputs = [start] + ([ones] if ones is not None else []) + [rows] + ([decay] if scanned else [])
    results = e.op("Scan", inputs, n_outputs=len(states) + len(copies), body=body,
                   num_scan_inputs=1 + int(scanned))
    return tuple(results[:len(states)]), tuple(results[len(states):])


def _scalar(e: Emitter, x: gs.Tensor) -> gs.Tensor:
    """An int64 [1] as a scalar."""
    return e.op("Reshape", [x, e.ints("scalar", [])])


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
