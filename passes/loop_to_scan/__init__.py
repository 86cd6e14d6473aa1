"""loop_to_scan: Loops that are scans in disguise become Scans, so every Scan pass applies.

Exporters write recurrences as Loops: TorchScript's scripted for-loops (``Gather(X, i)``
per step, outputs through SequenceInsert + ConcatFromSequence or a Concat that grows each
step), tf2onnx for TF2 control flow, ``torch.while_loop``. Such a Loop iterates a known
number of times and reads the i-th slice of outer tensors: a Scan over them. The analysis
(:mod:`.analysis`) proves it; the rewrite here moves the body into a Scan:

- each read ``Gather(X, i, axis=a)`` becomes a scan input over X along a (``T-1-i``:
  scan_input_directions=1); X is cut to the trip count first unless its length provably
  is the trip count (where it is shorter the Loop fails on its Gather, so nothing that
  runs changes);
- loop-carried values stay states; a carried stack becomes a scan output along its axis;
- the Loop's own scan outputs stay scan outputs;
- where the trip count may be 0, the Scan sits behind an If that gives the Loop's
  zero-step outputs (:mod:`.zero_steps`): onnxruntime's Scan refuses zero steps.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.constexpr import ConstantFolder
from scanopt.emit import INT64_MAX, Emitter
from scanopt.graph import HUGE, GraphLevel, is_op, node_label, remove_node
from scanopt.pass_api import LoopPass, Match, PassContext, Skip, register_pass
from scanopt.rewrite import Builder, detach, place_appended, replace_all_uses, replacing

from scanopt.passes.loop_to_scan import zero_steps
from scanopt.passes.loop_to_scan.analysis import CounterTest, LoopMatch, Read, analyse, shape_dim


@register_pass
class LoopToScan(LoopPass):
    name = "loop_to_scan"
    kind = "normalizer"
    order = 10
    summary = "Loops that index outer tensors at the iteration number and stack their results -> Scans"

    def match(self, node: gs.Node, level: GraphLevel, ctx: PassContext) -> Match | Skip:
        if node.name and node.name in ctx.chosen and ctx.options.get("portable_output"):
            # --target portable: OpenVINO's CPU runtime computed some of these loops wrong once
            # written as Scans (linrec's two-pass chunk loops) and runs them right as Loops
            return Skip(f"a loop {ctx.chosen[node.name]} emitted as the form it chose: kept a Loop for "
                        "--target portable (OpenVINO runs the Loop, not every Scan made of it)")
        folder = ctx.memo.setdefault(("loop_to_scan", "folder", ctx.edits), ConstantFolder(ctx.opset))
        found = analyse(node, level.graph, ctx.opset, ctx.shapes, folder)
        if isinstance(found, LoopMatch):
            for read in found.reads:
                if is_op(read.node, "Slice") and not read.squeezed and not _proven_length(found.trip, read, ctx, folder):
                    return Skip(f"Slice '{read.node.name}' reads row i of '{read.source.name}', whose length is not provably "
                                "the trip count: past its end a Slice gives an empty row where a Gather fails")
        if isinstance(found, LoopMatch) and ctx.opset < 10:
            if any(not _proven_length(found.trip, r, ctx, folder) for r in found.reads):
                return Skip("opset 9: a scanned tensor's length is not provably the trip count, and Slice "
                            "takes a computed end only from opset 10")
        emitted = bool(node.name) and node.name in ctx.chosen  # a form's own chunk loop: it runs where its form does
        if isinstance(found, LoopMatch) and not emitted and zero_steps.may_run_zero_steps(
                found, folder, lambda read: _proven_length(found.trip, read, ctx, folder)):
            found.zero_steps = zero_steps.plan(node, found, ctx)  # None: not known, no guard
        return found

    def rewrite(self, node: gs.Node, match: Match, level: GraphLevel, ctx: PassContext) -> str:
        assert isinstance(match, LoopMatch)
        folder = ConstantFolder(ctx.opset)
        graph, body = level.graph, node.attrs["body"]
        trip = match.trip
        n_carried = len(node.inputs) - 2
        position, start, outer = replacing(node, graph, ctx.names)
        inner = Builder(body, ctx.names)
        emit = Emitter(outer, ctx.opset)
        count = match.count
        if count is not None and not count.is_plain(folder):
            trip = _trip_count(count, emit, ctx)
        # a trip count from data may be negative (the Loop then runs zero steps, a Slice end
        # of -2 would keep all but 2 rows): clamped at 0 unless provably not negative
        clamp = count is None and not _never_negative(trip, folder)

        # Scan inputs: one per (tensor, axis, direction); the first read's output names the step's slice.
        groups: dict[tuple, list[Read]] = {}
        for read in match.reads:
            key = (id(read.node),) if read.index is not None else (id(_unsliced(read.source, folder)), read.axis, read.reverse)
            groups.setdefault(key, []).append(read)
        elements, sources, axes, directions = [], [], [], []
        cut = gathered = 0
        for read in match.reads:  # loop-invariant sources move out, before the Scan
            for moved in read.invariant:
                if any(moved is n for n in body.nodes):
                    remove_node(body, moved)
                    graph.nodes.append(moved)
                    for t in moved.outputs:
                        _typed(t, ctx)
        top = level.depth == 0 and not (node.name and node.name in ctx.chosen)  # a Loop of the model's top graph
        for reads in groups.values():
            first = reads[0]
            read_at = (_unsliced(first.source, folder).name, first.axis)
            if top and read_at not in ctx.loop_reads:  # verification probes it where it is a graph input
                ctx.loop_reads.append(read_at)  # (scanopt.scan_view.top_scanned_inputs); x of x[:, i] too
            element = _element(first, inner, ctx)
            for read in reads:
                out = read.node.outputs[0]
                detach(read.node, body)
                if read.keeps_axis:
                    replace_all_uses(out, Emitter(inner, ctx.opset).unsqueeze(element, [read.axis]), body)
                elif out is not element:
                    replace_all_uses(out, element, body)
            source = _unsliced(first.source, folder)
            if first.index is not None:
                source = _gathered(first, _trip_1d(trip, outer, emit, ctx, folder, clamp), emit, ctx)
                gathered += 1
            elif not _proven_length(trip, first, ctx, folder):
                ends = _trip_1d(trip, outer, emit, ctx, folder, clamp)
                source = outer.op("Slice", [_typed(source, ctx), emit.ints("zero", [0]), ends, emit.ints("axis", [first.axis])],
                                  dtype=source.dtype)
                rank = ctx.shapes.rank(first.source)
                length = _static_trip(trip, folder)
                length = None if length is None else max(length, 0)
                source.shape = None if rank is None else [d if k != first.axis else length
                                                          for k, d in enumerate(ctx.shapes.shape(first.source))]
                cut += 1
            elements.append(element)
            sources.append(source)
            axes.append(first.axis)
            directions.append(1 if first.reverse else 0)

        _drop_dead([h for r in match.reads for h in r.helpers], body)

        # The body: states, then the scan inputs; states, the Loop's scan outputs, the stacks.
        stack_values = []
        for stack in match.stacks:
            grown = stack.grower.inputs[1]
            detach(stack.grower, body)
            if stack.finisher is None and not grown.outputs and grown.inputs:  # the row's Unsqueeze
                detach(grown.inputs[0], body)
            stack_values.append(stack.value)
        for k in match.states:
            _type_state(node.inputs[2 + k], body.inputs[2 + k], body.outputs[1 + k], ctx)
        state_outputs = [body.outputs[1 + k] for k in match.states]
        body_outputs = state_outputs + list(body.outputs[1 + n_carried:]) + stack_values
        body.inputs[:] = [body.inputs[2 + k] for k in match.states] + elements
        body.outputs[:] = _distinct(body_outputs, inner)
        _drop_dead(match.cond_nodes, body)  # the condition, and a counter test's increment
        _fold_static_dims(body, inner, ctx, folder)

        # The Scan, in the Loop's place.
        stack_results, merges = [], []
        for stack in match.stacks:
            if stack.finisher is not None:
                detach(stack.finisher, graph)
            if stack.merge:
                stacked = outer.variable("stacked", dtype=stack.result.dtype)
                merges.append((stacked, stack))
                stack_results.append(stacked)
            else:
                stack_results.append(stack.result)
        inputs = [node.inputs[2 + k] for k in match.states] + sources
        outputs = [node.outputs[k] for k in match.states] + list(node.outputs[n_carried:]) + stack_results
        n_loop_outs = len(node.outputs) - n_carried
        attrs = {"body": body, "num_scan_inputs": len(sources)}
        if any(axes):
            attrs["scan_input_axes"] = axes
        if any(directions):
            attrs["scan_input_directions"] = directions
        out_axes = [0] * n_loop_outs + [s.axis for s in match.stacks]
        if any(out_axes):
            attrs["scan_output_axes"] = out_axes
        for t in outputs + [o for n in body.nodes for o in n.outputs]:  # later passes read types off tensors
            _typed(t, ctx)
        label = node_label(node)
        final = node.outputs[count.slot] if count is not None else None
        detach(node, graph)
        scan = gs.Node("Scan", name=node.name, attrs=attrs, inputs=inputs, outputs=outputs)
        if match.zero_steps is not None:
            zero_steps.guard(scan, outputs, match.zero_steps, sources[0], axes[0], outer, emit, label,
                             later=tuple(stacked for stacked, _ in merges))
        else:
            graph.nodes.append(scan)
        if final is not None and (final.outputs or any(o is final for o in graph.outputs)):
            _final_counter(count, trip if not count.is_plain(folder) else _trip_count(count, emit, ctx), final, emit, ctx)
        for stacked, stack in merges:  # torch.cat(outs): [.., T, k, ..] -> [.., T*k, ..]
            shape = outer.op("Shape", [stacked], dtype=np.int64)
            head = outer.op("Slice", [shape, emit.ints("start", [0]), emit.ints("end", [stack.axis])], dtype=np.int64)
            tail = outer.op("Slice", [shape, emit.ints("start", [stack.axis + 2]), emit.ints("end", [INT64_MAX])],
                            dtype=np.int64)
            pair = outer.op("Slice", [shape, emit.ints("start", [stack.axis]), emit.ints("end", [stack.axis + 2])],
                            dtype=np.int64)
            product = outer.op("ReduceProd", [pair], keepdims=1, dtype=np.int64)  # T*k, not -1: Reshape refuses
            merged = outer.op("Concat", [head, product, tail], axis=0, dtype=np.int64)  # -1 when a dim is 0
            outer.op("Reshape", [stacked, merged], outputs=[stack.result])
        place_appended(graph, position, start - 1)
        return _describe(label, match, len(sources), cut, gathered)


def _trip_count(count: CounterTest, emit: Emitter, ctx: PassContext) -> gs.Tensor:
    """A counter test's trip count, int64: ``min(M, max(0, T + inclusive - s))``, computed
    as ``Max(T, b) - b`` with b = s - inclusive, which cannot overflow (s ≥ 0, and b = -1
    only for ``<=``, whose T the analysis proved below the maximum)."""
    bound = _typed(count.bound, ctx)
    if bound.dtype != np.int64:
        bound = emit.op("Cast", [bound], to=onnx.TensorProto.INT64, dtype=np.int64)
    base = emit.const("counter_base", np.int64(count.start - int(count.inclusive)))
    trip = emit.op("Sub", [_int64_extreme(emit, "Max", bound, base), base], dtype=np.int64)
    if count.limit is not None:  # M < 0 runs the Loop zero times too
        limit = _typed(count.limit, ctx)
        if limit.dtype != np.int64:
            limit = emit.op("Cast", [limit], to=onnx.TensorProto.INT64, dtype=np.int64)
        trip = _int64_extreme(emit, "Max", _int64_extreme(emit, "Min", trip, limit), emit.const("zero", np.int64(0)))
    return trip


def _int64_extreme(emit: Emitter, op: str, a: gs.Tensor, b: gs.Tensor) -> gs.Tensor:
    """``Max``/``Min`` of two int64 values: Max and Min take integers only from opset 12;
    before, ``Where(Less(a, b), ...)`` (Less and Where take int64 from opset 9)."""
    if emit.opset >= 12:
        return emit.op(op, [a, b], dtype=np.int64)
    less = emit.op("Less", [a, b], dtype=np.bool_)
    return emit.op("Where", [less, b, a] if op == "Max" else [less, a, b], dtype=np.int64)


def _final_counter(count: CounterTest, trip: gs.Tensor, final: gs.Tensor, emit: Emitter, ctx: PassContext) -> None:
    """The counter's value after the Loop, which a reader still needs: start + trip count,
    in the counter's type (it never overflows: every value it takes is at most T)."""
    value = emit.op("Add", [trip, emit.const("counter_start", np.int64(count.start))], dtype=np.int64)
    value = emit.op("Reshape", [value, emit.ints("scalar", [])], dtype=np.int64)
    dtype = _typed(final, ctx).dtype
    if dtype is not None and np.dtype(dtype) != np.int64:
        emit.op("Cast", [value], to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), outputs=[final])
    else:
        emit.op("Identity", [value], outputs=[final])


def _never_negative(trip: gs.Tensor, folder: ConstantFolder) -> bool:
    """A shape dim, or a constant ≥ 0."""
    value = folder.scalar(trip)
    return shape_dim(trip, folder) is not None or (value is not None and value >= 0)


def _trip_1d(trip: gs.Tensor, outer: Builder, emit: Emitter, ctx: PassContext, folder: ConstantFolder,
             clamp: bool = False) -> gs.Tensor:
    """The trip count as int64 [1] (a Slice end, an arange length), at least 0 with ``clamp``.
    A constant one (TorchScript's static ``range(n)``) is written as a constant, so shape
    inference gives the cut inputs their length and the Scan its static dims (the cost policy
    measures a static Scan; a computed end left every dim unknown)."""
    count = _static_trip(trip, folder)
    if count is not None:
        return emit.ints("trip", [max(count, 0) if clamp else count])
    _typed(trip, ctx)
    ends = trip if trip.dtype in (None, np.int64) else outer.op("Cast", [trip], to=7, dtype=np.int64)
    if clamp:
        ends = _int64_extreme(emit, "Max", ends, emit.const("zero", np.int64(0)))
    return outer.op("Reshape", [ends, emit.ints("one", [1])], dtype=np.int64)


def _static_trip(trip: gs.Tensor, folder: ConstantFolder) -> int | None:
    """The trip count when it is a constant (folded from static shapes or written so), else None."""
    value = folder.scalar(trip)
    return int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else None


def _gathered(read: Read, trip: gs.Tensor, emit: Emitter, ctx: PassContext) -> gs.Tensor:
    """The rows the Loop reads at ``c ± i``, gathered at once: ``Gather(X, c ± arange(M))``.
    Row k is ``Gather(X, c ± k)``, the Loop's read at step k, whatever M is (the trip count
    is the Loop's own), with Gather's negative-index wrap and its failure on an index out of
    range, so the Scan runs exactly when the Loop does and reads the same rows."""
    index = read.index
    steps = emit.arange(trip, dtype=np.int64)
    if index.scale == -1:
        steps = emit.op("Neg", [steps], dtype=np.int64)
    if index.const:
        steps = emit.op("Add", [steps, emit.const("offset", np.int64(index.const))], dtype=np.int64)
    for coefficient, term in index.terms:
        scalar = emit.op("Reshape", [term, emit.ints("scalar", [])], dtype=np.int64)
        steps = emit.op("Add" if coefficient > 0 else "Sub", [steps, scalar], dtype=np.int64)
    source = _typed(read.source, ctx)
    rows = emit.op("Gather", [source, steps], axis=read.axis, dtype=source.dtype)
    shape = ctx.shapes.shape(read.source)
    rows.shape = None if shape is None else [d if k != read.axis else None for k, d in enumerate(shape)]
    return rows


def _element(read: Read, inner: Builder, ctx: PassContext) -> gs.Tensor:
    """The body input holding the step's slice: the read's own output when it drops the
    axis (its name, type and shape stay known), else a new value."""
    shape = ctx.shapes.shape(read.source)
    sliced = None if shape is None else [d for i, d in enumerate(shape) if i != read.axis]
    dtype = _typed(read.source, ctx).dtype or _typed(read.node.outputs[0], ctx).dtype
    if read.keeps_axis:
        return inner.variable(f"{read.source.name}_step", dtype=dtype, shape=sliced)
    element = read.node.outputs[0]
    element.dtype = element.dtype or dtype
    if element.shape is None and sliced is not None:
        element.shape = sliced
    return element


def _proven_length(trip: gs.Tensor, read: Read, ctx: PassContext, folder: ConstantFolder) -> bool:
    """True when the trip count is the length of ``read.source`` along its axis."""
    dim = shape_dim(trip, folder)
    if dim is not None and (dim[0], dim[1]) == _dim_origin(read.source, read.axis, ctx, folder):
        return True
    value = folder.value(trip)
    shape = ctx.shapes.shape(read.source)
    if value is None or value.size != 1 or shape is None or read.axis >= len(shape):
        return False
    return isinstance(shape[read.axis], (int, np.integer)) and int(shape[read.axis]) == int(value.reshape(-1)[0])


def _fold_static_dims(body: gs.Graph, inner: Builder, ctx: PassContext, folder: ConstantFolder) -> None:
    """``Gather(Shape(t), k)`` becomes a constant where dim k of t is static. TorchScript
    computes ``chunk`` bounds so inside the loop (``Shape(gates)[1] / 4``); in a Scan body
    the bounds then fold, and fusion sees constant gate slices."""
    for node in list(body.nodes):
        if not is_op(node, "Gather") or node.attrs.get("axis", 0) != 0 or len(node.inputs) != 2:
            continue
        shape_node = node.inputs[0].inputs[0] if len(node.inputs[0].inputs) == 1 else None
        index = folder.value(node.inputs[1])
        if shape_node is None or not is_op(shape_node, "Shape") or index is None or index.dtype.kind not in "iu":
            continue
        dims = ctx.shapes.shape(shape_node.inputs[0])
        if dims is None:
            continue
        start = int(shape_node.attrs.get("start", 0))
        end = shape_node.attrs.get("end")
        dims = dims[start:] if end is None else dims[start:int(end)]
        picked = [dims[int(k)] if -len(dims) <= int(k) < len(dims) else None for k in index.reshape(-1)]
        if not all(isinstance(d, (int, np.integer)) for d in picked):
            continue
        value = np.asarray(picked, np.int64).reshape(index.shape)
        out = node.outputs[0]
        replace_all_uses(out, inner.constant("static_dim", value), body)
        detach(node, body)
        if not any(len(t.outputs) for t in shape_node.outputs):
            detach(shape_node, body)


def _drop_dead(nodes: list[gs.Node], body: gs.Graph) -> None:
    """Detach the index arithmetic nobody reads any more (it read the counter, now gone)."""
    pending = list(nodes)
    while pending:
        dead = [n for n in pending if n.outputs and not any(len(t.outputs) for t in n.outputs)]
        if not dead:
            break
        for n in dead:
            detach(n, body)
        pending = [n for n in pending if n.outputs]


def _dim_origin(t: gs.Tensor, axis: int, ctx: PassContext, folder: ConstantFolder) -> tuple:
    """(X, k): the axis of an earlier tensor that ``t``'s ``axis`` has the length of, through
    whole-tensor Slices and Gathers at a scalar index (``x[i]`` keeps the other axes)."""
    while True:
        base = _unsliced(t, folder)
        node = base.inputs[0] if len(base.inputs) == 1 else None
        if node is None or not is_op(node, "Gather") or ctx.shapes.rank(node.inputs[1]) != 0:
            return base, axis
        gathered = int(node.attrs.get("axis", 0))
        if gathered < 0:
            rank = ctx.shapes.rank(node.inputs[0])
            if rank is None:
                return base, axis
            gathered += rank
        t, axis = node.inputs[0], axis + (axis >= gathered)


def _unsliced(t: gs.Tensor, folder: ConstantFolder) -> gs.Tensor:
    """``t`` seen through Identity and whole-tensor Slices (start 0, end past the end, step 1),
    which keep every length: TorchScript writes ``x[:, i]`` as such a Slice, then a Gather."""
    while len(t.inputs) == 1 and t.inputs[0].op in ("Identity", "Slice"):
        node = t.inputs[0]
        if node.op == "Slice":
            bounds = [folder.value(x) for x in node.inputs[1:3]] + [folder.value(x) for x in node.inputs[4:5]]
            if len(node.inputs) < 3 or any(b is None for b in bounds):
                break
            starts, ends = bounds[0].reshape(-1), bounds[1].reshape(-1)
            steps = bounds[2].reshape(-1) if len(bounds) > 2 else np.ones_like(starts)
            if not ((starts == 0).all() and (ends >= HUGE).all() and (steps == 1).all()):
                break
        t = node.inputs[0]
    return t


def _typed(t: gs.Tensor, ctx: PassContext) -> gs.Tensor:
    """Give ``t`` the element type and shape inference found, where gs has none (passes
    after this one read them from the tensor)."""
    elem, shape = ctx.shapes.type_of(t.name)
    if t.dtype is None and elem:
        t.dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    if t.shape is None and shape is not None:
        t.shape = shape
    return t


def _type_state(initial: gs.Tensor, inside: gs.Tensor, new: gs.Tensor, ctx: PassContext) -> None:
    """A state's body input typed where the exporter left it open (onnxscript does): the
    initial value's type, each dim kept where the step's new value has it too (all open
    where the new value's shape is unknown: a hint for later passes, which verification
    checks like any rewrite)."""
    _typed(inside, ctx)
    if inside.dtype is None:
        inside.dtype = _typed(initial, ctx).dtype
    if inside.shape is None:
        before, after = ctx.shapes.shape(initial), ctx.shapes.shape(_typed(new, ctx))
        if before is not None and after is None:
            inside.shape = [None] * len(before)
        elif before is not None and len(before) == len(after):
            inside.shape = [a if a == b else None for a, b in zip(before, after)]


def _distinct(outputs: list[gs.Tensor], inner: Builder) -> list[gs.Tensor]:
    """Body outputs with a repeated value, or one no body node computes (a body input, an
    outer value), written through an Identity: one value per slot, and onnxruntime
    miscomputes a Scan body output that is a body input."""
    made = {id(o) for n in inner.graph.nodes for o in n.outputs}
    seen, result = set(), []
    for t in outputs:
        if id(t) in seen or id(t) not in made:
            t = inner.op("Identity", [t], dtype=t.dtype, shape=t.shape)
        seen.add(id(t))
        result.append(t)
    return result


def _describe(label: str, match: LoopMatch, n_inputs: int, cut: int, gathered: int) -> str:
    parts = [f"{n_inputs} scan input(s)", f"{len(match.states)} state(s)"]
    if match.stacks:
        kinds = sorted({("SequenceInsert, concatenated" if s.merge else "SequenceInsert") if s.finisher is not None
                        else "growing Concat" for s in match.stacks})
        parts.append(f"{len(match.stacks)} stacked output(s) from {' and '.join(kinds)}")
    if any(r.reverse for r in match.reads):
        parts.append("reversed reads")
    if match.count is not None:
        count = match.count
        test = f"c + 1 {'<=' if count.inclusive else '<'} {count.bound.name} from c = {count.start}"
        parts.append(f"bounded by a counter test ({test}{' and the trip count' if count.limit is not None else ''})")
    if cut:
        parts.append(f"{cut} input(s) cut to the trip count")
    if gathered:
        shown = ", ".join(f"{r.source.name}[{r.index.describe()}]" for r in match.reads if r.index is not None)
        parts.append(f"{gathered} input(s) gathered at the Loop's indices ({shown})")
    return "Loop -> Scan: " + ", ".join(parts)
