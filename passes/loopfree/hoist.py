"""hoist: work a recurrent Scan does per step without needing its state moves out of the loop.

Body nodes that do not depend on a state (directly or through other body nodes) are lifted
with the rules of :mod:`lift`:
- invariant nodes (only outer values and constants) are computed once before the Scan; the
  body reads the result by outer-scope capture;
- per-step nodes (the input projection ``X_t W + b`` of a cell that cannot be fused, a
  per-step input normalization) become one batched computation over the whole sequence
  whose result is a new scan input (axis 0, forward: it is built in processing order).
A node that cannot be lifted (and everything after it) stays in the body. Lifted per-step
values obey vectorize's memory bound (``vectorize_max_bytes``, symbolic dims counted as 1):
one that would exceed it stays in the body. Skipped: Scan-8, Scans where nothing but
constants could move or where the only per-step work that could move is elementwise (as a new
scan input it costs about as much per step as it saves), and maps without any
state-dependent node (vectorize's case).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from scanopt.graph import GraphLevel, is_op, note_output
from scanopt.pass_api import Match, PassContext, ScanPass, Skip, register_pass
from scanopt.passes.loopfree.lift import (
    DEFAULT_MAX_BYTES, ELEMENTWISE, ONE_WAY, Declined, LiftEmitter, LiftPlan, element_value, emit_nodes,
    plan_node, step_bytes, to_processing_order,
)
from scanopt.rewrite import Builder, detach, place_appended, replace_all_uses, replacing
from scanopt.scan_view import ScanView

TRIVIAL = ("Constant", "Identity")  # moving only these out gains nothing


@dataclass
class HoistMatch(Match):
    view: ScanView
    plan: LiftPlan  # the lifted nodes, in body order
    frontier: list[gs.Tensor]  # lifted body values read by what stays in the body


@register_pass
class Hoist(ScanPass):
    name = "hoist"
    order = 90
    form = "hoisted"
    summary = "state-independent body work -> computed once (invariant) or as one batched op feeding a new scan input"

    def match(self, node: gs.Node, view: ScanView, level: GraphLevel, ctx: PassContext) -> Match | Skip:
        if view.batched:
            return Skip("opset-8 batched Scan: hoist handles Scan-9+ (the upgrade pass converts it first)")
        body = node.attrs["body"]
        n = view.num_states
        plan = LiftPlan([], {})
        stays: set[int] = {id(t) for t in body.inputs[:n]}  # values computed in the loop
        for j in range(view.num_scan_inputs):
            element = body.inputs[n + j]
            readable = view.input_axes[j] == 0 or view.input_ranks[j] is not None
            readable &= ctx.opset >= 10 or not view.input_directions[j]
            if readable:
                plan.values[id(element)] = element_value(view, j, element, ctx.shapes)
            else:
                stays.add(id(element))
        declined: list[str] = []
        limit = ctx.options.get("vectorize_max_bytes", DEFAULT_MAX_BYTES)
        trip = view.trip_count if view.trip_count is not None else 1
        sizes: dict[int, int] = {}  # per-step bytes of the lifted per-step values, as in largest_intermediate
        for body_node in body.nodes:
            if any(id(t) in stays for t in body_node.inputs):
                stays.update(id(t) for t in body_node.outputs)
                continue
            values = [plan.value(t, ctx.shapes.shape) if t.name else None for t in body_node.inputs]
            try:
                emit, outs = plan_node(body_node, values, ctx.opset, ctx.shapes.shape)
            except Declined as exc:
                declined.append(str(exc))
                stays.update(id(t) for t in body_node.outputs)
                continue
            found = step_bytes(body_node, outs, sizes, ctx.shapes)
            if max(found.values(), default=0) * trip > limit:
                declined.append(f"'{body_node.outputs[0].name}' would exceed vectorize_max_bytes lifted")
                stays.update(id(t) for t in body_node.outputs)
                continue
            plan.steps.append((body_node, emit))
            plan.values.update((id(t), v) for t, v in zip(body_node.outputs, outs))
            sizes.update(found)
        plan = _keep_trailing_copies(plan, stays)
        kept = [nd for nd in body.nodes if any(id(t) in stays for t in nd.outputs)]
        if not kept:
            return Skip("no body node depends on a state: the Scan is a map (vectorize's case)")
        lifted_nodes = [nd for nd, _ in plan.steps]
        if all(any(is_op(nd, op) for op in TRIVIAL) for nd in lifted_nodes):
            why = f" ({declined[0]})" if declined else ""
            return Skip(f"nothing to hoist: every computing node depends on a state{why}")
        if not any(_worth_lifting(nd, plan) for nd in lifted_nodes):
            first = next(nd for nd in lifted_nodes if not any(is_op(nd, op) for op in TRIVIAL))
            return Skip(f"nothing worth hoisting: the per-step work that could move is elementwise only "
                        f"({first.op} '{first.outputs[0].name}'); as a new scan input it would cost as much per "
                        "step as it saves")
        lifted = {id(t) for nd in lifted_nodes for t in nd.outputs}
        frontier: dict[int, gs.Tensor] = {}
        for nd in kept:
            for t in nd.inputs:
                if id(t) in lifted:
                    frontier.setdefault(id(t), t)
        for t in body.outputs:
            if id(t) in lifted:
                frontier.setdefault(id(t), t)
        here = {id(nd) for nd in body.nodes}
        for nd in lifted_nodes:  # read by a nested graph of a node that stays (outer-scope capture)
            for t in nd.outputs:
                if any(id(reader) not in here for reader in t.outputs):
                    frontier.setdefault(id(t), t)
        for t in frontier.values():
            if plan.values[id(t)].per_step and ctx.shapes.dtype(t) is None:
                return Skip(f"the element type of '{t.name}' is unknown, so it cannot become a scan input")
        return HoistMatch(view, plan, list(frontier.values()))

    def rewrite(self, node: gs.Node, match: Match, level: GraphLevel, ctx: PassContext) -> str:
        assert isinstance(match, HoistMatch)
        graph, view, plan = level.graph, match.view, match.plan
        body = node.attrs["body"]
        n = view.num_states
        position, start, build = replacing(node, graph, ctx.names)
        order: dict = {}

        def steps() -> gs.Tensor:
            if "steps" not in order:
                # any scan input the lifted nodes read (one is: a value is per-step through it);
                # the first one may be read only by what stays in the body
                first = next(j for j in range(view.num_scan_inputs) if id(body.inputs[n + j]) in mapping)
                order["steps"] = e.length(mapping[id(body.inputs[n + first])])
            return order["steps"]

        e = LiftEmitter(build, ctx.opset, steps=steps)
        mapping: dict[int, gs.Tensor] = {}
        read = {id(t) for nd, _ in plan.steps for t in nd.inputs}
        for j in range(view.num_scan_inputs):
            element = body.inputs[n + j]
            if id(element) in plan.values and id(element) in read:
                mapping[id(element)] = to_processing_order(e, node.inputs[n + j], view, j)
        emit_nodes(plan.steps, e, mapping)
        body_build = Builder(body, ctx.names)
        new_inputs = 0
        for t in match.frontier:
            outer = mapping[id(t)]
            if plan.values[id(t)].per_step:
                shape = ctx.shapes.shape(t)
                if outer.shape is None and shape is not None:  # so later passes see the trip count
                    outer.shape = [_trip_dim(node, view, ctx)] + list(shape)
                    outer.dtype = ctx.shapes.dtype(t)
                element = body_build.variable(f"{t.name}_step", ctx.shapes.dtype(t), shape)
                body.inputs.append(element)
                node.inputs.append(outer)
                new_inputs += 1
                replacement = element
            else:
                replacement = outer
            _redirect(body, t, replacement, body_build)
        for nd, _ in plan.steps:
            detach(nd, body)
        if new_inputs:
            node.attrs["num_scan_inputs"] = view.num_scan_inputs + new_inputs
            for key in ("scan_input_axes", "scan_input_directions"):
                if key in node.attrs:
                    node.attrs[key] = list(node.attrs[key]) + [0] * new_inputs
        added = place_appended(graph, position, start)
        moved = len(plan.steps)
        return (f"hoisted {moved} body node(s) out of the loop ({added} nodes before the Scan); "
                f"{new_inputs} per-step result(s) became scan inputs; {len(body.nodes)} node(s) stay in the body")


def _worth_lifting(node: gs.Node, plan: LiftPlan) -> bool:
    """Invariant work (computed once instead of T times) always is; per-step work is when it is
    more than elementwise (a MatMul, a reduction, ...): elementwise work costs about what
    slicing its result from a new scan input costs per step."""
    if any(is_op(node, op) for op in TRIVIAL):
        return False
    per_step = any(plan.values[id(t)].per_step for t in node.outputs if t.name)
    return not per_step or not (node.op in ELEMENTWISE or node.op in ONE_WAY)


def _trip_dim(node: gs.Node, view: ScanView, ctx: PassContext):
    """The trip count as a dim: static, else the symbolic size of the first scan input's axis."""
    if view.trip_count is not None:
        return view.trip_count
    shape = ctx.shapes.shape(node.inputs[view.num_states])
    axis = view.input_axes[0]
    return shape[axis] if shape is not None and 0 <= axis < len(shape) else None


def _keep_trailing_copies(plan: LiftPlan, stays: set[int]) -> LiftPlan:
    """Identity nodes that no other lifted node reads stay in the body (free there): lifted,
    each would become a second scan input holding the same values."""
    steps = list(plan.steps)
    read: set[int] = set()
    kept = []
    for node, emit in reversed(steps):
        if is_op(node, "Identity") and not any(id(t) in read for t in node.outputs):
            stays.update(id(t) for t in node.outputs)
            continue
        read.update(id(t) for t in node.inputs)
        kept.append((node, emit))
    return LiftPlan(kept[::-1], plan.values)


def _redirect(body: gs.Graph, old: gs.Tensor, new: gs.Tensor, build: Builder) -> None:
    """Body readers of ``old`` read ``new``; a body output that was ``old`` becomes an Identity of
    ``new`` (onnxruntime mishandles a body output that is a body input or an outer value)."""
    for i, t in enumerate(body.outputs):
        if t is old:
            copy = build.variable(f"{old.name}_out", old.dtype, None if old.shape is None else list(old.shape))
            build.op("Identity", [new], outputs=[copy])
            body.outputs[i] = copy
            note_output(copy, body)
    replace_all_uses(old, new, body)  # the readers (nested bodies' included); no output lists it any more
