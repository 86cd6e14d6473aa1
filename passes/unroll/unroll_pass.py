"""unroll: a Scan of short static length becomes the body repeated once per step.

Handles Scan-9 and later at every nesting level (a Scan in a Loop body unrolls into
that body). The trip count must be known at optimization time (a static size on the
scan axis, e.g. a constant scan input) and at most ``unroll_max`` (option, default
DEFAULT_UNROLL_MAX, chosen from benchmarks/bench_unroll.py). Per step: each scan input
is sliced with Gather at a scalar position (reverse inputs read from the end), the
body is copied with fresh names at every nesting level (scanopt.clone; its own
initializers and Constant nodes are hoisted once), states are threaded from step to
step; each scan output is Unsqueezed on its axis and Concatenated, in reverse step
order when it prepends. Zero steps: final states are the initial states and scan
outputs are empty constants (needs a static element shape), at every opset. An opset-8
Scan is unrolled in place at opset 8, per batch item and step (:mod:`batched`); by
default only with batch 1 and no ``sequence_lens`` (otherwise measured slower than the loop;
an explicit ``unroll_max`` unrolls it anyway).
Skipped: dynamic length (and for Scan-8 a symbolic batch), over the threshold, over the
size cap; and a Scan the fuse pass turns into a native op is left to it (``defers_to``: the
chooser declines unrolling there).

Size cap: however high ``unroll_max`` is set, the unrolled graph may add at most
``unroll_max_nodes`` nodes (default DEFAULT_MAX_NODES) and ``unroll_max_bytes`` bytes of
copied constants (default DEFAULT_MAX_BYTES), estimated before anything is built, so a
trip count of 10^9 is declined at once. Every step costs the same (fresh names are O(1)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.clone import BodyInliner
from scanopt.graph import GraphLevel, walk_graphs
from scanopt.ir import OWNER
from scanopt.emit import Emitter
from scanopt.pass_api import Match, PassContext, ScanPass, Skip, register_pass
from scanopt.rewrite import Builder, place_appended, rebind_outputs, replacing
from scanopt.passes.unroll.batched import empty_scan8_outputs, unroll_scan8
from scanopt.scan_view import ScanView

# From benchmarks/bench_unroll.py on this machine (README table): onnxruntime runs the
# unrolled graph no faster than its looped Scan beyond this many steps.
DEFAULT_UNROLL_MAX = 4
DEFAULT_MAX_NODES = 100_000
DEFAULT_MAX_BYTES = 64 << 20
STEP_OVERHEAD = 3  # nodes per copy besides the body: a slice per input, an Unsqueeze per output (about)


@dataclass
class UnrollMatch(Match):
    view: ScanView
    steps: int
    empty_outputs: list[np.ndarray]  # for zero steps: one empty array per scan output
    batch: int = 1  # Scan-8: the static batch size (one body copy per item and step)
    out_dtypes: list = None  # Scan-8 with sequence_lens: element types of the scan outputs


@register_pass
class Unroll(ScanPass):
    tunables = {
        "unroll_max_nodes": (int, f"largest unrolled graph in nodes (default {DEFAULT_MAX_NODES:,})"),
        "unroll_max_bytes": (int, f"most bytes of nested constants copied by unrolling (default {DEFAULT_MAX_BYTES:,})"),
    }
    name = "unroll"
    order = 100
    form = "unrolled"
    defers_to = ("fuse",)
    summary = "short static-length Scans -> straight-line graphs (body copied once per step)"

    def match(self, node: gs.Node, view: ScanView, level: GraphLevel, ctx: PassContext) -> Match | Skip:
        steps = view.trip_count
        if steps is None:
            return Skip(f"dynamic length: {_dynamic_reason(node, view, ctx)}")
        limit = ctx.options.get("unroll_max")
        limit = DEFAULT_UNROLL_MAX if limit is None else limit
        if steps > limit:
            return Skip(f"over threshold ({steps} steps > unroll_max {limit}); raise it with --unroll-max")
        body = node.attrs["body"]
        batch = 1
        if view.batched and steps:
            batch = _static_batch(node, ctx)
            if batch is None:
                return Skip("opset-8 Scan with a symbolic batch size: unrolling copies the body per batch item")
            if (batch > 1 or view.sequence_lens) and ctx.options.get("unroll_max") is None:
                return Skip(f"not applied: opset-8 Scan with {'sequence_lens' if view.sequence_lens else f'batch {batch}'}: "
                            f"unrolled per item ({batch * steps} body copies) it measured slower than the loop (1.1-3.2x, "
                            "benchmarks/bench_unroll.py --scan8); --unroll-max N unrolls it anyway")
        too_big = _size_cap(body, steps * batch, ctx)
        if too_big:
            return Skip(too_big)
        empty = []
        if steps == 0:
            for k, element in enumerate(body.outputs[view.num_states:]):
                array = _empty_output(element, 0 if view.batched else view.output_axes[k], ctx, view.batched)
                if array is None:
                    return Skip(
                        f"zero steps and the element shape or type of scan output '{view.scan_outputs[k]}' "
                        f"is not static ({ctx.shapes.shape(element)}), so its empty value cannot be built"
                    )
                empty.append(array)
        dtypes = None
        if view.batched and view.sequence_lens and steps:
            dtypes = [ctx.shapes.dtype(t) for t in body.outputs[view.num_states:]]
            unknown = [view.scan_outputs[k] for k, d in enumerate(dtypes) if d is None]
            if unknown:
                return Skip(f"the element type of scan output '{unknown[0]}' is unknown (needed for the zeros past each length)")
        return UnrollMatch(view, steps, empty, batch, dtypes)

    def rewrite(self, node: gs.Node, match: Match, level: GraphLevel, ctx: PassContext) -> str:
        assert isinstance(match, UnrollMatch)
        graph, view, steps = level.graph, match.view, match.steps
        position, count_before, build = replacing(node, graph, ctx.names)
        body = node.attrs["body"]
        n = view.num_states
        states = list(node.inputs[:n])
        scanned = list(node.inputs[n:])
        elements: list[list[gs.Tensor]] = [[] for _ in view.scan_outputs]
        indices: dict[int, gs.Constant] = {}  # step position -> its scalar index, shared by inputs
        if view.batched:
            emit = Emitter(build, ctx.opset, domain=None)
            if steps == 0:
                values = empty_scan8_outputs(node, view, emit, match.empty_outputs)
            else:
                values = unroll_scan8(node, view, steps, match.batch, emit, ctx.names, match.out_dtypes)
            rebind_outputs(node, values, graph)
            added = place_appended(graph, position, count_before - 1)
            if steps == 0:
                return f"unrolled 0 steps: states pass through, scan outputs empty ({added} nodes added)"
            lens = ", masked by sequence_lens" if view.sequence_lens else ""
            return (f"unrolled opset-8 Scan in place: {match.batch} item(s) x {steps} steps{lens}: {added} nodes added "
                    f"(body of {len(body.nodes)} nodes copied {match.batch * steps} times)")
        inliner = BodyInliner(body, graph, ctx.names)
        for t in range(steps):
            slices = [
                _step_slice(build, x, view.input_axes[j], steps - 1 - t if view.input_directions[j] else t,
                            body.inputs[n + j], indices)
                for j, x in enumerate(scanned)
            ]
            outs = inliner.inline(states + slices, suffix=f"_t{t}")
            states = outs[:n]
            for k, value in enumerate(outs[n:]):
                elements[k].append(value)
        if steps == 0:
            outputs = [build.constant("empty", array) for array in match.empty_outputs]
        else:
            emit = Emitter(build, ctx.opset, domain=None)
            # An omitted optional output (empty outer name) is read by nobody: no stack for it.
            outputs = [
                emit.stack(values[::-1] if view.output_directions[k] else values, view.output_axes[k])
                if node.outputs[n + k].name else None
                for k, values in enumerate(elements)
            ]
        rebind_outputs(node, states + outputs, graph)
        added = place_appended(graph, position, count_before - 1)
        if steps == 0:
            return f"unrolled 0 steps: states pass through, scan outputs empty ({added} nodes added)"
        return f"unrolled {steps} steps: {added} nodes added (body of {len(body.nodes)} nodes copied {steps} times)"


def _step_slice(build: Builder, x: gs.Tensor, axis: int, position: int, element: gs.Tensor, indices: dict):
    """x at ``position`` on ``axis``, the axis removed (Gather with a scalar index), typed like
    the body input it feeds."""
    if position not in indices:
        indices[position] = build.constant(f"step{position}", np.array(position, np.int64))
    shape = None if element.shape is None else list(element.shape)
    value = build.variable(f"{element.name}_{position}", element.dtype, shape)
    return build.op("Gather", [x, indices[position]], axis=axis, outputs=[value])


def _empty_output(element: gs.Tensor, axis: int, ctx: PassContext, batched: bool = False) -> np.ndarray | None:
    """The empty scan output for zero steps, when the element's shape and type are static
    (Scan-8: [1, 0, ...], expanded to the batch later)."""
    shape = ctx.shapes.shape(element)
    dtype = ctx.shapes.dtype(element)
    if shape is None or dtype is None or not all(isinstance(d, int) for d in shape):
        return None
    shape = list(shape)
    shape.insert(axis if axis >= 0 else axis + len(shape) + 1, 0)
    if batched:
        shape.insert(0, 1)
    return np.zeros(shape, dtype)


def _static_batch(node: gs.Node, ctx: PassContext) -> int | None:
    """Scan-8's batch size when a state or scan input declares it statically."""
    for t in node.inputs[1:]:
        shape = ctx.shapes.shape(t)
        if shape and isinstance(shape[0], int):
            return shape[0]
    return None


def _size_cap(body: gs.Graph, copies: int, ctx: PassContext) -> str | None:
    """The reason the unrolled graph would be too large, or None. Counted before building:
    nodes at every nesting level and the constants of nested bodies are copied per step."""
    nodes = 0
    constant_bytes = 0
    for sub in walk_graphs(body):
        nodes += len(sub.graph.nodes)
        if sub.graph is not body:
            constant_bytes += sum(np.asarray(t.values).nbytes for t in sub.graph.tensors().values()
                                  if isinstance(t, gs.Constant) and getattr(t, OWNER, None) is sub.graph)
    max_nodes = ctx.options.get("unroll_max_nodes", DEFAULT_MAX_NODES)
    max_bytes = ctx.options.get("unroll_max_bytes", DEFAULT_MAX_BYTES)
    added = copies * (nodes + STEP_OVERHEAD)
    if added > max_nodes:
        return (f"unrolled size: {copies} copies of a {nodes}-node body would add about {added} nodes, "
                f"over unroll_max_nodes {max_nodes}")
    if copies * constant_bytes > max_bytes:
        return (f"unrolled size: {copies} copies of {constant_bytes} bytes of nested constants would exceed "
                f"unroll_max_bytes {max_bytes}")
    return None


def _dynamic_reason(node: gs.Node, view: ScanView, ctx: PassContext) -> str:
    first = len(node.inputs) - view.num_scan_inputs
    sizes = []
    for j, x in enumerate(node.inputs[first:]):
        shape = ctx.shapes.shape(x)
        axis = view.input_axes[j]
        if shape is None or axis < 0:
            return f"scan input '{x.name}' has no known shape"
        size = shape[axis]
        if not isinstance(size, int):
            return f"scan input '{x.name}' has size {size or '?'} on its scan axis {axis}"
        sizes.append(size)
    return f"scan inputs disagree on the length ({sizes})"
