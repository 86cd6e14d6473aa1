"""An upgraded Scan-8 behind ``If(B == 0 or T == 0)``.

onnxruntime runs a Scan-8 over zero steps (the initial states, empty outputs) and refuses an
empty batch cleanly, but dies of SIGFPE in a Scan-9 over axis 1 when either is 0 and refuses
a Scan-9 over zero steps: an upgraded model would crash or fail where the original ran. Behind
the guard, the empty branch gives the initial states and zeros of shape [B, T, per-step
dims...] (what Scan-8 gives at T = 0) and the other branch runs the upgrade's own form. A
per-step output dim that is not stated leaves the form unguarded (verification's edge
inputs then decide)."""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.emit import Emitter
from scanopt.rewrite import Guard


def step_dims(body: gs.Graph, n: int, match, *, batched: bool, states=()) -> list | None:
    """Per scan output of the Scan-8 body (after its ``n`` states): its dims after the batch
    and time axes and its dtype; None when one is not known. The dims are stated ints, or (a
    body output that is a copy of a state: ``y_t = Identity(h)``) the initial state's own dims
    after its batch axis, read at run time: the outer state tensor stands for them.
    ``batched``: the body's outputs already carry the batch axis first (strategy (b))."""
    found = []
    copies = {id(t): k for k, t in enumerate(body.inputs[:n])}
    for tensor, dtype in zip(body.outputs[n:], match.output_dtypes[n:]):
        shape = tensor.shape
        dims = None if shape is None else list(shape[1:] if batched else shape)
        if dtype is None:
            return None
        if dims is None or not all(isinstance(d, int) and d >= 0 for d in dims):
            source = _copied_state(tensor, copies)
            if source is None or source >= len(states) or match.target < 10:  # Slice takes inputs from opset 10
                return None
            dims = states[source]  # the outer initial state: its dims after the batch
        found.append((dims, np.dtype(dtype)))
    return found


def _copied_state(tensor: gs.Tensor, copies: dict) -> int | None:
    """The index of the body state input ``tensor`` is (through Identity), else None."""
    while id(tensor) not in copies and len(tensor.inputs) == 1 and tensor.inputs[0].op == "Identity":
        tensor = tensor.inputs[0].inputs[0]
    return copies.get(id(tensor))


def guarded(outer: Emitter, x: gs.Tensor, states, outputs, per_step, run: Callable, match, ctx) -> gs.Node:
    """Emit ``run(emitter, results)`` (the upgraded form, writing the final states then the scan
    outputs) behind the guard when ``per_step`` is known, else as it is; ``outputs`` receive
    the values; ``x``: the Scan-8's first scan input [B, T, ...]. Returns the node that
    produces ``outputs``."""
    from scanopt.passes.upgrade.upgrade_pass import held

    if per_step is None:
        run(outer, outputs)
        return outputs[0].inputs[0]
    shape = outer.op("Shape", [x])
    batch = outer.op("Gather", [shape, outer.ints("zero", [0])], axis=0)
    steps = outer.op("Gather", [shape, outer.ints("one", [1])], axis=0)
    zero = outer.ints("zero", [0])
    empty = outer.op("Or", [outer.op("Equal", [batch, zero]), outer.op("Equal", [steps, zero])])  # [1]: If's condition
    guard = Guard(ctx.names, "scan8_empty", "scan8_upgraded")
    results = guard.orelse.values(outputs, "{}_run")
    run(held(guard.orelse.graph, match, ctx), results)
    quick = held(guard.then.graph, match, ctx)
    kept = [quick.op("Identity", [s], dtype=out.dtype) for s, out in zip(states, outputs)]
    zeros = []
    for dims, dtype in per_step:
        if isinstance(dims, gs.Tensor):  # a copy of a state: the state's dims after its batch
            tail = quick.op("Slice", [quick.op("Shape", [dims]), quick.ints("one", [1]), quick.ints("end", [2**62])])
            parts = [batch, steps, tail]
        else:
            parts = [batch, steps] + ([quick.ints("dims", dims)] if dims else [])
        value = gs.Constant(quick.b.names.fresh("zero_value"), np.zeros([1], dtype))
        zeros.append(quick.op("ConstantOfShape", [quick.op("Concat", parts, axis=0)], value=value, dtype=dtype))
    return guard.close(outer.b, empty, outputs, kept + zeros, results, domain=outer.domain, outer_weights=True)
