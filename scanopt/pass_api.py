"""The pass interface: what a pass is, what it returns, and how passes register.

A pass takes the model's top gs.Graph, rewrites what it can prove equivalent at every
nesting level, and returns a ScanPassResult saying per Scan node (per Loop node for a
LoopPass) what it did or why not.
Most passes are ScanPasses: ``match`` inspects one Scan and returns a Match or a
Skip(reason) without touching the graph or taking a fresh name (a trial build draws from
``NameAllocator.draft``); ``rewrite`` runs only on a Match. A declined match therefore leaves
the graph exactly as it was, and a pipeline run can ask every form about every Scan
(scanopt.chooser) without changing what the rewrites write.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import onnx_graphsurgeon as gs

from scanopt.graph import GraphLevel, NameAllocator, editing, is_op, is_removed, node_label, walk_graphs
from scanopt.scan_view import ScanView
from scanopt.shapes import ShapeTable


@dataclass(frozen=True)
class NodeOutcome:
    """What one pass did with one Scan node: applied (with detail) or skipped (with reason)."""

    pass_name: str
    node: str
    path: str  # the graph holding the node; "" for the top graph
    applied: bool
    detail: str
    expected: str = ""  # the cost policy's word on an applied rewrite: expected speed-up and why
    speedup: float | None = None  # the cost policy's number: expected (or measured) speed-up of this form
    measured: bool = False  # speedup was measured (--tune), not predicted
    declined_for_speed: bool = False  # the pass matched; the cost policy declined the rewrite
    kept: str = ""  # on a decline for speed: the form chosen instead ("loop" or another), where known

    def to_dict(self) -> dict:
        return {
            "pass": self.pass_name,
            "node": self.node,
            "graph": self.path or "main",
            "applied": self.applied,
            "detail": self.detail,
            "expected": self.expected,
            "speedup": self.speedup,
            "measured": self.measured,
            "declined_for_speed": self.declined_for_speed,
            "kept": self.kept,
        }


@dataclass
class ScanPassResult:
    """What one scanopt pass returns: the (edited) graph, whether anything changed, and per
    Scan what was done or why not. Not onnx_ir's PassResult(model, modified): see
    :func:`scanopt.ir_pass` for an onnx_ir pass."""

    graph: gs.Graph
    modified: bool
    outcomes: list[NodeOutcome] = field(default_factory=list)


def __getattr__(name: str):
    """``PassResult``: the old name of ScanPassResult, kept for a while with a warning."""
    if name == "PassResult":
        import warnings

        warnings.warn("scanopt PassResult is renamed ScanPassResult (onnx_ir's PassResult is a different "
                      "type)", DeprecationWarning, stacklevel=2)
        return ScanPassResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class PassContext:
    """What passes share during one pipeline run."""

    opset: int
    names: NameAllocator
    shapes: ShapeTable
    options: dict[str, Any] = field(default_factory=dict)
    # names of the passes this run executes (None: unknown, e.g. a pass used alone)
    selected: tuple[str, ...] | None = None
    # (pass name, node label) pairs a pass must not rewrite, e.g. after a failed verification
    denied: frozenset[tuple[str, str]] = frozenset()
    # decides whether a form's proposed rewrite applies (scanopt.chooser.Chooser); None: every
    # proposal applies but where a form defers to another (Pass.defers_to)
    chooser: Any = None
    # rewrites applied so far in this run (any pass): what a pass keeps in ``memo`` about
    # the graph between calls is valid while this stays the same
    edits: int = 0
    memo: dict = field(default_factory=dict)
    # label of a Scan a rewrite emitted -> label of the Scan it replaced: a measured choice for
    # that Scan (scanopt.tune) covers it too (fuse's per-step cell-state loop, for one)
    derived: dict[str, str] = field(default_factory=dict)
    # name of a loop a rewrite emitted as its chosen form -> that pass: no Scan pass rewrites it
    # again in this run (loop_to_scan, a Loop pass, may still make it a Scan, keeping the name)
    chosen: dict[str, str] = field(default_factory=dict)
    # name of a Scan a rewrite kept as the loop branch of a run-time dispatch (linrec's If on a
    # symbolic length) -> that pass: it does not rewrite the Scan again; other passes may (hoist)
    loop_branches: dict[str, str] = field(default_factory=dict)
    # called with (Scans done, Scans in total) as a pass walks the Scans (scanopt.progress)
    progress: Callable[[int, int], None] | None = None
    # inputs a rewrite is sensitive to, named by the pass that applied it: graph input name ->
    # (low, high, why): the range the model is meant to be fed in (linattn: a log decay g <= 0,
    # where exp(g) > 1 makes the state grow without bound). Verification draws them there
    # (scanopt.inputs.InputSynthesizer); a pass adds to it in ``rewrite`` only.
    input_ranges: dict[str, tuple[float | None, float | None, str]] = field(default_factory=dict)
    # (tensor, axis) of each top-graph tensor a top-level Loop of the model reads one slice of per
    # iteration, where loop_to_scan made that Loop a Scan: verification probes these sequences as
    # it does a top-level Scan's scanned inputs (a NaN at one step, a long sequence, a wide batch:
    # scanopt.edge_inputs, scanopt.weak_spots); loop_to_scan adds to it in ``rewrite`` only.
    loop_reads: list[tuple[str, int]] = field(default_factory=list)


# In the name of a Scan a rewrite keeps as its own fallback behind an If (linrec's two-pass form
# where a chunk start overflows): no pass rewrites it, in this run or a later one on the result.
FALLBACK_MARK = "scanopt_fallback"


def is_fallback(node: gs.Node) -> bool:
    return bool(node.name) and FALLBACK_MARK in node.name


@dataclass(frozen=True)
class Skip:
    """A declined match and the reason a user can act on."""

    reason: str


class Match:
    """Base for what a pass's ``match`` hands to its ``rewrite``; passes subclass it."""

    # a length below which the matched form measured slower than the loop, for a Scan whose
    # length is symbolic: unmeasured, the cost policy keeps the loop (it may run that short)
    slower_below: int | None = None
    # a run-time dispatch the form can be written as: the loop where the dim ``dispatch_on``
    # ("T": the length, "B": the batch) is at least ``dispatch_below``, the form below it (the
    # length: the loop below, measured never slower than the loop). The chooser sets
    # ``dispatch`` (and, where the pass leaves it to the cost model, ``dispatch_below``) where it
    # chooses that (Estimate.dispatch)
    dispatch_on: str = "T"
    dispatch_below: int | None = None
    dispatch: bool = False

    def native_ops(self) -> tuple[tuple[str, dict, tuple[str, ...]], ...]:
        """(op type, attributes, optional inputs given) of each native recurrent op the rewrite
        writes, which a target's runtime must run (scanopt.portable); none by default."""
        return ()


class Pass:
    """A named rewrite over the whole model."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    # "normalizer": changes how a Scan is written, not the work it does (loop_to_scan, upgrade,
    # canonicalize, cleanup); it never asks the chooser. "form": builds another form of a Scan's
    # computation, applied where the chooser (scanopt.chooser) picks it.
    kind: ClassVar[str] = "form"
    # where the pass runs in the pipeline (lower first; scanopt.pipeline lists the order)
    order: ClassVar[int] = 500
    # the report's and the measured times' name of the form this pass builds ("" : its name)
    form: ClassVar[str] = ""
    # the form leaves no loop behind (a native op, CumSum, a map's batch): worth a second loop
    # where a Scan is split so that a piece gets it (canonicalize's fission)
    loop_free: ClassVar[bool] = False
    # why this form is not applied unmeasured ("" : it is), where only a measurement at the
    # model's shapes can tell whether it is faster
    needs_measurement: ClassVar[str] = ""
    # forms that go first where they also match and the chooser applies them (unroll: copying
    # the body per step destroys the cell fuse matches)
    defers_to: ClassVar[tuple[str, ...]] = ()
    # options this pass reads from PassContext.options that a user may set (the CLI's
    # --pass-option KEY=VALUE): key -> (type, one line of help)
    tunables: ClassVar[dict[str, tuple[type, str]]] = {}

    def __call__(self, graph: gs.Graph, ctx: PassContext) -> ScanPassResult:
        raise NotImplementedError

    def running(self, ctx: PassContext):
        """A context around one run of the pass over the model (alone, or with the other forms
        in the chooser's walk): where a pass keeps what its Scans share (fuse: emitted
        weights, partner look-ups). None by default."""
        return nullcontext()


class ScanPass(Pass):
    """A pass that considers each Scan node on its own, at every nesting level."""

    def match(self, node: gs.Node, view: ScanView, level: GraphLevel, ctx: PassContext) -> Match | Skip:
        raise NotImplementedError

    def rewrite(self, node: gs.Node, match: Match, level: GraphLevel, ctx: PassContext) -> str:
        """Apply the rewrite; return a one-line description of what was done."""
        raise NotImplementedError

    def __call__(self, graph: gs.Graph, ctx: PassContext) -> ScanPassResult:
        """The pass alone over every Scan (a pipeline run asks every form at once instead:
        :meth:`scanopt.chooser.Chooser.walk`)."""
        with self.running(ctx), editing(graph) as session:
            result = self._run(graph, ctx)
            session.changed = result.modified  # a declined match leaves the graph as it was
        return result

    def _run(self, graph: gs.Graph, ctx: PassContext) -> ScanPassResult:
        result = ScanPassResult(graph, modified=False)
        # Deepest first: a rewrite of an outer Scan may copy or drop its body, so
        # everything nested in it is settled before.
        found_scans = sorted(scan_nodes(graph), key=lambda pair: -pair[0].depth)
        for done, (level, node) in enumerate(found_scans):
            if ctx.progress is not None:
                ctx.progress(done, len(found_scans))
            if is_removed(node):  # by an earlier rewrite in this run
                continue
            label = node_label(node)
            refused = refusal(self.name, node, label, ctx)
            if refused is not None:
                if refused:
                    result.outcomes.append(NodeOutcome(self.name, label, level.path, False, refused))
                continue
            view = ScanView.from_gs(node, ctx.opset, ctx.shapes)
            found = self.match(node, view, level, ctx)
            if isinstance(found, Skip):
                result.outcomes.append(NodeOutcome(self.name, label, level.path, False, found.reason))
                continue
            estimate = decide(self, node, view, found, level, ctx)
            if estimate is not None and not estimate.apply:
                result.outcomes.append(declined(self.name, label, level, estimate))
                continue
            result.outcomes.append(apply(self, node, found, estimate, level, ctx))
            result.modified = True
        if ctx.progress is not None and found_scans:
            ctx.progress(len(found_scans), len(found_scans))
        return result


def refusal(pass_name: str, node: gs.Node, label: str, ctx: PassContext) -> str | None:
    """Why ``pass_name`` does not consider ``node`` at all, before any match: "" to say
    nothing (a rewrite's own fallback, whose rewrite's line says so), else the report's
    reason; None: it is considered."""
    if (pass_name, label) in ctx.denied:
        return "rolled back: failed verification"
    if is_fallback(node):
        return ""
    owner = ctx.chosen.get(node.name) if node.name else None
    if owner is not None:
        return f"a loop {owner} {EMITTED}"
    return None


EMITTED = "emitted as the form it chose: not rewritten again"


def is_emitted(outcome: NodeOutcome) -> bool:
    """A skip that only says the Scan is part of another rewrite's form (whose own line says so)."""
    return not outcome.applied and outcome.detail.endswith(EMITTED)


def declined(pass_name: str, label: str, level: GraphLevel, estimate) -> NodeOutcome:
    """The outcome of a proposal the chooser declined (``estimate``: its scanopt.cost.Estimate)."""
    return NodeOutcome(pass_name, label, level.path, False, estimate.note, speedup=estimate.speedup,
                       measured=estimate.measured, declined_for_speed=True, kept=estimate.kept)


def apply(scan_pass: "ScanPass", node: gs.Node, found: Match, estimate, level: GraphLevel,
          ctx: PassContext) -> NodeOutcome:
    """Rewrite ``node`` as ``found`` proposes, in the form ``estimate`` (the chooser's verdict,
    or None) chose; count the edit and return the outcome."""
    label = node_label(node)
    if estimate is not None and estimate.dispatch:
        found.dispatch = True
        if estimate.dispatch_below is not None:
            found.dispatch_below = estimate.dispatch_below
    detail = scan_pass.rewrite(node, found, level, ctx)
    ctx.edits += 1
    if estimate is None:
        return NodeOutcome(scan_pass.name, label, level.path, True, detail)
    return NodeOutcome(scan_pass.name, label, level.path, True, detail, estimate.note,
                       speedup=estimate.speedup, measured=estimate.measured)


class LoopPass(Pass):
    """A pass that considers each Loop node on its own, deepest first, like ScanPass does
    Scans (no ScanView, no cost policy: a Loop pass changes the form, not the work)."""

    def match(self, node: gs.Node, level: GraphLevel, ctx: PassContext) -> Match | Skip:
        raise NotImplementedError

    def rewrite(self, node: gs.Node, match: Match, level: GraphLevel, ctx: PassContext) -> str:
        raise NotImplementedError

    def __call__(self, graph: gs.Graph, ctx: PassContext) -> ScanPassResult:
        with editing(graph) as session:
            result = ScanPassResult(graph, modified=False)
            for level, node in sorted(op_nodes(graph, "Loop"), key=lambda pair: -pair[0].depth):
                if is_removed(node):
                    continue
                label = node_label(node)
                if (self.name, label) in ctx.denied:
                    result.outcomes.append(NodeOutcome(self.name, label, level.path, False, "rolled back: failed verification"))
                    continue
                found = self.match(node, level, ctx)
                if isinstance(found, Skip):
                    result.outcomes.append(NodeOutcome(self.name, label, level.path, False, found.reason))
                    continue
                detail = self.rewrite(node, found, level, ctx)
                ctx.edits += 1
                result.modified = True
                result.outcomes.append(NodeOutcome(self.name, label, level.path, True, detail))
            session.changed = result.modified
        return result


def decide(scan_pass: "ScanPass", node: gs.Node, view: ScanView, match: Match, level: GraphLevel | None,
           ctx: PassContext):
    """The chooser's verdict on ``match`` (scanopt.chooser), or None: apply it."""
    if ctx.chooser is None:
        from scanopt.chooser import Chooser

        return Chooser(None).verdict(scan_pass, node, view, match, level, ctx)
    return ctx.chooser.verdict(scan_pass, node, view, match, level, ctx)


def op_nodes(graph: gs.Graph, op_type: str):
    """(GraphLevel, node) for every default-domain ``op_type`` node, outermost first."""
    for level in walk_graphs(graph):
        for node in level.graph.nodes:
            if is_op(node, op_type):
                yield level, node


def scan_nodes(graph: gs.Graph):
    """(GraphLevel, node) for every default-domain Scan node, outermost first."""
    return op_nodes(graph, "Scan")


_REGISTRY: dict[str, type[Pass]] = {}


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator: make a pass available by name to the pipeline and ``--passes``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def registered_passes() -> dict[str, type[Pass]]:
    import scanopt.passes  # noqa: F401 - importing registers the built-in passes

    return dict(_REGISTRY)


def pass_order(registry: dict[str, type[Pass]] | None = None) -> tuple[str, ...]:
    """The names of ``registry``'s passes (default: the registered ones) in pipeline order."""
    registry = registered_passes() if registry is None else registry
    return tuple(sorted(registry, key=lambda name: (registry[name].order, name)))


# A pair of forms whose name is not its parts' joined (fuse, then hoist of what is left).
PAIR_NAMES = {("fuse", "hoist"): "hoisted+native"}


def form_name(passes) -> str:
    """The report's (and the measured times') name of the form a set of passes builds: "loop"
    for none, a pass's ``form`` (else its name) for one."""
    key = tuple(sorted(passes))
    if not key:
        return "loop"
    if key in PAIR_NAMES:
        return PAIR_NAMES[key]
    registry = registered_passes()
    return "+".join((getattr(registry.get(p), "form", "") or p) for p in key)
