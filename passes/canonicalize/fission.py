"""Loop fission: a Scan whose states split one way is two loops in one.

The states' dependency graph (state i -> state j when the body computes i's next value
from j) falls into strongly connected components, in topological order. A component
that reads no other state (group A: an RNN's ``h``) can run as a Scan of its own; the
rest (group B: a running sum of ``h``) follows as a second Scan that reads, as scan
inputs, per-step values of A (the *frontier*: walking back from B's outputs, the first
values that depend on no B state and that A computes anyway, or A's state inputs; what
lies between, such as the ``0.1 * h`` of an EMA, is computed again in B). Scan outputs go
with the states they read (outputs reading A's states only, or no state, stay with A).
Both pieces read every original scan input in its direction (the next canonicalize drops
the unread ones); the frontier is stacked in processing order (axis 0, appending; Scan-8:
batch-major [B, T, ...], zero past each sequence length), or read from a scan output of
A that stacks it so already, and read back forward, so step t of B sees what step t of A
computed, for every direction, Scan-8 and ``sequence_lens`` included. Each rewrite splits
one component off; the rest is split again in the next round, so any number of groups
comes apart. A mutual dependency (h reads s, s reads h) is one component: never split.

When (option ``fission``, default "auto"): two loops and a stacked frontier cost more than
one loop, so a Scan is split only when the whole Scan gets no form from
the loop-free forms (``Pass.loop_free``) that the chooser would apply (a cell beside a step counter
fuses as it is, and stays whole), and
- where the Scan's forms were measured (``scanopt.tune``; canonicalize, and so this
  split, runs inside every form it times): the fastest form is one of those passes';
  the second piece then takes the same measured choice;
- else, on a trial split built apart from the graph (detached copies, unhooked
  afterwards; one trial per component no other state feeds):
  - for target portable (any form applies there), what the forms leave: each form a
    piece gets rewrites a fresh copy of it, and the split is made when a piece then has
    no Loop or Scan left (a native op, CumSum, a map's batch) or the pieces together
    have fewer than the Scan had. linrec's form for a symbolic length is itself chunked
    Loops (which loop_to_scan turns back into Scans), so a split whose only form is that
    would turn one loop into three;
  - for onnxruntime, some piece gets a form the cost model predicts faster than its loop
    (forms it has no numbers for, like linrec's, still apply to the pieces of a split,
    but do not justify a second loop alone).
"always" splits wherever the states allow, "never" keeps every Scan whole.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import onnx_graphsurgeon as gs

from scanopt.graph import GraphLevel, in_graph_outputs, node_label, node_position, walk_graphs
from scanopt.chooser import Chooser
from scanopt.pass_api import Skip
from scanopt.passes.canonicalize.fission_build import build_pieces, unhook, unhook_graph
from scanopt.passes.canonicalize.fission_plan import Fission, plan_fission
from scanopt.scan_view import ScanView

LOOP_OPS = ("Loop", "Scan")
# option ``fission``: split where it pays (above), wherever the states allow, or never
MODES = ("auto", "always", "never")


def match_fission(node: gs.Node, view: ScanView, level: GraphLevel, ctx) -> Fission | str | None:
    """The split to make (the first possible one that pays, see the module docstring), the
    reason not to split, or None (nothing to split, or option ``fission`` is "never")."""
    mode = ctx.options.get("fission") or "auto"
    if mode not in MODES:
        return f"option fission={mode!r} is not one of {', '.join(MODES)}"
    if mode == "never" or (mode == "auto" and not _selected(ctx)):
        return None  # no pass this run would rewrite a piece
    plans = plan_fission(node, view, ctx)
    if not isinstance(plans, list):
        return plans
    splits = " or ".join(f"states {p.first} and {p.rest}" for p in plans)
    measured = _measured(node, level, ctx)
    if mode == "auto":
        whole = _forms_of(node, view, level, ctx)
        if whole:
            return f"split into {splits} would do, but the Scan as it is gets {whole[0][0]}"
        if measured is not None and not set(measured["passes"]) & set(_selected(ctx)):
            return (f"split into {splits} would do, but the measured fastest form is {measured['form']} "
                    "(the forms timed include the split)")
    tried = []
    for plan in plans:
        trial = _trial(node, view, plan, level, ctx)
        if isinstance(trial, str):
            return trial
        plan.forms = ["+".join(name for name, _ in found) for found, _ in trial]
        if mode == "always" or measured is not None:
            return plan  # measured: the fastest form is a split one
        if _portable(ctx):
            left = [min((_loops_left(node, view, plan, index, name, level, ctx) for name, _ in found), default=as_is)
                    for index, (found, as_is) in enumerate(trial)]
            before = _loops(gs.Graph(nodes=[node]))
            if 0 in left or sum(left) < before:
                return plan
            tried.append(f"states {plan.first} | {plan.rest}: "
                         + " and ".join(f"{form or 'a loop'} ({n} loops)" for form, n in zip(plan.forms, left))
                         + f" where the Scan has {before}")
            continue
        if any(_pays(e, ctx) for found, _ in trial for _, e in found):
            return plan
        tried.append(f"states {plan.first} | {plan.rest}: " + ", ".join(form or "a loop" for form in plan.forms))
    if _portable(ctx):
        return (f"split into {splits} would do, but no piece would then be native or loop-free, nor would the "
                f"pieces have fewer loops than the Scan ({'; '.join(tried)}; among {', '.join(_selected(ctx))})")
    return (f"split into {splits} would do, but no piece would then get a native or loop-free form predicted "
            f"faster than its loop ({'; '.join(tried)}; among {', '.join(_selected(ctx))}): two loops would cost "
            "more than one")


def _chooser(ctx) -> Chooser:
    return ctx.chooser if ctx.chooser is not None else Chooser(None)


def _portable(ctx) -> bool:
    """Target portable (or no cost policy): any form applies, so the question is what the
    forms leave, not their speed."""
    return _chooser(ctx).portable


def _pays(estimate, ctx) -> bool:
    """A piece's form justifies a second loop on onnxruntime: one the cost model predicts
    faster (a form it has no numbers for, such as linrec's, still applies to the pieces,
    but does not alone justify the split)."""
    if estimate is None:
        return True
    return estimate.measured or (estimate.speedup is not None and estimate.speedup > 1)


def _selected(ctx) -> list[str]:
    """The loop-free forms of this run: what could justify a split."""
    return _chooser(ctx).forms(ctx, loop_free=True)


def _forms_of(node, view, level, ctx) -> list[tuple]:
    """(pass, the chooser's Estimate or None) for the loop-free forms that would rewrite
    ``node`` with the chooser's consent."""
    return _chooser(ctx).applied_forms(node, view, level, ctx)


def _measured(node, level, ctx) -> dict | None:
    return _chooser(ctx).measured_choice(node, level)


def _trial(node, view, plan: Fission, level, ctx) -> list[tuple[list[tuple], int]] | str:
    """Per piece, what _forms_of says of it and its Loop/Scan nodes as it is, judged on
    detached copies of the pieces; or why the split is impossible. Leaves the graph as it
    was."""
    with _detached(node, view, plan, level, ctx) as (pieces, where):
        if isinstance(pieces, str):
            return pieces
        return [(_forms_of(piece, ScanView.from_gs(piece, ctx.opset, ctx.shapes), where, ctx),
                 _loops(gs.Graph(nodes=[piece]))) for piece in pieces]


def _loops_left(node, view, plan: Fission, index: int, name: str, level, ctx) -> int:
    """Loop and Scan nodes (nested ones included) piece ``index`` still has once pass
    ``name`` rewrote a fresh detached copy of it: linrec's form for a symbolic length is
    itself Loops (which loop_to_scan turns back into Scans); a native op or CumSum has none.
    A rewrite that fails on the copy counts as leaving the piece as it was."""
    with _detached(node, view, plan, level, ctx) as (pieces, where):
        piece, kept = pieces[index], _loops(gs.Graph(nodes=[pieces[index]]))
        if not Chooser.trial(name, piece, where, ctx):
            return kept
        other = pieces[1 - index]
        return _loops(gs.Graph(nodes=[n for n in where.graph.nodes if n is not other]))


def _loops(graph: gs.Graph) -> int:
    return sum(n.op in LOOP_OPS for level in walk_graphs(graph) for n in level.graph.nodes)


@contextmanager
def _detached(node, view, plan: Fission, level, ctx):
    """(the two pieces, a GraphLevel of a scratch graph holding them) built apart from the
    graph, reading the node's own inputs (fuse looks through a scan input to the projection
    computing it outside) and writing stand-ins for its outputs, or (the reason, None);
    every node of the scratch graph, and whatever a rewrite put there, is unhooked
    afterwards, so the graph's tensors lose the readers the trial gave them."""
    outs = [gs.Variable(t.name, dtype=t.dtype, shape=t.shape) for t in node.outputs]
    readers = [gs.Node("Identity", inputs=[s]) for s, t in zip(outs, node.outputs) if t.outputs or t.name and _listed(t, level)]
    pieces = build_pieces(node, view, plan, list(node.inputs), outs, ctx, rest_name=_rest_name(node))
    scratch = gs.Graph(nodes=list(pieces) + readers) if not isinstance(pieces, str) else None
    try:
        if scratch is None:
            yield pieces, None
        else:
            where = GraphLevel(scratch, level.parents, level.path)
            _canonicalize(pieces, where, ctx)
            yield pieces, where
    finally:
        if scratch is not None:
            for piece in pieces:
                unhook(piece)
            unhook_graph(scratch)
        for reader in readers:
            reader.inputs.clear()
        ctx.edits += 1  # readers came and went on the graph's tensors: what passes memoized of them is stale


def _canonicalize(pieces, where: GraphLevel, ctx, rounds: int = 3) -> None:
    """Bring the trial's pieces to canonical form, as the next round does before any other
    pass sees them (a piece's copy of an output, its unread inputs and invariant states
    would otherwise stop fuse on the trial only); no further fission."""
    inner = replace(ctx, options={**ctx.options, "fission": "never"})
    from scanopt.passes.canonicalize.canonicalize_pass import Canonicalize  # it imports this module

    canonicalize = Canonicalize()
    for piece in pieces:
        for _ in range(rounds):
            try:
                found = canonicalize.match(piece, ScanView.from_gs(piece, ctx.opset, ctx.shapes), where, inner)
                if isinstance(found, Skip) or not any(n is piece for n in where.graph.nodes):
                    break
                canonicalize.rewrite(piece, found, where, inner)
            except Exception:  # noqa: BLE001 - the piece is judged as built
                break


def _rest_name(node) -> str:
    return f"{node_label(node)}_rest"


def _listed(t, level) -> bool:
    top = level.parents[0] if level.parents else level.graph
    return in_graph_outputs(t, top)


def split(node: gs.Node, view: ScanView, plan: Fission, level: GraphLevel, ctx) -> str:
    """Replace ``node`` by its two pieces (they write into its output tensors)."""
    graph = level.graph
    inputs, outputs = list(node.inputs), list(node.outputs)
    pieces = build_pieces(node, view, plan, inputs, outputs, ctx, rest_name=ctx.names.fresh(_rest_name(node)),
                          reuse_body=True)
    measured = _measured(node, level, ctx)
    if measured is not None:  # the measured form's time includes the split: both pieces take its choice
        _chooser(ctx).share_measurement(measured, pieces[1].name)
    position = node_position(graph, node)
    node.inputs.clear()
    node.outputs.clear()
    graph.nodes[position:position + 1] = list(pieces)
    stacked = ", ".join(f"'{f.name}'" for f in plan.frontier) or "nothing"
    forms = " and ".join(f"{form or 'a loop'}" for form in plan.forms)
    return (f"split into two Scans: states {plan.first} with scan outputs {plan.first_outputs} ('{pieces[0].name}'), "
            f"then states {plan.rest} with scan outputs {plan.rest_outputs} ('{pieces[1].name}') reading "
            f"{stacked} per step from the first; the pieces get {forms}")
