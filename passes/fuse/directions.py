"""One Scan as one direction of a native recurrent op: what it reads and writes, whether it
can be fused (with the reason when not), and its bidirectional partner."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.constexpr import ConstantFolder

from scanopt.errors import ScanoptError
from scanopt.graph import dtype_of, is_op, node_label
from scanopt.pass_api import Match, Skip
from scanopt.passes.fuse.algebra import describe, resolve
from scanopt.passes.fuse.cell import Cell
from scanopt.passes.fuse.cell_states import cell_output, cell_output_problem
from scanopt.passes.fuse.lengths import NotLengths, read_lengths
from scanopt.passes.fuse.poly import NoMatch
from scanopt.passes.fuse.projection import flipped, is_reversal_of, projected_inputs, projection_readers, projects
from scanopt.passes.fuse.recognize import recognize
from scanopt.passes.fuse.reversal import reversed_source
from scanopt.rewrite import is_read
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
    source: gs.Tensor | None = None  # X the native op reads, when not the Scan's own (a reversal's input)
    notes: tuple[str, ...] = ()  # for the report
    broadcast: bool = False  # batch sizes of X and the states not proven equal: expand them to the common one
    batch_of_one: bool = False  # a Scan-8 over a batch of one whose body holds the real batch (tf2onnx opset 8)
    lengths: gs.Tensor | None = None  # per-item lengths the body masks its steps with (passes.fuse.lengths)
    cell_outputs: dict | None = None  # scan output index -> what it is of the cell state (cell_states.cell_output)

    @property
    def x(self) -> gs.Tensor:
        return self.node.inputs[-1] if self.source is None else self.source

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

    def native_ops(self):
        """The native op each direction's cell is written as (scanopt.pass_api.Match.native_ops)."""
        return tuple((d.cell.kind, d.cell.attrs(), ("P",) if d.cell.P is not None else ()) for d in self.dirs)




def _direction(node, view, level, ctx, folder=None):
    """(Direction, batched, in_axis) for one Scan, or Skip(reason)."""
    body = node.attrs["body"]
    n = view.num_states
    proj = projected_inputs(node, view, ctx, folder)
    if view.num_scan_inputs != 1 and proj is None:
        return Skip(f"{view.num_scan_inputs} scan inputs; the native ops read one sequence X "
                    "(or projections X·W + b of one, computed outside the loop)")
    x = body.inputs[n]
    if dtype_of(x) != np.float32:
        return Skip(f"the scan input is {dtype_of(x)}; only float32 cells are fused ({_dtype_reason(dtype_of(x))})")
    if proj is not None:
        x = proj.x
    lengths = None
    if not view.batched and proj is None:
        try:
            lengths = read_lengths(node, n, folder or ConstantFolder(ctx.opset), ctx.shapes.rank)
        except NotLengths as exc:
            return Skip(f"not fused: {exc}")
    unmasked = lengths.unmasked if lengths else {}
    ins = body.inputs[:n]
    outs = [unmasked.get(i, o) for i, o in enumerate(body.outputs[:n])]
    counter = lengths.counter if lengths else None
    invariant = [i for i in range(n) if i != counter and resolve(outs[i]) is ins[i]]
    recurrent = [i for i in range(n) if i not in invariant and i != counter]
    if lengths and any(i not in unmasked for i in recurrent):
        return Skip("not fused: a recurrent state is not masked by the per-item lengths the others are")
    try:
        seeds = () if proj is None else tuple((t, proj.seeds[id(t)]) for t in body.inputs[n:] if id(t) in proj.seeds)
        cell = recognize(x, [(ins[i], outs[i]) for i in recurrent], ctx.shapes.rank, body, folder, seeds)
    except NoMatch as exc:
        return Skip(f"not fused: {exc}")
    roles = {id(cell.h): "h", id(cell.c): "c"}
    states = [("counter", i) if i == counter else ("invariant", i) if i in invariant else (roles[id(ins[i])], i)
              for i in range(n)]
    h_out = resolve(outs[next(i for kind, i in states if kind == "h")])
    c_out = resolve(outs[next(i for kind, i in states if kind == "c")]) if cell.c is not None else None
    cell_outputs = {}
    for k, y in enumerate(body.outputs[n:]):
        if lengths and n + k not in unmasked:
            return Skip(f"not fused: scan output {k} is not zeroed past the per-item lengths; the native op's Y is")
        y = unmasked.get(n + k, y)
        of_cell = cell_output(y, c_out) if c_out is not None else None
        if of_cell is not None:
            problem = cell_output_problem(cell, view.batched, lengths)
            if problem:
                return Skip(f"not fused: scan output {k} is the cell state{'' if of_cell[0] == 'c' else ' through ' + of_cell[1][0]}"
                            f" of every step, which is recomputed from LSTM's Y only without {problem}")
            cell_outputs[k] = of_cell
            continue
        if resolve(y) is not h_out:
            return Skip(f"scan output {k} is {describe(resolve(y))}, not the hidden state; the native op cannot produce it")

    rank = ctx.shapes.rank(x)
    state_ranks = {ctx.shapes.rank(ins[i]) for kind, i in states if kind not in ("invariant", "counter")}
    one = view.batched and rank == 2 and state_ranks == {2} and _batch_of_one(node, view, ctx, states)
    if rank not in (1, 2) or state_ranks != {rank} or (view.batched and rank != 1 and not one):
        return Skip(f"x has rank {rank} and the states {sorted(state_ranks, key=str)} in the body; "
                    "fused are [B, I] with [B, H] and [I] with [H] (Scan-8: [I] with [H])")
    top = level.parents[0] if level.parents else level.graph
    reverse = bool(view.input_directions[0])
    finals_read = any(is_read(node.outputs[i], top) for kind, i in states if kind not in ("invariant", "counter"))
    if lengths:
        return _masked_direction(node, view, level, ctx, folder, cell, states, reverse, finals_read, top, lengths)
    ys_read = any(is_read(t, top) for t in node.outputs[n:])
    if one:  # Scan-8 over X [1, T, B, I]: a Scan-9 over X[0] [T, B, I] with states [B, H]
        found = _unbatched_direction(node, view, level, ctx, folder, cell, states, reverse, finals_read, top, proj)
        if isinstance(found, Skip):
            return found
        found[0].batch_of_one, found[0].first = True, 1
        return found
    if view.batched:  # Scan-8: X [B, T, I], states [B, H], outputs [B, T, H]
        if reverse and ys_read:
            return Skip("Scan-8 reverse scan outputs need ReverseSequence (opset 10) to reorder")
        guard = _guard(finals_read, view)
        if view.sequence_lens and finals_read:
            guard = "lens"
        outputs = [(reverse, 1) for _ in view.output_axes]
        return Direction(node, cell, reverse, states, outputs, guard, first=1), True, 1
    found = _unbatched_direction(node, view, level, ctx, folder, cell, states, reverse, finals_read, top, proj)
    if cell_outputs and not isinstance(found, Skip):
        found[0].cell_outputs = cell_outputs
        found[0].notes = found[0].notes + ("the per-step cell state recomputed from Y as a linear recurrence",)
    return found


def _masked_direction(node, view, level, ctx, folder, cell, states, reverse, finals_read, top, lengths):
    """A Scan-9+ whose body masks its steps by per-item lengths: forward only, the counter's
    final value unread; final states of length-0 items keep the initial state ("lens" guard)."""
    if is_read(node.outputs[lengths.counter], top):
        return Skip("not fused: the step counter's final value is read; the native op does not produce it")
    rank = ctx.shapes.rank(node.attrs["body"].inputs[view.num_states])
    if rank != 2:
        return Skip(f"not fused: per-item lengths need a batch axis; x has rank {rank} in the body")
    found = _unbatched_direction(node, view, level, ctx, folder, cell, states, reverse, finals_read, top)
    if isinstance(found, Skip):
        return found
    d, batched, in_axis = found
    if d.reverse:
        return Skip("not fused: a reverse scan masked by per-item lengths (the native reverse op starts at each "
                    "length, the Scan at T)")
    batch_axis = 1 if in_axis == 0 else 0
    if not ctx.shapes.dims.same((node.inputs[-1].name, batch_axis), (lengths.lens.name, 0)):
        if ctx.opset < 10:
            return Skip(f"not fused: cannot prove the batch size of the lengths '{lengths.lens.name}' equal to X's; "
                        "expanding them to a common batch needs opset 10 for the zero-length case")
        d.broadcast = True
        d.notes = d.notes + (f"batch size of the lengths '{lengths.lens.name}' not proven equal to X's: "
                             "X, lengths and initial states expanded to their common batch",)
    if ctx.opset < 12:
        return Skip("not fused: clipping the per-item lengths to [0, T] needs integer Min/Max (opset 12)")
    d.lengths = lengths.lens
    d.guard = "lens" if finals_read else None
    d.notes = d.notes + ("per-item lengths from the body's step mask",)
    return d, batched, in_axis


def _unbatched_direction(node, view, level, ctx, folder, cell, states, reverse, finals_read, top, proj=None):
    """The Scan-9+ part of :func:`_direction` (also a Scan-8 over a batch of one, read as
    the Scan-9 over its only item: X [T, B, I] with states [B, H], all axes 0)."""
    n, one = view.num_states, view.batched
    rank = ctx.shapes.rank(node.attrs["body"].inputs[n])
    broadcast: tuple[str, ...] | Skip = ()
    if rank == 2:
        positions = [i for kind, i in states if kind not in ("invariant", "counter")]
        problem = _batch_problem_of_one(node, ctx, positions) if one else _batch_problem(node, view, ctx, positions)
        if problem:
            broadcast = _broadcast_batches(problem, _guard(finals_read, view), ctx.opset)
            if isinstance(broadcast, Skip):
                return broadcast
    in_axis = 0 if one else view.input_axes[0] % (rank + 1)
    scanned = node.inputs[-1] if proj is None else proj.source  # what the native op reads, unless reversed
    source, note = (None, None) if one else reversed_source(scanned, in_axis, rank + 1, ctx, folder)
    if source is not None:  # a Scan over reverse(X) is a Scan over X in the other direction
        reverse = not reverse
    if proj is not None:  # the native op reads X and folds the projection into W and B (a row-wise
        # projection commutes with reversing the scan axis)
        folded = f"input projection of '{proj.source.name}' folded into W and B"
        note = folded if note is None else f"{folded}, {note}"
        source = proj.source if source is None else source
    out_axes = [0] * view.num_scan_outputs if one else [a % (rank + 1) for a in view.output_axes]
    out_dirs = [0] * view.num_scan_outputs if one else view.output_directions
    outputs = [(bool(d) != reverse, a) for d, a in zip(out_dirs, out_axes)]
    if ctx.opset < 10 and any(flip for (flip, _), t in zip(outputs, node.outputs[n:]) if is_read(t, top)):
        return Skip("an output runs against the input direction; reversing it needs Slice steps (opset 10+)")
    return (Direction(node, cell, reverse, states, outputs, _guard(finals_read, view), source=source,
                      notes=((note,) if note else ()) + broadcast, broadcast=bool(broadcast)), rank == 2, in_axis)


def _dtype_reason(dtype) -> str:
    if dtype == np.float64:
        return "onnxruntime has no double RNN/GRU/LSTM kernel"
    if dtype == np.float16:
        # Probed: onnxruntime's CPU runs a float16 RNN/GRU/LSTM in float32 behind Casts.
        return ("the Scan rounds every op's result and the state to float16 at each step, while a native "
                "float16 op computes at the runtime's internal precision (onnxruntime's CPU: float32 behind "
                "Casts, rounding only Y/Y_h), so the rewrite is not provably equivalent; a Cast-to-float32 "
                "wrapper changes the per-step rounding the same way")
    return f"the native ops take float16/float/double, not {dtype}"


def _guard(finals_read, view) -> str | None:
    """A Scan over zero steps returns its initial states; the native ops return zeros."""
    return "empty" if finals_read and not (view.trip_count and view.trip_count >= 1) else None


def _partner(node, direction, in_axis, level, ctx, folder=None, members=None, readers=None) -> Direction | None:
    """A Scan over the same X and axis in the other direction, with a cell one native op can
    run beside this one (same kind, sizes, clip, linear_before_reset). Only Scans that read X
    against this one's direction are analysed: X's Scan readers are sorted by direction once
    per X (``readers``: a dict the caller keeps for one pass, see :func:`_scan_readers`), so N
    Scans over one X cost O(N) in all, not N analyses each. ``members()`` (ids of the level's
    nodes, asked for only when there is a candidate) tells which of them live in this graph."""
    x = direction.x
    by_direction = _scan_readers(x, ctx, readers)
    for other, view in by_direction[not direction.reverse]:
        if other is node or not other.inputs or not _reads_whole(other, x):
            continue  # removed by a rewrite since (a fused partner), or no longer reading X
        if members is not None and id(other) not in members():
            continue
        if ("fuse", node_label(other)) in ctx.denied:
            continue
        found = _direction(other, view, level, ctx, folder)
        if isinstance(found, Skip) or found[0].lengths is not None or direction.lengths is not None:
            continue
        if found[0].cell_outputs or direction.cell_outputs:  # kept one direction per op
            continue
        d, _, axis = found
        a, c = direction.cell, d.cell
        if (d.x is x and axis == in_axis and d.reverse != direction.reverse and a.kind == c.kind and a.hidden == c.hidden
                and a.input_size == c.input_size and a.clip == c.clip and a.linear_before_reset == c.linear_before_reset
                and a.input_forget == c.input_forget):
            return d
    return None


def _reads_whole(scan: gs.Node, x: gs.Tensor) -> bool:
    """``scan``'s scan input is ``x``, the output of a Slice/ReverseSequence of ``x``, or a
    projection of ``x`` (:func:`projection_readers`)."""
    last = scan.inputs[-1]
    return last is x or is_reversal_of(last, x) or projects(last, x)


def _scan_readers(x: gs.Tensor, ctx, readers: dict | None) -> dict[bool, list]:
    """X's Scan readers (directly or through a Slice/ReverseSequence of X) as
    {direction: [(Scan, ScanView)]}, the direction being the one a Scan has over X when X
    reaches it whole (a reversal flips it): a partner must have the other one.

    Built once per X and kept in ``readers``, the dict of one run of the fuse pass (shared
    with dry runs made during it): fusing adds no Scan, and the Scans it removes are
    skipped by the caller. Without it (a dry run while another pass runs) the lists are
    kept in ``ctx.memo`` until the next rewrite of any pass (``ctx.edits``), which may add
    a Scan reading X."""
    if readers is None:
        memo = ctx.memo.setdefault("fuse.scan_readers", {})
        if memo.get("edits") != ctx.edits:
            memo.clear()
            memo["edits"] = ctx.edits
        readers = memo
    cached = readers.get(id(x))
    if cached is not None and cached[0] is x:
        return cached[1]
    found: dict[bool, list] = {False: [], True: []}
    seen: set[int] = set()
    projected = projection_readers(x)
    candidates = list(x.outputs) + [r for t in x.outputs if is_op(t, "Slice") or is_op(t, "ReverseSequence")
                                    for o in t.outputs for r in o.outputs] + projected
    for other in candidates:
        if id(other) in seen or not is_op(other, "Scan") or not other.inputs or not _reads_whole(other, x):
            continue
        seen.add(id(other))
        try:
            view = ScanView.from_gs(other, ctx.opset, ctx.shapes)
        except ScanoptError:
            continue
        if view.batched or (view.num_scan_inputs != 1 and not any(other is p for p in projected)):
            continue
        found[bool(view.input_directions[0]) != flipped(other, x)].append((other, view))
    readers[id(x)] = (x, found)
    return found


def _batch_of_one(node, view, ctx, states) -> bool:
    """A Scan-8 without sequence_lens whose outer batch is statically 1 on X and every
    recurrent state (tf2onnx's opset-8 form: X reshaped to [1, T, B, I])."""
    if view.sequence_lens:
        return False
    tensors = [node.inputs[-1]] + [node.inputs[1 + i] for kind, i in states if kind != "invariant"]
    shapes = [ctx.shapes.shape(t) for t in tensors]
    return all(s and s[0] == 1 for s in shapes)


def _batch_problem(node, view, ctx, state_positions) -> str | None:
    """Why the batch sizes of X and the initial states may differ, or None if provably equal."""
    x_shape = ctx.shapes.shape(node.inputs[-1])
    batch_axis = 1 if view.input_axes[0] % 3 == 0 else 0
    dims = [x_shape[batch_axis] if x_shape and len(x_shape) > batch_axis else None]
    for i in state_positions:
        shape = ctx.shapes.shape(node.inputs[i])
        dims.append(shape[0] if shape else None)
    if all(isinstance(d, (int, str)) and d != "" for d in dims) and len(set(dims)) == 1:
        return None
    x = node.inputs[-1].name
    if all(ctx.shapes.dims.same((x, batch_axis), (node.inputs[i].name, 0)) for i in state_positions):
        return None  # the graph's ops make them one dim, whatever they are named (tf2onnx's unk__N)
    return (f"cannot prove the batch sizes of X and the initial states equal ({', '.join(map(str, dims))}); "
            "the Scan would broadcast a size-1 batch, the native op would not")


def _batch_problem_of_one(node, ctx, state_positions) -> str | None:
    """:func:`_batch_problem` for a Scan-8 over a batch of one: X [1, T, B, I], states [1, B, H]."""
    x_shape = ctx.shapes.shape(node.inputs[-1])
    dims = [x_shape[2] if x_shape and len(x_shape) == 4 else None]
    for i in state_positions:
        shape = ctx.shapes.shape(node.inputs[1 + i])
        dims.append(shape[1] if shape and len(shape) == 3 else None)
    if all(isinstance(d, (int, str)) and d != "" for d in dims) and len(set(dims)) == 1:
        return None
    x = node.inputs[-1].name
    if all(ctx.shapes.dims.same((x, 2), (node.inputs[1 + i].name, 1)) for i in state_positions):
        return None  # the graph's ops make them one dim, whatever they are named (tf2onnx's unk__N)
    return (f"cannot prove the batch sizes of X and the initial states equal ({', '.join(map(str, dims))}); "
            "the Scan would broadcast a size-1 batch, the native op would not")


def _broadcast_batches(problem: str, guard: str | None, opset: int) -> tuple[str, ...] | Skip:
    """The fallback where the batch sizes cannot be proven equal (tf2onnx names every unknown
    dim ``unk__N``, so a caller-given initial state never shares X's symbol): X and the
    initial states are expanded to their common batch at run time (``Expand`` by each
    other's batch size), which is what the Scan's broadcasting computes whenever it runs and
    a copy when the sizes are equal. A zero-length scan returns the initial state at its own
    batch size; that final state is cut back to it, which needs Slice with run-time ends
    (opset 10). Returns the report note, or Skip."""
    if guard == "empty" and opset < 10:
        return Skip(f"{problem}; expanding them to a common batch needs opset 10 for the zero-length case")
    return ("batch sizes of X and the initial states not proven equal: both expanded to their common batch",)
