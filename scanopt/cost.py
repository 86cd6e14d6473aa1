"""Whether a rewrite pays off where the model runs (onnxruntime CPU).

Each Scan gets one *form*: the original loop, or what a set of passes builds from it
(``fuse``: the native op, ``hoist``: the hoisted loop, both: hoisted+native, ``vectorize``,
``unroll``, or any pass registered later). A pass's proposed rewrite applies exactly when it
belongs to the chosen form. The form is chosen:

- measured (:mod:`scanopt.tune`): every candidate form timed on the Scan's own subgraph at
  the deployment shapes; ``options["measured"]`` maps a top-level node label to the choice;
- else modelled, here: per form, per-step overhead plus FLOPs and gate elements at a rate
  (below); a rewritten form's modelled time is inflated by :data:`MODEL_MARGIN` (the model's
  error). Where a dim is unknown, over :data:`UNKNOWN_RANGE`, the form never more than 5%
  slower than the loop at any point and best in geometric mean; the note says which dims
  were unknown and what was assumed.
  The constants are committed (:data:`DEFAULT_CONSTANTS`, fitted to benchmarks/bench_policy.py),
  so a run without measurements gives the same output on every machine.

Targets: ``onnxruntime`` (the default) as above; ``portable`` applies every rewrite (native
ops and loop-free forms are what other backends can run). The execution provider
(:mod:`scanopt.providers`, ``options["deployment_target"]``): the CPU's is the model above; a
provider measured here comes as ``measured``; one that is not is modelled by its own model
(CUDA: :func:`scanopt.providers.cuda_seconds`) or, without one, gets the portable preference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from scanopt.pass_api import form_name

NOISE = 0.05
TARGETS = ("onnxruntime", "portable")

# Over these, a dim the graph (and the user) leaves unknown is assumed to range.
UNKNOWN_RANGE = {"B": (1, 8, 32), "T": (16, 128, 1024), "H": (16, 64, 256), "I": (16, 64, 256)}
SLOWER_BOUND = 1.05  # at known sizes, a modelled form is never chosen where it is more than 5% slower than the loop
# With unknown dims, a form modelled (margin included) at most this much slower than the loop at
# every point of the range and best in geometric mean is chosen: a native GRU or LSTM wins 2-8x
# at B=1 and loses 1.0-1.25x at B=32 T=1024 (measured, benchmarks/bench_cost.py over the range,
# docs/cost-policy.md), and "never 5% slower anywhere" kept the loop for all of them (issue 28:
# no shapes, 28 cells, geometric mean 1.73x the fastest form, worst 7.2x; with this bound and
# the margins below 1.05x, worst 1.82x, none slower than the loop at the cells' sizes).
RANGE_BOUND = 1.25
# A rewritten form's modelled time counts this much more: the model's error. bench_cost.py
# --emit gives the smallest factors with which no form chosen over the unknown range measured
# >5% slower than the loop at a measured point; over the range grid (T up to 1024, H up to 512)
# the margins and RANGE_BOUND were picked together on bench_policy's 28 cells (above).
# unroll: 1, its pass keeps to its own measured bound (unroll_max) and shares the loop's FLOPs.
# The forms with a margin are the ones the model predicts (model_seconds); the others are not
# predicted slower than the loop.
MODEL_MARGIN = {"fuse": 1.1, "hoist": 1.1, "unroll": 1.0}

# Seconds per unit on onnxruntime 1.32 CPU with one intra-op thread, fitted by
# ``python benchmarks/bench_cost.py --emit`` (the model is linear in them).
DEFAULT_CONSTANTS = {
    "scan_setup": 4.32e-06,  # a Scan node's own cost per run (setting up the body's feeds and fetches)
    "scan_step": 0.0,  # a Scan iteration's own overhead (the fit puts it into the kernel launches)
    "node": 3.31e-07,  # one kernel launch in a loop body
    "flop_rows1": 2.58e-11,  # a FLOP of a per-step MatMul over one row (GEMV)
    "flop_rows": 9.96e-12,  # ... over several rows
    "flop_big": 1.28e-11,  # ... of one MatMul over the whole sequence (a hoisted or native input projection)
    "elem_loop": 1.54e-09,  # a gate element through the body's elementwise ops
    "native_step_rnn": 5.02e-07,  # a native RNN step's overhead
    "native_step_gates": 9.09e-07,  # ... a GRU or LSTM step's
    "native_row_gates": 9.29e-08,  # ... per batch row, GRU or LSTM
    "flop_native": 1.42e-11,  # a recurrent FLOP of the native kernels
    "elem_native_rnn": 1.15e-08,  # a gate element through ORT's RNN kernel (its activations are slow)
    "elem_native_gates": 6.13e-10,  # ... through its GRU and LSTM kernels
}
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
CELL_STATE_NODES = 12  # the ops around the recomputed gates (products, cuts, activations)


@dataclass(frozen=True)
class Estimate:
    """A decision on one proposed rewrite."""

    apply: bool
    speedup: float | None  # original / rewritten time; None when nothing predicts it
    note: str  # for the report: the numbers behind the choice, or why the rewrite was not applied
    measured: bool = False  # speedup timed on this machine at the deployment shapes (scanopt.tune), not modelled
    kept: str = ""  # on a decline: the form chosen instead ("loop" or another form), where known
    dispatch: bool = False  # apply the match's run-time dispatch form (Match.dispatch_below)
    dispatch_below: int | None = None  # the threshold the model set for it (Match.dispatch_on "B")


@dataclass(frozen=True)
class Shape:
    """The iteration of a Scan: length T, batch B, input width I, hidden width H, scan outputs K."""

    T: int | None
    B: int | None
    I: int | None
    H: int | None
    K: int

    def describe(self) -> str:
        return " ".join(f"{k}={'?' if v is None else v}" for k, v in vars(self).items())


class CostPolicy:
    """Decides per proposed rewrite; see the module docstring."""

    def __init__(self, target: str = "onnxruntime", measured: dict | None = None, deployment: Any = None,
                 declared: bool = False, constants: dict | None = None, scales: dict | None = None,
                 provider: Any = None):
        if target not in TARGETS:
            raise ValueError(f"unknown target '{target}' (choose from {', '.join(TARGETS)})")
        self.target = target
        self.measured = dict(measured or {})  # top-level node label -> choice (scanopt.tune)
        self.deployment = deployment  # ShapeTable at the deployment shapes, or None
        self.declared = declared
        self.constants = dict(DEFAULT_CONSTANTS, **(constants or {}))
        self.scales = dict(scales or {})  # per form, this machine against the constants (scanopt.calibrate)
        self.provider = provider  # scanopt.providers.Target, or None: the CPU
        self.provider_model = getattr(provider, "model", "cpu") or "cpu"

    @classmethod
    def from_options(cls, options: dict) -> "CostPolicy":
        return cls(options.get("target", "onnxruntime"), options.get("measured"), options.get("deployment"),
                   bool(options.get("input_shapes")), options.get("cost_constants"), options.get("cost_scales"),
                   options.get("deployment_target"))

    def decide(self, form: Any, label: str, node: Any, view: Any, match: Any, ctx: Any, level: Any = None,
               alternatives: dict | None = None) -> Estimate:
        """The verdict on ``form``'s (a form pass's) proposal ``match``; ``alternatives``: {pass:
        its match} of the other modelled forms proposing a rewrite of the same Scan."""
        pass_name = form.name
        path = getattr(level, "path", "") if level is not None else ""
        from scanopt.graph import guard_branch

        top = not path or guard_branch(path)  # a Scan behind an empty-input guard is measured as a top-level one
        origin = getattr(ctx, "derived", {}).get(label, label)  # a Scan a rewrite emitted: its origin's choice
        if top and origin in self.measured:
            choice = self.measured[origin]
            if choice.get("form") is not None:
                return _measured_verdict(pass_name, choice)
            from scanopt.tune import undecided_text

            modelled = self._unmeasured(form, node, view, match, ctx, alternatives or {})
            return replace(modelled, note=f"{undecided_text(choice)}; {modelled.note}")
        return self._unmeasured(form, node, view, match, ctx, alternatives or {})

    def _unmeasured(self, form: Any, node: Any, view: Any, match: Any, ctx: Any, alternatives: dict) -> Estimate:
        """The decision without a measurement: the target, the form's own bounds, the model."""
        pass_name = form.name
        if self.target == "portable":
            return Estimate(True, None, "target portable: applied whatever onnxruntime's speed")
        provider = _provider_verdict(self.provider, pass_name)
        if provider is not None:
            return provider
        below = getattr(match, "slower_below", None)
        if below is not None and getattr(view, "trip_count", None) is None and self.provider_model == "cpu":
            steps = scan_shape(node, view, match, ctx, self.deployment).T if self.deployment is not None else None
            offered = getattr(match, "dispatch_below", None)
            if steps is None and offered is not None and self.deployment is None:  # no shapes at all
                return Estimate(True, None, f"the length is symbolic and unmeasured: this form measured slower than the "
                                            f"loop below {below} steps and faster from {offered} on; written behind a "
                                            f"run-time If on the length (the loop below {offered} steps), never slower "
                                            "than the loop at any length (benchmarks/bench_symbolic_t.py)", dispatch=True)
            if steps is None:
                return Estimate(False, None, f"the length is symbolic and unmeasured: this form measured slower than the "
                                             f"loop below {below} steps; declare it (--input-shape) to have it measured, "
                                             "or --target portable")
            if steps < below:
                return Estimate(False, None, f"declared {steps} steps, unmeasured: this form measured slower than the "
                                             f"loop below {below}")
        if form.needs_measurement:
            return Estimate(False, None, f"not applied unmeasured: {form.needs_measurement}; declare shapes "
                                         "(--input-shape) to have it measured, or --target portable")
        if pass_name == "unroll" and "unroll_max" in ctx.options:  # the user chose the threshold
            return Estimate(True, None, f"unroll_max={ctx.options['unroll_max']} given: applied as asked")
        if pass_name not in MODEL_MARGIN:
            return Estimate(True, None, "no cost model for this form unmeasured; loop-free forms are not predicted slower")
        return self._modelled(pass_name, node, view, match, ctx, alternatives)

    def _modelled(self, pass_name, node, view, match, ctx, alternatives: dict) -> Estimate:
        shape = scan_shape(node, view, match, ctx, self.deployment)
        if not getattr(match, "dirs", None) and not _multiplies(node):
            shape = Shape(T=shape.T, B=shape.B, I=1, H=1, K=shape.K)  # no products: widths do not matter
        kind = _cell_kind(node, view, match)
        body_nodes = len(node.attrs["body"].nodes)
        forms = [pass_name] + list(alternatives)
        unknown = [k for k in ("T", "B", "I", "H") if getattr(shape, k) is None]
        points = [dict(vars(shape), cells=_cell_sequences(match if pass_name == "fuse" else alternatives.get("fuse")))]
        for k in unknown:
            points = [dict(p, **{k: v}) for p in points for v in UNKNOWN_RANGE[k]]
        lifted = _lifted(match if pass_name == "hoist" else alternatives.get("hoist"))
        from scanopt.calibrate import scale_key

        cpu = self.provider_model == "cpu"
        scale = {f: self.scales.get(scale_key(f, kind), 1.0) if cpu else 1.0 for f in forms}
        seconds = self._seconds
        if not cpu:
            lbr = _linear_before_reset(match if pass_name == "fuse" else alternatives.get("fuse"))
            points = [dict(p, lbr=lbr) for p in points]
        ratios = {f: [MODEL_MARGIN[f] * scale[f] * seconds(f, kind, p, body_nodes, lifted)
                      / seconds("loop", kind, p, body_nodes) for p in points] for f in forms}
        bound = RANGE_BOUND if unknown else SLOWER_BOUND
        best, geo = range_choice(ratios, bound)
        where = shape.describe() + (" (declared)" if self.declared else "")
        if unknown:
            where += (f"; {', '.join(unknown)} unknown: assumed {', '.join(k + ' in {' + ', '.join(map(str, UNKNOWN_RANGE[k])) + '}' for k in unknown)}, "
                      f"chosen as never >{round((bound - 1) * 100)}% slower than the loop there and best in geometric mean")
        listing = ", ".join(f"{form_name((f,))} {geo[f] / MODEL_MARGIN[f]:.2f}x of the loop's time" for f in forms)
        calibrated = (f"calibrated on this machine ({', '.join(f'{form_name((f,))} x{scale[f]:g}' for f in forms)})"
                      if self.scales and cpu else "committed constants" if cpu else
                      f"scanopt's {self.provider_model.upper()} model, not measured")
        if unknown:
            listing += " (geometric mean)"
        else:
            p = points[0]
            loop = seconds("loop", kind, p, body_nodes)
            listing = ", ".join(f"{form_name((f,))} {scale[f] * seconds(f, kind, p, body_nodes, lifted) * 1e3:.3g} ms"
                                for f in forms) + f" vs loop {loop * 1e3:.3g} ms"
        listing += f"; {calibrated}"
        speedup = MODEL_MARGIN[pass_name] / geo[pass_name]
        below, small = None, 1.0
        if best in (pass_name, "loop") and "B" in unknown and getattr(match, "dispatch_on", "T") == "B" and cpu:
            below, small = batch_dispatch([(p["B"], MODEL_MARGIN[pass_name] * scale[pass_name]
                                            * seconds(pass_name, kind, p, body_nodes, lifted) / seconds("loop", kind, p, body_nodes))
                                           for p in _over_batches(points)])
        if below is not None:  # faster at small batches, slower than the loop (by the bound) from B=below
            return Estimate(True, 1 / small, f"the batch is unknown: {form_name((pass_name,))} expected {1 / small:.2f}x "
                                             f"faster below B={below} and slower from it (modelled: {listing}; {where}); "
                                             f"written behind a run-time If on the batch (the loop from B={below})",
                            dispatch=True, dispatch_below=below)
        if best == pass_name:
            return Estimate(True, speedup, f"expected {speedup:.2f}x faster (modelled: {listing}; {where})")
        if best != "loop":
            why = f"predicted slower than {form_name((best,))} ({best})"
        elif max(ratios[pass_name]) > bound and geo[pass_name] < 1:
            worst = max(range(len(points)), key=lambda k: ratios[pass_name][k])
            at = " ".join(f"{k}={points[worst][k]}" for k in unknown)
            why = (f"predicted {ratios[pass_name][worst]:.2f}x the loop's time at {at}, counting a "
                   f"{MODEL_MARGIN[pass_name]:g}x margin for the model's error (more than {round((bound - 1) * 100)}% "
                   "slower there)")
            speedup = 1 / ratios[pass_name][worst]  # the point it was declined for, not the average
        else:
            why = "predicted slower than the loop"
        on = getattr(self.provider, "label", "onnxruntime CPU")
        hint = ("declare shapes (--input-shape) to measure" if cpu else
                f"optimize where onnxruntime runs {getattr(self.provider, 'label', on)[len('onnxruntime '):].lower()} to measure")
        return Estimate(False, speedup, f"not applied: {why} on {on} (modelled: {listing}; {where}); "
                                        f"{hint}, --target portable applies it anyway",
                        kept=form_name((best,)) if best != "loop" else "loop")

    def _seconds(self, form: str, kind: str, p: dict, body_nodes: int, lifted: int = 2) -> float:
        """Modelled seconds of ``form`` on the target's provider (the CPU's: :func:`model_seconds`)."""
        if self.provider_model == "cpu":
            return model_seconds(form, kind, p, body_nodes, self.constants, lifted)
        from scanopt.providers import model_seconds as provider_seconds

        return provider_seconds(self.provider_model, form, kind, p, body_nodes, lifted)


# The batch sizes a run-time dispatch on an unknown batch considers (Match.dispatch_on "B").
DISPATCH_BATCHES = (1, 2, 4, 8, 16, 32)


def _over_batches(points: list[dict]):
    """``points`` (each unknown dim at its assumed values) at every batch of DISPATCH_BATCHES
    instead of the assumed three."""
    seen = set()
    for p in points:
        for batch in DISPATCH_BATCHES:
            q = dict(p, B=batch)
            key = tuple(sorted((k, repr(v)) for k, v in q.items()))
            if key not in seen:
                seen.add(key)
                yield q


def batch_dispatch(ratios) -> tuple[int | None, float]:
    """(the batch from which the loop runs, the form's geometric-mean ratio below it) for a
    form modelled at ``ratios`` ((batch, ratio to the loop) pairs, several per batch through
    the other unknown dims): the form runs below the first batch at which it is more than
    SLOWER_BOUND times the loop anywhere, or not faster on average; (None, 1.0) when that is
    the first batch."""
    by_batch: dict[int, list[float]] = {}
    for batch, ratio in ratios:
        by_batch.setdefault(batch, []).append(ratio)
    small: list[float] = []
    for batch in sorted(by_batch):
        found = by_batch[batch]
        if max(found) > SLOWER_BOUND or math.exp(sum(map(math.log, small + found)) / len(small + found)) >= 1:
            return (batch, math.exp(sum(map(math.log, small)) / len(small))) if small else (None, 1.0)
        small += found
    return None, 1.0  # faster at every batch: no dispatch needed (range_choice takes it)


def range_choice(ratios: dict[str, list[float]], bound: float = SLOWER_BOUND) -> tuple[str, dict[str, float]]:
    """(the form chosen, {form: geometric mean}) from each form's modelled time ÷ the loop's at
    every point: among the forms never more than ``bound`` times the loop's anywhere and faster
    on average, the best in geometric mean; else "loop"."""
    geo = {f: math.exp(sum(math.log(r) for r in rs) / len(rs)) for f, rs in ratios.items()}
    fit = [f for f in ratios if max(ratios[f]) <= bound and geo[f] < 1]
    return (min(fit, key=lambda f: geo[f]) if fit else "loop"), geo


def model_seconds(form: str, kind: str, p: dict, body_nodes: int, c: dict, lifted: int = 2) -> float:
    """Modelled seconds of one run of ``form`` at sizes ``p`` (T, B, I, H, K); ``lifted``: body
    nodes hoisting moves out. Linear in the constants ``c``."""
    T, B, I, H, K = (max(int(p[k] or 1), 1) for k in ("T", "B", "I", "H", "K"))
    g = GATES.get(kind, 1)
    inproj, rec, elems = 2 * B * I * H * g, 2 * B * H * H * g, B * H * g
    small = c["flop_rows1"] if B == 1 else c["flop_rows"]
    if form == "loop":
        return c["scan_setup"] + T * (c["scan_step"] + body_nodes * c["node"] + (inproj + rec) * small + elems * c["elem_loop"])
    if form == "hoist":
        kept = max(body_nodes - lifted, 1) + 1  # + the new scan input's per-step slice
        return (c["scan_setup"] + lifted * c["node"] + T * inproj * c["flop_big"]
                + T * (c["scan_step"] + kept * c["node"] + rec * small + elems * c["elem_loop"]))
    if form == "fuse":
        if kind == "RNN":
            step = c["native_step_rnn"] + elems * c["elem_native_rnn"]
        else:
            step = c["native_step_gates"] + B * c["native_row_gates"] + elems * c["elem_native_gates"]
        native = 2 * c["node"] + T * inproj * c["flop_big"] + T * (step + rec * c["flop_native"])
        # An LSTM's per-step cell state (passes/fuse/cell_states.py): three of the four gates
        # recomputed over the whole sequence, then c's recurrence as a three-node Scan.
        cells = int(p.get("cells") or 0)
        recompute = CELL_STATE_NODES * c["node"] + T * (0.75 * (inproj + rec) * c["flop_big"] + elems * c["elem_loop"])
        return native + cells * (recompute + c["scan_setup"] + T * (c["scan_step"] + 3 * c["node"]))
    if form == "unroll":
        return K * c["node"] + T * ((body_nodes + K) * c["node"] + (inproj + rec) * small + elems * c["elem_loop"])
    if form == "vectorize":
        return body_nodes * c["node"] + T * ((inproj + rec) * c["flop_big"] + elems * c["elem_loop"])
    raise ValueError(form)


def _cell_sequences(fuse_match) -> int:
    """How many directions of a fuse match also recompute the LSTM's per-step cell state."""
    return sum(1 for d in getattr(fuse_match, "dirs", None) or () if getattr(d, "cell_outputs", None))


def _provider_verdict(target: Any, pass_name: str) -> Estimate | None:
    """The verdict a provider that is not the CPU gives without its numbers: the portable
    preference where scanopt has no model of it; a loop-free form under the CUDA model (no host
    loop: a Scan step costs microseconds per body node there, whatever its width); else None."""
    if target is None or getattr(target, "model", "cpu") == "cpu":
        return None
    if target.mode == "portable":
        return Estimate(True, None, f"{target.label}: no cost model, not measured: native ops and loop-free "
                                    "forms preferred (the portable preference)")
    if target.model == "cuda" and pass_name not in MODEL_MARGIN:
        return Estimate(True, None, f"{target.label} (modelled, not measured): a loop-free form removes the host-side "
                                    "loop, whose every step launches the body's kernels (about 5 us + 8 us per node; "
                                    "CUDA graphs cannot capture it)")
    return None


def _linear_before_reset(fuse_match) -> int | None:
    """A fused GRU's linear_before_reset (None when the match is not a GRU)."""
    dirs = getattr(fuse_match, "dirs", None)
    cell = getattr(dirs[0], "cell", None) if dirs else None
    return getattr(cell, "linear_before_reset", None) if getattr(cell, "kind", None) == "GRU" else None


def _lifted(hoist_match) -> int:
    """How many body nodes hoisting moves out of this Scan (the plan of hoist's match, when
    hoist is a candidate), else 2 (a cell's input projection: MatMul and bias Add)."""
    steps = getattr(getattr(hoist_match, "plan", None), "steps", None)
    return len(steps) if steps else 2


def _measured_verdict(pass_name: str, choice: dict) -> Estimate:
    """Apply ``pass_name`` exactly when it belongs to the measured fastest form."""
    times = choice["times"]
    best = choice["form"]
    loop = form_name(())
    mine = form_name((pass_name,)) if form_name((pass_name,)) in times else best
    speedup = times[loop] / times[best] if times.get(best) else None
    others = ", ".join(f"{name} {t * 1e3:.3g} ms" for name, t in times.items()
                       if name not in (best, loop) and (pass_name in choice["passes"] or name != mine))
    same = "; ".join(f"{a} is {b}" for a, b in (choice.get("same") or {}).items())
    tail = (f"{choice['where']}; measured, {choice['clock']} time, median of {choice['rounds']}, "
            f"noise {choice['noise'] * 100:.0f}%" + (", cached" if choice.get("cached") else "")
            + (f"; {same}" if same else ""))
    if pass_name in choice["passes"]:
        head = f"{best} applied: {times[best] * 1e3:.3g} ms vs loop {times[loop] * 1e3:.3g} ms ({speedup:.2f}x)"
        return Estimate(True, speedup, head + (f", {others}" if others else "") + f"; {tail}", measured=True)
    mine_time = times.get(mine)
    head = f"not applied: {best} kept" + (f" ({times[best] * 1e3:.3g} ms)" if best != loop else
                                          f" ({times[loop] * 1e3:.3g} ms; no form faster beyond the noise)")
    head += f"; {mine} {mine_time * 1e3:.3g} ms" if mine_time is not None and mine != best else ""
    return Estimate(False, times[loop] / mine_time if mine_time else None,
                    head + (f"; others: {others}" if others else "") + f"; {tail}", measured=True, kept=best)


def _static(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def scan_dims(x_shape, view: Any) -> tuple[int | None, int | None, int | None]:
    """T, B, I of a Scan from the shape of its first scan input (``view``: its ScanView):
    the scan axis, the product of the axes between, the last (a step of one scalar: B=1, no
    I); None where not static."""
    if not x_shape or (view.batched and len(x_shape) < 2):
        return None, None, None
    axis = 1 if view.batched else view.input_axes[0] % len(x_shape)
    rest = [d for k, d in enumerate(x_shape) if k != axis]
    batch = rest[:-1]
    B = math.prod(batch) if all(_static(d) is not None for d in batch) else None
    return _static(x_shape[axis]), B, _static(rest[-1]) if rest else None


def scan_shape(node: Any, view: Any, match: Any, ctx: Any, deployment: Any = None) -> Shape:
    """T, B, I, H, K of a Scan from its first scan input and first state, as far as known:
    the deployment shapes (static or declared) first, then what the graph says."""
    by_name = {t.name: t for t in node.inputs}

    def shape_of(tensor):
        if tensor is None:
            return None
        if deployment is not None:
            found = deployment.type_of(tensor.name)[1]
            if found is not None:
                return found
        return ctx.shapes.shape(tensor)

    x = by_name.get(view.scan_inputs[0]) if view.scan_inputs else None
    x_shape = shape_of(x)
    T, B, I = scan_dims(x_shape, view) if x_shape is not None and len(x_shape) >= 2 else (None, None, None)
    T = getattr(match, "steps", None) if getattr(match, "steps", None) is not None else (T if T is not None else view.trip_count)
    H = None
    dirs = getattr(match, "dirs", None)
    if dirs:
        H = getattr(getattr(dirs[0], "cell", None), "hidden", None)
        I = getattr(getattr(dirs[0], "cell", None), "input_size", None) or I
    if H is None and view.initial_states:
        s_shape = shape_of(by_name.get(view.initial_states[0]))
        H = _static(s_shape[-1]) if s_shape else None
    return Shape(T=_static(T), B=B, I=I, H=H, K=view.num_scan_outputs)


def _multiplies(node: Any) -> bool:
    """Whether the body (at any depth) holds a matrix product, whose FLOPs the widths decide."""
    from scanopt.graph import walk_graphs

    return any(n.op in ("MatMul", "Gemm", "Conv", "Einsum", "MatMulInteger")
               for level in walk_graphs(node.attrs["body"]) for n in level.graph.nodes)


def _cell_kind(node: Any, view: Any, match: Any) -> str:
    dirs = getattr(match, "dirs", None)
    kind = getattr(getattr(dirs[0], "cell", None), "kind", None) if dirs else None
    if kind in ("RNN", "GRU", "LSTM"):
        return kind
    body_ops = {n.op for n in node.attrs["body"].nodes}
    return "LSTM" if view.num_states >= 2 and "Sigmoid" in body_ops else ("GRU" if "Sigmoid" in body_ops else "RNN")
