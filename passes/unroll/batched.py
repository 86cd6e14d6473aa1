"""Unrolling an opset-8 Scan in place, at opset 8 (the body is per batch item).

The body is copied once per batch item and step (B must be static): item b's states start as
``init[b]``; its step t reads ``x[b, t]`` (forward) or, reversed, ``x[b, T-1-t]`` without
``sequence_lens`` and ``x[b, max(len[b]-1-t, 0)]`` with it (the spec's reverse: from each
item's own last element). With ``sequence_lens`` every step is masked by ``t < len[b]``: past
the length the state keeps its value and the step's outputs are zeros (scanopt's contract).
Masks select with Gather from a stacked pair, so values are copied, never recomputed
(no 0 * inf). Opset 8 has no Where and no integer comparisons, so lengths are compared as
float (exact below 2^24). A zero-length Scan-8 becomes its initial states and empty outputs
[B, 0, ...] (any B).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.clone import BodyInliner
from scanopt.emit import Emitter
from scanopt.scan_view import ScanView


def unroll_scan8(node: gs.Node, view: ScanView, steps: int, batch: int, emit: Emitter, names,
                 out_dtypes: list) -> list[gs.Tensor]:
    """New values for the node's outputs (final states, then scan outputs)."""
    body = node.attrs["body"]
    n = view.num_states
    first = 1
    lens = node.inputs[0] if view.sequence_lens else None
    inits = list(node.inputs[first:first + n])
    xs = list(node.inputs[first + n:])
    inliner = BodyInliner(body, emit.b.graph, names)
    ints: dict[int, gs.Constant] = {}
    floats: dict[float, gs.Constant] = {}

    def index(i: int) -> gs.Constant:
        if i not in ints:
            ints[i] = emit.const(f"i{i}", np.array(i, np.int64))
        return ints[i]

    def number(v: float) -> gs.Constant:
        if v not in floats:
            floats[v] = emit.const("f", np.array(v, np.float32))
        return floats[v]

    lens_f = emit.op("Cast", [lens], to=onnx.TensorProto.FLOAT) if lens is not None else None
    finals: list[list[gs.Tensor]] = [[] for _ in range(n)]
    outputs: list[list[gs.Tensor]] = [[] for _ in range(view.num_scan_outputs)]
    for b in range(batch):
        states = [emit.op("Gather", [s, index(b)], axis=0) for s in inits]
        items = [emit.op("Gather", [x, index(b)], axis=0) for x in xs]
        length = emit.op("Gather", [lens_f, index(b)], axis=0) if lens is not None else None
        per_step: list[list[gs.Tensor]] = [[] for _ in range(view.num_scan_outputs)]
        for t in range(steps):
            slices = []
            for j, item in enumerate(items):
                if view.input_directions[j] and length is not None:
                    back = emit.op("Relu", [emit.op("Sub", [length, number(t + 1.0)])])
                    position = emit.op("Cast", [back], to=onnx.TensorProto.INT64)
                else:
                    position = index(steps - 1 - t if view.input_directions[j] else t)
                slices.append(emit.op("Gather", [item, position], axis=0))
            outs = inliner.inline(states + slices, suffix=f"_b{b}_t{t}")
            new_states, ys = outs[:n], outs[n:]
            if length is not None:
                valid = emit.op("Cast", [emit.op("Less", [number(float(t)), length])], to=onnx.TensorProto.INT64)
                new_states = [_select(emit, valid, old, new) for old, new in zip(states, new_states)]
                ys = [_select(emit, valid, _zeros_like(emit, y, out_dtypes[k]), y) for k, y in enumerate(ys)]
            states = new_states
            for k, y in enumerate(ys):
                per_step[k].append(y)
        for i, s in enumerate(states):
            finals[i].append(s)
        for k, values in enumerate(per_step):
            outputs[k].append(emit.stack(values, 0))
    return [emit.stack(items, 0) for items in finals] + [emit.stack(items, 0) for items in outputs]


def empty_scan8_outputs(node: gs.Node, view: ScanView, emit: Emitter, empties: list[np.ndarray]) -> list[gs.Tensor]:
    """Zero steps: initial states, and [B, 0, ...] outputs with B read from the first scan input."""
    first = 1
    n = view.num_states
    x = node.inputs[first + n]
    batch = emit.slice(emit.op("Shape", [x]), [0], [1], [0])
    results = list(node.inputs[first:first + n])
    for array in empties:
        ones = emit.ints("ones", [1] * (array.ndim - 1))
        shape = emit.op("Concat", [batch, ones], axis=0)
        results.append(emit.op("Expand", [emit.const("empty", array), shape]))
    return results


def _select(emit: Emitter, valid: gs.Tensor, old: gs.Tensor, new: gs.Tensor) -> gs.Tensor:
    """``new`` where ``valid`` (int64 scalar) is 1, else ``old``: Gather from the stacked pair."""
    pair = emit.op("Concat", [emit.unsqueeze(old, [0]), emit.unsqueeze(new, [0])], axis=0)
    return emit.op("Gather", [pair, valid], axis=0)


def _zeros_like(emit: Emitter, y: gs.Tensor, dtype: np.dtype) -> gs.Tensor:
    return emit.op("Expand", [emit.const("zero", np.zeros([], dtype)), emit.op("Shape", [y])])
