"""The upgrade pass's strategy (c): a loop over batch items, one Scan-9 per item.

Correct for every Scan-8, whatever its body does. The loop over items is itself a Scan-9
over axis 0 of every state and scan input (and of sequence_lens), with no loop state: its
body receives item b, keeps the item's first ``len[b]`` steps (Slice; a reverse input is
then read from ``len[b] - 1`` down to 0 by the inner Scan-9's own direction), runs the
original body through the inner Scan-9, and pads each scan output with zeros back to T
steps. The outer Scan stacks the per-item final states and scan outputs along axis 0,
which is exactly Scan-8's [B, ...] and [B, T, ...] layout.

Why a Scan over the batch and not a Loop: both run the items one by one, but onnx's
reference Loop (which scanopt's reference executor uses) concatenates scan outputs of
rank >= 2 instead of stacking them and never iterates when ``cond`` is omitted, so a
Loop here could not be verified by the second engine.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from scanopt.passes.upgrade.empty_guard import guarded, step_dims
from scanopt.rewrite import new_graph, rebind_outputs


def rewrite_per_item(node: gs.Node, match, level, ctx) -> gs.Node:
    """Replace the Scan-8 ``node`` with the per-item Scan-9; return the outer Scan node."""
    from scanopt.passes.upgrade.upgrade_pass import held, scan_9

    view = match.view
    n, m = view.num_states, view.num_scan_inputs
    lens = node.inputs[0] if view.sequence_lens is not None else None
    per_batch = ([lens] if lens is not None else []) + list(node.inputs[1:])
    name = node.name or "scan"
    items = new_graph(ctx.names.fresh(f"{name}_items"))
    for tensor, dtype in zip(per_batch, match.input_dtypes):
        shape = ctx.shapes.shape(tensor)
        items.inputs.append(gs.Variable(ctx.names.fresh(f"{tensor.name}_item"), dtype=dtype, shape=shape[1:] if shape else None))
    inner = held(items, match, ctx)
    item_inputs = list(items.inputs)
    if lens is not None:
        length = inner.unsqueeze(item_inputs.pop(0), [0])  # int64 [1]
        item_inputs[n:] = [inner.prefix(x, length) for x in item_inputs[n:]]
    results = [inner.b.variable(f"{t.name}_item", dtype=d) for t, d in zip(node.outputs, match.output_dtypes)]
    scan_9(inner, item_inputs, results, node.attrs["body"], m, directions=view.input_directions)
    results[0].inputs[0].name = ctx.names.fresh(f"{name}_per_item")
    if lens is not None:
        steps = inner.op("Shape", [items.inputs[1 + n]])  # [T, ...] of the first scan input
        rows = inner.op("Sub", [inner.slice(steps, [0], [1], [0]), length])
        for j in range(n, len(results)):
            zeros = inner.zeros_like_tail(results[j], rows, match.output_dtypes[j])
            results[j] = inner.op("Concat", [results[j], zeros], axis=0, dtype=match.output_dtypes[j])
    # Declared: the outer shape minus the batch axis, else at least the rank (onnxruntime
    # refuses a Scan-9 body output without a shape).
    for j, (value, outer_tensor) in enumerate(zip(results, node.outputs)):
        outer_shape = ctx.shapes.shape(outer_tensor)
        rank = match.output_ranks[j]
        if outer_shape:
            value.shape = list(outer_shape[1:])
        elif rank is not None:
            value.shape = [None] * (rank + (1 if j >= n else 0))
        else:
            value.shape = None
    items.outputs = results

    outer = held(level.graph, match, ctx)
    stacked = [outer.b.variable(f"{t.name}_stacked", dtype=d) for t, d in zip(node.outputs, match.output_dtypes)]

    def run(e, results) -> None:
        scan_9(e, per_batch, results, items, len(per_batch))

    loop = guarded(outer, node.inputs[1 + n], list(node.inputs[1:1 + n]), stacked,
                   step_dims(node.attrs["body"], n, match, batched=False), run, match, ctx)
    rebind_outputs(node, stacked, level.graph)
    return loop
