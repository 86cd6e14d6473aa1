"""The one place that decides which form a Scan gets.

Passes are of two kinds (``Pass.kind``). A *normalizer* (loop_to_scan, upgrade, canonicalize,
cleanup) changes how a Scan is written, not its work, and never asks. A *form* (fuse, linattn,
linrec, distances, vectorize, hoist, unroll, and any pass registered later) proposes with its
``match`` (pure: the graph is not touched) and builds with its ``rewrite``; the chooser says
whether a proposal applies, from, in order:

- a measurement (:mod:`scanopt.tune`): the form timed fastest at the deployment shapes;
- else the cost policy's model (:mod:`scanopt.cost`), which ranks the proposal against the other
  modelled forms that match the same Scan (collected here, once per decision);
- else the preference: forms the model has no numbers for apply, a form defers to those named in
  its ``defers_to`` that match and apply (unroll to fuse), and the pipeline order settles the rest.

Only this module calls a pass's ``match`` or ``rewrite`` on another pass's behalf (the cost
policy's alternatives, canonicalize's trial split) and only it calls the cost policy.
"""

from __future__ import annotations

import itertools
from typing import Any

import onnx_graphsurgeon as gs

from scanopt.cost import MODEL_MARGIN, CostPolicy, Estimate
from scanopt.graph import GraphLevel, node_label
from scanopt.pass_api import Match, PassContext, Skip, form_name, pass_order, registered_passes
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
                ctx: PassContext) -> Estimate | None:
        """Whether ``scan_pass``'s proposal ``match`` for ``node`` applies, with the numbers behind
        it; None for a normalizer (it does not ask)."""
        if scan_pass.kind != "form":
            return None
        if self.portable_output:
            refused = match_refusal(match)
            if refused is not None:
                return Estimate(False, None, f"not applied for --target portable: {refused}")
        label = node_label(node)
        ahead = self._deferred_to(scan_pass, node, view, level, ctx)
        if ahead is not None:
            return Estimate(False, None, f"left to {ahead}: it becomes {_article(ahead)}", kept=_form(ahead))
        if self.policy is None:
            return None
        alternatives = {}
        if scan_pass.name in MODEL_MARGIN and level is not None:
            modelled = [name for name in self.forms(ctx) if name != scan_pass.name and name in MODEL_MARGIN]
            alternatives = dict(proposals(modelled, node, view, level, ctx))
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
                     ctx: PassContext) -> str | None:
        """The first form of ``scan_pass.defers_to`` in this run that matches ``node`` and would
        be applied, or None."""
        if level is None or not view.trip_count:
            return None
        registry = registered_passes()
        wanted = [name for name in scan_pass.defers_to if name in self.forms(ctx)]
        for name, match in proposals(wanted, node, view, level, ctx):
            estimate = self.verdict(registry[name], node, view, match, level, ctx)
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


def _form(name: str) -> str:
    return form_name((name,))


def _article(name: str) -> str:
    """The words for what a form makes of a Scan ("a native op")."""
    return "a native op" if name == "fuse" else f"its {_form(name)} form"
