"""Whether a rewrite pays off: a cost model for onnxruntime CPU (one intra-op thread).

A pass proposes a rewrite (its ``match`` succeeded); :class:`CostPolicy` predicts the
speed-up (original latency / rewritten latency) from measurements committed below
(``python benchmarks/bench_cost.py --emit`` prints them) and declines a rewrite predicted
slower by more than :data:`NOISE`. The prediction is the nearest measured size in log
space (batch first, then hidden size, then length and input size). What decides is the
shape of the iteration, so the policy is pass-agnostic: it reads the Scan (ScanView and
known shapes) and, where present, what a pass's match says about the form it builds
(``dirs[0].cell.kind`` of fuse, ``steps`` of unroll, ``strategy`` of upgrade).

Targets: ``onnxruntime`` (the default) as above; ``portable`` applies every rewrite
(native ops and loop-free forms are what other backends can run). Sizes the graph does
not state (a symbolic batch) are decided on the worst measured case and the note says so.
``--tune`` replaces the prediction by a measurement (``options["measured"]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

NOISE = 0.05  # a predicted speed-up within 1 ± NOISE is "no change"
TARGETS = ("onnxruntime", "portable")

# Measured by benchmarks/bench_cost.py (onnxruntime 1.32.0, 1 thread, one interleaved run on a
# shared 2-core machine). The B >= 8 sizes were re-measured at 1 s per model: in the first run
# their fused/native sanity ratio (1 by construction) was off by up to 2.3x.
FUSE_MEASURED = (  # kind, T, B, I, H, scan/fused
    ("RNN", 16, 1, 16, 16, 3.56),
    ("RNN", 64, 1, 64, 64, 2.61),
    ("RNN", 100, 1, 128, 128, 1.89),
    ("RNN", 32, 2, 64, 64, 1.33),
    ("RNN", 50, 2, 256, 256, 0.76),
    ("RNN", 32, 4, 64, 64, 1.10),
    ("RNN", 32, 8, 64, 64, 0.53),
    ("RNN", 50, 8, 256, 256, 0.72),
    ("RNN", 32, 16, 64, 64, 0.55),
    ("RNN", 32, 32, 128, 256, 0.37),
    ("GRU", 16, 1, 16, 16, 4.63),
    ("GRU", 64, 1, 64, 64, 17.23),
    ("GRU", 100, 1, 128, 128, 11.00),
    ("GRU", 32, 2, 64, 64, 4.35),
    ("GRU", 50, 2, 256, 256, 1.79),
    ("GRU", 32, 4, 64, 64, 3.16),
    ("GRU", 32, 8, 64, 64, 1.93),
    ("GRU", 50, 8, 256, 256, 1.19),
    ("GRU", 32, 16, 64, 64, 6.89),
    ("GRU", 32, 32, 128, 256, 1.10),
    ("LSTM", 16, 1, 16, 16, 6.32),
    ("LSTM", 64, 1, 64, 64, 5.48),
    ("LSTM", 100, 1, 128, 128, 6.96),
    ("LSTM", 32, 2, 64, 64, 4.27),
    ("LSTM", 50, 2, 256, 256, 1.81),
    ("LSTM", 32, 4, 64, 64, 6.48),
    ("LSTM", 32, 8, 64, 64, 2.12),
    ("LSTM", 50, 8, 256, 256, 1.55),
    ("LSTM", 32, 16, 64, 64, 1.92),
    ("LSTM", 32, 32, 128, 256, 1.04),
)
UNROLL_MEASURED = (  # T, scan outputs, H, looped/unrolled
    (1, 1, 16, 1.07),
    (2, 1, 16, 0.97),
    (4, 1, 16, 1.03),
    (8, 1, 16, 0.76),
    (1, 4, 16, 0.93),
    (2, 4, 16, 0.76),
    (4, 4, 16, 0.67),
    (8, 4, 16, 0.45),
    (1, 1, 256, 1.42),
    (2, 1, 256, 0.95),
    (4, 1, 256, 0.98),
    (8, 1, 256, 0.71),
    (1, 4, 256, 1.14),
    (2, 4, 256, 0.73),
    (4, 4, 256, 0.88),
    (8, 4, 256, 0.86),
)
HOIST_MEASURED = (  # T, B, I, H, scan/hoisted (benchmarks/bench_hoist.py, README; tanh RNN and a residual cell)
    (16, 1, 32, 32, 1.31),
    (100, 1, 128, 128, 1.53),
    (100, 8, 64, 128, 1.11),
    (32, 32, 64, 64, 1.16),
    (64, 4, 256, 256, 3.42),
    (16, 1, 32, 32, 1.08),
    (100, 1, 128, 128, 1.26),
    (100, 8, 64, 128, 1.00),
    (32, 32, 64, 64, 1.18),
    (64, 4, 256, 256, 4.93),
)
# upgrade strategy (c) at batch 1 with sequence_lens against the Scan-8 it replaces
# (issue 14: 11-18% slower on three BiDAF-style bodies; benchmarks/bench_upgrade.py).
UPGRADE_C_BATCH1_LENS = 0.85

# What the worst case ranges over when the graph leaves a size symbolic.
UNKNOWN = {"B": (1, 2, 4, 8, 16, 32), "T": (16, 32, 64, 100), "H": (16, 64, 256), "I": (16, 64, 256), "K": (1, 4)}
NEUTRAL_PASSES = ("canonicalize", "cleanup")


@dataclass(frozen=True)
class Estimate:
    """A decision on one proposed rewrite."""

    apply: bool
    speedup: float | None  # original / rewritten latency; None when nothing predicts it
    note: str  # for the report: the expected speed-up, or why the rewrite was not applied


@dataclass(frozen=True)
class Shape:
    """The iteration of a Scan: length T, batch B, input width I, hidden width H, scan outputs K."""

    T: int | None
    B: int | None
    I: int | None
    H: int | None
    K: int

    def describe(self) -> str:
        return ", ".join(f"{k}={'?' if v is None else v}" for k, v in vars(self).items())


class CostPolicy:
    """Decides per proposed rewrite; see the module docstring."""

    def __init__(self, target: str = "onnxruntime", measured: dict | None = None):
        if target not in TARGETS:
            raise ValueError(f"unknown target '{target}' (choose from {', '.join(TARGETS)})")
        self.target = target
        self.measured = dict(measured or {})  # (pass, node label) -> measured speed-up (--tune)

    @classmethod
    def from_options(cls, options: dict) -> "CostPolicy":
        return cls(options.get("target", "onnxruntime"), options.get("measured"))

    def decide(self, pass_name: str, label: str, node: Any, view: Any, match: Any, ctx: Any, level: Any = None) -> Estimate | None:
        """None for a pass that does not change speed (canonicalize, cleanup).

        A form predicted slower than the Scan is declined; so is one predicted slower than
        another candidate form a later pass of this run proposes for the same Scan (that
        pass's ``match`` is asked; it never mutates): the later pass then applies.
        """
        if pass_name in NEUTRAL_PASSES:
            return None
        if (pass_name, label) in self.measured:
            speedup = self.measured[(pass_name, label)]
            return self._verdict(speedup, f"measured {_times(speedup)} with --tune")
        if self.target == "portable":
            return Estimate(True, None, "target portable: applied whatever onnxruntime's speed")
        estimate = self._predict(pass_name, node, view, match, ctx)
        if estimate is None or not estimate.apply or estimate.speedup is None or level is None:
            return estimate
        for other, other_estimate in self._alternatives(pass_name, node, view, level, ctx):
            if other_estimate.speedup is not None and other_estimate.speedup > estimate.speedup * (1 + NOISE):
                return Estimate(False, estimate.speedup,
                                f"not applied: {other} is predicted faster ({other_estimate.speedup:.2f}x against "
                                f"{estimate.speedup:.2f}x for {pass_name}; {other_estimate.note})")
        return estimate

    def _predict(self, pass_name: str, node: Any, view: Any, match: Any, ctx: Any) -> Estimate | None:
        shape = scan_shape(node, view, match, ctx)
        if pass_name == "fuse":
            return self._fuse(_cell_kind(node, view, match), shape)
        if pass_name == "hoist":
            rows = [(dict(T=t, B=b, I=i, H=hd), r) for t, b, i, hd, r in HOIST_MEASURED]
            speedup, near, unknown = _worst_nearest(rows, shape, ("B", "H", "T", "I"))
            return self._verdict(speedup, f"hoisted loop at {shape.describe()}; nearest measured {_point(near)}"
                                          + (f"; {', '.join(unknown)} unknown: worst case" if unknown else ""))
        if pass_name == "unroll":
            if "unroll_max" in ctx.options:  # the user chose the threshold: not second-guessed
                return Estimate(True, None, f"unroll_max={ctx.options['unroll_max']} given: applied as asked")
            return self._unroll(shape)
        if pass_name == "upgrade":
            return self._upgrade(view, match, shape)
        return Estimate(True, None, "no cost data for this form; loop-free forms are not predicted slower")

    def _alternatives(self, pass_name: str, node: Any, view: Any, level: Any, ctx: Any):
        """(pass, estimate) for each later selected pass that would rewrite this Scan."""
        from scanopt.pass_api import Skip, registered_passes

        selected = list(ctx.selected or ())
        later = selected[selected.index(pass_name) + 1:] if pass_name in selected else []
        registry = registered_passes()
        for other in later:
            if other in NEUTRAL_PASSES or other not in registry or other == "upgrade":
                continue
            try:
                found = registry[other]().match(node, view, level, ctx)
            except Exception:  # noqa: BLE001 - a pass that cannot judge this Scan offers no alternative
                continue
            if not isinstance(found, Skip):
                estimate = self._predict(other, node, view, found, ctx)
                if estimate is not None and estimate.apply:
                    yield other, estimate

    def _verdict(self, speedup: float, why: str) -> Estimate:
        if speedup >= 1 - NOISE:
            return Estimate(True, speedup, f"expected {_times(speedup)} ({why})")
        return Estimate(False, speedup, f"not applied: predicted {speedup:.2f}x, slower on onnxruntime CPU ({why}); "
                                        "--target portable applies it anyway, --tune measures it")

    def _fuse(self, kind: str, shape: Shape) -> Estimate:
        rows = [(dict(T=t, B=b, I=i, H=hd), r) for k, t, b, i, hd, r in FUSE_MEASURED if k == kind]
        speedup, near, unknown = _worst_nearest(rows, shape, ("B", "H", "T", "I"))
        where = f"native {kind} at {shape.describe()}; nearest measured {_point(near)}"
        if unknown:
            where += f"; {', '.join(unknown)} unknown: worst case over {', '.join(f'{u} in {list(UNKNOWN[u])}' for u in unknown)}"
        return self._verdict(speedup, where)

    def _unroll(self, shape: Shape) -> Estimate:
        rows = [(dict(T=t, K=k, H=hd), r) for t, k, hd, r in UNROLL_MEASURED]
        speedup, near, unknown = _worst_nearest(rows, shape, ("T", "K", "H"))
        where = f"unrolled at {shape.describe()}; nearest measured {_point(near)}"
        if unknown:
            where += f"; {', '.join(unknown)} unknown: worst case"
        return self._verdict(speedup, where)

    def _upgrade(self, view: Any, match: Any, shape: Shape) -> Estimate:
        # The upgrade is what an opset migration needs: it is never declined for speed.
        if getattr(match, "strategy", None) == "c" and shape.B == 1 and getattr(view, "sequence_lens", None):
            return Estimate(True, UPGRADE_C_BATCH1_LENS,
                            f"needed for the migration; expected {_times(UPGRADE_C_BATCH1_LENS)} (strategy c at batch 1 "
                            "with sequence_lens is slower than Scan-8)")
        return None


def _times(speedup: float) -> str:
    return f"{speedup:.2f}x faster" if speedup >= 1 else f"{speedup:.2f}x (slower)"


def _point(values: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items())


_WEIGHTS = {"B": 1.0, "H": 0.6, "K": 1.0, "T": 0.4, "I": 0.3}


def _worst_nearest(rows, shape: Shape, keys) -> tuple[float, dict, list[str]]:
    """The measured ratio of the nearest row; with sizes unknown, the worst over their range."""
    unknown = [k for k in keys if getattr(shape, k) is None]
    choices = [dict()]
    for k in unknown:
        choices = [dict(c, **{k: v}) for c in choices for v in UNKNOWN[k]]
    worst = None
    for choice in choices:
        point = {k: choice.get(k, getattr(shape, k)) for k in keys}
        near, ratio = min(rows, key=lambda row: _distance(row[0], point))
        if worst is None or ratio < worst[0]:
            worst = (ratio, near)
    return worst[0], worst[1], unknown


def _distance(a: dict, b: dict) -> float:
    return sum(_WEIGHTS[k] * abs(math.log2(max(a[k], 1)) - math.log2(max(b[k], 1))) for k in b)


def _static(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def scan_shape(node: Any, view: Any, match: Any, ctx: Any) -> Shape:
    """T, B, I, H, K of a Scan from its first scan input and first state, as far as known."""
    by_name = {t.name: t for t in node.inputs}
    x = by_name.get(view.scan_inputs[0]) if view.scan_inputs else None
    x_shape = ctx.shapes.shape(x) if x is not None else None
    T = B = I = None
    if x_shape is not None and len(x_shape) >= 2:
        axis = 1 if view.batched else view.input_axes[0] % len(x_shape)
        T = _static(x_shape[axis])
        rest = [d for k, d in enumerate(x_shape) if k != axis]
        I = _static(rest[-1])
        batch = rest[:-1]
        B = math.prod(batch) if all(_static(d) is not None for d in batch) else None
        if not batch:
            B = 1
    T = getattr(match, "steps", None) if getattr(match, "steps", None) is not None else (T if T is not None else view.trip_count)
    H = None
    dirs = getattr(match, "dirs", None)
    if dirs:
        H = getattr(getattr(dirs[0], "cell", None), "hidden", None)
        I = getattr(getattr(dirs[0], "cell", None), "input_size", None) or I
    if H is None and view.initial_states:
        state = by_name.get(view.initial_states[0])
        s_shape = ctx.shapes.shape(state) if state is not None else None
        H = _static(s_shape[-1]) if s_shape else None
    return Shape(T=_static(T), B=B, I=I, H=H, K=view.num_scan_outputs)


def _cell_kind(node: Any, view: Any, match: Any) -> str:
    dirs = getattr(match, "dirs", None)
    kind = getattr(getattr(dirs[0], "cell", None), "kind", None) if dirs else None
    if kind in ("RNN", "GRU", "LSTM"):
        return kind
    body_ops = {n.op for n in node.attrs["body"].nodes}
    return "LSTM" if view.num_states >= 2 and "Sigmoid" in body_ops else ("GRU" if "Sigmoid" in body_ops else "RNN")
