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
:data:`FORM_PASSES` that the cost policy would apply (a cell beside a step counter
fuses as it is, and stays whole), and
- where the Scan's forms were measured (``scanopt.tune``; canonicalize, and so this
  split, runs inside every form it times): the fastest form is one of those passes';
  the second piece then takes the same measured choice;
- else, on a trial split built apart from the graph (detached copies, unhooked
  afterwards; one trial per component no other state feeds), some piece gets a form
  the cost policy applies: any, for target portable; one the cost model predicts
  faster than its loop, for onnxruntime (forms it has no numbers for, like linrec's,
  still apply to the pieces of a split, but do not justify a second loop alone).
"always" splits wherever the states allow, "never" keeps every Scan whole.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from scanopt.graph import GraphLevel, in_graph_outputs, node_label, node_position
from scanopt.pass_api import dry_matches, registered_passes
from scanopt.passes.canonicalize.fission_build import build_pieces, unhook
from scanopt.passes.canonicalize.fission_plan import Fission, plan_fission
from scanopt.scan_view import ScanView

# Passes whose rewrite leaves a piece without its loop (native op, CumSum, a map's batch).
FORM_PASSES = ("fuse", "linrec", "vectorize", "distances")
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
        if measured is not None and not set(measured["passes"]) & set(FORM_PASSES):
            return (f"split into {splits} would do, but the measured fastest form is {measured['form']} "
                    "(the forms timed include the split)")
    tried = []
    for plan in plans:
        trial = _trial(node, view, plan, level, ctx)
        if isinstance(trial, str):
            return trial
        plan.forms = ["+".join(name for name, _ in found) for found in trial]
        if mode == "always" or any((measured is not None) or _pays(e, ctx) for found in trial for _, e in found):
            return plan  # measured: the fastest form is a split one, and this split gives a piece a form
        tried.append(f"states {plan.first} | {plan.rest}: " + ", ".join(form or "a loop" for form in plan.forms))
    return (f"split into {splits} would do, but no piece would then get a native or loop-free form predicted "
            f"faster than its loop ({'; '.join(tried)}; among {', '.join(_selected(ctx))}): two loops would cost "
            "more than one")


def _pays(estimate, ctx) -> bool:
    """A piece's form justifies a second loop: any form for target portable (or without a
    cost policy), else one the cost model predicts faster (a form it has no numbers for,
    such as linrec's, still applies to the pieces, but does not alone justify the split)."""
    if estimate is None or getattr(ctx.cost, "target", "") == "portable":
        return True
    return estimate.measured or (estimate.speedup is not None and estimate.speedup > 1)


def _selected(ctx) -> list[str]:
    registry = registered_passes()
    return [p for p in FORM_PASSES if p in registry and (ctx.selected is None or p in ctx.selected)]


def _forms_of(node, view, level, ctx) -> list[tuple]:
    """(pass, the cost policy's Estimate or None) for the FORM_PASSES that would rewrite
    ``node`` with the cost policy's consent."""
    found = []
    for name, match in dry_matches(_selected(ctx), node, view, level, ctx):
        estimate = ctx.cost.decide(name, node_label(node), node, view, match, ctx, level) if ctx.cost is not None else None
        if estimate is None or estimate.apply:
            found.append((name, estimate))
    return found


def _measured(node, level, ctx) -> dict | None:
    measured = getattr(ctx.cost, "measured", None) or {}
    return measured.get(node_label(node)) if not level.path else None


def _trial(node, view, plan: Fission, level, ctx) -> list[list[tuple]] | str:
    """Per piece, what _forms_of says of it, judged on detached copies of the pieces; or
    why the split is impossible. Leaves the graph as it was."""
    stand_in = [gs.Variable(t.name, dtype=t.dtype, shape=t.shape) if t.name else t for t in node.inputs]
    outs = [gs.Variable(t.name, dtype=t.dtype, shape=t.shape) for t in node.outputs]
    readers = [gs.Node("Identity", inputs=[s]) for s, t in zip(outs, node.outputs) if t.outputs or t.name and _listed(t, level)]
    pieces = build_pieces(node, view, plan, stand_in, outs, ctx, rest_name=_rest_name(node))
    try:
        if isinstance(pieces, str):
            return pieces
        scratch = gs.Graph(nodes=list(pieces) + readers)
        where = GraphLevel(scratch, level.parents, level.path)
        return [_forms_of(piece, ScanView.from_gs(piece, ctx.opset, ctx.shapes), where, ctx) for piece in pieces]
    finally:
        for piece in pieces if not isinstance(pieces, str) else ():
            unhook(piece)
        for reader in readers:
            reader.inputs.clear()


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
        ctx.cost.measured[pieces[1].name] = measured
    position = node_position(graph, node)
    node.inputs.clear()
    node.outputs.clear()
    graph.nodes[position:position + 1] = list(pieces)
    stacked = ", ".join(f"'{f.name}'" for f in plan.frontier) or "nothing"
    forms = " and ".join(f"{form or 'a loop'}" for form in plan.forms)
    return (f"split into two Scans: states {plan.first} with scan outputs {plan.first_outputs} ('{pieces[0].name}'), "
            f"then states {plan.rest} with scan outputs {plan.rest_outputs} ('{pieces[1].name}') reading "
            f"{stacked} per step from the first; the pieces get {forms}")
