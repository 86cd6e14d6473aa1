"""The two-pass positions form of a wide linear recurrence h_t = a_t ⊙ h_{t-1} + b_t (Mamba's
selective scan, state [B, D, N]).

Why a third form: on a wide state the [T, ...state] tensors of the other chunked forms (a, b,
their products, every h) are each megabytes, and the full-size Transposes, copies and the
products tracked per position cost as much as the loop saves. Here:

- the steps are put in the order [C, T/C] on the *scan inputs* (small: [T, D], [T, N]), before
  the body is lifted, so a and b come out position-major with no Transpose of their own, and
  the scan outputs are put back in step order after (small again);
- pass 1, a Loop over the C positions of every chunk at once (state [T/C, ...]), carries only
  the chunk's local state from zero and its running product of a: two final values, nothing
  stacked;
- the chunk starts are composed by doubling over the T/C chunk ends (short);
- pass 2, a Loop over the positions again from those starts, updates h and computes the scan
  outputs y_t = f(h_t, x_t) inside the loop on [T/C, ...] slices: h over all steps is never
  materialized.

Padding steps (T not a multiple of C) are made the identity pair (a, b) = (1, 0) with a mask,
so the last chunk's end is the final state. Numerics: the products and sums the loop forms,
in another association (chunk-local, then across chunks): no log, no exp, no division.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.emit import INT64_MAX, Emitter
from scanopt.passes.loopfree.prefix_scan import carry_loop
from scanopt.rewrite import Builder, new_graph


def permute_steps(e: Emitter, x: gs.Tensor, rank: int, chunk: int, count: int, padding: int,
                  tail_shape=None) -> gs.Tensor:
    """[T, ...] (rank ``rank``) in position-major order [C·K, ...]: row c·K + k is step k·C + c
    (zero rows pad T to K·C). ``tail_shape``: the per-step dims where all are static, written
    as constants so shape inference carries them through the lifted body (see by_position)."""
    if padding:
        pads = [0] * rank + [padding] + [0] * (rank - 1)
        x = e.op("Pad", [x, e.ints("pads", pads)])
    if _static(tail_shape):
        tail = [int(d) for d in tail_shape]
        x = e.op("Reshape", [x, e.ints("chunks", [count, chunk] + tail)])
        x = e.op("Transpose", [x], perm=[1, 0] + list(range(2, rank + 1)))
        return e.op("Reshape", [x, e.ints("rows", [count * chunk] + tail)])
    tail = e.slice(e.op("Shape", [x]), [1], [INT64_MAX], [0])
    x = e.op("Reshape", [x, e.op("Concat", [e.ints("chunks", [count, chunk]), tail], axis=0)])
    x = e.op("Transpose", [x], perm=[1, 0] + list(range(2, rank + 1)))
    return e.op("Reshape", [x, e.op("Concat", [e.ints("rows", [-1]), tail], axis=0)])


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape)


def unpermute_steps(e: Emitter, y: gs.Tensor, rank: int, chunk: int, count: int, steps: int) -> gs.Tensor:
    """The inverse of :func:`permute_steps` for ``y`` [C·K, ...] of rank ``rank``, cut to T rows."""
    tail = e.slice(e.op("Shape", [y]), [1], [INT64_MAX], [0])
    y = e.op("Reshape", [y, e.op("Concat", [e.ints("positions", [chunk, count]), tail], axis=0)])
    y = e.op("Transpose", [y], perm=[1, 0] + list(range(2, rank + 1)))
    y = e.op("Reshape", [y, e.op("Concat", [e.ints("steps", [-1]), tail], axis=0)])
    return e.slice(y, [0], [steps], [0]) if count * chunk != steps else y


def by_position(e: Emitter, x: gs.Tensor, chunk: int, count: int, rank: int, per_step_shape=None) -> gs.Tensor:
    """[C·K, ...] (rank ``rank``) -> [C, K, ...] (a Reshape; the rows are already
    position-major), to a constant target where the per-step shape is static. Its shape says
    [C, K, ...]: the Loops read it C long, so loop_to_scan, turning them into Scans, cuts none
    of their inputs to the trip count (a copy each)."""
    if _static(per_step_shape):
        dims = [chunk, count] + [int(d) for d in per_step_shape]
        return e.op("Reshape", [x, e.ints("split", dims)], shape=dims)
    tail = e.slice(e.op("Shape", [x]), [1], [INT64_MAX], [0])
    return e.op("Reshape", [x, e.op("Concat", [e.ints("split", [chunk, count]), tail], axis=0)],
                shape=[chunk, count] + [None] * (rank - 1))


def mask_padding(e: Emitter, a: gs.Tensor, b: gs.Tensor, rank: int, chunk: int, count: int, steps: int,
                 dtype) -> tuple[gs.Tensor, gs.Tensor]:
    """a, b [C, K, ...] with the padding steps (k·C + c >= T) made the identity pair (1, 0)."""
    real = (np.arange(count)[None, :] * chunk + np.arange(chunk)[:, None]) < steps
    mask = e.const("real_steps", real.reshape([chunk, count] + [1] * rank))
    a = e.op("Where", [mask, a, e.const("one", np.ones([], dtype))])
    b = e.op("Where", [mask, b, e.const("zero", np.zeros([], dtype))])
    return a, b


def chunk_ends(e: Emitter, a: gs.Tensor, b: gs.Tensor, h0: gs.Tensor, chunk: int, count: int, rank: int,
               dtype) -> tuple[gs.Tensor, gs.Tensor]:
    """Pass 1: (Π a, local state from zero) at the end of each chunk, [K, ...], by a Loop over
    the positions of a, b [C, K, ...]; nothing stacked."""
    zeros = e.op("ConstantOfShape", [e.op("Concat", [e.ints("count", [count]), e.op("Shape", [h0])], axis=0)],
                 value=gs.Constant(e.b.names.fresh("zero"), np.zeros([1], dtype)))
    ones = e.op("ConstantOfShape", [e.slice(e.op("Shape", [a]), [1], [INT64_MAX], [0])],
                value=gs.Constant(e.b.names.fresh("one"), np.ones([1], dtype)))
    (local, product), _ = carry_loop(e, a, b, zeros, ones, rank + 1, dtype, e.const("positions", np.int64(chunk)),
                                     False, stack=False)
    return product, local


def outputs_pass(e: Emitter, a: gs.Tensor, b: gs.Tensor, starts: gs.Tensor, chunk: int, rank: int, dtype,
                 per_step: dict, body_outputs) -> tuple[gs.Tensor, list[gs.Tensor]]:
    """Pass 2: a Loop over the C positions of a, b [C, K, ...] from ``starts`` [K, ...]: h = a ⊙ h + b,
    then ``body_outputs(emitter, h, gathered)`` -> the scan outputs at that position ([K, ...]),
    where ``gathered`` maps each key of ``per_step`` (values [C, K, ...]) to its row. Returns the
    final states [K, ...] and each output stacked [C, K, ...]."""
    body = new_graph(e.b.names.fresh("chunk_outputs"))
    inner = Emitter(Builder(body, e.b.names), e.opset)
    position = gs.Variable(e.b.names.fresh("position"), dtype=np.int64, shape=[])
    cond = gs.Variable(e.b.names.fresh("cond"), dtype=np.bool_, shape=[])
    h_in = gs.Variable(e.b.names.fresh("h"), dtype=dtype, shape=[None] * (rank + 1))
    a_t, b_t = (inner.op("Gather", [x, position], axis=0) for x in (a, b))
    h_out = inner.op("Add", [inner.op("Mul", [a_t, h_in]), b_t], dtype=dtype, shape=h_in.shape)
    gathered = {key: inner.op("Gather", [x, position], axis=0) for key, x in per_step.items()}
    ys = body_outputs(inner, h_out, gathered)
    copies = [inner.op("Identity", [y]) for y in ys]  # a body output must be its own value
    body.inputs = [position, cond, h_in]
    body.outputs = [inner.op("Identity", [cond], dtype=np.bool_, shape=[]), h_out] + copies
    results = e.op("Loop", [e.const("positions", np.int64(chunk)), gs.Variable.empty(), starts],
                   n_outputs=1 + len(copies), body=body)
    results = results if isinstance(results, list) else [results]
    return results[0], results[1:]

