"""The upgrade pass's strategy (b): one Scan-9 over the time axis, batch kept inside.

Used when :mod:`proof` has shown the body batch-polymorphic. The Scan-9 scans
axis 1 of every [B, T, ...] input and writes axis 1 of every output, so the body runs T
times on whole batches instead of B x T times on single items. With sequence_lens a mask
``live[b, t] = t < len[b]`` is computed once, before the Scan: it enters the body as one
more scan input (one per state rank, shaped to broadcast) where a Where keeps each state's
old value past ``len[b]``, and after the Scan one Where per output zeroes the positions
past ``len[b]``. A reverse input with lengths is reversed per item by ReverseSequence
(positions len[b]-1 .. 0 first, the rest left in place and masked), then scanned forward;
Scan-8 writes its outputs in processing order, so no output is reversed back.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.emit import Emitter
from scanopt.passes.upgrade.empty_guard import guarded, step_dims
from scanopt.rewrite import rebind_outputs


def rewrite_batched(node: gs.Node, match, level, ctx) -> gs.Node:
    """Replace the Scan-8 ``node`` with the batched Scan-9; return the Scan-9 node."""
    from scanopt.passes.upgrade.upgrade_pass import held, scan_9

    view, plan = match.view, match.plan
    body = node.attrs["body"]
    n, k = view.num_states, view.num_scan_outputs
    for tensor in plan.batched:
        if tensor.shape is not None:
            tensor.shape = [match.batch_dim] + list(tensor.shape)
    for target, key, value in plan.attr_edits:
        target.attrs[key] = value
    for target, index, value in plan.input_edits:
        target.inputs[index] = gs.Constant(ctx.names.fresh(f"{target.inputs[index].name}_batched"), value)

    outer = held(level.graph, match, ctx)
    lens = node.inputs[0] if view.sequence_lens is not None else None
    states, scans = list(node.inputs[1:1 + n]), list(node.inputs[1 + n:])
    directions = list(view.input_directions)
    finals = [outer.b.variable(f"{t.name}_batched", dtype=t.dtype) for t in node.outputs[:n]]
    outputs = [outer.b.variable(f"{t.name}_batched", dtype=t.dtype) for t in node.outputs[n:]]
    mask = None
    if lens is not None:
        for j, reverse in enumerate(directions):
            if reverse:
                scans[j] = outer.op("ReverseSequence", [scans[j], lens], batch_axis=0, time_axis=1)
                directions[j] = 0
        mask = _LiveMask(outer, lens, scans[0])
        ranks = sorted(set(match.output_ranks[:n]))
        scans += [mask.shaped(r) for r in ranks]
        directions += [0] * len(ranks)
        _mask_states(body, ranks, match, held(body, match, ctx), ctx)
    m = len(scans)

    def run(e: Emitter, results) -> None:
        scan_9(e, states + scans, results, body, m, directions=directions, input_axes=[1] * m, output_axes=[1] * k)

    scan = guarded(outer, node.inputs[1 + n], states, finals + outputs, step_dims(body, n, match, batched=True, states=states),
                   run, match, ctx)
    if mask is not None:  # zero every output past len[b], once, on the whole [B, T, ...] tensor
        outputs = [
            outer.op("Where", [mask.shaped(match.output_ranks[n + j]), y, outer.const("zero", np.zeros((), d))], dtype=d)
            for j, (y, d) in enumerate(zip(outputs, match.output_dtypes[n:]))
        ]
    rebind_outputs(node, finals + outputs, level.graph)
    return scan


class _LiveMask:
    """live[b, t] = t < len[b] (bool [B, T]), and views of it shaped [B, T, 1, ..., 1]."""

    def __init__(self, e: Emitter, lens: gs.Tensor, first_scan: gs.Tensor):
        self.e = e
        steps = e.op("Gather", [e.op("Shape", [first_scan]), e.ints("time_axis", [1])], axis=0)
        positions = e.unsqueeze(e.arange(steps), [0])  # [1, T]
        self.live = e.op("Less", [positions, e.unsqueeze(lens, [1])], dtype=np.bool_)  # [B, T]
        self.views: dict[int, gs.Tensor] = {0: self.live}

    def shaped(self, rank: int) -> gs.Tensor:
        """The mask with ``rank`` trailing 1s, to broadcast against [B, T, item of that rank]."""
        if rank not in self.views:
            self.views[rank] = self.e.unsqueeze(self.live, list(range(2, rank + 2)), dtype=np.bool_)
        return self.views[rank]


def _mask_states(body: gs.Graph, ranks: list[int], match, e: Emitter, ctx) -> None:
    """One more scan input per state rank (the step's mask, [B, 1, ...]); each state output
    becomes Where(mask, new, old), so a state stops changing at len[b]."""
    n = match.view.num_states
    step_masks = {}
    for rank in ranks:
        step_masks[rank] = gs.Variable(ctx.names.fresh("live"), dtype=np.bool_, shape=[match.batch_dim] + [1] * rank)
        body.inputs.append(step_masks[rank])
    for i in range(n):
        new, old = body.outputs[i], body.inputs[i]
        body.outputs[i] = e.op("Where", [step_masks[match.output_ranks[i]], new, old],
                               dtype=match.output_dtypes[i], shape=new.shape)
