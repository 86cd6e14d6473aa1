"""fuse: a Scan whose body is an RNN, GRU or LSTM cell becomes the native op.

Handles Scans at any nesting level with one scan input x, one recurrent state (RNN, GRU)
or two (LSTM: h and the cell state c) and any number of loop-invariant states; bodies
with a batch axis (x [B, I], h [B, H]) or without (x [I], h [H]); any scan axis; every
input/output direction. The cell is recognized by :mod:`scanopt.cells` (algebra, not node
order); weights come out in ONNX layout and gate order. The Scan is replaced by the
native op plus the glue around it: X to [T, B, I] (``layout=1`` for [B, T, I] only at
opset 14+ with the option ``fuse_layout=1``: onnxruntime 1.31 rejects layout=1), Y
back to each scan output's axis, reversed where the output runs against the input (an
appending output of a reverse scan lists states in processing order; the native op
aligns them with input time), Y_h / Y_c to the final states. A forward and a reverse
Scan over the same X with compatible cells merge into one bidirectional op.

Exactness details: a zero-length sequence leaves a Scan's states at their initial
values while the native ops return zeros, so a final state whose trip count is not
statically >= 1 is selected by T > 0. Scan-8 is fused at its opset (8): sequence_lens
becomes the native op's (int32) sequence_lens; final states of length-0 items, where the
native op leaves exact zeros, become ``Y_h + h0 ⊙ (len == 0)`` (opset 8 has no Where;
exact for finite initial states). A Scan-8 reverse scan output needs ReverseSequence
(opset 10) and is declined.

Declines (with the reason) anything else: other scan outputs, a non-float32 cell, batch
sizes of x and the states that cannot be proven equal (a size-1 x would broadcast in
the Scan but not in the native op), reversals needing Slice steps before opset 10.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.cells import Cell, Sum, recognize
from scanopt.errors import ScanoptError
from scanopt.graph import dtype_of, is_op, is_topologically_sorted, node_label
from scanopt.emit import INT64_MAX, Emitter
from scanopt.pass_api import Match, ScanPass, Skip, register_pass
from scanopt.pattern import NoMatch, describe, resolve
from scanopt.rewrite import Builder, is_read, rebind_outputs
from scanopt.scan_view import ScanView

@dataclass
class Direction:
    """One Scan as one direction of the native op."""

    node: gs.Node
    cell: Cell
    reverse: bool
    states: list[tuple[str, int]]  # per Scan state: ("h" | "c" | "invariant", state index)
    outputs: list[tuple[bool, int]]  # per scan output: (reversed against the native Y, axis)
    guard: str | None  # final states need: "empty" the zero-length select, "lens" the length-0 items' one
    first: int = 0  # position of the first state among the node's inputs (Scan-8: 1)

    def outer(self, tensor: gs.Tensor) -> gs.Tensor:
        """The value a run-time weight read by the body has outside: a loop-invariant
        state's initial value, else the enclosing graph's value itself."""
        body = self.node.attrs["body"]
        for i, t in enumerate(body.inputs[:len(self.states)]):
            if t is tensor:
                return self.node.inputs[self.first + i]
        return tensor

    def initial(self, kind: str) -> gs.Tensor:
        """The outer initial value of state ``kind`` ("h" or "c")."""
        return self.node.inputs[self.first + dict(self.states)[kind]]


@dataclass
class FusePlan(Match):
    batched: bool  # the outer states have a batch axis ([B, H]); X is [.., B, .., I]
    in_axis: int  # of X, with batched X of rank 3 (Scan-8: 1)
    layout: int
    sequence_lens: gs.Tensor | None
    dirs: list[Direction]  # one, or forward then reverse


@register_pass
class Fuse(ScanPass):
    name = "fuse"
    summary = "RNN/GRU/LSTM-cell Scan bodies become native RNN/GRU/LSTM ops"

    def match(self, node, view, level, ctx):
        found = _direction(node, view, level, ctx)
        if isinstance(found, Skip):
            return found
        direction, batched, in_axis = found
        dirs = [direction]
        partner = None if view.batched else _partner(node, direction, in_axis, level, ctx)
        if partner is not None:
            dirs = sorted([direction, partner], key=lambda d: d.reverse)
        # onnxruntime 1.31 refuses layout=1 ("Batchwise recurrent operations are not supported"),
        # so a [B, T, I] input is transposed unless options["fuse_layout"] = 1 asks otherwise.
        layout = int(batched and in_axis == 1 and ctx.opset >= 14 and ctx.options.get("fuse_layout") == 1)
        lens = node.inputs[0] if view.batched and view.sequence_lens else None
        return FusePlan(batched, in_axis, layout, lens, dirs)

    def rewrite(self, node, plan: FusePlan, level, ctx):
        graph = level.graph
        top = level.parents[0] if level.parents else graph
        b = Builder(graph, ctx.names)
        emit = _Emitter(b, ctx.opset)
        first = plan.dirs[0]
        cell, kind, n_dirs = first.cell, first.cell.kind, len(plan.dirs)
        x = first.node.inputs[-1]
        if plan.batched:
            perm = {0: None, 1: None if plan.layout else [1, 0, 2], 2: [2, 0, 1]}[plan.in_axis]
            xn = x if perm is None else b.op("Transpose", [x], perm=perm)
            state_axes, dir_axis = [plan.layout], plan.layout
        else:
            xn = x if plan.in_axis == 0 else b.op("Transpose", [x], perm=[1, 0])
            xn = emit.unsqueeze(xn, [1])
            state_axes, dir_axis = [0, 1], 0

        def initial(kind_):
            parts = [emit.unsqueeze(d.initial(kind_), state_axes) for d in plan.dirs]
            return parts[0] if n_dirs == 1 else b.op("Concat", parts, axis=dir_axis)

        def weight(name, of):
            return emit.weight(f"{kind}_{name}", [(of(d.cell), d.outer) for d in plan.dirs])

        inputs = [xn, weight("W", lambda c: c.W), weight("R", lambda c: c.R), weight("B", lambda c: c.B)]
        inputs.append(emit.cast_int32(plan.sequence_lens) if plan.sequence_lens is not None else gs.Variable.empty())
        inputs.append(initial("h"))
        if kind == "LSTM":
            inputs.append(initial("c"))
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
        b.op(kind, inputs, outputs=outs, **attrs)

        for index, d in enumerate(plan.dirs):
            values = self._direction_outputs(d, index, n_dirs, plan, outs, want, emit, x, top)
            rebind_outputs(d.node, values, graph)
        if not is_topologically_sorted(graph):  # new nodes were appended after the Scan's readers
            graph.toposort(recurse_subgraphs=False)
        where = f"{'bidirectional' if n_dirs == 2 else ('reverse' if first.reverse else 'forward')}"
        merged = f", merged with Scan '{node_label(plan.dirs[1].node)}'" if n_dirs == 2 else ""
        notes = ", ".join(dict.fromkeys(n for d in plan.dirs for n in d.cell.notes))
        return (f"fused into {kind} (hidden {cell.hidden}, input {cell.input_size}, {where}{merged}, activations "
                f"{', '.join(str(a) for d in plan.dirs for a in d.cell.activations)}"
                + (f", clip {cell.clip:g}" if cell.clip is not None else "")
                + (", sequence_lens" if plan.sequence_lens is not None else "") + (f", {notes}" if notes else "") + ")")

    @staticmethod
    def _direction_outputs(d, index, n_dirs, plan, outs, want, emit, x, top):
        """New values for one Scan's outputs, taken from the shared native outputs."""
        node, values = d.node, []
        for kind_, i in d.states:
            t = node.outputs[i]
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
            if d.guard == "empty":
                v = emit.keep_initial_if_empty(v, node.inputs[d.first + i], x, plan.in_axis)
            elif d.guard == "lens":
                v = emit.keep_initial_where_length_0(v, node.inputs[d.first + i], plan.sequence_lens)
            values.append(v)
        ys = node.outputs[len(d.states):]
        if not any(is_read(t, top) for t in ys):
            return values + [None] * len(ys)
        # Y [T, D, B, H] (layout 1: [B, T, D, H]); drop D, and B without a batch axis.
        y = emit.pick(outs[0], index, n_dirs, 1 + plan.layout)
        if not plan.batched:
            y = emit.squeeze(y, [1])
        time_axis, rank = plan.layout, 3 if plan.batched else 2
        done: dict = {}
        for (flip, axis), t in zip(d.outputs, ys):
            if not is_read(t, top):
                values.append(None)
                continue
            if (flip, axis) not in done:
                v = emit.reverse(y, time_axis) if flip else y
                done[(flip, axis)] = emit.move_axis(v, time_axis, axis, rank)
            values.append(done[(flip, axis)])
        return values


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


def _direction(node, view, level, ctx):
    """(Direction, batched, in_axis) for one Scan, or Skip(reason)."""
    if view.num_scan_inputs != 1:
        return Skip(f"{view.num_scan_inputs} scan inputs; the native ops read one sequence X")
    body = node.attrs["body"]
    n = view.num_states
    x = body.inputs[n]
    if dtype_of(x) != np.float32:
        return Skip(f"the scan input is {dtype_of(x)}; only float32 cells are fused "
                    "(onnxruntime has no double GRU/LSTM kernel)")
    ins, outs = body.inputs[:n], body.outputs[:n]
    invariant = [i for i in range(n) if resolve(outs[i]) is ins[i]]
    recurrent = [i for i in range(n) if i not in invariant]
    try:
        cell = recognize(x, [(ins[i], outs[i]) for i in recurrent], ctx.shapes.rank, body)
    except NoMatch as exc:
        return Skip(f"not fused: {exc}")
    roles = {id(cell.h): "h", id(cell.c): "c"}
    states = [("invariant", i) if i in invariant else (roles[id(ins[i])], i) for i in range(n)]
    h_out = resolve(outs[next(i for kind, i in states if kind == "h")])
    c_out = resolve(outs[next(i for kind, i in states if kind == "c")]) if cell.c is not None else None
    for k, y in enumerate(body.outputs[n:]):
        if resolve(y) is c_out:
            return Skip(f"scan output {k} is the cell state; LSTM's Y holds only the hidden state")
        if resolve(y) is not h_out:
            return Skip(f"scan output {k} is {describe(resolve(y))}, not the hidden state; the native op cannot produce it")

    rank = ctx.shapes.rank(x)
    state_ranks = {ctx.shapes.rank(ins[i]) for kind, i in states if kind != "invariant"}
    if rank not in (1, 2) or state_ranks != {rank} or (view.batched and rank != 1):
        return Skip(f"x has rank {rank} and the states {sorted(state_ranks, key=str)} in the body; "
                    "fused are [B, I] with [B, H] and [I] with [H] (Scan-8: [I] with [H])")
    top = level.parents[0] if level.parents else level.graph
    reverse = bool(view.input_directions[0])
    finals_read = any(is_read(node.outputs[i], top) for kind, i in states if kind != "invariant")
    ys_read = any(is_read(t, top) for t in node.outputs[n:])
    if view.batched:  # Scan-8: X [B, T, I], states [B, H], outputs [B, T, H]
        if reverse and ys_read:
            return Skip("Scan-8 reverse scan outputs need ReverseSequence (opset 10) to reorder")
        guard = _guard(finals_read, view)
        if view.sequence_lens and finals_read:
            guard = "lens"
        outputs = [(reverse, 1) for _ in view.output_axes]
        return Direction(node, cell, reverse, states, outputs, guard, first=1), True, 1
    if rank == 2:
        problem = _batch_problem(node, view, ctx, [i for kind, i in states if kind != "invariant"])
        if problem:
            return Skip(problem)
    in_axis = view.input_axes[0] % (rank + 1)
    out_axes = [a % (rank + 1) for a in view.output_axes]
    outputs = [(bool(d) != reverse, a) for d, a in zip(view.output_directions, out_axes)]
    if ctx.opset < 10 and any(flip for (flip, _), t in zip(outputs, node.outputs[n:]) if is_read(t, top)):
        return Skip("an output runs against the input direction; reversing it needs Slice steps (opset 10+)")
    return Direction(node, cell, reverse, states, outputs, _guard(finals_read, view)), rank == 2, in_axis


def _guard(finals_read, view) -> str | None:
    """A Scan over zero steps returns its initial states; the native ops return zeros."""
    return "empty" if finals_read and not (view.trip_count and view.trip_count >= 1) else None


def _partner(node, direction, in_axis, level, ctx) -> Direction | None:
    """A Scan over the same X and axis in the other direction, with a cell one native op can
    run beside this one (same kind, sizes, clip, linear_before_reset)."""
    x = node.inputs[-1]
    for other in level.graph.nodes:
        if other is node or not is_op(other, "Scan") or other.inputs[-1] is not x:
            continue
        if ("fuse", node_label(other)) in ctx.denied:
            continue
        try:
            view = ScanView.from_gs(other, ctx.opset, ctx.shapes)
        except ScanoptError:
            continue
        found = _direction(other, view, level, ctx)
        if isinstance(found, Skip):
            continue
        d, _, axis = found
        a, c = direction.cell, d.cell
        if (axis == in_axis and d.reverse != direction.reverse and a.kind == c.kind and a.hidden == c.hidden
                and a.input_size == c.input_size and a.clip == c.clip and a.linear_before_reset == c.linear_before_reset):
            return d
    return None


def _batch_problem(node, view, ctx, state_positions) -> str | None:
    """Why the batch sizes of X and the initial states may differ, or None if provably equal."""
    x_shape = ctx.shapes.shape(node.inputs[-1])
    batch_axis = 1 if view.input_axes[0] % 3 == 0 else 0
    dims = [x_shape[batch_axis] if x_shape else None]
    for i in state_positions:
        shape = ctx.shapes.shape(node.inputs[i])
        dims.append(shape[0] if shape else None)
    if all(isinstance(d, (int, str)) and d != "" for d in dims) and len(set(dims)) == 1:
        return None
    return (f"cannot prove the batch sizes of X and the initial states equal ({', '.join(map(str, dims))}); "
            "the Scan would broadcast a size-1 batch, the native op would not")


class _Emitter(Emitter):
    """The glue around the native op; opset-dependent forms come from :class:`Emitter`."""

    def __init__(self, b: Builder, opset: int):
        super().__init__(b, opset, domain=None)
        self._steps: dict = {}  # (id(X), axis) -> "X has steps" (opset 8: "X is empty" as 0/1)
        self._masks: dict = {}  # id(sequence_lens) -> [B, 1] float mask of length-0 items

    def _const(self, hint, value):
        return self.const(hint, np.asarray(value))

    def weight(self, name, per_dir):
        """One weight input [D, ...] from each direction's (value, outer) where value is an
        array or a tuple of blocks (see :class:`scanopt.cells.Cell`)."""
        if all(isinstance(v, np.ndarray) for v, _ in per_dir):
            return self.const(name, np.stack([v for v, _ in per_dir]).astype(np.float32))
        dirs = []
        for value, outer in per_dir:
            blocks = [self.block(p, outer) for p in ((value,) if isinstance(value, np.ndarray) else value)]
            joined = blocks[0] if len(blocks) == 1 else self.op("Concat", blocks, axis=0)
            dirs.append(self.unsqueeze(joined, [0]))
        return dirs[0] if len(dirs) == 1 else self.op("Concat", dirs, axis=0)

    def block(self, piece, outer):
        if isinstance(piece, np.ndarray):
            return self.const("block", piece.astype(np.float32))
        if isinstance(piece, Sum):
            parts = [self.block(r, outer) for r in piece.runtimes]
            if np.any(piece.const):
                parts.insert(0, self.const("bias", piece.const.astype(np.float32)))
            total = parts[0]
            for part in parts[1:]:
                total = self.op("Add", [total, part])
            return total
        # A Runtime in x·W orientation: cut its columns, bring it to ONNX layout [out, in].
        t = outer(piece.tensor)
        axis = 0 if piece.vector or piece.transposed else 1
        if piece.start or piece.stop is not None:
            t = self.slice(t, [piece.start], [INT64_MAX if piece.stop is None else piece.stop], [axis])
        if not piece.vector and not piece.transposed:
            t = self.op("Transpose", [t], perm=[1, 0])
        if piece.scale != 1.0:
            t = self.op("Mul", [t, self.const("scale", np.float32(piece.scale))])
        return t

    def pick(self, x, index, count, axis):
        """Direction ``index`` of ``count`` along ``axis``, that axis removed."""
        if count == 1:
            return self.squeeze(x, [axis])
        return self.op("Gather", [x, self._const("direction", np.int64(index))], axis=axis)

    def cast_int32(self, x):
        return self.op("Cast", [x], to=onnx.TensorProto.INT32)

    def move_axis(self, x, source, target, rank):
        if source == target:
            return x
        order = [a for a in range(rank) if a != source]
        order.insert(target, source)
        return self.op("Transpose", [x], perm=order)

    def keep_initial_where_length_0(self, final, initial, lens):
        """``final + initial ⊙ (len == 0)``: the native op leaves exact zeros for length-0
        items, so this is ``initial`` there and ``final`` elsewhere (for finite initial
        states: opset 8 has no Where)."""
        if id(lens) not in self._masks:
            empty = self.op("Equal", [lens, self._const("zero", np.int64(0))])
            self._masks[id(lens)] = self.unsqueeze(self.op("Cast", [empty], to=onnx.TensorProto.FLOAT), [1])
        return self.op("Add", [final, self.op("Mul", [initial, self._masks[id(lens)]])])

    def keep_initial_if_empty(self, final, initial, x, axis):
        """``final`` unless X has no steps along ``axis``, then ``initial`` (a Scan's result)."""
        key = (id(x), axis)
        if key not in self._steps:
            if self.opset >= 15:  # Shape(start, end) gives the length as [1] in one op
                steps = self.op("Shape", [x], start=axis, end=axis + 1)
            else:
                steps = self.op("Gather", [self.op("Shape", [x]), self._const("seq_axis", np.int64(axis))], axis=0)
            if self.opset >= 9:
                self._steps[key] = self.op("Greater", [steps, self._const("zero", np.int64(0))])
            else:
                equal = self.op("Equal", [steps, self._const("zero", np.int64(0))])
                self._steps[key] = self.op("Cast", [equal], to=onnx.TensorProto.INT64)
        if self.opset >= 9:
            return self.op("Where", [self._steps[key], final, initial])
        # Opset 8 has no Where: Gather picks [final, initial][steps == 0], exactly.
        both = self.op("Concat", [self.unsqueeze(final, [0]), self.unsqueeze(initial, [0])], axis=0)
        return self.op("Gather", [both, self._steps[key]], axis=0)
