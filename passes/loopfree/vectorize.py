"""vectorize: a Scan that is a map becomes its body applied once to the whole sequence.

A Scan is a map when every state passes through unchanged (or there are none): then no
step depends on another. Each scan input is brought to processing order with the scan axis
first (Transpose for another axis, a reversal for a reverse input), the body is lifted with
the step axis as a leading batch axis (rules in :mod:`lift`), and each scan output is put
back on its axis and in its direction. Final states are the initial states. A body output
that does not depend on the step is repeated T times.

Memory bound: the loop holds one step's intermediates; the vectorized graph holds T of them.
Every lifted intermediate is estimated as T x its per-step size, counting each symbolic
dimension as 1 (so the bound reads "per unit" of a dynamic batch such as skl2onnx's query
rows) and the trip count as 1 when it is symbolic. Over ``vectorize_max_bytes`` (option,
default 64 MiB) a static-length Scan is split into at most MAX_CHUNKS chunks, each vectorized
on its own and concatenated; beyond that, and for a symbolic length, it is skipped with
the estimate as the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from scanopt.graph import HUGE, GraphLevel
from scanopt.pass_api import Match, PassContext, ScanPass, Skip, register_pass
from scanopt.passes.loopfree.lift import (
    DEFAULT_MAX_BYTES, Declined, LiftEmitter, LiftPlan, Value, element_value, emit_nodes, largest_intermediate,
    changing_states, needed_nodes, plan_nodes, to_processing_order, from_processing_order,
)
from scanopt.rewrite import place_appended, rebind_outputs, replacing
from scanopt.scan_view import ScanView

MAX_CHUNKS = 8


@dataclass
class VectorizeMatch(Match):
    view: ScanView
    plan: LiftPlan
    out_ranks: list[int | None]  # per-step rank of each scan output
    chunks: int  # 1: the whole sequence at once
    largest: tuple[str, int]  # (value, estimated bytes) for the report


@register_pass
class Vectorize(ScanPass):
    tunables = {"vectorize_max_bytes": (int, f"memory bound of a vectorized (or hoisted) value (default {DEFAULT_MAX_BYTES:,})")}
    name = "vectorize"
    order = 80
    form = "vectorized"
    loop_free = True
    summary = "map Scans (no state changes across steps) -> the body applied once to the whole sequence"

    def match(self, node: gs.Node, view: ScanView, level: GraphLevel, ctx: PassContext) -> Match | Skip:
        if view.batched:
            return Skip("opset-8 batched Scan: vectorize handles Scan-9+ (the upgrade pass converts it first)")
        body = node.attrs["body"]
        n = view.num_states
        changing = changing_states(body, n)
        if changing:
            i = changing[0]
            return Skip(f"state '{view.initial_states[i] or i}' changes across iterations: a recurrence, not a map")
        if ctx.opset < 10 and any(view.input_directions + view.output_directions):
            return Skip(f"reverse directions need Slice with steps (opset 10+), the model is at opset {ctx.opset}")
        roots: dict[int, Value] = {}
        for i in range(n):
            roots[id(body.inputs[i])] = Value(False, ctx.shapes.rank(body.inputs[i]))
        for j in range(view.num_scan_inputs):
            if view.input_axes[j] != 0 and view.input_ranks[j] is None:
                return Skip(f"scan input '{view.scan_inputs[j]}' on axis {view.input_axes[j]} has an unknown rank")
            element = body.inputs[n + j]
            roots[id(element)] = element_value(view, j, element, ctx.shapes)
        outputs = body.outputs[n:]
        try:
            plan = plan_nodes(needed_nodes(body, outputs), roots, ctx.opset, ctx.shapes.shape)
        except Declined as exc:
            return Skip(f"not vectorized: {exc}")
        out_ranks = []
        for k, t in enumerate(outputs):
            value = plan.value(t, ctx.shapes.shape)
            needs_rank = not value.per_step or view.output_axes[k] != 0
            if needs_rank and value.rank is None:
                return Skip(f"scan output '{view.scan_outputs[k]}': the rank of body output '{t.name}' is unknown")
            out_ranks.append(value.rank)
        name, largest = largest_intermediate(plan, view.trip_count, ctx.shapes)
        limit = ctx.options.get("vectorize_max_bytes", DEFAULT_MAX_BYTES)
        chunks = 1
        if largest > limit:
            chunks = math.ceil(largest / limit)
            if view.trip_count is None or chunks > MAX_CHUNKS:
                how = ("the length is symbolic, so it cannot be chunked" if view.trip_count is None
                       else f"it would need {chunks} chunks (at most {MAX_CHUNKS})")
                return Skip(
                    f"memory bound: '{name}' would take about {_mib(largest)} vectorized (T x its per-step size), "
                    f"over vectorize_max_bytes {_mib(limit)}; {how}"
                )
            chunks = min(chunks, view.trip_count)
        return VectorizeMatch(view, plan, out_ranks, max(chunks, 1), (name, largest))

    def rewrite(self, node: gs.Node, match: Match, level: GraphLevel, ctx: PassContext) -> str:
        assert isinstance(match, VectorizeMatch)
        graph, view, plan = level.graph, match.view, match.plan
        position, start, build = replacing(node, graph, ctx.names)
        body = node.attrs["body"]
        n = view.num_states
        chunk: dict = {}  # the current chunk's first input and, once asked for, its step count

        def steps() -> gs.Tensor:
            if "steps" not in chunk:
                chunk["steps"] = e.length(chunk["input"])
            return chunk["steps"]

        e = LiftEmitter(build, ctx.opset, steps=steps)
        scanned = [to_processing_order(e, node.inputs[n + j], view, j) for j in range(view.num_scan_inputs)]
        if not _lengths_static_and_equal(node, view, ctx):
            scanned = _same_length(e, scanned)
        varies = [any(plan.values[id(t)].per_step for t in nd.outputs if t.name) for nd, _ in plan.steps]
        invariant = [step for step, v in zip(plan.steps, varies) if not v]
        per_step = [step for step, v in zip(plan.steps, varies) if v]
        shared: dict[int, gs.Tensor] = {id(body.inputs[i]): node.inputs[i] for i in range(n)}
        emit_nodes(invariant, e, shared)
        trip = view.trip_count
        bounds = [(0, None)] if match.chunks == 1 else _chunk_bounds(trip, match.chunks)
        pieces: list[list[gs.Tensor]] = []
        for lo, hi in bounds:
            inputs = scanned if hi is None else [e.slice(x, [lo], [hi], [0]) for x in scanned]
            chunk.clear()
            chunk["input"] = inputs[0]
            mapping = dict(shared)
            mapping.update((id(body.inputs[n + j]), x) for j, x in enumerate(inputs))
            emit_nodes(per_step, e, mapping)
            pieces.append([_stacked(e, t, mapping, plan, match.out_ranks[k], ctx) for k, t in enumerate(body.outputs[n:])])
        outputs = []
        for k in range(view.num_scan_outputs):
            parts = [p[k] for p in pieces]
            stacked = parts[0] if len(parts) == 1 else e.op("Concat", parts, axis=0)
            outputs.append(from_processing_order(e, stacked, view, k, match.out_ranks[k]))
        rebind_outputs(node, list(node.inputs[:n]) + outputs, graph)
        added = place_appended(graph, position, start - 1)
        chunked = f" in {match.chunks} chunks" if match.chunks > 1 else ""
        name, size = match.largest
        return (f"vectorized{chunked}: body of {len(body.nodes)} nodes applied once to the whole sequence "
                f"({added} nodes; largest intermediate '{name}' about {_mib(size)} per unit of symbolic dims)")


def _lengths_static_and_equal(node: gs.Node, view: ScanView, ctx) -> bool:
    """True when the scan inputs' lengths are one static size (or there is one scan input)."""
    n = view.num_states
    sizes = set()
    for j in range(view.num_scan_inputs):
        shape = ctx.shapes.shape(node.inputs[n + j])
        axis = view.input_axes[j]
        if shape is None or not -len(shape) <= axis < len(shape) or not isinstance(shape[axis], int):
            return False
        sizes.add(shape[axis])
    return len(sizes) <= 1


def _same_length(e: LiftEmitter, scanned: list[gs.Tensor]) -> list[gs.Tensor]:
    """The scan inputs (processing order), each after the first checked to have its length.

    Scan fails when its scan inputs differ in length; the lifted body would broadcast a
    length of 1 against the others (or return outputs of different lengths) instead. A
    Concat on axis 1 of ``[L0 + 1, 1]`` and ``[Lj + 1, 1]`` fails exactly when the lengths
    differ (never empty: onnxruntime skips empty Concat inputs unchecked), and the input is
    reshaped to the length it gives, so the check is on the data path (a Reshape to the
    shape it has)."""
    one = e.ints("one", [1])

    def column(x: gs.Tensor) -> gs.Tensor:
        rows = e.op("Add", [e.length(x), one])
        return e.op("ConstantOfShape", [e.op("Concat", [rows, one], axis=0)])

    first = column(scanned[0])
    checked = [scanned[0]]
    for x in scanned[1:]:
        both = e.op("Concat", [first, column(x)], axis=1)
        length = e.op("Sub", [e.length(both), one])
        tail = e.slice(e.op("Shape", [x]), [1], [HUGE], [0])
        checked.append(e.op("Reshape", [x, e.op("Concat", [length, tail], axis=0)]))
    return checked


def _stacked(e: LiftEmitter, t: gs.Tensor, mapping, plan: LiftPlan, rank, ctx) -> gs.Tensor:
    """Body output ``t`` stacked over the steps (axis 0, processing order)."""
    value = mapping.get(id(t), t)
    if plan.value(t, ctx.shapes.shape).per_step:
        return value
    return e.over_steps(value, rank)


def _chunk_bounds(trip: int, chunks: int) -> list[tuple[int, int]]:
    size = math.ceil(trip / chunks)
    return [(lo, min(lo + size, trip)) for lo in range(0, trip, size)]


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB" if size >= 1 << 20 else f"{size / 1024:.1f} KiB"
