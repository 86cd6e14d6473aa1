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
such stack, every scan input (read in processing order, reversed when the output
prepends). An output reading scan inputs alone is a map of them and stays (hoist moves
its work out of the loop as a new scan input; vectorize handles whole maps). The old
state ``h_{t-1}`` (a state's body input) is a source only where a scan output stacks it;
otherwise the output stays in the loop with the reason (its stack would be
``[h_0, h_1 .. h_{T-2}]``, a shift this module does not build). Nodes with bodies, random
ops and whatever else :mod:`lift` declines stay in the loop too, with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from scanopt.graph import identity_root
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


def plan_epilogue(y: gs.Tensor, roots: dict[int, int], view, body: gs.Graph, ctx, *,
                  reverse: bool) -> Epilogue | str | None:
    """The Epilogue of body output ``y`` given ``roots`` ({id(identity root of a body output):
    scan output} of the outputs it may read); the reason it stays in the loop although it
    reads such a stack (for the report); or None when it reads none (nothing to move: the
    cell's own ``h``, a map of the scan inputs). ``reverse``: the output prepends (scan
    inputs are then read in reverse processing order)."""
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
            why.append(_unreadable(view, j, ctx.opset, reverse))
            read_elements[id(t)] = j
            values[id(t)] = element_value(view, j, t, ctx.shapes)
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


def _unreadable(view, j: int, opset: int, reverse: bool) -> str:
    if view.input_axes[j] != 0 and view.input_ranks[j] is None:
        return f"it reads scan input {j}, whose rank is unknown (its scan axis cannot be moved first)"
    if (view.input_directions[j] or reverse) and opset < 10:
        return f"it reads scan input {j} in reverse, and reversing needs Slice steps (opset 10+), not opset {opset}"
    return ""


def emit_epilogue(chain: Epilogue, stacks: dict[int, gs.Tensor], xs: list, view, reverse: bool,
                  after: Builder, opset: int) -> gs.Tensor:
    """Emit ``chain`` on the scan outputs' ``stacks`` (axis 0, in the output's order) and the
    scan inputs ``xs`` (as the node reads them); returns the stacked value, written by the
    last emitted node (the caller rebinds it with :func:`write_into`)."""
    mapping: dict[int, gs.Tensor] = {}
    e = LiftEmitter(after, opset, steps=lambda: e.length(next(iter(mapping.values()))))
    for key, k in chain.sources.items():
        mapping[key] = stacks[k]
    for key, j in chain.elements.items():
        x = to_processing_order(e, xs[j], view, j)
        mapping[key] = e.reverse(x, 0) if reverse else x
    emit_nodes(chain.plan.steps, e, mapping)
    return mapping[id(chain.value)]


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
