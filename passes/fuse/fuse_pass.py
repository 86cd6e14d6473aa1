"""The fuse pass: match a Scan (and its reverse partner), emit the native op and rebind
the Scan's outputs to it. See the package docstring for what is fused and how."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.constexpr import ConstantFolder
from scanopt.graph import is_topologically_sorted, node_label
from scanopt.pass_api import ScanPass, Skip, register_pass
from scanopt.passes.fuse.cell_states import cell_sequence
from scanopt.passes.fuse.directions import FusePlan, _direction, _partner
from scanopt.passes.fuse.glue import FuseEmitter
from scanopt.rewrite import Builder, is_read, loop_where, rebind_outputs


class _RunState:
    """What one run of the pass shares across Scans, so its cost stays linear in the model:
    evaluated constants, each level's node ids (for partner lookup), emitted weights."""

    def __init__(self, opset: int, edits: int = 0):
        self.folder = ConstantFolder(opset)
        self.members: dict[int, tuple[gs.Graph, set[int]]] = {}
        self.weights: dict = {}  # (id(graph), dtype, shape, digest) -> gs.Constant
        self.readers: dict | None = {}  # X's Scan readers by direction (directions._partner); None: a dry run
        # ctx.edits not made by fuse's own rewrites: the look-ups above assume only fuse edits
        # (it adds no Scan); another form's rewrite in the same walk (scanopt.chooser) voids them
        self.others = edits
        self.own = 0

    def refresh(self, edits: int) -> None:
        """Forget the graph look-ups when another pass rewrote something since they were made."""
        if edits - self.own != self.others:
            self.others = edits - self.own
            self.members.clear()
            if self.readers is not None:
                self.readers.clear()

    def nodes_of(self, graph: gs.Graph) -> set[int]:
        found = self.members.get(id(graph))
        if found is None or found[0] is not graph:
            found = (graph, {id(n) for n in graph.nodes})
            self.members[id(graph)] = found
        return found[1]


@register_pass
class Fuse(ScanPass):
    tunables = {"fuse_layout": (int, "1: emit layout=1 for batch-major X (opset 14+) instead of a Transpose")}
    name = "fuse"
    order = 40
    form = "native"
    loop_free = True
    summary = "RNN/GRU/LSTM-cell Scan bodies become native RNN/GRU/LSTM ops"

    @contextmanager
    def running(self, ctx):
        self._run_state = _RunState(ctx.opset, ctx.edits)
        ctx.memo["fuse.readers"] = self._run_state.readers  # dry runs during this run share it
        try:
            yield
        finally:
            self._run_state = None
            ctx.memo.pop("fuse.readers", None)

    def _state(self, ctx) -> _RunState:
        if getattr(self, "_run_state", None) is None:  # a dry run (inspect) calls match alone
            self._run_state = _RunState(ctx.opset, ctx.edits)
            self._run_state.readers = ctx.memo.get("fuse.readers")  # None: outside a fuse pass
        return self._run_state

    def match(self, node, view, level, ctx):
        if node.name and ctx.loop_branches.get(node.name) == self.name:
            return Skip("the loop branch of fuse's run-time dispatch on the batch: not fused again")
        run = self._state(ctx)
        run.refresh(ctx.edits)
        found = _direction(node, view, level, ctx, run.folder)
        if isinstance(found, Skip):
            return found
        direction, batched, in_axis = found
        dirs = [direction]
        partner = None if view.batched else _partner(node, direction, in_axis, level, ctx, run.folder,
                                                     lambda: run.nodes_of(level.graph), run.readers)
        if partner is not None:
            dirs = sorted([direction, partner], key=lambda d: d.reverse)
        # onnxruntime 1.31 refuses layout=1 ("Batchwise recurrent operations are not supported"),
        # so a [B, T, I] input is transposed unless options["fuse_layout"] = 1 asks otherwise.
        # The per-step cell state (cell_states) is computed time-major: layout 0 then.
        layout = int(batched and in_axis == 1 and ctx.opset >= 14 and ctx.options.get("fuse_layout") == 1
                     and not any(d.cell_outputs for d in dirs))
        lens = node.inputs[0] if view.batched and view.sequence_lens else None
        plan = FusePlan(batched, in_axis, layout, lens, dirs)
        if _batch_dispatchable(plan, view):
            plan.dispatch_on = "B"
        return plan

    def rewrite(self, node, plan: FusePlan, level, ctx):
        detail = self._rewrite(node, plan, level, ctx)
        self._state(ctx).own += 1  # the caller counts it in ctx.edits: not another pass's edit
        return detail

    def _rewrite(self, node, plan: FusePlan, level, ctx):
        graph = level.graph
        top = level.parents[0] if level.parents else graph
        start = len(graph.nodes)
        b = Builder(graph, ctx.names)
        emit = FuseEmitter(b, ctx.opset, self._state(ctx).weights)
        emit.portable = bool(ctx.options.get("portable_output"))  # written for OpenVINO too (scanopt.portable)
        first = plan.dirs[0]
        cell, kind, n_dirs = first.cell, first.cell.kind, len(plan.dirs)
        x = first.x
        one = first.batch_of_one  # Scan-8 over a batch of one: fused as the Scan-9 over its item
        if one:
            x = emit.squeeze(x, [0])
        if plan.batched:
            perm = {0: None, 1: None if plan.layout else [1, 0, 2], 2: [2, 0, 1]}[plan.in_axis]
            xn = x if perm is None else b.op("Transpose", [x], perm=perm)
            state_axes, dir_axis = [plan.layout], plan.layout
        else:
            xn = x if plan.in_axis == 0 else b.op("Transpose", [x], perm=[1, 0])
            xn = emit.unsqueeze(xn, [1])
            state_axes, dir_axis = [0, 1], 0

        item = {}  # Scan-8 over a batch of one: the initial states without that batch

        def initial(kind_):
            if one:
                item[kind_] = emit.squeeze(first.initial(kind_), [0])
            return [emit.unsqueeze(item[kind_] if one else d.initial(kind_), state_axes) for d in plan.dirs]

        def weight(name, of):
            return emit.weight(f"{kind}_{name}", [(of(d.cell), d.outer) for d in plan.dirs])

        inputs = [xn, weight("W", lambda c: c.W), weight("R", lambda c: c.R), weight("B", lambda c: c.B)]
        lens = plan.sequence_lens
        batch_axis = 1 - plan.layout  # X [T, B, I] and states [D, B, H]; layout 1: [B, T, I], [B, D, H]
        if first.lengths is not None:  # the body's step mask (passes.fuse.lengths)
            lens = emit.clipped_lengths(first.lengths, xn, plan.layout)
            if first.broadcast:
                inputs[0] = emit.expand_batch(inputs[0], batch_axis, 3, emit.batch_size(lens, 0))
        parts = initial("h") + (initial("c") if kind == "LSTM" else [])  # per state kind, per direction
        if any(d.broadcast for d in plan.dirs):  # each direction's states at X's batch before they meet
            inputs[0], parts = emit.common_batch(inputs[0], parts, batch_axis, batch_axis)
            if first.lengths is not None:
                lens = emit.op("Expand", [lens, emit.batch_size(inputs[0], batch_axis)])
        inputs.append(emit.cast_int32(lens) if lens is not None else gs.Variable.empty())
        for k in range(0, len(parts), n_dirs):
            inputs.append(parts[k] if n_dirs == 1 else b.op("Concat", parts[k:k + n_dirs], axis=dir_axis))
        if kind == "LSTM":
            if any(d.cell.P is not None for d in plan.dirs):
                inputs.append(weight("P", lambda c: np.zeros(3 * c.hidden) if c.P is None else c.P))

        finals = {id(d.node): {k: d.node.outputs[i] for k, i in d.states} for d in plan.dirs}
        want_y = any(is_read(t, top) for d in plan.dirs for t in d.node.outputs[len(d.states):])
        want = [want_y] + [any(is_read(finals[id(d.node)][k], top) for d in plan.dirs)
                           for k in (("h", "c") if kind == "LSTM" else ("h",))]
        while len(want) > 1 and not want[-1]:
            want.pop()
        outs = [b.variable(f"{kind}_{name}", np.float32) if w else gs.Variable.empty()
                for name, w in zip(("Y", "Y_h", "Y_c"), want)]
        attrs = _attrs(plan, n_dirs)
        # the empty branch ends in the initial states, no select after it (glue.native): three ops
        # fewer on every call, and the form OpenVINO runs right (scanopt.portable)
        initial = all(d.guard in ("empty", None) and not d.broadcast for d in plan.dirs)
        emit.native(kind, inputs, outs, attrs, layout=plan.layout, static_nonempty=_static_nonempty(x),
                    initial_states=initial)

        per_dir = [self._direction_outputs(d, index, n_dirs, plan, outs, want, emit, x, top, item, lens, inputs)
                   for index, d in enumerate(plan.dirs)]
        for emitted in graph.nodes[start:]:  # the cell-state loop: covered by this Scan's measured form
            if emitted.op == "Scan":
                ctx.derived[node_label(emitted)] = node_label(node)
        dispatched = ""
        if plan.dispatch:
            dispatched = self._behind_batch_if(node, per_dir[0], plan, x, start, level, ctx)
        else:
            for d, values in zip(plan.dirs, per_dir):
                rebind_outputs(d.node, values, graph)
        if not is_topologically_sorted(graph):  # new nodes were appended after the Scan's readers
            graph.toposort(recurse_subgraphs=False)
        where = f"{'bidirectional' if n_dirs == 2 else ('reverse' if first.reverse else 'forward')}"
        merged = f", merged with Scan '{node_label(plan.dirs[1].node)}'" if n_dirs == 2 else ""
        notes = ", ".join(dict.fromkeys(n for d in plan.dirs for n in d.cell.notes + d.notes))
        return (f"fused into {kind} (hidden {cell.hidden}, input {cell.input_size}, {where}{merged}, activations "
                f"{', '.join(str(a) for d in plan.dirs for a in d.cell.activations)}"
                + (f", clip {cell.clip:g}" if cell.clip is not None else "")
                + (", sequence_lens" if lens is not None else "") + (f", {notes}" if notes else "") + ")" + dispatched)

    def _behind_batch_if(self, node, values, plan: FusePlan, x, start: int, level, ctx) -> str:
        """The native op and its glue (the nodes from ``start`` on) behind If(B >= the model's
        threshold) with the Scan in the then branch: the batch is unknown, and the native op is
        modelled faster only at small batches. The Scan is not fused again (ctx.loop_branches)."""
        below = plan.dispatch_below
        if not node.name:  # named as the report labelled it, for the entries of later passes
            label = node_label(node)
            node.name = ctx.names.fresh(label)
            ctx.derived[node.name] = label
        ctx.loop_branches[node.name] = self.name
        graph, axis = level.graph, 1 - plan.in_axis  # X [T, B, I] or [B, T, I]

        def large() -> gs.Tensor:
            e = FuseEmitter(Builder(graph, ctx.names, prefix=f"{node.name}_"), ctx.opset)
            batch = e.op("Gather", [e.op("Shape", [x]), e.const("batch_axis", np.int64(axis))], axis=0)
            return e.op("Greater", [batch, e.const("batch_bound", np.int64(below - 1))])

        loop_where(node, values, graph, start, ctx.names, large, "native", ctx.shapes.dtype)
        return f"; behind If(B >= {below}): the Scan from batch {below}, the native op below it (the batch is unknown)"

    @staticmethod
    def _direction_outputs(d, index, n_dirs, plan, outs, want, emit, x, top, item, lens, native):
        """New values for one Scan's outputs, taken from the shared native outputs (a Scan-8
        over a batch of one gets that batch axis back; ``item``: its initial states without it)."""
        values = Fuse._item_outputs(d, index, n_dirs, plan, outs, want, emit, x, top, item, lens, native)
        if not d.batch_of_one:
            return values
        return [v if v is None or (k < len(d.states) and d.states[k][0] == "invariant") else emit.unsqueeze(v, [0])
                for k, v in enumerate(values)]

    @staticmethod
    def _item_outputs(d, index, n_dirs, plan, outs, want, emit, x, top, item, lens, native):
        """``native``: the native op's inputs (the per-step cell state is recomputed from them)."""
        node, values = d.node, []
        for kind_, i in d.states:
            t = node.outputs[i]
            if kind_ == "counter":  # unread (directions._masked_direction)
                values.append(None)
                continue
            if kind_ == "invariant":
                values.append(node.inputs[d.first + i] if is_read(t, top) else None)
                continue
            slot = 1 if kind_ == "h" else 2
            if not is_read(t, top) or not want[slot:slot + 1] == [True]:
                values.append(None)
                continue
            # Y_h [D, B, H] (layout 1: [B, D, H]); without a batch axis also drop B.
            v = emit.pick(outs[slot], index, n_dirs, plan.layout if plan.batched else 0)
            if not plan.batched:
                v = emit.squeeze(v, [0])
            if d.guard == "empty" and not getattr(emit, "initial_in_guard", False):
                start = item[kind_] if d.batch_of_one else node.inputs[d.first + i]
                v = emit.keep_initial_if_empty(v, start, x, plan.in_axis)
                if d.broadcast:
                    v = emit.initial_batch_if_empty(v, start, x, plan.in_axis)
            elif d.guard == "lens":
                start = node.inputs[d.first + i]
                v = emit.keep_initial_where_length_0(v, start, lens)
                if d.broadcast:  # zero steps: the Scan returns the initial state at its own batch
                    v = emit.initial_batch_if_empty(emit.keep_initial_if_empty(v, start, x, plan.in_axis), start, x,
                                                    plan.in_axis)
            values.append(v)
        ys = node.outputs[len(d.states):]
        if not any(is_read(t, top) for t in ys):
            return values + [None] * len(ys)
        # Y [T, D, B, H] (layout 1: [B, T, D, H]); drop D, and B without a batch axis.
        y = emit.pick(outs[0], index, n_dirs, 1 + plan.layout)
        cells = d.cell_outputs or {}
        sequences = {"h": y}
        if any(is_read(t, top) for k, t in enumerate(ys) if k in cells):  # layout 0 (Fuse.match)
            sequences["c"] = cell_sequence(emit, d.cell, native, y, index, n_dirs, d.reverse,
                                           per_gate=emit.portable)
        for key, seq in list(sequences.items()):
            sequences[key] = seq if plan.batched else emit.squeeze(seq, [1])
        time_axis, rank = plan.layout, 3 if plan.batched else 2
        done: dict = {}
        for k, ((flip, axis), t) in enumerate(zip(d.outputs, ys)):
            if not is_read(t, top):
                values.append(None)
                continue
            what = cells.get(k, ("h", None))
            key = (flip, axis, what[0], repr(what[1]))
            if key not in done:
                v = sequences["c" if k in cells else "h"]
                if what[0] == "act":
                    v = emit.op(what[1][0], [v], **what[1][1])
                v = emit.reverse(v, time_axis) if flip else v
                done[key] = emit.move_axis(v, time_axis, axis, rank)
            values.append(done[key])
        return values


def _static_nonempty(x) -> bool:
    """Whether X's declared shape has only positive sizes (no empty batch or sequence)."""
    shape = getattr(x, "shape", None)
    return shape is not None and all(isinstance(d, int) and d > 0 for d in shape)


def _attrs(plan: FusePlan, n_dirs: int) -> dict:
    per_dir = [d.cell.attrs() for d in plan.dirs]
    attrs = dict(per_dir[0])
    for key in ("activations", "activation_alpha", "activation_beta"):
        values = [v for a in per_dir for v in a.get(key, [])]
        if values:
            attrs[key] = values
    if n_dirs == 2:
        attrs["direction"] = "bidirectional"
    elif plan.dirs[0].reverse:
        attrs["direction"] = "reverse"
    if plan.layout:
        attrs["layout"] = 1
    return attrs


def _batch_dispatchable(plan: FusePlan, view) -> bool:
    """Whether the plan can be written behind a run-time If on the batch (one Scan-9 direction
    over X [T, B, I] or [B, T, I], no lengths, batches that do not broadcast)."""
    d = plan.dirs[0]
    return (len(plan.dirs) == 1 and not view.batched and plan.batched and plan.in_axis in (0, 1)
            and plan.sequence_lens is None and d.lengths is None and not d.broadcast and not d.batch_of_one)
