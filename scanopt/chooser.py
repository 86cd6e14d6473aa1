"""The one place that decides which form a Scan gets.

Passes are of two kinds (``Pass.kind``). A *normalizer* (loop_to_scan, upgrade, canonicalize,
cleanup) changes how a Scan is written, not its work, and never asks. A *form* (fuse, linattn,
linrec, distances, vectorize, hoist, unroll, and any pass registered later) proposes with its
``match`` (pure: the graph and the names are not touched) and builds with its ``rewrite``.

In a pipeline run the forms do not run one after another: :meth:`Chooser.walk` visits the
Scans once, deepest first, and per Scan collects every form's proposal once, then takes the
first proposal, in the preference order, whose verdict applies it. The verdict comes from:

- a measurement (:mod:`scanopt.tune`): the form timed fastest at the deployment shapes;
- else the cost policy's model (:mod:`scanopt.cost`), which ranks the modelled forms that
  propose (their proposals taken from the collection, not asked again) against the loop;
- else the preference: forms the model has no numbers for apply, a form defers to those named in
  its ``defers_to`` that propose and apply (unroll to fuse), and the pipeline order (each pass's
  ``order``) settles the rest.

The winner is applied; every other proposal gets a "not chosen" line in the report, with its
time against the winner's where there are numbers. A Scan the winner leaves (the same one
rewritten in place by hoist or moved into a run-time dispatch's branch, or one emitted near its
outputs) is proposed on by the forms after the winner, in the same walk; the written model is
then what running the forms one after another in that order wrote (a level a rewrite left
unsorted is sorted where that form's own pass over the model would have ended: before a later
form rewrites there, :meth:`Walk.settle`, and before a Scan holding it is read,
:meth:`Walk.sort_inside`). On failed verification
the pipeline runs again with the failed (form, Scan) denied, and the next proposal wins.

Only this module calls a pass's ``match`` or ``rewrite`` on another pass's behalf (the walk,
the cost policy's alternatives, canonicalize's trial split) and only it calls the cost policy.
"""

from __future__ import annotations

import itertools
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import onnx_graphsurgeon as gs

from scanopt.cost import MODEL_MARGIN, CostPolicy, Estimate
from scanopt.graph import GraphLevel, editing, has_node, is_removed, node_label, sort_level, subgraphs_of
from scanopt.pass_api import (
    Match, NodeOutcome, PassContext, ScanPass, Skip, apply, declined, form_name, pass_order, refusal,
    registered_passes, scan_nodes,
)
from scanopt.portable import match_refusal
from scanopt.scan_view import ScanView


class Chooser:
    """Decides each proposed rewrite of a pipeline run (see the module docstring)."""

    def __init__(self, policy: CostPolicy | None, portable_output: bool = False):
        self.policy = policy  # None: a pass used alone, every proposal applies (deferrals apart)
        # --target portable's output: no form whose native op a portable runtime refuses (scanopt.portable)
        self.portable_output = portable_output

    @classmethod
    def from_options(cls, options: dict, denied: frozenset = frozenset()) -> "Chooser":
        """The chooser of a pipeline run; ``denied``: (pass, Scan label) pairs rolled back after a
        failed verification, whose measured choices fall to the next fastest form."""
        policy = CostPolicy.from_options(options)
        if denied and policy.measured:
            policy.measured = {label: next_choice(choice, {p for p, at in denied if at == label})
                               for label, choice in policy.measured.items()}
        return cls(policy, bool(options.get("portable_output")))

    @property
    def portable(self) -> bool:
        """Every proven form applies (``--target portable``): the question is what the forms
        leave, not their speed."""
        return self.policy is None or self.policy.target == "portable"

    def verdict(self, scan_pass, node: gs.Node, view: ScanView, match: Match, level: GraphLevel | None,
                ctx: PassContext, offers: dict | None = None) -> Estimate | None:
        """Whether ``scan_pass``'s proposal ``match`` for ``node`` applies, with the numbers behind
        it; None for a normalizer (it does not ask). ``offers``: the other forms' proposals for
        ``node`` as it stands ({pass: Match, or why not}), collected once by :meth:`walk`;
        without them (or for a form they lack) the other forms are asked here."""
        if scan_pass.kind != "form":
            return None
        if self.portable_output:
            refused = match_refusal(match)
            if refused is not None:
                return Estimate(False, None, f"not applied for --target portable: {refused}")
        label = node_label(node)
        ahead = self._deferred_to(scan_pass, node, view, level, ctx, offers)
        if ahead is not None:
            return Estimate(False, None, f"left to {ahead}: it becomes {_article(ahead)}", kept=_form(ahead))
        if self.policy is None:
            return None
        alternatives = {}
        if scan_pass.name in MODEL_MARGIN and level is not None:
            modelled = [name for name in self.forms(ctx) if name != scan_pass.name and name in MODEL_MARGIN]
            alternatives = dict(_offered(modelled, node, view, level, ctx, offers))
        return self.policy.decide(scan_pass, label, node, view, match, ctx, level, alternatives)

    def forms(self, ctx: PassContext, loop_free: bool = False) -> list[str]:
        """The form passes this run has (in pipeline order); ``loop_free``: only those whose
        form leaves no loop."""
        registry = registered_passes()
        return [name for name in pass_order(registry) if registry[name].kind == "form" and (not loop_free or registry[name].loop_free)
                and (ctx.selected is None or name in ctx.selected)]

    def applied_forms(self, node: gs.Node, view: ScanView, level: GraphLevel, ctx: PassContext) -> list[tuple[str, Any]]:
        """(form, its verdict) for each loop-free form that proposes a rewrite of ``node`` and
        would be applied: what a Scan, or a piece of one split in two, would become."""
        registry = registered_passes()
        found = []
        for name, match in proposals(self.forms(ctx, loop_free=True), node, view, level, ctx):
            estimate = self.verdict(registry[name], node, view, match, level, ctx)
            if estimate is None or estimate.apply:
                found.append((name, estimate))
        return found

    def walk(self, graph: gs.Graph, forms: list[ScanPass], ctx: PassContext) -> "Walk":
        """One pass of the forms ``forms`` (in pipeline order) over every Scan of ``graph``,
        deepest first: per Scan, every form's proposal collected once, the first that the
        verdicts apply (see the module docstring) rewritten, the rest reported "not chosen"."""
        done = Walk({p.name: [] for p in forms}, dict.fromkeys((p.name for p in forms), 0.0), set())
        with ExitStack() as stack:
            for form in forms:
                stack.enter_context(form.running(ctx))
            session = stack.enter_context(editing(graph))
            # Deepest first: a rewrite of an outer Scan may copy or drop its body, so
            # everything nested in it is settled before.
            found = sorted(scan_nodes(graph), key=lambda pair: -pair[0].depth)
            done.known.update(id(node) for _, node in found)
            for count, (level, node) in enumerate(found):
                if ctx.progress is not None:
                    ctx.progress(count, len(found))
                if not is_removed(node):  # else by an earlier rewrite in this walk
                    self._choose(node, level, forms, ctx, done)
            session.changed = bool(done.modified)
        if ctx.progress is not None and found:
            ctx.progress(len(found), len(found))
        return done

    def _choose(self, node: gs.Node, level: GraphLevel, forms: list[ScanPass], ctx: PassContext, done: "Walk") -> None:
        """Decide one Scan: collect every proposal, rank them once, apply the winner, report the
        rest. A Scan the winner leaves (the same one rewritten in place or moved into a run-time
        dispatch's branch, or one it emits) is decided by the forms after the winner."""
        pending = list(forms)
        done.sort_inside(node)
        while pending:
            label = node_label(node)
            view = ScanView.from_gs(node, ctx.opset, ctx.shapes)
            offers = {form.name: self._offer(form, node, view, label, level, ctx, done) for form in pending}
            ranked = self._rank(pending, offers, node, view, level, ctx, done)
            winner = next((form for form, estimate in ranked.items() if estimate is None or estimate.apply), None)
            for form in pending:  # what each form said, up to the winner
                if form is winner:
                    break
                offer = offers[form.name]
                if isinstance(offer, Match):
                    done.outcomes[form.name].append(declined(form.name, label, level, ranked[form]))
                elif offer:  # "": a rewrite's own fallback, said nothing about
                    done.outcomes[form.name].append(NodeOutcome(form.name, label, level.path, False, offer))
            if winner is None:
                return
            start = time.perf_counter()
            outputs = [t for t in node.outputs if t.name]
            done.settle(level, winner.name)
            done.outcomes[winner.name].append(apply(winner, node, offers[winner.name], ranked[winner], level, ctx))
            done.seconds[winner.name] += time.perf_counter() - start
            done.modified.add(winner.name)
            later = pending[pending.index(winner) + 1:]
            if not is_removed(node) and has_node(level.graph, node):
                pending = later  # rewritten in place (hoist): the later forms propose on what it became
                continue
            left = _left_by(node, level, outputs) if later else []
            if not any(scan is node for scan, _ in left):
                for other in later:  # the Scan is gone: every later proposal lost to the winner
                    if isinstance(offers[other.name], Match):
                        why = self._not_chosen(other, ranked[other], winner, ranked[winner], label, level, ctx)
                        done.outcomes[other.name].append(NodeOutcome(other.name, label, level.path, False, why,
                                                                     kept=_form(winner.name)))
            for scan, where in left:
                if not is_removed(scan) and (scan is node or id(scan) not in done.known):
                    done.known.add(id(scan))  # one the walk visits, or one a rewrite left: decided once
                    self._choose(scan, where, later, ctx, done)
            return

    def _rank(self, pending: list[ScanPass], offers: dict, node: gs.Node, view: ScanView, level: GraphLevel,
              ctx: PassContext, done: "Walk") -> "Ranking":
        """Every proposal's verdict, once, in the preference order (the forms' pipeline order):
        the winner is the first one that applies."""
        ranked = Ranking()
        for form in pending:
            if isinstance(offers[form.name], Match):
                start = time.perf_counter()
                ranked[form] = self.verdict(form, node, view, offers[form.name], level, ctx, offers)
                done.seconds[form.name] += time.perf_counter() - start
        return ranked

    @staticmethod
    def _offer(form: ScanPass, node: gs.Node, view: ScanView, label: str, level: GraphLevel, ctx: PassContext,
               done: "Walk"):
        """``form``'s proposal for ``node``: a Match, else the report's reason ("" for none)."""
        refused = refusal(form.name, node, label, ctx)
        if refused is not None:
            return refused
        start = time.perf_counter()
        try:
            found = form.match(node, view, level, ctx)
        except Exception as exc:  # noqa: BLE001 - a pass never crashes on a Scan it does not understand
            said = (str(exc).splitlines() or [""])[0][:120]
            found = Skip(f"cannot judge this Scan ({type(exc).__name__}: {said})")
        done.seconds[form.name] += time.perf_counter() - start
        return found.reason if isinstance(found, Skip) else found

    def _not_chosen(self, other: ScanPass, estimate: Estimate | None, winner: ScanPass, won: Estimate | None,
                    label: str, level: GraphLevel, ctx: PassContext) -> str:
        """The report's line for ``other``'s proposal (its verdict ``estimate``), which lost to
        ``winner`` (verdict ``won``): both times where measured or modelled, else why not."""
        mine, theirs = _form(other.name), _form(winner.name)
        choice = self.policy.measured_for(label, level, ctx) if self.policy is not None else None
        times = (choice or {}).get("times") or {}
        best = (choice or {}).get("form")
        if mine in times and best in times:
            return f"not chosen: {mine} ({times[mine] * 1e3:.3g} ms vs {best}'s {times[best] * 1e3:.3g} ms, measured)"
        if estimate is not None and won is not None and estimate.speedup and won.speedup and not won.measured:
            return (f"not chosen: {mine} ({1 / estimate.speedup:.2f}x the loop's time vs {theirs}'s "
                    f"{1 / won.speedup:.2f}x, modelled)")
        if estimate is not None and not estimate.apply:
            return f"not chosen: {mine} ({estimate.note})"
        return (f"not chosen: {mine} ({theirs} goes first: without numbers for both, the preference order of the "
                "forms decides, native ops and loop-free forms first)")

    def measured_choice(self, node: gs.Node, level: GraphLevel) -> dict | None:
        """The measured choice for a top-level ``node`` (scanopt.tune), or None."""
        if self.policy is None or level.path:
            return None
        return self.policy.measured.get(node_label(node))

    def share_measurement(self, choice: dict, name: str) -> None:
        """A Scan a rewrite emitted takes ``choice`` (a split's second piece: the timed form
        included the split)."""
        self.policy.measured[name] = choice

    @staticmethod
    def trial(name: str, node: gs.Node, level: GraphLevel, ctx: PassContext) -> bool:
        """Rewrite ``node`` (a detached copy the caller owns) with form ``name``; whether it
        did. A pass that cannot rewrite the copy leaves it as it was."""
        rewriter = registered_passes()[name]()
        try:
            match = rewriter.match(node, ScanView.from_gs(node, ctx.opset, ctx.shapes), level, ctx)
            if isinstance(match, Skip):
                return False
            rewriter.rewrite(node, match, level, ctx)
        except Exception:  # noqa: BLE001 - a pass that cannot rewrite the copy gives it no form
            return False
        return True

    def _deferred_to(self, scan_pass, node: gs.Node, view: ScanView, level: GraphLevel | None,
                     ctx: PassContext, offers: dict | None = None) -> str | None:
        """The first form of ``scan_pass.defers_to`` in this run that matches ``node`` and would
        be applied, or None."""
        if level is None or not view.trip_count:
            return None
        registry = registered_passes()
        wanted = [name for name in scan_pass.defers_to if name in self.forms(ctx)]
        for name, match in _offered(wanted, node, view, level, ctx, offers):
            estimate = self.verdict(registry[name], node, view, match, level, ctx, offers)
            if estimate is None or estimate.apply:
                return name
        return None


def next_choice(choice: dict, denied: set[str]) -> dict:
    """``choice`` (a measured one, scanopt.tune) when none of its passes is in ``denied``, else
    the fastest measured form that uses none of them (the loop when no form left beats it): a
    form that failed verification gives way to the next, not to the loop."""
    if not denied or not denied & set(choice.get("passes") or ()) or choice.get("form") is None:
        return choice
    names = {form_name(()): frozenset()}
    registry = registered_passes()
    forms = [name for name in registry if registry[name].kind == "form"]
    names.update((form_name(pair), frozenset(pair)) for k in (1, 2) for pair in itertools.combinations(forms, k))
    times = choice["times"]
    left = [f for f in times if f in names and not names[f] & denied]
    best = min(left, key=lambda f: times[f], default=form_name(()))
    if times.get(best, 0) >= times.get(form_name(()), 0):
        best = form_name(())
    failed = ", ".join(sorted(denied & set(choice["passes"])))
    return dict(choice, form=best, passes=sorted(names[best]),
                where=f"{choice['where']}; {choice['form']} failed verification ({failed}): the next fastest measured")


def proposals(names, node: gs.Node, view: ScanView, level: GraphLevel, ctx: PassContext):
    """(pass name, its Match) for each registered pass in ``names`` whose ``match`` accepts
    ``node``, without rewriting. A pass denied on the node, or one that cannot judge it (it
    raises), proposes nothing."""
    registry = registered_passes()
    for name in names:
        if name not in registry or (name, node_label(node)) in ctx.denied:
            continue
        try:
            found = registry[name]().match(node, view, level, ctx)
        except Exception:  # noqa: BLE001 - a pass that cannot judge this Scan proposes nothing
            continue
        if not isinstance(found, Skip):
            yield name, found


class Ranking(dict):
    """{form pass: its verdict (an Estimate, or None: apply)} for one Scan's proposals, in the
    preference order (:meth:`Chooser._rank`)."""


@dataclass
class Walk:
    """What one :meth:`Chooser.walk` did: per form, its outcomes (in the order of the Scans) and
    the seconds spent matching and rewriting; the forms that rewrote something."""

    outcomes: dict[str, list[NodeOutcome]]
    seconds: dict[str, float]
    modified: set[str] = field(default_factory=set)
    # id(graph) -> (the graph, the places in ``outcomes``' order of the forms that rewrote a
    # Scan in it since it was last sorted, how often it was sorted in this walk)
    dirty: dict[int, tuple[gs.Graph, set[int], int]] = field(default_factory=dict)
    # id(graph) -> the levels under it (itself included) a rewrite left unsorted in this walk
    under: dict[int, dict[int, gs.Graph]] = field(default_factory=dict)
    known: set[int] = field(default_factory=set)  # ids of the Scans this walk decides or decided

    def settle(self, level: GraphLevel, form: str) -> None:
        """Before ``form`` rewrites a Scan of ``level``: sort the level if a form earlier in the
        pipeline order rewrote there since, as the end of that form's own pass over the model
        did when forms ran one after another (the written node order stays theirs). At most
        once per form and level per walk, so the walk stays linear."""
        graph = level.graph
        place = list(self.outcomes).index(form)
        held, earlier, sorts = self.dirty.get(id(graph), (graph, set(), 0))
        if earlier and min(earlier) < place and sorts < len(self.outcomes):
            sort_level(graph)
            earlier, sorts = set(), sorts + 1
        self.dirty[id(graph)] = (graph, earlier | {place}, sorts)
        for holder in level.parents + (graph,):  # the Scans whose bodies hold it: sorted before they are read
            self.under.setdefault(id(holder), {})[id(graph)] = graph

    def sort_inside(self, node: gs.Node) -> None:
        """Before ``node``'s bodies are read (every form's match walks a body's nodes in order):
        sort the levels in them that a rewrite of this walk left unsorted, as the end of that
        rewrite's pass did."""
        for _, body in subgraphs_of(node):
            for graph in self.under.pop(id(body), {}).values():
                sort_level(graph)
                held, earlier, sorts = self.dirty.get(id(graph), (graph, set(), 0))
                self.dirty[id(graph)] = (graph, set(), sorts)


# How far back from a rewritten Scan's former outputs :func:`_left_by` looks for the Scans it left:
# producers (hops, and nodes in all)
REACH = 6
REACH_NODES = 64


def _left_by(node: gs.Node, level: GraphLevel, outputs: list) -> list[tuple[gs.Node, GraphLevel]]:
    """The Scans near ``node``'s former ``outputs`` after its rewrite (within REACH producers of
    them in ``level``'s graph, or directly in a branch of an If among those: ``node`` moved whole
    into a run-time dispatch, scanopt.rewrite.loop_where, or a Scan emitted in its place; the
    caller keeps those the walk already knew out), deepest first. Bounded (REACH_NODES), so
    O(1) per rewrite; a Scan it misses is decided in the next round."""
    found: dict[int, tuple[gs.Node, GraphLevel]] = {}
    seen: set[int] = set()
    frontier = list(outputs)
    for _ in range(REACH):
        producers = []
        for tensor in frontier:
            for holder in tensor.inputs:
                if id(holder) not in seen and len(seen) < REACH_NODES:
                    seen.add(id(holder))
                    producers.append(holder)
        for holder in producers:
            if holder.op == "Scan" and holder is not node:
                found.setdefault(id(holder), (holder, level))
            elif holder.op == "If":
                for key, sub in subgraphs_of(holder):
                    step = f"{node_label(holder)}/{key}"
                    inner = GraphLevel(sub, level.parents + (level.graph,), f"{level.path} > {step}" if level.path else step)
                    for scan in sub.nodes:
                        if scan.op == "Scan":
                            found.setdefault(id(scan), (scan, inner))
        frontier = [t for holder in producers for t in holder.inputs]
    return sorted(found.values(), key=lambda pair: -pair[1].depth)


def _offered(names, node: gs.Node, view: ScanView, level: GraphLevel, ctx: PassContext, offers: dict | None):
    """(pass name, its Match) for each of ``names`` that proposes a rewrite of ``node``: from
    ``offers`` (a walk's collection) where it holds the pass, else asked (:func:`proposals`)."""
    for name in names:
        if offers is not None and name in offers:
            if isinstance(offers[name], Match) and (name, node_label(node)) not in ctx.denied:
                yield name, offers[name]
        else:
            yield from proposals([name], node, view, level, ctx)


def _form(name: str) -> str:
    return form_name((name,))


def _article(name: str) -> str:
    """The words for what a form makes of a Scan ("a native op")."""
    return "a native op" if name == "fuse" else f"its {_form(name)} form"
