"""The two-pass positions form of a wide linear recurrence h_t = a_t ⊙ h_{t-1} + b_t (Mamba's
selective scan, state [B, D, N]): the layout and the Loops it is built from.

Why a third form: on a wide state the [T, ...state] tensors of the other chunked forms (a, b,
their products, every h) are each megabytes, past the caches, and the full-size Transposes,
copies and the products tracked per position cost as much as the loop saves. Here:

- the steps are put in the order [C, T/C] on the *scan inputs* (small: [T, D], [T, N]), before
  the body is lifted, so every per-step value comes out position-major with no Transpose of
  its own, and the scan outputs are put back in step order after (small again);
- what is small is lifted once over all steps (Δ = softplus(...), Δ·x, the Unsqueezes); what
  makes a value of the state's width (Δ ⊗ A, Exp, the outer product: a and b) is computed
  inside the Loops, per position, on [T/C, ...] slices that stay in cache;
- :func:`position_loop` runs the C positions of every chunk at once (state [T/C, ...]); linrec
  uses it for a pass from zero per chunk and then either a correction from the chunk starts
  (outputs linear in the state: module decay_correction) or a second pass from the starts
  reading the outputs: h over all steps is never materialized.

Padding steps (T not a multiple of C) come after the last chunk's real steps: they reach no
output and no other chunk, and the final state is read at the last real step. Numerics: the
products and sums the loop forms, in another association (chunk-local, then across chunks):
no log, no division.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.emit import INT64_MAX, Emitter
from scanopt.rewrite import Builder, new_graph


@dataclass
class Chunking:
    """T steps laid out as C positions of K chunks: K and T static ints, or (a symbolic length)
    int64 [1] tensors computed at run time, K = max(ceil(T / C), 1)."""

    chunk: int
    count: int | gs.Tensor
    steps: int | gs.Tensor

    @staticmethod
    def of(e: Emitter, chunk: int, steps: int | None, scanned: gs.Tensor) -> "Chunking":
        """For ``steps`` static; else from ``scanned``'s length on axis 0 (a scan input in
        processing order)."""
        if steps is not None:
            chunk = max(1, min(chunk, steps))
            return Chunking(chunk, -(-steps // chunk), steps)
        length = e.slice(e.op("Shape", [scanned]), [0], [1], [0])
        count = e.op("Div", [e.op("Add", [length, e.ints("chunk_less_one", [chunk - 1])]), e.ints("chunk", [chunk])])
        # one chunk at least: zero steps run one of padding, whose final state is not read
        return Chunking(chunk, e.op("Max", [count, e.ints("one", [1])]), length)

    @property
    def static(self) -> bool:
        return isinstance(self.count, int)

    @property
    def padded(self) -> bool:
        """Whether padding steps may exist (always, for a symbolic length)."""
        return not self.static or self.count * self.chunk != self.steps

    def chunks(self, e: Emitter) -> gs.Tensor:
        """K as the int64 scalar a Loop's trip count takes."""
        if self.static:
            return e.const("chunks", np.int64(self.count))
        return e.op("Reshape", [self.count, e.ints("scalar", [])])

    def padding(self, e: Emitter) -> int | gs.Tensor:
        if self.static:
            return self.count * self.chunk - self.steps
        return e.op("Sub", [e.op("Mul", [self.count, e.ints("chunk", [self.chunk])]), self.steps])

    def count_dim(self):
        """K for a declared shape: the int, or None."""
        return self.count if self.static else None


def permute_steps(e: Emitter, x: gs.Tensor, rank: int, at: Chunking, tail_shape=None) -> gs.Tensor:
    """[T, ...] (rank ``rank``) in position-major order [C·K, ...]: row c·K + k is step k·C + c
    (zero rows pad T to K·C). ``tail_shape``: the per-step dims where all are static, written
    as constants so shape inference carries them through the lifted body (see by_position)."""
    if at.padded:
        padding = at.padding(e)
        if at.static:
            pads = e.ints("pads", [0] * rank + [padding] + [0] * (rank - 1))
        else:
            pads = e.op("Concat", [e.ints("before", [0] * rank), padding, e.ints("after", [0] * (rank - 1))], axis=0)
        x = e.op("Pad", [x, pads])
    if _static(tail_shape) and at.static:
        tail = [int(d) for d in tail_shape]
        x = e.op("Reshape", [x, e.ints("chunks", [at.count, at.chunk] + tail)])
        x = e.op("Transpose", [x], perm=[1, 0] + list(range(2, rank + 1)))
        return e.op("Reshape", [x, e.ints("rows", [at.count * at.chunk] + tail)])
    tail = e.slice(e.op("Shape", [x]), [1], [INT64_MAX], [0])
    x = e.op("Reshape", [x, e.op("Concat", [e.ints("chunks", [-1, at.chunk]), tail], axis=0)])
    x = e.op("Transpose", [x], perm=[1, 0] + list(range(2, rank + 1)))
    return e.op("Reshape", [x, e.op("Concat", [e.ints("rows", [-1]), tail], axis=0)])


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape)


def unpermute_steps(e: Emitter, y: gs.Tensor, rank: int, at: Chunking) -> gs.Tensor:
    """The inverse of :func:`permute_steps` for ``y`` [C·K, ...] of rank ``rank``, cut to T rows."""
    tail = e.slice(e.op("Shape", [y]), [1], [INT64_MAX], [0])
    y = e.op("Reshape", [y, e.op("Concat", [e.ints("positions", [at.chunk, -1]), tail], axis=0)])
    y = e.op("Transpose", [y], perm=[1, 0] + list(range(2, rank + 1)))
    y = e.op("Reshape", [y, e.op("Concat", [e.ints("steps", [-1]), tail], axis=0)])
    if not at.padded:
        return y
    if at.static:
        return e.slice(y, [0], [at.steps], [0])
    return e.op("Slice", [y, e.ints("zero", [0]), at.steps, e.ints("axis", [0])])


def by_position(e: Emitter, x: gs.Tensor, at: Chunking, rank: int, per_step_shape=None) -> gs.Tensor:
    """[C·K, ...] (rank ``rank``) -> [C, K, ...] (a Reshape; the rows are already
    position-major), to a constant target where the shape is static. Its shape says [C, K, ...]:
    the Loops read it C long, so loop_to_scan, turning them into Scans, cuts none of their
    inputs to the trip count (a copy each)."""
    if _static(per_step_shape) and at.static:
        dims = [at.chunk, at.count] + [int(d) for d in per_step_shape]
        return e.op("Reshape", [x, e.ints("split", dims)], shape=dims)
    tail = e.slice(e.op("Shape", [x]), [1], [INT64_MAX], [0])
    known = [int(d) for d in per_step_shape] if _static(per_step_shape) else [None] * (rank - 1)
    return e.op("Reshape", [x, e.op("Concat", [e.ints("split", [at.chunk, -1]), tail], axis=0)],
                shape=[at.chunk, at.count_dim()] + known)


def position_loop(e: Emitter, starts: list[gs.Tensor], per_step: dict, chunk: int, width: int, dtype,
                  step) -> tuple[list[gs.Tensor], list[gs.Tensor]]:
    """A Loop over the C positions carrying ``starts`` (each [K, ...], rank ``width``):
    ``step(inner, position, carried, gathered) -> (new carried, outputs)``, where ``gathered``
    maps each key of ``per_step`` (values [C, K, ...]) to its row at the position. Returns the
    final carried values and each output stacked [C, K, ...]. A Loop, not a Scan: the passes
    rewrite Scans, and this loop is the chosen form."""
    body = new_graph(e.b.names.fresh("chunk_positions"))
    inner = Emitter(Builder(body, e.b.names), e.opset)
    position = gs.Variable(e.b.names.fresh("position"), dtype=np.int64, shape=[])
    cond = gs.Variable(e.b.names.fresh("cond"), dtype=np.bool_, shape=[])
    carried = [gs.Variable(e.b.names.fresh("carried"), dtype=dtype, shape=[None] * width) for _ in starts]
    gathered = {key: inner.op("Gather", [x, position], axis=0) for key, x in per_step.items()}
    new, ys = step(inner, position, carried, gathered)
    _hoist_reshapes(e, body, {id(g): per_step[key] for key, g in gathered.items()})
    new = [inner.op("Identity", [t]) if t in carried else t for t in new]
    ys, after = zip(*[_sink_squeeze(body, y) for y in ys]) if ys else ((), ())
    seen = {id(t) for t in carried + new}
    copies = []
    for y in ys:  # a body output must be its own value: a copy only where one is shared
        copies.append(inner.op("Identity", [y]) if id(y) in seen else y)
        seen.add(id(y))
    body.inputs = [position, cond] + carried
    body.outputs = [inner.op("Identity", [cond], dtype=np.bool_, shape=[])] + new + copies
    results = e.op("Loop", [e.const("positions", np.int64(chunk)), gs.Variable.empty()] + list(starts),
                   n_outputs=len(starts) + len(copies), body=body)
    results = results if isinstance(results, list) else [results]
    stacked = [e.squeeze(y, axes) if axes else y for y, axes in zip(results[len(starts):], after)]
    return results[:len(starts)], stacked


def _hoist_reshapes(e: Emitter, body: gs.Graph, rows_of: dict) -> None:
    """A Reshape to a constant shape of a gathered row ([K, ...], read by nothing else), its
    first dim 0 (kept) and none -1, is applied once to the whole [C, K, ...] value before the
    Loop, which then gathers reshaped rows: one node fewer per position (y's read of C_t as a
    column)."""
    for node in list(body.nodes):
        if node.op != "Reshape" or node.domain or len(node.inputs) != 2 or not isinstance(node.inputs[1], gs.Constant):
            continue
        row, target = node.inputs
        dims = np.asarray(target.values).reshape(-1)
        if id(row) not in rows_of or len(row.outputs) != 1 or dims.size == 0 or dims[0] != 0 or np.any(dims < 0) \
                or node.attrs.get("allowzero", 0):
            continue
        source = rows_of[id(row)]
        known = list(source.shape) if source.shape is not None and len(source.shape) == dims.size + 1 else None
        shape = [known[i] if d == 0 else int(d) for i, d in enumerate([0] + list(dims))] if known else None
        whole = e.op("Reshape", [source, e.ints("rows", [0] + [int(d) for d in dims])], shape=shape)
        gather = row.inputs[0]
        gather.inputs[0] = whole
        result = node.outputs[0]
        gather.outputs = [result]
        node.inputs.clear()
        node.outputs.clear()
        body.nodes.remove(node)


def _sink_squeeze(body: gs.Graph, y: gs.Tensor) -> tuple[gs.Tensor, list[int] | None]:
    """(the value the Loop stacks, the axes to squeeze after it or None): a per-position output
    made by a Squeeze of negative constant axes read by nothing else is stacked unsqueezed and
    squeezed once after the Loop (the same axes counted from the end), one node fewer per
    position."""
    node = y.inputs[0] if len(y.inputs) == 1 else None
    if node is None or node.op != "Squeeze" or node.domain or y.outputs:
        return y, None
    if len(node.inputs) == 2 and isinstance(node.inputs[1], gs.Constant):
        values = np.asarray(node.inputs[1].values).reshape(-1)
    else:
        values = np.asarray(node.attrs.get("axes", []), np.int64) if len(node.inputs) == 1 else np.zeros(0)
    if values.size == 0 or np.any(values >= 0):
        return y, None
    source = node.inputs[0]
    body.nodes.remove(node)
    node.inputs.clear()
    node.outputs.clear()
    return source, [int(v) for v in values]
