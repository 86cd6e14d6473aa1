"""Scan outputs computed after the loop (epilogues): a scan output whose step value is a
function of values other scan outputs stack (the new state ``h_t`` an RNN emits anyway),
of scan elements (``x_t``) and of outer values is computed once on the stacks, with the
body's nodes lifted over the leading step axis by the rules of
:mod:`scanopt.passes.loopfree.lift`: a projection ``h_t·V`` becomes one MatMul over all
steps instead of T small ones, a Softmax over the features or a LayerNorm moves as it is,
and the loop keeps only the cell, which ``fuse`` can then match (tf.scan emitting ``h·v``,
an RNN language model emitting logits ``h_t·W_out``).

What counts as a source: a kept scan output in the same direction and layout as the output
moved (its stack, in that order, is what the lifted nodes read; the lifted nodes act on
each step alone, so the order of the step axis carries through), and, beside at least one
such stack, every forward scan input when the output appends (read as it is; a reversal
outside the loop would cost what the loop does for free). An output reading scan inputs alone is a map of them and stays (hoist moves
its work out of the loop as a new scan input; vectorize handles whole maps). The old
state ``h_{t-1}`` (a state's body input) is a source only where a scan output stacks it;
otherwise the output stays in the loop with the reason (its stack would be
``[h_0, h_1 .. h_{T-2}]``, a shift this module does not build). Nodes with bodies, random
ops and whatever else :mod:`lift` declines stay in the loop too, with its reason.

Scan-8 without ``sequence_lens`` too: its stacks are [B, T, ...], reshaped to one row per
(item, step) for the lifted nodes and back (forward scan inputs read the same way). With
``sequence_lens`` its stacks are zero past each length, which ``f(0)`` need not be, and
opset 8 has no Where or Range to restore them: the pass does not try (the upgrade to
Scan-9+ does it with masks, and the output then moves).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
import onnx_graphsurgeon as gs

from scanopt.emit import INT64_MAX
from scanopt.graph import identity_root, reverses_axis
from scanopt.passes.loopfree.lift import (
    DEFAULT_MAX_BYTES, Declined, LiftEmitter, LiftPlan, Value, element_value, emit_nodes, largest_intermediate,
    plan_nodes, to_processing_order,
)
from scanopt.rewrite import Builder, replace_all_uses


@dataclass
class Epilogue:
    """How one scan output is computed after the loop."""

    sources: dict[int, int]  # id(body value read) -> the scan output stacking it
    elements: dict[int, int]  # id(scan element read) -> its scan input
    plan: LiftPlan  # the body nodes from the sources to the output's value, in body order
    value: gs.Tensor  # the output's body value

    @property
    def source(self) -> int | None:
        """The first scan output read (None: the output reads scan inputs only)."""
        return min(self.sources.values(), default=None)

    def ops(self) -> list[str]:
        return [node.op for node, _ in self.plan.steps if node.op != "Identity"]


def plan_epilogue(y: gs.Tensor, roots: dict[int, int], view, body: gs.Graph, xs: list, ctx, *,
                  reverse: bool) -> Epilogue | str | None:
    """The Epilogue of body output ``y`` given ``roots`` ({id(identity root of a body output):
    scan output} of the outputs it may read) and the node's scan inputs ``xs``; the reason it stays in the loop although it
    reads such a stack (for the report); or None when it reads none (nothing to move: the
    cell's own ``h``, a map of the scan inputs). ``reverse``: the output prepends (then
    no scan input is read: see :func:`_unreadable`)."""
    n, own = view.num_states, {id(node) for node in body.nodes}
    elements = {id(body.inputs[n + j]): j for j in range(view.num_scan_inputs)}
    state_inputs = {id(t): t for t in body.inputs[:n]}
    sources, read_elements, values, nodes, why = {}, {}, {}, {}, []
    seen, stack = set(), [y]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        root = roots.get(id(identity_root(t)))
        if root is not None and t is not y:
            sources[id(t)] = root
            values[id(t)] = Value(True, ctx.shapes.rank(t))
        elif id(t) in elements:
            j = elements[id(t)]
            why.append(_unreadable(view, j, xs, ctx, reverse))
            read_elements[id(t)] = j
            # Scan-8: the body's element has neither the batch nor the sequence axis
            values[id(t)] = Value(True, ctx.shapes.rank(t)) if view.batched else element_value(view, j, t, ctx.shapes)
        elif id(t) in state_inputs:
            why.append(f"it reads the state input '{t.name}' (the previous step's value), which no scan output "
                       "stacks in the same direction")
        elif len(t.inputs) == 1 and id(t.inputs[0]) in own:
            nodes[id(t.inputs[0])] = t.inputs[0]
            stack.extend(x for x in t.inputs[0].inputs if x.name)
    if not sources:
        return None
    if any(why):
        return next(w for w in why if w)
    try:
        plan = plan_nodes([node for node in body.nodes if id(node) in nodes], values, ctx.opset, ctx.shapes.shape)
    except Declined as exc:
        return str(exc)
    name, size = largest_intermediate(plan, view.trip_count, ctx.shapes)
    limit = ctx.options.get("vectorize_max_bytes", DEFAULT_MAX_BYTES)
    if size > limit:
        return f"'{name}' over all steps would take {size} bytes, above vectorize_max_bytes ({limit})"
    return Epilogue(sources, read_elements, plan, y)


def _unreadable(view, j: int, xs: list, ctx, reverse: bool) -> str:
    """Why scan input ``j`` cannot be read after the loop as it is, or "". A reverse input or
    a prepending output would cost a reversal outside the loop that the loop does for free
    (canonicalize keeps directions for that reason); a scan input that is itself a reversal
    is being folded into the direction, so it is not read either."""
    if view.input_axes[j] != 0 and view.input_ranks[j] is None:
        return f"it reads scan input {j}, whose rank is unknown (its scan axis cannot be moved first)"
    if view.input_directions[j] or reverse:
        return (f"it reads scan input {j} and {'the input' if view.input_directions[j] else 'the output'} runs in "
                "reverse (a reversal after the loop where the loop reverses for free)")
    x = xs[j]
    axis = view.input_axes[j] + (view.input_ranks[j] or 0) * (view.input_axes[j] < 0)
    if len(x.inputs) == 1 and reverses_axis(x.inputs[0], axis, view.input_ranks[j], ctx.opset):
        return f"it reads scan input {j}, a reversal (which canonicalize folds into the direction instead)"
    return ""


def emit_epilogue(chain: Epilogue, stacks: dict[int, gs.Tensor], xs: list, view, after: Builder,
                  opset: int) -> gs.Tensor:
    """Emit ``chain`` on the scan outputs' ``stacks`` (axis 0, in the output's order) and the
    scan inputs ``xs`` (as the node reads them, in that order already: see
    :func:`_unreadable`); returns the stacked value, written by the last emitted node (the
    caller rebinds it with :func:`write_into`)."""
    mapping: dict[int, gs.Tensor] = {}
    e = LiftEmitter(after, opset, steps=lambda: e.length(next(iter(mapping.values()))))
    for key, k in chain.sources.items():
        mapping[key] = _rows(e, stacks[k]) if view.batched else stacks[k]
    for key, j in chain.elements.items():
        if view.batched:  # [B, T, ...] in processing order already (forward inputs only)
            mapping[key] = _rows(e, xs[j])
            continue
        mapping[key] = to_processing_order(e, xs[j], view, j)  # forward: no reversal
    emit_nodes(chain.plan.steps, e, mapping)
    value = mapping[id(chain.value)]
    return _batch_major(e, value, stacks[chain.source]) if view.batched else value


def _rows(e: LiftEmitter, stack: gs.Tensor) -> gs.Tensor:
    """A Scan-8 stack [B, T, ...] as [B*T, ...]: every (item, step) one row, the one leading
    axis the lift rules know."""
    tail = e.slice(e.op("Shape", [stack]), [2], [INT64_MAX], [0])
    return e.op("Reshape", [stack, e.op("Concat", [e.ints("rows", [-1]), tail], axis=0)])


def _batch_major(e: LiftEmitter, value: gs.Tensor, like: gs.Tensor) -> gs.Tensor:
    """``value`` [B*T, ...] back to [B, T, ...], B and T read from the stack ``like``. A 0 in
    Reshape's shape copies the input's dim (no allowzero before opset 14): B = 0 copies B*T = 0,
    right; T = 0 would copy the first tail dim, so a zero T is asked for as -1 (0 rows / B)."""
    shape = e.op("Shape", [like])
    steps = e.slice(shape, [1], [2], [0])
    empty = e.op("Cast", [e.op("Equal", [steps, e.ints("zero", [0])])], to=int(onnx.TensorProto.INT64))
    lead = [e.slice(shape, [0], [1], [0]), e.op("Sub", [steps, empty])]
    tail = e.slice(e.op("Shape", [value]), [1], [INT64_MAX], [0])
    return e.op("Reshape", [value, e.op("Concat", [*lead, tail], axis=0)])


def write_into(value: gs.Tensor, target: gs.Tensor, after: Builder) -> None:
    """Make ``target`` hold ``value``: its producer in ``after`` writes ``target`` directly,
    else (a source read as it is) an Identity copies it."""
    producer = value.inputs[0] if len(value.inputs) == 1 else None
    if producer is None or not any(node is producer for node in after.graph.nodes):
        after.op("Identity", [value], outputs=[target])
        return
    slot = next(i for i, t in enumerate(producer.outputs) if t is value)
    replace_all_uses(value, target, after.graph)
    producer.outputs[slot] = target
    if target.dtype is None:
        target.dtype = value.dtype
