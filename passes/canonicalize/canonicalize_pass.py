"""canonicalize: bring every Scan-9+ (any nesting level) to one canonical form.

Canonical form (what later passes and backends may assume):
- every scan input and output axis is 0; a Transpose outside the Scan gives the tensor
  the layout the model asked for (the outer tensor keeps its name);
- no attribute equal to its default (all-zero axes or directions are left out);
- every scan output is read, and no two compute the same body value in the same direction
  (a second layout of the same value is a Transpose of the first), and none is computed
  per step from values other outputs stack (``h_t·V``: computed once after the loop on
  the stacks, :mod:`epilogue`);
- every state is read after the loop or feeds a kept output (across iterations), and no
  state is loop-invariant: the body reads the initial value from the outer scope;
- no scan input is listed twice with the same axis and direction, and every scan input is
  read by the body (one is always kept: it sets the trip count);
- directions are kept: a reverse input or prepend output costs nothing inside the Scan,
  while moving it outside costs one reversal (Slice/ReverseSequence) per tensor. The one
  direction change made is the one that is cheaper: a full reversal (Slice, step -1) that
  alone feeds a scan input, or alone reads a scan output, is removed and the direction
  toggled instead;
- no two loops in one where splitting pays: a Scan whose states split one way (an RNN's h
  and a running sum of h) becomes two Scans once nothing else above changes (loop
  fission, :mod:`fission`; option ``fission``), Scan-8 included.
Scan-8 (opset 8, batched, ``sequence_lens``) gets the edits that keep its batch semantics
exactly: dead states, unread and duplicate scan outputs, duplicate and unused scan inputs go,
outputs computed from another's stack move after the loop without ``sequence_lens``
(:func:`_match_scan8`); its loop-invariant states stay (the body sees one batch item of them,
which no outer value is), and it has no axes to move. So a Scan-8 cell with extra dead
states still fuses at opset 8. An axis whose rank is unknown stays as it is (reported);
everything else still applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_graphsurgeon as gs

from scanopt.graph import has_node
from scanopt.pass_api import Match, ScanPass, Skip, register_pass
from scanopt.graph import identity_root, in_graph_outputs, reverses_axis
from scanopt.passes.canonicalize.analysis import input_dependencies, shadows
from scanopt.passes.canonicalize.edit import apply_plan
from scanopt.passes.canonicalize.epilogue import Epilogue, plan_epilogue
from scanopt.passes.canonicalize.fission import match_fission, split
from scanopt.passes.canonicalize.fission_plan import Fission
from scanopt.scan_view import ScanView
from scanopt.rewrite import consumers, is_read

DIRECTIONS = ("scan_input_directions", "scan_output_directions")
UNKNOWN_RANK = "its rank is unknown (declare its shape)"


@dataclass
class CanonicalPlan(Match):
    """What to change. Positions refer to the node as it is: states 0..N-1, scan inputs
    0..M-1, scan outputs 0..K-1."""

    n: int
    first: int = 0  # position of the first state among the node's inputs (Scan-8: 1, after sequence_lens)
    keep_states: list[int] = field(default_factory=list)
    invariant_states: list[int] = field(default_factory=list)
    dead_states: list[int] = field(default_factory=list)
    keep_inputs: list[int] = field(default_factory=list)
    merged_inputs: dict[int, int] = field(default_factory=dict)  # duplicate -> the input kept
    unused_inputs: list[int] = field(default_factory=list)
    input_flips: dict[int, gs.Node] = field(default_factory=dict)  # scan input -> reversal producing it
    input_perms: dict[int, list[int]] = field(default_factory=dict)  # Transpose perms moving the axis to 0
    keep_outputs: list[int] = field(default_factory=list)
    dead_outputs: list[int] = field(default_factory=list)
    merged_outputs: dict[int, int] = field(default_factory=dict)
    epilogues: dict = field(default_factory=dict)  # scan output -> Epilogue: computed after the loop
    new_stacks: dict = field(default_factory=dict)  # source index an epilogue reads -> state whose new value it stacks
    output_flips: dict[int, gs.Node] = field(default_factory=dict)  # scan output -> its only reader, a reversal
    output_perms: dict[int, list[int]] = field(default_factory=dict)  # Transpose perms from axis 0 back
    attrs: dict = field(default_factory=dict)  # the node's attributes afterwards
    dropped: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # what stays non-canonical, and why

    @property
    def removes_node(self) -> bool:
        return not self.keep_states and not self.keep_outputs

    def changes(self) -> bool:
        return any(
            (self.invariant_states, self.dead_states, self.merged_inputs, self.unused_inputs, self.input_flips,
             self.input_perms, self.dead_outputs, self.merged_outputs, self.epilogues, self.output_flips, self.output_perms,
             self.dropped)
        )


@register_pass
class Canonicalize(ScanPass):
    name = "canonicalize"
    kind = "normalizer"
    order = 30
    summary = "scan axes to 0, default attributes dropped, dead/duplicate/invariant states and outputs removed"
    tunables = {"fission": (str, "auto (default): split a Scan whose states split one way into two Scans where a piece "
                                 "then gets a native or loop-free form; always: wherever the states split; never")}

    def match(self, node, view, level, ctx):
        top = level.parents[0] if level.parents else level.graph
        read = [is_read(t, top) for t in node.outputs]
        if not any(read):
            return Skip("none of its outputs is read; the cleanup pass removes it")
        if view.batched:
            return _or_fission(_match_scan8(node, view, read, ctx), node, view, level, ctx)
        plan = CanonicalPlan(view.num_states)
        out_dirs, out_axes = _plan_outputs(plan, node, view, read, level, ctx)
        needed = _plan_states(plan, node, read)
        if plan.removes_node:
            return plan
        in_dirs = _plan_inputs(plan, node, view, needed, level, ctx)
        in_axes = [0 if i in plan.input_perms else view.input_axes[i] for i in plan.keep_inputs]
        plan.attrs, plan.dropped = _new_attrs(
            node.attrs, len(plan.keep_inputs), in_axes, [out_axes[i] for i in plan.keep_outputs] + [0] * len(plan.new_stacks),
            [in_dirs[i] for i in plan.keep_inputs], [out_dirs[i] for i in plan.keep_outputs] + [0] * len(plan.new_stacks),
        )
        if not plan.changes():
            skip = Skip("not canonical: " + "; ".join(plan.left)) if plan.left else Skip("already canonical")
            return _or_fission(skip, node, view, level, ctx)
        return plan

    def rewrite(self, node, plan: CanonicalPlan | Fission, level, ctx):
        if isinstance(plan, Fission):
            return split(node, ScanView.from_gs(node, ctx.opset, ctx.shapes), plan, level, ctx)
        return apply_plan(node, plan, level, ctx)


def _or_fission(found, node, view, level, ctx):
    """A Scan with nothing else to change may still be two loops in one (see fission)."""
    if not isinstance(found, Skip):
        return found
    split_found = match_fission(node, view, level, ctx)
    if split_found is None:
        return found
    return split_found if isinstance(split_found, Fission) else Skip(f"{found.reason}; not split: {split_found}")


def _match_scan8(node, view, read, ctx):
    """The Scan-8 plan: dead states and outputs, duplicate outputs, outputs computed after
    the loop (without sequence_lens), duplicate and unused scan inputs. Invariant states
    stay states (see the module docstring)."""
    n, k, m = view.num_states, view.num_scan_outputs, view.num_scan_inputs
    plan = CanonicalPlan(n, first=1)
    body = node.attrs["body"]
    plan.dead_outputs = [i for i in range(k) if not read[n + i]]
    first_seen: dict = {}
    for i in (i for i in range(k) if read[n + i]):
        key = id(identity_root(body.outputs[n + i]))
        if key in first_seen:
            plan.merged_outputs[i] = first_seen[key]
        else:
            first_seen[key] = i
    plan.keep_outputs = [i for i in range(k) if read[n + i] and i not in plan.merged_outputs]
    if not view.sequence_lens:  # stacks past a length are zeros, which f(0) need not keep (see epilogue)
        _plan_epilogues(plan, body, node.inputs[1 + n:], view, [0] * k, [0] * k, ctx)
    needed = _plan_states(plan, node, read, invariants=False)
    if plan.removes_node:
        return plan
    xs, dirs = node.inputs[1 + n:], list(view.input_directions)
    _merge_and_keep_inputs(plan, [(id(xs[i]), dirs[i]) for i in range(m)], needed)
    plan.attrs = {key: value for key, value in node.attrs.items() if key != "directions"}
    plan.attrs["num_scan_inputs"] = len(plan.keep_inputs)
    kept_dirs = [dirs[i] for i in plan.keep_inputs]
    if any(kept_dirs):
        plan.attrs["directions"] = kept_dirs
    plan.dropped = ["directions"] if "directions" in node.attrs and not any(kept_dirs) else []
    if plan.changes():
        return plan
    left = "; " + "; ".join(plan.left) if plan.left else ""
    return Skip("already canonical (Scan-8: no dead, duplicate or unused states, inputs or outputs; axes and invariant "
                "states stay as opset 8 defines them)" + left)


def _plan_outputs(plan, node, view, read, level, ctx):
    """Unread scan outputs go; a lone reversal reader is folded into the direction; axes
    move to 0 where the rank is known; equal values in equal directions merge.
    Returns (directions, axes) per scan output after the rewrite."""
    n, k = plan.n, view.num_scan_outputs
    body, ys = node.attrs["body"], node.outputs[n:]
    top = level.parents[0] if level.parents else level.graph
    dirs, axes = list(view.output_directions), list(view.output_axes)
    plan.dead_outputs = [i for i in range(k) if not read[n + i]]
    live = [i for i in range(k) if read[n + i]]
    for i in live:
        body_rank = ctx.shapes.rank(body.outputs[n + i])
        rank = body_rank + 1 if body_rank is not None else ctx.shapes.rank(ys[i])
        axis = _resolve(axes[i], rank)
        flip = _sole_reversal_reader(ys[i], top, level.graph, axis, rank, ctx.opset)
        if flip is not None:
            plan.output_flips[i] = flip
            dirs[i] ^= 1
        if rank is None and axis != 0:
            plan.left.append(f"scan output {i} (outer tensor '{ys[i].name}') keeps axis {axes[i]}: {UNKNOWN_RANK}")
            continue
        if axis != 0:
            plan.output_perms[i] = list(range(1, axis + 1)) + [0] + list(range(axis + 1, rank))
        axes[i] = 0
    first = {}
    for i in live:
        key = (id(identity_root(body.outputs[n + i])), dirs[i], axes[i])
        if key in first:
            plan.merged_outputs[i] = first[key]
        else:
            first[key] = i
    plan.keep_outputs = [i for i in live if i not in plan.merged_outputs]
    _plan_epilogues(plan, body, node.inputs[n:], view, dirs, axes, ctx)
    return dirs, axes


def _plan_epilogues(plan, body, xs, view, dirs, axes, ctx) -> None:
    """Scan outputs computed from other kept outputs' values (same direction and layout),
    scan elements and outer values move after the loop (see :mod:`epilogue`). An output
    another one is computed from stays in the loop; so does one whose computation the lift
    rules decline (the reason goes to the report: a cell's fusion may hinge on it)."""
    n = plan.n
    layout = {i: (dirs[i], axes[i], tuple(plan.output_perms.get(i, ()))) for i in plan.keep_outputs}
    found = {}
    state_values = {id(identity_root(body.outputs[j])) for j in range(n)}
    # a stack of an outer value (a loop-invariant output) is no source: it is the same row T times
    local = {id(t) for t in body.inputs} | {id(t) for node in body.nodes for t in node.outputs}
    stacks = [j for j in plan.keep_outputs if id(identity_root(body.outputs[n + j])) in local]
    # a state's new value no output stacks yet can be stacked for an epilogue (an RNN emitting
    # only logits h_t·W): a forward output reads it as a new scan output, index k + j
    k = view.num_scan_outputs
    stacked = {id(identity_root(body.outputs[n + j])) for j in stacks}
    computed = {id(t) for node in body.nodes for t in node.outputs}
    unstacked = {} if view.batched else {
        id(identity_root(body.outputs[j])): k + j for j in range(n)
        if id(identity_root(body.outputs[j])) in computed - stacked}
    for i in plan.keep_outputs:
        roots = {id(identity_root(body.outputs[n + j])): j for j in stacks if j != i and layout[j] == layout[i]}
        chain = plan_epilogue(body.outputs[n + i], roots, view, body, xs, ctx, reverse=bool(dirs[i]))
        if chain is None and not dirs[i]:  # no stack read: perhaps a state's new value, stacked anew
            roots.update({key: v for key, v in unstacked.items() if key != id(identity_root(body.outputs[n + i]))})
            with_new = plan_epilogue(body.outputs[n + i], roots, view, body, xs, ctx, reverse=False)
            # a new stack only where it serves, and only for a function of the state alone: one
            # that also reads the step's inputs (linear attention's y = q_t·S_t) is linrec's to read
            chain = with_new if isinstance(with_new, Epilogue) and not with_new.elements else None
        if isinstance(chain, Epilogue):
            found[i] = chain
        elif chain is not None and id(identity_root(body.outputs[n + i])) not in state_values:  # not the cell's h
            plan.left.append(f"scan output {i} is computed from another one's value but stays in the loop: {chain}")
    sources = {j for e in found.values() for j in e.sources.values()}
    plan.epilogues = {i: e for i, e in found.items() if i not in sources}
    plan.keep_outputs = [i for i in plan.keep_outputs if i not in plan.epilogues]
    plan.new_stacks = {j: j - k for e in plan.epilogues.values() for j in e.sources.values() if j >= k}


def _plan_states(plan, node, read, invariants: bool = True) -> set[int]:
    """Loop-invariant states (with ``invariants``) read the initial value from outside; a
    state whose final value is unread and that no kept output depends on (through any chain
    of iterations) goes. Returns the body input positions the kept body outputs depend on."""
    n, body = plan.n, node.attrs["body"]
    for j in range(n if invariants else 0):
        if identity_root(body.outputs[j]) is body.inputs[j]:
            if shadows(body, node.inputs[j], body.inputs[j]):
                plan.left.append(
                    f"state {j} is loop-invariant but the body defines another value named '{node.inputs[j].name}'"
                )
            else:
                plan.invariant_states.append(j)
    deps = input_dependencies(body)
    dead = {j for j in range(n) if j not in plan.invariant_states and not read[j]}
    while True:  # the largest set of states that nothing kept depends on
        live = [j for j in range(n) if j not in dead and j not in plan.invariant_states]
        stacked = list(plan.new_stacks.values())  # a state stacked for an epilogue is read every step
        needed = set().union(*(deps[s] for s in live + [n + i for i in plan.keep_outputs] + stacked))
        if not dead & needed:
            break
        dead -= needed
    plan.dead_states = sorted(dead)
    plan.keep_states = [j for j in range(n) if j not in dead and j not in plan.invariant_states]
    return needed


def _plan_inputs(plan, node, view, needed, level, ctx) -> list[int]:
    """Fold lone reversals, merge duplicates, drop unused scan inputs (never the last one),
    and move axes to 0 where the rank is known. Returns the directions afterwards."""
    n, m = plan.n, view.num_scan_inputs
    xs = node.inputs[n:]
    top = level.parents[0] if level.parents else level.graph
    dirs, sources = list(view.input_directions), list(xs)
    for i in range(m):
        rank = view.input_ranks[i]
        axis = _resolve(view.input_axes[i], rank)
        flip = _sole_reversal_producer(xs[i], node, top, level.graph, axis, rank, ctx.opset)
        if flip is not None:
            plan.input_flips[i], sources[i] = flip, flip.inputs[0]
            dirs[i] ^= 1
    _merge_and_keep_inputs(plan, [(id(sources[i]), dirs[i], view.input_axes[i]) for i in range(m)], needed)
    for i in plan.keep_inputs:
        axis, rank = view.input_axes[i], view.input_ranks[i]
        if axis != 0 and rank is None:
            plan.left.append(f"scan input {i} (outer tensor '{xs[i].name}') keeps axis {axis}: {UNKNOWN_RANK}")
        elif axis != 0:
            plan.input_perms[i] = [axis] + [d for d in range(rank) if d != axis]
    return dirs


def _merge_and_keep_inputs(plan, keys: list, needed: set[int]) -> None:
    """Scan inputs with equal ``keys`` (source, direction, axis) merge into the first; inputs
    the kept body outputs do not depend on (``needed``: body input positions) go, except
    that one always stays (it sets the trip count)."""
    n, first = plan.n, {}
    for i, key in enumerate(keys):
        if key in first:
            plan.merged_inputs[i] = first[key]
        else:
            first[key] = i
    used = {plan.merged_inputs.get(p - n, p - n) for p in needed if p >= n}
    plan.unused_inputs = [i for i in range(len(keys)) if i not in plan.merged_inputs and i not in used]
    plan.keep_inputs = [i for i in range(len(keys)) if i not in plan.merged_inputs and i in used]
    if not plan.keep_inputs:
        plan.keep_inputs = [plan.unused_inputs.pop(0)]


def _new_attrs(old: dict, m: int, in_axes, out_axes, in_dirs, out_dirs) -> tuple[dict, list[str]]:
    """The node's attributes afterwards, in their original order, defaults left out; and
    the attributes dropped."""
    values = {
        "num_scan_inputs": m,
        "scan_input_axes": in_axes,
        "scan_output_axes": out_axes,
        "scan_input_directions": in_dirs,
        "scan_output_directions": out_dirs,
    }
    attrs = {}
    for key, value in old.items():
        if key not in values:
            attrs[key] = value
        elif key == "num_scan_inputs" or any(values[key]):
            attrs[key] = list(values[key]) if key != "num_scan_inputs" else m
    for key in DIRECTIONS:  # a folded reversal can make a direction non-default
        if key not in attrs and any(values[key]):
            attrs[key] = list(values[key])
    return attrs, [key for key in old if key not in attrs]


def _resolve(axis: int, rank: int | None) -> int | None:
    return axis if axis >= 0 else (None if rank is None else axis + rank)


def _sole_reversal_producer(x, node, top, graph, axis, rank, opset):
    """The Slice of ``graph`` reversing ``x`` along the scan axis, when this Scan is all that reads ``x``."""
    if axis is None or len(x.inputs) != 1 or not has_node(graph, x.inputs[0]):
        return None
    if any(reader is not node for reader in consumers(x)) or in_graph_outputs(x, top):
        return None
    if any(t is x for t in node.inputs[: len(node.inputs) - node.attrs["num_scan_inputs"]]):
        return None  # also an initial state, which must keep reading the reversed tensor
    return x.inputs[0] if reverses_axis(x.inputs[0], axis, rank, opset) else None


def _sole_reversal_reader(y, top, graph, axis, rank, opset):
    """The Slice of ``graph`` reversing ``y`` along the scan axis, when it is all that reads ``y``."""
    readers = consumers(y)
    if axis is None or len(readers) != 1 or in_graph_outputs(y, top):
        return None
    flip = readers[0]
    if not has_node(graph, flip) or flip.inputs[0] is not y or any(t is y for t in flip.inputs[1:]):
        return None
    return flip if reverses_axis(flip, axis, rank, opset) else None
