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

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from scanopt.graph import GraphLevel, cleanup, identity_root, node_label, node_position, walk_graphs
from scanopt.pass_api import Match, Skip, registered_passes
from scanopt.passes.canonicalize.analysis import Dependencies
from scanopt.rewrite import replace_all_uses
from scanopt.scan_view import ScanView

# Passes whose rewrite leaves a piece without its loop (native op, CumSum, a map's batch).
FORM_PASSES = ("fuse", "linrec", "vectorize", "distances")
# option ``fission``: split where it pays (above), wherever the states allow, or never
MODES = ("auto", "always", "never")


@dataclass
class Fission(Match):
    """One split: ``first`` (a component no other state feeds) and everything else."""

    first: list[int]  # states of the first piece
    rest: list[int]
    first_outputs: list[int]  # scan outputs each piece computes
    rest_outputs: list[int]
    frontier: list[gs.Tensor]  # body values of the first piece the rest reads per step
    stacked_as: dict[int, int]  # frontier position -> a scan output of the first piece that stacks it already
    forms: list[str]  # what later passes make of the pieces (the trial), for the report


def components(reads: list[set[int]]) -> list[list[int]]:
    """Strongly connected components of ``i -> reads[i]``, each sorted, the components a
    component reads before it (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in range(len(reads)):
        if root in index:
            continue
        work = [(root, iter(sorted(reads[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        u = stack.pop()
                        on_stack.discard(u)
                        comp.append(u)
                        if u == v:
                            break
                    found.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w)
                on_stack.add(w)
                work.append((w, iter(sorted(reads[w]))))
            elif w in on_stack:
                low[v] = min(low[v], index[w])
    return found


def plan_fission(node: gs.Node, view: ScanView, ctx) -> list[Fission] | str | None:
    """The possible splits of ``node``'s states, one per component no other state feeds
    (an RNN's h and a step counter beside it are two), before any trial; the reason there
    is none; or None when there is nothing to split (fewer than two states)."""
    n, k = view.num_states, view.num_scan_outputs
    if n < 2:
        return None
    body = node.attrs["body"]
    deps = Dependencies(body)
    states = set(range(n))
    reads = [set(deps.of(body.outputs[j])) & states for j in range(n)]
    comps = components(reads)
    if len(comps) == 1:
        pair = next(((i, j) for i in range(n) for j in reads[i] if j != i and i in reads[j]), None)
        why = (f"state {pair[0]} reads state {pair[1]} and state {pair[1]} reads state {pair[0]}" if pair
               else "each state reads another through a cycle")
        return f"its {n} states are one recurrence ({why})"
    plans = []
    for first in (c for c in comps if set().union(*(reads[j] for j in c)) <= set(c)):
        rest = [j for j in range(n) if j not in first]
        first_outputs = [i for i in range(k) if set(deps.of(body.outputs[n + i])) & states <= set(first)]
        rest_outputs = [i for i in range(k) if i not in first_outputs]
        frontier = _frontier(body, deps, [body.outputs[j] for j in rest] + [body.outputs[n + i] for i in rest_outputs],
                             [body.outputs[j] for j in first] + [body.outputs[n + i] for i in first_outputs],
                             set(first), set(rest))
        unknown = next((f for f in frontier if _dtype(f, ctx) is None), None)
        if unknown is not None:
            return f"the type of body value '{unknown.name}' the states {rest} read from states {first} is unknown"
        plans.append(Fission(first, rest, first_outputs, rest_outputs, frontier,
                             _stacked_already(node, view, frontier, first_outputs), []))
    return plans


def _stacked_already(node, view, frontier, first_outputs) -> dict[int, int]:
    """Frontier values a scan output of the first piece stacks already, in processing order
    (axis 0, appending; Scan-8 always): the rest reads that output instead of a new one."""
    n, body = view.num_states, node.attrs["body"]
    found = {}
    for p, f in enumerate(frontier):
        for k in first_outputs:
            forward = view.batched or (view.output_axes[k] == 0 and not view.output_directions[k])
            if forward and node.outputs[n + k].name and identity_root(body.outputs[n + k]) is identity_root(f):
                found[p] = k
                break
    return found


def _frontier(body, deps: Dependencies, outputs, first_outputs, first: set[int], rest: set[int]) -> list[gs.Tensor]:
    """The values the rest reads from the first piece: walking back from the rest's
    ``outputs``, the first values that depend on no ``rest`` state and that the first
    piece computes anyway (on the way to ``first_outputs``) or that are body inputs. What
    lies between (``0.1 * h`` of an EMA) is computed again in the rest, so the first piece
    only stacks values it has (``h``, often a scan output already)."""
    cone = _cone(deps, first_outputs)
    found, seen, stack = {}, set(), list(reversed(outputs))
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        on = deps.of(t)
        producer = deps.producer(t)
        if on & first and not on & rest and (id(t) in cone or producer is None):
            found[id(t)] = t
            continue
        if producer is not None:
            stack.extend(reversed(deps.reads(producer)))
    return list(found.values())


def _cone(deps: Dependencies, outputs) -> set[int]:
    """ids of every body value ``outputs`` are computed from (them included)."""
    seen, stack = set(), list(outputs)
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        producer = deps.producer(t)
        if producer is not None:
            stack.extend(deps.reads(producer))
    return seen


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
        if mode == "always" or measured is not None or any(_pays(e, ctx) for found in trial for _, e in found):
            return plan
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
    registry, found = registered_passes(), []
    for name in _selected(ctx):
        if (name, node_label(node)) in ctx.denied:
            continue
        try:
            match = registry[name]().match(node, view, level, ctx)
        except Exception:  # noqa: BLE001 - a pass that cannot judge a piece offers no form
            continue
        if isinstance(match, Skip):
            continue
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
    from scanopt.graph import in_graph_outputs

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


def build_pieces(node, view, plan: Fission, inputs, outputs, ctx, *, rest_name: str, reuse_body: bool = False):
    """The two Scan nodes (first, rest) reading ``inputs`` and writing ``outputs`` (the
    node's own, or stand-ins for a trial). ``reuse_body``: the first piece takes the
    node's body itself (the node goes); else both bodies are copies. A string when the
    pieces would still read each other's states (never expected: the plan's analysis)."""
    n, m, lead = view.num_states, view.num_scan_inputs, 1 if view.batched else 0
    body, names = node.attrs["body"], ctx.names
    inits, xs = inputs[lead:lead + n], inputs[lead + n:]
    finals, ys = outputs[:n], outputs[n:]
    rest_body, rest_of = _copy(body, ctx)
    first_body, first_of = (body, lambda t: t) if reuse_body else _copy(body, ctx)
    b_in, b_out = list(body.inputs), list(body.outputs)
    steps = []
    emitted = [f for p, f in enumerate(plan.frontier) if p not in plan.stacked_as]
    for f in plan.frontier:
        shape = ctx.shapes.shape(f)
        step = gs.Variable(names.fresh(f"{f.name}_step"), dtype=_dtype(f, ctx), shape=shape)
        replace_all_uses(rest_of(f), step, rest_body)
        steps.append(step)
    rest_outs = list(rest_body.outputs)
    _finish(rest_body, [rest_of(b_in[j]) for j in plan.rest] + [rest_of(t) for t in b_in[n:]] + steps,
            [rest_outs[j] for j in plan.rest] + [rest_outs[n + i] for i in plan.rest_outputs], names)
    _finish(first_body, [first_of(b_in[j]) for j in plan.first] + [first_of(t) for t in b_in[n:]],
            [first_of(b_out[j]) for j in plan.first] + [first_of(b_out[n + i]) for i in plan.first_outputs]
            + [first_of(f) for f in emitted], names)
    leaks = [(g, [of(b_in[j]) for j in other]) for g, of, other in
             ((rest_body, rest_of, plan.first), (first_body, first_of, plan.rest))]
    if any(_read_in(t, g) for g, ts in leaks for t in ts):
        for g in (rest_body, first_body) if not reuse_body else (rest_body,):
            unhook_graph(g)
        return "the pieces would still read each other's states"
    new_stacks = [gs.Variable(names.fresh(f"{f.name}_stacked"), dtype=_dtype(f, ctx)) for f in emitted]
    made = iter(new_stacks)
    stacks = [ys[plan.stacked_as[p]] if p in plan.stacked_as else next(made) for p in range(len(plan.frontier))]
    attrs = dict(node.attrs)
    first_attrs = _attrs(attrs, view, first_body, plan.first_outputs, 0)
    rest_attrs = _attrs(attrs, view, rest_body, plan.rest_outputs, len(steps))
    first = gs.Node("Scan", name=node.name or ctx.names.fresh(node_label(node)) if reuse_body else node.name, attrs=first_attrs, domain=node.domain,
                    inputs=list(inputs[:lead]) + [inits[j] for j in plan.first] + list(xs),
                    outputs=[finals[j] for j in plan.first] + [ys[i] for i in plan.first_outputs] + new_stacks)
    rest = gs.Node("Scan", name=rest_name, attrs=rest_attrs, domain=node.domain,
                   inputs=list(inputs[:lead]) + [inits[j] for j in plan.rest] + list(xs) + stacks,
                   outputs=[finals[j] for j in plan.rest] + [ys[i] for i in plan.rest_outputs])
    return first, rest


def _attrs(attrs: dict, view: ScanView, body: gs.Graph, outputs: list[int], extra_inputs: int) -> dict:
    """A piece's attributes: the node's, its own scan outputs', and forward axis-0 entries
    for the frontier (the first piece's extra outputs, the rest's extra inputs)."""
    m = view.num_scan_inputs
    extra_outputs = len(body.outputs) - len(outputs) - (len(body.inputs) - m - extra_inputs)
    new = dict(attrs, body=body, num_scan_inputs=m + extra_inputs)
    if view.batched:
        if "directions" in attrs:
            new["directions"] = list(view.input_directions) + [0] * extra_inputs
        return new
    per = {"scan_input_axes": (list(view.input_axes), extra_inputs), "scan_input_directions": (list(view.input_directions), extra_inputs),
           "scan_output_axes": ([view.output_axes[i] for i in outputs], extra_outputs),
           "scan_output_directions": ([view.output_directions[i] for i in outputs], extra_outputs)}
    for key, (values, more) in per.items():
        raw = attrs.get(key)
        if key.startswith("scan_input"):
            values = list(raw) if raw is not None else values
        else:
            values = [list(raw)[i] for i in outputs] if raw is not None else values
        values += [0] * more
        if any(values) or (raw is not None and values):
            new[key] = values
        else:
            new.pop(key, None)
    return new


def _copy(body: gs.Graph, ctx):
    """A detached copy of ``body`` and original -> copy for its inputs and its nodes'
    values; a copy without a declared shape or type takes the original's inferred one."""
    from scanopt.clone import clone_graph

    copy = clone_graph(body, ctx.names)
    mapping = {id(a): b for a, b in zip(body.inputs, copy.inputs)}
    for old, new in zip(body.nodes, copy.nodes):
        for a, b in zip(list(old.inputs) + list(old.outputs), list(new.inputs) + list(new.outputs)):
            mapping.setdefault(id(a), b)
    for a in list(body.inputs) + [t for node in body.nodes for t in node.outputs]:
        b = mapping[id(a)]
        if b.shape is None:
            b.shape = ctx.shapes.shape(a)
        if b.dtype is None:
            b.dtype = _dtype(a, ctx)
    return copy, lambda t: mapping.get(id(t), t)


def _finish(body: gs.Graph, inputs: list, outputs: list, names) -> None:
    """Give ``body`` its signature; an output that is an input or listed twice goes
    through an Identity; drop the nodes nothing reads any more."""
    listed: set[int] = {id(t) for t in inputs}
    final = []
    for t in outputs:
        if id(t) in listed:
            copy = gs.Variable(names.fresh(f"{t.name}_copy"), dtype=t.dtype, shape=t.shape)
            body.nodes.append(gs.Node("Identity", name=names.fresh(f"{t.name}_copy"), inputs=[t], outputs=[copy]))
            t = copy
        listed.add(id(t))
        final.append(t)
    body.inputs = list(inputs)
    body.outputs = final
    dropped = [node for node in body.nodes]
    cleanup(body)
    kept = {id(node) for node in body.nodes}
    for node in dropped:  # a removed node's own bodies still hold reads of our values
        if id(node) not in kept:
            for level in walk_graphs(gs.Graph(nodes=[node])):
                if level.parents:
                    unhook_graph(level.graph, recurse=False)


def _read_in(t: gs.Tensor, graph: gs.Graph) -> bool:
    """Whether a node of ``graph`` (nested bodies included) or its outputs read ``t``."""
    return any(t is x for level in walk_graphs(graph) for node in level.graph.nodes for x in node.inputs) or any(
        t is o for o in graph.outputs)


def _dtype(t: gs.Tensor, ctx):
    dtype = t.dtype if t.dtype is not None else ctx.shapes.dtype(t)
    return dtype


def unhook(node: gs.Node) -> None:
    """Detach a node that never joins the graph, and every node of its bodies, from the
    tensors they read and write (gs keeps readers on each tensor)."""
    for level in walk_graphs(gs.Graph(nodes=[node])):
        unhook_graph(level.graph, recurse=False)


def unhook_graph(graph: gs.Graph, recurse: bool = True) -> None:
    levels = walk_graphs(graph) if recurse else [GraphLevel(graph, (), "")]
    for level in levels:
        for node in level.graph.nodes:
            node.inputs.clear()
            node.outputs.clear()
