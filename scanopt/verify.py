"""Numeric equivalence of two models: the check a rewrite must pass before it is written.

Both models run on the same feeds (the user's, or synthesized for several seeds) and
every output is compared: same dtype, same shape, values within the dtype's tolerance
from :data:`TOLERANCES`, NaN where the original has NaN. Each model is loaded into an
engine once and reused for every seed, because the pipeline calls this per rewrite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import onnx

from scanopt.edge_inputs import LabelledFeeds, edge_sets, is_edge, screened
from scanopt.engines import EngineError, Feeds, ModelLike, Runner, ort_miscomputes, prepare, resolve_model
from scanopt.errors import ScanoptError, printable_lines
from scanopt.external_data import has_marks, serialized_size_bound
from scanopt.isolated import SURVIVORS_KEPT, first_run, screen_original, survived
from scanopt.inputs import (
    FeedBudgetError,
    InputSynthesizer,
    TensorSpec,
    check_feeds,
    input_specs,
    output_specs,
)
from scanopt.weak_spots import long_sequences, long_trip_counts, row_queries, wide_batches
from scanopt.widen import NARROW_FLOATS as WIDENED_TYPES
from scanopt.widen import widened, widened_feeds

# The tolerance rule, in one place (:func:`tolerance` applies it). An element passes when
# |candidate - original| <= atol + rtol * |original|, where for a floating dtype
#   (rtol, atol) = TOLERANCES[dtype], then
#   atol = max(atol, SPREAD_FACTOR * spread)   spread: the original's own disagreement between
#       engines (max |onnxruntime - reference executor| over that output, same feeds): how
#       exactly float arithmetic pins this output down here. It carries the growth with the
#       sequence length: it is measured at the feeds' T, not modelled. Only computed for an
#       output the table's tolerance fails, only when both engines run the original, and only
#       counted while the engines agree within the grown bound below or within SCALE_ULPS
#       machine epsilons of the output's largest magnitude (a cancelling sum's rounding); beyond
#       both, one engine is wrong, which says nothing about rounding.
#   both * max(1, steps / ACCUMULATION_STEPS)   only where no spread can be measured: the two
#       engines compared with each other on the original (--engine both). Rounding errors of a
#       recurrence that does not amplify them add up at most linearly in its length; the
#       table is for sequences up to ACCUMULATION_STEPS. ``steps``: the longest Scan sequence
#       of the feeds (SequenceLength).
# --rtol/--atol replace the table and switch both adjustments off. Dtypes not listed
# (integers, bool, strings) compare exactly.
#
# The truth acquits (:func:`truth_check`): for an output in a narrow float (float32, float16,
# bfloat16), or a float64 one (its value may come through narrow floats: a float32 cell's state
# summed in float64 carries the cell's float32 rounding, which the float64 table refuses), the
# original is also run as its float64 twin (scanopt.widen) on the same feeds,
# and an output the table (widened or not) refuses still passes when
#   |candidate - truth| <= TRUTH_FACTOR * max |original - truth| + TRUTH_ULPS * eps * |truth|
# at every element (the max over the output; eps: the dtype's), with no non-finite value where
# the truth is finite within the dtype's range and the original is finite. So an
# exact reordering of a long sum passes (its error is the loop's own size) and a form more
# accurate than the original is never penalized for differing from it; a cancelling form that
# loses digits is judged by the table against the original, which the weak-spot inputs make
# fail. Where the truth exceeds the dtype's range either form may overflow; where the original
# overflowed and the truth did not, so may the candidate (the loop's own behaviour). Both
# errors are reported (for models over TRUTH_ALWAYS_BYTES only where the table refused: the
# twin is a float64 copy of every weight). Models whose twin cannot run (over TRUTH_BYTES, or
# no engine runs it) are judged by the table alone; the report says so.
# But not at a distance map's reference points (scanopt.weak_spots.RowQueries.reference:
# queries at, near and among the rows a Scan scans): there the loop's distances are exact
# differences (0 at a row), and a form that rounds them otherwise moves a fitted kernel model
# by what its weights amplify (a Gaussian process's K⁻¹: 2.5e-4 on the mean, 2.6e-2 on the
# std at 2,000 rows) while the original, itself far from float64 there, is no better: the
# truth does not acquit on that set, the table against the original judges (the report
# gives both errors and says why).
TRUTH_FACTOR = 8
TRUTH_ULPS = 16
TRUTH_BYTES = 2**29  # a model whose float64 twin would be larger is judged by the table
REFERENCE_SPREAD_STEPS = 256  # longer sets get no spread from the reference executor (seconds at 1024 steps)
TRUTH_ALWAYS_BYTES = 2**24  # up to this size the truth runs on every input set; above, only when the table refuses
NARROW_FLOATS = ("float32", "float16", "bfloat16")
JUDGED_BY_TRUTH = NARROW_FLOATS + ("float64",)  # a float64 output all in float64 has the twin's values: 16 ulps
SPREAD_FACTOR = 16
SCALE_ULPS = 64
ACCUMULATION_STEPS = 16
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-9, 1e-12),
    "complex128": (1e-9, 1e-12),
    "float32": (1e-4, 1e-5),
    "complex64": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
    "float8_e4m3fn": (0.25, 0.1),
    "float8_e4m3fnuz": (0.25, 0.1),
    "float8_e5m2": (0.5, 0.25),
    "float8_e5m2fnuz": (0.5, 0.25),
}

ENGINE_CHOICES = ("auto", "ort", "reference", "both")
MAX_LISTED = 10  # failure lines that format() lists before summarizing the rest


def tolerance(
    dtype: np.dtype,
    rtol: float | None = None,
    atol: float | None = None,
    *,
    spread: float | None = None,
    steps: int | None = None,
) -> tuple[float, float]:
    """(rtol, atol) for ``dtype`` by the rule above: the table, widened to SPREAD_FACTOR times
    the original's engine ``spread`` or, without one, grown linearly past ACCUMULATION_STEPS
    ``steps``. Overrides apply to the dtypes of the table, never to exact ones, and are final."""
    name = np.dtype(dtype).name
    if name not in TOLERANCES:
        return 0.0, 0.0
    if rtol is not None or atol is not None:
        default_rtol, default_atol = TOLERANCES[name]
        return (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)
    rtol, atol = TOLERANCES[name]
    if spread is not None:
        atol = max(atol, SPREAD_FACTOR * spread)
    elif steps is not None and steps > ACCUMULATION_STEPS:
        growth = steps / ACCUMULATION_STEPS
        rtol, atol = rtol * growth, atol * growth
    return rtol, atol


@dataclass
class OutputCheck:
    """One output compared on one set of feeds."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    passed: bool
    max_abs: float | None = None  # None when the values are not numbers
    max_rel: float | None = None  # relative to the original; elements where it is 0 left out
    rtol: float = 0.0
    atol: float = 0.0
    mismatches: int = 0  # elements out of tolerance
    worst_index: tuple[int, ...] | None = None  # where the largest error is, when it fails
    worst_values: tuple | None = None  # (original, candidate) at worst_index
    note: str = ""  # why it failed when no number says it: dtype, shape, missing output
    spread: float | None = None  # the original's engine disagreement the tolerance was widened by
    truth: tuple[float, float] | None = None  # (original's, candidate's) max abs error from the float64 twin
    truth_bound: float | None = None  # the largest candidate error the truth rule allowed
    unacquitted: str = ""  # why the truth did not acquit a failure it would have (reference points)

    def describe(self) -> str:
        """One line saying how this output failed."""
        if self.note:
            return self.note
        line = f"{self.mismatches} of {int(np.prod(self.shape))} elements differ"
        if self.max_abs is not None:
            line += f", max abs error {_num(self.max_abs)}"
            if self.worst_index is not None:
                original, candidate = (_value(v) for v in self.worst_values)
                line += f" at {self.worst_index} (expected {original}, got {candidate})"
        if self.rtol or self.atol:
            line += f"; tolerance rtol {self.rtol:g} atol {self.atol:g}"
        if self.spread is not None:
            line += f" (the original's engines disagree by {_num(self.spread)})"
        if self.truth is not None:
            line += (f"; from float64: original {_num(self.truth[0])}, candidate {_num(self.truth[1])} "
                     f"(allowed {TRUTH_FACTOR} x the original's + {TRUTH_ULPS} ulp of each value, at most "
                     f"{_num(self.truth_bound)}; no non-finite value where both are finite)")
        if self.unacquitted:
            line += f"; {self.unacquitted}"
        return line

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "passed": self.passed,
            "max_abs": _json_float(self.max_abs),
            "max_rel": _json_float(self.max_rel),
            "rtol": self.rtol,
            "atol": self.atol,
            "mismatches": self.mismatches,
            "worst_index": None if self.worst_index is None else list(self.worst_index),
            "note": self.note,
            "engine_spread": _json_float(self.spread),
            "float64_error": None if self.truth is None else {"original": _json_float(self.truth[0]),
                                                               "candidate": _json_float(self.truth[1]),
                                                               "bound": _json_float(self.truth_bound)},
        }


@dataclass
class Comparison:
    """All outputs of one run (``actual``) against another (``expected``) on one set of feeds.

    A run is a model ("original" or "candidate") on an engine ("ort" or "reference").
    """

    inputs: str  # "seed 0", or "inputs" for the user's feeds
    expected: tuple[str, str]  # (model, engine)
    actual: tuple[str, str]
    checks: list[OutputCheck] = field(default_factory=list)
    error: str | None = None  # ``actual`` failed to load or run

    @property
    def passed(self) -> bool:
        return self.error is None and all(c.passed for c in self.checks)

    @property
    def label(self) -> str:
        """'candidate vs original [ort]', or 'original: reference vs ort' for an engine cross-check."""
        (a_model, a_engine), (e_model, e_engine) = self.actual, self.expected
        if a_engine == e_engine:
            return f"{a_model} vs {e_model} [{a_engine}]"
        return f"{a_model}: {a_engine} vs {e_engine}"

    def to_dict(self) -> dict:
        return {
            "inputs": self.inputs,
            "expected": {"model": self.expected[0], "engine": self.expected[1]},
            "actual": {"model": self.actual[0], "engine": self.actual[1]},
            "passed": self.passed,
            "error": self.error,
            "outputs": [c.to_dict() for c in self.checks],
        }


@dataclass
class VerifyResult:
    """Every comparison made, and the engines used."""

    engine: str  # "ort", "reference" or "both", after resolving "auto"
    comparisons: list[Comparison]
    notes: list[str] = field(default_factory=list)
    sizes: dict[str, str] = field(default_factory=dict)  # synthesized sizes per input set label

    @property
    def passed(self) -> bool:
        return bool(self.comparisons) and all(c.passed for c in self.comparisons)

    def failures(self) -> list[str]:
        """One line per failing output (or per run that failed)."""
        lines = []
        for comp in self.comparisons:
            where = f"{comp.inputs}, {comp.label}"
            if comp.error is not None:
                lines.append(f"{where}: {comp.error}")
            lines += [f"output '{c.name}' ({where}): {c.describe()}" for c in comp.checks if not c.passed]
        return lines

    def summary(self) -> str:
        sets = len({c.inputs for c in self.comparisons})
        if self.passed:
            worst = max((c.max_abs or 0.0 for comp in self.comparisons for c in comp.checks), default=0.0)
            sizes = "; ".join(f"{label} {text}" for label, text in self.sizes.items())
            sizes = f"; sizes {sizes}" if sizes else ""
            judged = [c.truth for comp in self.comparisons for c in comp.checks if c.truth is not None]
            truth = ""
            if judged:
                truth = (f"; from float64: original {_num(max(t[0] for t in judged))}, "
                         f"candidate {_num(max(t[1] for t in judged))}")
            return f"equivalent on {sets} input set(s) with {self.engine} (max abs error {_num(worst)}{truth}{sizes})"
        failures = self.failures()
        return f"NOT equivalent: {failures[0]}" + (f" (+{len(failures) - 1} more)" if len(failures) > 1 else "")

    def format(self) -> str:
        """A text table: one row per output per comparison, then the verdict."""
        header = ("inputs", "compared", "output", "dtype", "shape", "max abs", "max rel", "rtol/atol", "result")
        rows = []
        for comp in self.comparisons:
            compared = comp.label
            if comp.error is not None:
                rows.append((comp.inputs, compared, "-", "-", "-", "-", "-", "-", "ERROR"))
            for c in comp.checks:
                tol = f"{c.rtol:g}/{c.atol:g}" if (c.rtol or c.atol) else "exact"
                shape = "(" + ", ".join(map(str, c.shape)) + ")"
                verdict = "ok" if c.passed else "FAIL"
                errors = (_num(c.max_abs), _num(c.max_rel))
                rows.append((comp.inputs, compared, c.name, c.dtype, shape, *errors, tol, verdict))
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in [header, *rows]]
        lines += [f"sizes: {label}: {text}" for label, text in self.sizes.items()]
        lines += [f"note: {n}" for n in self.notes]
        if self.passed:
            lines.append(f"PASSED: {self.summary()}")
        else:
            failures = self.failures()
            lines += [f"FAILED: {line}" for line in failures[:MAX_LISTED]]
            if len(failures) > MAX_LISTED:
                lines.append(f"FAILED: ... and {len(failures) - MAX_LISTED} more")
        return printable_lines(lines)

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "engine": self.engine,
            "summary": self.summary(),
            "notes": list(self.notes),
            "sizes": dict(self.sizes),
            "comparisons": [c.to_dict() for c in self.comparisons],
        }


# -- comparing ---------------------------------------------------------------------------------


CHUNK_ELEMENTS = 2**18  # elements compared per step: float64 temporaries stay bounded for big outputs


def compare_arrays(
    name: str,
    expected: np.ndarray,
    actual: np.ndarray,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    spread: float | None = None,
    steps: int | None = None,
) -> OutputCheck:
    """Compare one output: dtype and shape exactly, values within the dtype's tolerance
    (:func:`tolerance`; ``spread`` and ``steps`` as there)."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    base = {"name": name, "dtype": str(expected.dtype), "shape": tuple(expected.shape)}
    if actual.dtype != expected.dtype:
        return OutputCheck(**base, passed=False, note=f"dtype is {actual.dtype}, expected {expected.dtype}")
    if actual.shape != expected.shape:
        return OutputCheck(**base, passed=False, note=f"shape is {actual.shape}, expected {expected.shape}")
    r, a = tolerance(expected.dtype, rtol, atol, spread=spread, steps=steps)
    check = OutputCheck(**base, passed=True, rtol=r, atol=a, spread=spread)
    flat_expected, flat_actual = expected.reshape(-1), actual.reshape(-1)
    worst = None  # (error, flat index) of the worst mismatch so far
    for start in range(0, max(flat_expected.size, 1), CHUNK_ELEMENTS):
        e, x = flat_expected[start:start + CHUNK_ELEMENTS], flat_actual[start:start + CHUNK_ELEMENTS]
        if expected.dtype.kind in "OUS":
            ok, diff, rel = np.asarray(x == e), None, None
        else:
            ok, diff, rel = _numeric_errors(e, x, r, a)
            if diff.size:
                check.max_abs = max(check.max_abs or 0.0, float(diff.max()))
                check.max_rel = max(check.max_rel or 0.0, float(rel.max()))
            else:
                check.max_abs, check.max_rel = check.max_abs or 0.0, check.max_rel or 0.0
        bad = ~ok
        count = int(np.count_nonzero(bad))
        if count:
            # the worst mismatching element: largest error, or the first one for exact types
            index = int(np.argmax(bad)) if diff is None else int(np.argmax(np.where(bad, diff, -1.0)))
            error = 0.0 if diff is None else float(diff[index])
            if worst is None or (diff is not None and error > worst[0]):
                worst = (error, start + index)
        check.mismatches += count
    check.passed = check.mismatches == 0
    if worst is not None:
        flat = worst[1]
        check.worst_index = tuple(int(i) for i in np.unravel_index(flat, expected.shape))
        check.worst_values = (flat_expected[flat].item(), flat_actual[flat].item())
    return check


def _numeric_errors(e: np.ndarray, x: np.ndarray, rtol: float, atol: float):
    """(ok, abs error, rel error) per element of two same-typed 1-D numeric arrays."""
    expected_dtype = e.dtype
    wide = np.complex128 if expected_dtype.kind == "c" else np.float64
    we, wx = e.astype(wide), x.astype(wide)
    with np.errstate(invalid="ignore", over="ignore"):
        same = (wx == we) | (np.isnan(we) & np.isnan(wx))  # equal infinities and NaN in the same place
        diff = np.where(same, 0.0, np.abs(wx - we))
        diff = np.where(np.isnan(diff), np.inf, diff)  # NaN against a number, inf against finite
        if expected_dtype.name in TOLERANCES:  # an infinity passes only by being equal
            ok = same | (np.isfinite(we) & (diff <= atol + rtol * np.abs(we)))
        else:
            ok = np.asarray(x == e)  # exact, and without float rounding of big int64
        scale = np.abs(we)
        rel = np.divide(diff, scale, out=np.zeros_like(diff), where=(scale > 0) & np.isfinite(scale))
    return ok, diff, rel


def compare_outputs(
    expected: Mapping[str, np.ndarray],
    actual: Mapping[str, np.ndarray],
    *,
    rtol: float | None = None,
    atol: float | None = None,
    steps: int | None = None,
) -> list[OutputCheck]:
    """Every output of ``expected`` against the same-named output of ``actual``, and the
    order of the outputs: a consumer that reads outputs by position (onnxruntime's
    ``run(None, ...)``, a model that embeds this one) breaks when two are swapped."""
    checks = []
    for position, (want, got) in enumerate(zip(expected, actual)):
        if want != got:
            checks.append(OutputCheck(
                f"#{position}", "-", (), False,
                note=f"output #{position} is '{got}', expected '{want}' (outputs are reordered)",
            ))
    for name, value in expected.items():
        if name not in actual:
            value = np.asarray(value)
            checks.append(OutputCheck(name, str(value.dtype), tuple(value.shape), False, note="output is missing"))
        else:
            checks.append(compare_values(name, value, actual[name], rtol=rtol, atol=atol, steps=steps))
    return checks


def compare_values(name: str, expected, actual, *, rtol: float | None = None, atol: float | None = None,
                   steps: int | None = None) -> OutputCheck:
    """:func:`compare_arrays` for an output of any type: a sequence (a list, as onnxruntime
    returns it) or a map (a dict) compares element by element, same length or same keys,
    each element with its dtype's tolerance; the first element that differs is named."""
    if not isinstance(expected, (list, tuple, dict)) and not isinstance(actual, (list, tuple, dict)):
        return compare_arrays(name, expected, actual, rtol=rtol, atol=atol, steps=steps)
    kind = "map" if isinstance(expected, dict) else "sequence" if isinstance(expected, (list, tuple)) else "tensor"
    got = "map" if isinstance(actual, dict) else "sequence" if isinstance(actual, (list, tuple)) else "tensor"
    check = OutputCheck(name, kind, (len(expected),) if kind != "tensor" else (), False)
    if got != kind:
        check.note = f"is a {got}, expected a {kind}"
        return check
    keys = list(expected) if kind == "map" else list(range(len(expected)))
    if (set(actual) if kind == "map" else len(actual)) != (set(keys) if kind == "map" else len(keys)):
        check.note = f"has {'keys' if kind == 'map' else 'length'} " + (
            f"{sorted(actual)}, expected {sorted(keys)}" if kind == "map" else f"{len(actual)}, expected {len(keys)}")
        return check
    for key in keys:
        inner = compare_values(f"{name}[{key!r}]", expected[key], actual[key], rtol=rtol, atol=atol, steps=steps)
        if inner.max_abs is not None:
            check.max_abs = max(check.max_abs or 0.0, inner.max_abs)
            check.max_rel = max(check.max_rel or 0.0, inner.max_rel or 0.0)
        check.rtol, check.atol = max(check.rtol, inner.rtol), max(check.atol, inner.atol)
        if not inner.passed:
            check.mismatches = inner.mismatches or 1
            check.note = f"element [{key!r}]: " + (inner.note or f"{inner.mismatches} value(s) out of tolerance "
                                                   f"(max abs error {inner.max_abs:g})")
            return check
    check.passed = True
    return check


class SequenceLength:
    """The longest Scan sequence of a feed set of ``model``: the largest feed axis that is
    some Scan's trip count (scanopt.dims), 1 when none is. Analyses the model on first use."""

    def __init__(self, model: onnx.ModelProto):
        self._model = model
        self._axes: list[tuple[str, int]] | None = None

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> int:
        if self._axes is None:
            from scanopt.dims import DimClasses

            classes = DimClasses(self._model)
            self._axes = [(s.name, a) for s in input_specs(self._model) for a in range(s.rank or 0)
                          if classes.is_trip_count(s.name, a)]
        return max((np.shape(feeds[n])[a] for n, a in self._axes if n in feeds and a < np.ndim(feeds[n])), default=1)


# -- signatures ----------------------------------------------------------------------------------


class SignatureMismatchError(ScanoptError):
    """The two models do not take and give the same tensors: not equivalent.

    A subclass so that the pipeline can treat a rewrite that changed the signature as a
    failed rewrite, and `scanopt verify` as a failed verification (exit 1, as the README's
    exit codes say), not as bad input.
    """

    exit_code = 1


def check_signatures(original: onnx.ModelProto, candidate: onnx.ModelProto) -> None:
    """Raise SignatureMismatchError naming the first difference in names, dtypes or ranks."""
    for kind, ours, theirs in (
        ("input", input_specs(original), input_specs(candidate)),
        ("output", output_specs(original), output_specs(candidate)),
    ):
        a, b = {s.name: s for s in ours}, {s.name: s for s in theirs}
        only_a, only_b = [n for n in a if n not in b], [n for n in b if n not in a]
        if only_a or only_b:
            parts = [f"{kind}s only in the {side}: {', '.join(repr(n) for n in names)}"
                     for side, names in (("original", only_a), ("candidate", only_b)) if names]
            raise SignatureMismatchError(f"the models' signatures differ: {'; '.join(parts)}")
        for name, spec in a.items():
            other = b[name]
            undeclared = onnx.TensorProto.UNDEFINED in (spec.elem_type, other.elem_type)
            if spec.elem_type != other.elem_type and not undeclared:
                raise SignatureMismatchError(
                    f"the models' signatures differ: {kind} '{name}' is {_type_name(spec)} in the original "
                    f"but {_type_name(other)} in the candidate"
                )
            if spec.rank is not None and other.rank is not None and spec.rank != other.rank:
                raise SignatureMismatchError(
                    f"the models' signatures differ: {kind} '{name}' has rank {spec.rank} in the original "
                    f"but {other.rank} in the candidate"
                )


def _type_name(spec: TensorSpec) -> str:
    return onnx.TensorProto.DataType.Name(spec.elem_type).lower()


# -- the check -------------------------------------------------------------------------------------


def compare_models(
    original: ModelLike,
    candidate: ModelLike,
    *,
    inputs: Feeds | Sequence[Feeds] | None = None,
    engine: str = "auto",
    seeds: int = 3,
    rtol: float | None = None,
    atol: float | None = None,
    keep_ort: bool = False,
    input_ranges: dict | None = None,
    loop_reads: Sequence[tuple[str, int]] = (),
) -> VerifyResult:
    """Run both models on the same feeds and compare every output.

    ``inputs``: one feed dict or a list of them; without, feeds are synthesized for
    seeds 0..seeds-1. ``engine``: "ort", "reference", "auto" (onnxruntime when it loads
    both models, else the reference executor for both) or "both" (each engine on each
    model, plus a cross-check of the engines on each model); ``keep_ort``: with "auto", a
    candidate onnxruntime cannot load while it loads the original fails. A candidate that fails to
    load or run is a failed comparison; an original that fails is a ScanoptError,
    since then the inputs (or the engine) are the problem. ``loop_reads``: the sequences
    top-level Loops read per iteration (PassContext.loop_reads), probed by the edge and
    weak-spot inputs as a top-level Scan's are.
    """
    if engine not in ENGINE_CHOICES:
        raise ScanoptError(f"unknown engine '{engine}' (choose from {', '.join(ENGINE_CHOICES)})")
    if (rtol is not None and rtol < 0) or (atol is not None and atol < 0):
        raise ScanoptError("tolerances must not be negative")
    original, original_path = resolve_model(original)
    candidate, candidate_path = resolve_model(candidate)
    check_signatures(original, candidate)
    synthesizer, candidate_dies = None, None
    if _ort_runs(original, candidate, engine):
        first, where, synthesizer = _first_feeds(original, inputs, input_ranges)
        died, = screen_original(original, first, where, others=[candidate])
        if died:
            candidate_dies = (f"not run: onnxruntime's process dies on the candidate ({died}, {where}), "
                              "where it runs the original")
    pairs, notes = _prepare_pairs(original, original_path, candidate, candidate_path, engine, keep_ort, candidate_dies)
    if inputs is not None:
        try:
            runs, sizes = _given_runs(original, candidate, inputs, pairs, notes), {}
        except EngineError as exc:
            # auto: inputs onnxruntime refuses but the spec allows (a sequence_lens entry
            # of 0) go to the reference executor, as synthesized inputs do
            if engine != "auto" or [p[0] for p in pairs] != ["ort"]:
                raise
            pairs = _pairs_for("reference", original, original_path, candidate, candidate_path)
            runs, sizes = _given_runs(original, candidate, inputs, pairs, notes), {}
            notes.append(f"using the reference executor: {exc}")
    else:
        if seeds < 1:
            raise ScanoptError(f"seeds must be at least 1 (got {seeds})")
        pairs, runs, sizes = _synthesized_runs(original, candidate, candidate_path, pairs, seeds, engine, notes,
                                               input_ranges, synthesizer, loop_reads)
    resolved = "both" if len(pairs) == 2 else pairs[0][0]

    comparisons = []
    widen = rtol is None and atol is None  # the user's tolerances are final
    other = _OtherEngine(original, original_path, pairs)
    engines = ("ort", "reference") if any(name == "ort" for name, _, _ in pairs) else ("reference",)
    truth = Truth(original, original_path, notes, engines) if widen else None
    length = SequenceLength(original)
    for label, feeds, expected_by_engine in runs:  # one input set at a time: its outputs die with it
        ran = {}
        fed_non_finite = _has_non_finite(feeds)
        spread = _Spread(feeds, expected_by_engine, other, length)
        wide = None
        for name, _, candidate_runner in pairs:
            if fed_non_finite and resolved == "both" and name == "reference":
                continue  # a fed NaN/inf is judged where the model runs: the executors order 0*inf apart
            expected = expected_by_engine[name]
            comp = Comparison(label, ("original", name), ("candidate", name))
            if name == "ort" and getattr(feeds, "unsafe", None):  # onnxruntime's process died on it
                actual, comp.error = None, feeds.unsafe
            else:
                actual = _run_candidate(candidate_runner, feeds, comp)
                if actual is not None and fed_non_finite:
                    actual = _where_original_finite(expected, actual)
            if actual is not None:
                comp.checks = compare_outputs(expected, actual, rtol=rtol, atol=atol)
                if widen:
                    _widen_by_spread(comp, expected, actual, spread)
                if truth is not None and truth.wanted(comp):
                    wide = truth(feeds) if wide is None else wide
                    if wide is not None:
                        _judge_by_truth(comp, expected, actual, wide, acquit=not getattr(feeds, "reference", False))
                if isinstance(expected, SpecOutputs) and not comp.passed and _keeps_scan8(candidate):
                    _judge_candidate_by_spec(comp, expected, candidate, candidate_path, feeds, rtol, atol, notes)
            comparisons.append(comp)
            ran[name] = (expected, actual)
        if resolved == "both" and not fed_non_finite:
            comparisons += _cross_check(label, ran, rtol, atol, length(feeds) if widen else None, spread if widen else None)
        del feeds, expected_by_engine, expected, actual, ran, spread, wide  # before the next set's runs
    return VerifyResult(resolved, comparisons, notes, sizes)


_TWIN_SURVIVED: dict[int, onnx.ModelProto] = {}  # originals whose twin's first run a child survived (the last few)


class Truth:
    """The original's float64 twin (scanopt.widen), run on each feed set: the truth a narrow
    float output is judged against. Prepared on first use; when no engine runs the twin, or
    it would be over TRUTH_BYTES, it is None for every feed set and a note says why."""

    def __init__(self, original: onnx.ModelProto, path, notes: list[str], engines=("ort", "reference")):
        self._original, self._path, self._notes = original, path, notes
        self._engines = engines  # the pairs' own: a twin onnxruntime may die on is not run there
        self._runner: Runner | None | bool = False  # False: not prepared yet; None: cannot
        self._small = serialized_size_bound(original) <= TRUTH_ALWAYS_BYTES

    def wanted(self, comp: Comparison) -> bool:
        """Whether to run the truth for ``comp``: always for a small model (the report gives
        both errors), for a big one only where the table refused a narrow float output."""
        return self._small or any(not c.passed and not c.note and c.dtype in JUDGED_BY_TRUTH for c in comp.checks)

    def __call__(self, feeds) -> dict | None:
        if self._runner is False:
            self._runner = self._prepare(feeds)
        if self._runner is None:
            return None
        if getattr(self._runner, "engine", None) == "ort" and is_edge(feeds):
            return None  # an empty input or a zero count: the twin was not screened, onnxruntime may die on it
        try:
            return self._runner(widened_feeds(feeds))
        except EngineError as exc:
            self._notes.append(f"the float64 truth did not run ({exc}): judged by the tolerance table")
            self._runner = None
            return None

    def _prepare(self, feeds) -> Runner | None:
        types = {s.elem_type for s in output_specs(self._original)}
        narrow = bool(types & set(WIDENED_TYPES))
        if not narrow and onnx.TensorProto.DOUBLE not in types:
            return None  # nothing to judge by it
        if ort_miscomputes(self._original):  # the original's outputs are not its semantics: nothing to weigh
            return None
        if has_marks(self._original) or serialized_size_bound(self._original) * 2 > TRUTH_BYTES:
            if narrow:
                self._notes.append("the float64 truth is over the memory budget: judged by the tolerance table")
            return None
        twin = widened(self._original)
        if not narrow and twin == self._original:  # float64 outputs computed in float64 throughout: no truth to add
            return None
        failures = []
        for engine in self._engines:
            if engine == "ort" and id(self._original) not in _TWIN_SURVIVED and not is_edge(feeds):
                died = first_run([twin], widened_feeds(feeds))[0]  # its first run, where a crash is survivable
                if died:
                    failures.append(f"onnxruntime's process dies on it ({died})")
                    continue
                if len(_TWIN_SURVIVED) >= SURVIVORS_KEPT:
                    _TWIN_SURVIVED.pop(next(iter(_TWIN_SURVIVED)))
                _TWIN_SURVIVED[id(self._original)] = self._original  # kept: its id stays its own
            try:
                return prepare(twin, engine)
            except EngineError as exc:
                failures.append(str(exc))
        self._notes.append(f"the float64 truth does not load ({failures[-1]}): judged by the tolerance table")
        return None


def _judge_by_truth(comp: Comparison, expected, actual, wide, acquit: bool = True) -> None:
    """Add each narrow float (and float64) output's errors from the truth to its check; a check the table
    refused passes when the truth rule does (see TOLERANCES), unless not ``acquit`` (a
    distance map's reference points)."""
    for check in comp.checks:
        if check.note or check.dtype not in JUDGED_BY_TRUTH or check.name not in wide:
            continue
        truth_values = np.asarray(wide[check.name])
        if truth_values.shape != check.shape:
            continue
        errors, bound, passed = truth_check(expected[check.name], actual[check.name], truth_values)
        check.truth, check.truth_bound = errors, bound
        if passed and not check.passed and not acquit:
            check.unacquitted = ("at a distance map's reference points the original's outputs judge: there its "
                                 "distances are exact differences, and the candidate's other rounding of them moves "
                                 "this output beyond the tolerance")
        elif passed and not check.passed:
            check.passed, check.mismatches, check.worst_index, check.worst_values = True, 0, None, None


def truth_check(original, candidate, truth) -> tuple[tuple[float, float], float, bool]:
    """((original's, candidate's) max error from the float64 ``truth``, the bound, whether the
    candidate passes the truth rule beside TOLERANCES) for one narrow float output."""
    original, candidate = np.asarray(original), np.asarray(candidate)
    dtype = original.dtype
    info = np.finfo(np.float32 if dtype.name == "bfloat16" else dtype)
    top = 3.38e38 if dtype.name == "bfloat16" else float(info.max)
    o, c = original.reshape(-1).astype(np.float64), candidate.reshape(-1).astype(np.float64)
    t = np.asarray(truth, np.float64).reshape(-1)
    with np.errstate(invalid="ignore", over="ignore"):
        in_range = np.isfinite(t) & (np.abs(t) <= top)
        fed = ~np.isfinite(t)  # the truth itself is NaN or infinite (a fed NaN): reproduce the original
        same = (c == o) | (np.isnan(c) & np.isnan(o))
        bad = (fed & ~same) | (in_range & np.isfinite(o) & ~np.isfinite(c))
        counted_o, counted_c = in_range & np.isfinite(o), in_range & np.isfinite(c)
        error_o = float(np.max(np.abs(o[counted_o] - t[counted_o]), initial=0.0))
        diff_c = np.abs(c[counted_c] - t[counted_c])
        error_c = float(np.max(diff_c, initial=0.0))
        allowed = TRUTH_FACTOR * error_o + TRUTH_ULPS * float(info.eps) * np.abs(t[counted_c]) + float(info.tiny)
        over = bool(np.any(diff_c > allowed))
    bound = float(np.max(allowed, initial=TRUTH_FACTOR * error_o))
    return (error_o, error_c), bound, not bad.any() and not over


class _OtherEngine:
    """The engine the comparison does not use, for the original only, prepared on first need."""

    def __init__(self, original, original_path, pairs):
        engines = [name for name, _, _ in pairs]
        self.missing = None if len(engines) == 2 else ("reference" if engines == ["ort"] else "ort")
        self._model, self._path = original, original_path
        self._runner: Runner | None | bool = False  # False: not prepared yet; None: cannot

    def run(self, feeds) -> dict | None:
        if self.missing is None:
            return None
        if self._runner is False:
            self._runner = self._prepare(feeds)
        if self._runner is None:
            return None
        try:
            return self._runner(feeds)
        except EngineError:
            return None

    def _prepare(self, feeds) -> Runner | None:
        if self.missing == "ort":  # the pairs run the reference executor: onnxruntime has not run the original yet
            if ort_miscomputes(self._model):
                return None  # its numbers say nothing (or it crashes: a Loop with an omitted output)
            if not survived(self._model) and first_run([self._model], feeds)[0]:
                return None  # its process dies on the original: no spread
        try:
            return prepare(self._model, self.missing, path=self._path)
        except EngineError:
            return None


class _Spread:
    """The original's engine disagreement per output on one feed set (see TOLERANCES),
    measured on first need: the other engine runs the original once per feed set."""

    def __init__(self, feeds, expected_by_engine, other: _OtherEngine, length: SequenceLength):
        self._feeds, self._expected, self._other, self._length = feeds, expected_by_engine, other, length
        self._pair: tuple | None | bool = False

    def __call__(self, output: str) -> float | None:
        if self._pair is False:
            if "ort" in self._expected and "reference" in self._expected:
                self._pair = (self._expected["ort"], self._expected["reference"])
            elif self._other.missing == "reference" and self._length(self._feeds) > REFERENCE_SPREAD_STEPS:
                self._pair = None  # numpy would step it for seconds: the float64 truth judges it instead
            else:
                (engine, outputs), = self._expected.items()
                more = self._other.run(self._feeds)
                self._pair = None if more is None else ((outputs, more) if engine == "ort" else (more, outputs))
        if self._pair is None:
            return None
        ort_out, ref_out = self._pair
        if output not in ort_out or output not in ref_out:
            return None
        # Beyond float noise (onnxruntime known to miscompute a model, a broken engine) the
        # disagreement says nothing about rounding: no widening then. Within it, the
        # comparison's largest error is the spread (a pass leaves no NaN or inf error).
        check = compare_arrays(output, ort_out[output], ref_out[output], steps=self._length(self._feeds))
        if check.passed:
            return check.max_abs
        return check.max_abs if _within_rounding_of_scale(check, ort_out[output]) else None


def _within_rounding_of_scale(check: OutputCheck, values) -> bool:
    """Float noise all the same: a disagreement within SCALE_ULPS machine epsilons of the output's
    largest finite magnitude. A cancelling sum (mamba-minimal's y = Σ h ⊙ C: elements of 0.1
    from terms of 1e4) rounds far above the table's bound on its small elements and within an
    epsilon or two of its scale (measured 1–2e-7 at T = 64–1024); an engine computing something
    else differs at that scale, and an output whose engines differ by hundreds of epsilons of
    it (a GaussianProcess's std, 4e-5) is not pinned down by rounding alone."""
    values = np.asarray(values)
    if check.max_abs is None or values.dtype.kind not in "fc":
        return False
    finite = np.abs(values[np.isfinite(values)]).astype(np.float64)
    return finite.size > 0 and check.max_abs <= SCALE_ULPS * float(np.finfo(values.dtype).eps) * float(finite.max())


def _widen_by_spread(comp: Comparison, expected, actual, spread: _Spread) -> None:
    """Re-check each floating output that failed the table's tolerance with the rule's
    widened one (the original's own engine disagreement), when it can be measured."""
    for i, check in enumerate(comp.checks):
        if check.passed or check.note or check.dtype not in TOLERANCES or check.name not in expected:
            continue
        measured = spread(check.name)
        if measured is not None:
            comp.checks[i] = compare_arrays(check.name, expected[check.name], actual[check.name], spread=measured)


def runnable_feeds(model: ModelLike, *, seeds: int = 2, engine: str = "auto") -> list[dict]:
    """Synthesized input sets, one per seed, that ``model`` runs on (the search
    :func:`compare_models` makes). For checking a model derived from ``model`` whose own
    signature says less, e.g. after an opset migration turned Scan-8's sequence_lens into
    a plain int64 input."""
    model, path = resolve_model(model)
    engine = "auto" if engine == "both" else engine
    synthesizer = None
    if _ort_runs(model, model, engine):
        first, where, synthesizer = _first_feeds(model, None, None)
        screen_original(model, first, where)
    pairs, notes = _prepare_pairs(model, path, model, path, engine)
    _, runs, _ = _synthesized_runs(model, model, path, pairs, seeds, engine, notes, synthesizer=synthesizer)
    return [LabelledFeeds(feeds, label, getattr(feeds, "safe_for", ()), getattr(feeds, "unsafe", None))
            for label, feeds, _ in runs]


def _ort_runs(original, candidate, engine: str) -> bool:
    """Whether onnxruntime will run ``original`` in this process for ``engine``."""
    if engine in ("ort", "both"):
        return True
    return engine == "auto" and not (ort_miscomputes(original) or ort_miscomputes(candidate))


def _first_feeds(original, inputs, input_ranges) -> tuple[dict | None, str, InputSynthesizer | None]:
    """(the feeds of the original's first run in onnxruntime, them in words, the synthesizer
    made for them): the first given set that is not an edge (those are screened apart,
    edge_inputs.screened), else seed 0's first sizes; None (creating the session alone) where
    there are none or they do not check."""
    if inputs is not None:
        given = [inputs] if isinstance(inputs, Mapping) else list(inputs)
        for feeds in given:
            if not is_edge(feeds):
                try:
                    return check_feeds(original, feeds), f"on {getattr(feeds, 'label', None) or 'the given inputs'}", None
                except ScanoptError:
                    break  # reported as it was when the runs get to it
        return None, "creating its session", None
    try:
        synthesizer = InputSynthesizer(original, input_ranges=input_ranges)
    except ScanoptError:  # reported as it was by _synthesized_runs
        return None, "creating its session", None
    try:
        return synthesizer.feeds(0, synthesizer.attempts(0)[0], min_len=1), "on seed 0's synthesized inputs", synthesizer
    except ScanoptError:
        return None, "creating its session", synthesizer


class CannotVerifyError(EngineError):
    """No synthesized input runs the original (or none fits the memory budget).

    Exit code 1: the file is not broken, it just cannot be checked without the user's
    inputs (``--inputs``).
    """

    exit_code = 1


def _prepare_pairs(original, original_path, candidate, candidate_path, engine, keep_ort=False, candidate_dies=None):
    """(engine, original runner, candidate runner or load error) per engine to use, and notes.

    ``keep_ort`` (auto only): a candidate onnxruntime cannot load while it loads the original
    fails, instead of both going to the reference executor (what the pipeline wants: a rewrite
    must not cost the user their runtime). ``candidate_dies``: why onnxruntime must not run
    the candidate in this process (its process died on it in a child: a failure, not a reason
    to switch engines)."""
    notes: list[str] = []
    wrong = ort_miscomputes(original) or ort_miscomputes(candidate)
    if engine == "auto" and wrong:
        notes.append(f"using the reference executor: {wrong}")
        engine = "reference"
    elif wrong and engine in ("ort", "both"):  # asked for: run it, but say why it may differ
        notes.append(f"onnxruntime's numbers are not trustworthy here: {wrong}")
    if engine == "auto":
        try:
            original_runner = prepare(original, "ort", path=original_path)
            if candidate_dies:
                return [("ort", original_runner, candidate_dies)], notes
            try:
                candidate_runner = prepare(candidate, "ort", path=candidate_path)
            except EngineError as exc:
                if keep_ort:  # the rewrite lost onnxruntime: a failure, never a reason to switch engines
                    return [("ort", original_runner, f"{exc} (onnxruntime loads the original)")], notes
                raise
            return [("ort", original_runner, candidate_runner)], notes
        except EngineError as exc:
            notes.append(f"using the reference executor: {exc}")
            try:
                return _pairs_for("reference", original, original_path, candidate, candidate_path), notes
            except EngineError as neither:  # no engine runs both: a limit of the engines, not bad input
                raise CannotVerifyError(f"cannot verify: {exc}; and {neither}") from None
    return _pairs_for(engine, original, original_path, candidate, candidate_path, candidate_dies), notes


def _pairs_for(engine: str, original, original_path, candidate, candidate_path, candidate_dies=None):
    pairs = []
    for name in ("ort", "reference") if engine == "both" else (engine,):
        original_runner = prepare(original, name, path=original_path)
        try:
            candidate_runner: Runner | str = (candidate_dies if name == "ort" and candidate_dies
                                              else prepare(candidate, name, path=candidate_path))
        except EngineError as exc:
            candidate_runner = str(exc)
        pairs.append((name, original_runner, candidate_runner))
    return pairs


def _given_runs(original, candidate, inputs, pairs, notes) -> list[tuple[str, dict, dict]]:
    """(label, feeds, original's outputs per engine) for the user's input sets; those with an
    empty input or a count of 0 are first run in a child process (edge_inputs.screened)."""
    given = [inputs] if isinstance(inputs, Mapping) else list(inputs)
    if not given:
        raise ScanoptError("no input sets given")
    labels = ["inputs"] if len(given) == 1 else [f"inputs #{i + 1}" for i in range(len(given))]
    labels = [getattr(feeds, "label", None) or label for label, feeds in zip(labels, given)]
    checked = []
    for label, feeds in zip(labels, given):
        ready = check_feeds(original, feeds)
        checked.append((label, LabelledFeeds(ready, label, getattr(feeds, "safe_for", ()), getattr(feeds, "unsafe", None),
                                             getattr(feeds, "reference", False))
                        if isinstance(feeds, LabelledFeeds) else ready))
    if any(name == "ort" for name, _, _ in pairs):
        checked = screened(original, candidate, checked, notes, drop_errors=False)
    runs = []
    spec = _OtherEngine(original, None, [p for p in pairs if p[0] == "ort"])
    for label, feeds in checked:
        expected = {name: _run_original(runner, feeds, label) for name, runner, _ in pairs}
        _judge_edge_by_spec(expected, spec, feeds, label, notes)
        runs.append((label, feeds, expected))
    return runs


def _synthesized_runs(original, candidate, candidate_path, pairs, seeds: int, engine: str, notes: list[str],
                      input_ranges: dict | None = None, synthesizer: InputSynthesizer | None = None, loop_reads=()):
    """(pairs, runs): per seed, the first sizes the original runs on (see InputSynthesizer.attempts).

    With ``engine="auto"``, an original onnxruntime runs on no input of (a zero-length
    Scan-9, say) is run by the reference executor instead, both models. ``synthesizer``: one
    made for ``original`` and ``input_ranges`` already."""
    try:
        if synthesizer is None:
            synthesizer = InputSynthesizer(original, input_ranges=input_ranges)
    except ScanoptError as exc:  # an input without a rank, or of a type scanopt cannot draw
        raise CannotVerifyError(f"cannot verify: {exc}") from None
    notes.extend(synthesizer.range_notes)
    # where the shape derivation met contradictory declarations or stopped on a model it
    # misreads: the sizes tried may then be poor, and the report should say so
    notes.extend(f"input sizes: {conflict}" for conflict in synthesizer.input_shapes.conflicts)
    sizes: dict = {}
    first, pairs = _seed_run(synthesizer, 0, original, candidate, candidate_path, pairs, engine, notes, sizes)
    pending = [first]

    def runs():
        """Seed 0's run (it settled the engine), then each later seed's when asked for: the
        original's outputs for one seed at a time, not for all seeds at once; then seed 0's
        feeds at the model's weak spots (scanopt.weak_spots) that the original runs on."""
        seed0 = pending[0][1]
        yield pending.pop()
        for seed in range(1, seeds):
            yield _seed_run(synthesizer, seed, original, candidate, candidate_path, pairs, engine, notes, sizes)[0]
        probes = [*row_queries(original, seed0), *long_trip_counts(original, seed0)]
        if all(name != "reference" for name, _, _ in pairs):  # numpy steps a long Scan slowly
            probes += [*long_sequences(original, seed0, loop_reads), *wide_batches(original, seed0, loop_reads)]
        for label, feeds in probes:
            try:
                expected = {name: runner(feeds) for name, runner, _ in pairs}
            except EngineError:
                continue  # inputs the original refuses say nothing of the rewrite
            notes.append(f"also checked at seed 0's sizes with {label}")
            yield label, feeds, expected
        edges = []
        ort_used = any(name == "ort" for name, _, _ in pairs)
        sets = list(edge_sets(original, seed0, loop_reads))
        spec = _OtherEngine(original, None, [p for p in pairs if p[0] == "ort"])
        for label, feeds in screened(original, candidate, sets, notes) if ort_used else sets:
            try:
                expected = {name: runner(feeds) for name, runner, _ in pairs}
            except EngineError:
                continue  # an edge the original refuses: the candidate may refuse it too
            _judge_edge_by_spec(expected, spec, feeds, f"edge {label}", notes)
            edges.append(label)
            yield f"edge: {label}", feeds, expected
        if edges:
            notes.append(f"also checked on {len(edges)} edge input(s) the original accepts: {'; '.join(edges)}")

    return pairs, runs(), sizes


def _judge_edge_by_spec(expected: dict, spec: _OtherEngine, feeds, label: str, notes: list[str]) -> None:
    """On an empty or zero-count input run by onnxruntime, the spec's outputs where they differ
    (:func:`_ort_against_spec`), with a note."""
    if "ort" in expected and is_edge(feeds) and _ort_against_spec(expected, spec, feeds):
        notes.append(f"{label}: onnxruntime's original gives other values than the ONNX spec "
                     "(the reference executor) there: the candidate is judged against the spec")


def _ort_against_spec(expected: dict, spec: _OtherEngine, feeds) -> bool:
    """On an empty or zero-count edge input, onnxruntime's Scan may return what the spec does
    not (a Scan-8 over zero steps gives other states than the initial ones): where the
    reference executor runs the original and disagrees, its outputs replace onnxruntime's as
    the expected ones (``expected`` changed in place). Whether they were replaced."""
    reference = expected.get("reference")
    if reference is None:
        reference = spec.run(feeds) if spec.missing == "reference" else None
    if reference is None or all(c.passed for c in compare_outputs(reference, expected["ort"])):
        return False
    expected["ort"] = SpecOutputs(reference)
    return True


class SpecOutputs(dict):
    """The reference executor's outputs of the original that replaced onnxruntime's on an edge
    input (:func:`_ort_against_spec`): there onnxruntime departs from the spec, on the
    candidate too where it keeps the same op (a Scan-8 over zero steps returns unset states)."""


def _seed_run(synthesizer, seed, original, candidate, candidate_path, pairs, engine, notes, sizes):
    """((label, feeds, the original's outputs per engine), pairs) for one seed; on seed 0 with
    ``engine="auto"`` the pairs may switch to the reference executor."""
    run, failures = _first_that_runs(synthesizer, seed, pairs)
    if run is None and seed == 0 and engine == "auto" and [p[0] for p in pairs] == ["ort"]:
        reference = _pairs_for("reference", original, None, candidate, candidate_path)
        run, _ = _first_that_runs(synthesizer, seed, reference)
        if run is not None:
            pairs = reference
            notes.append(f"using the reference executor: onnxruntime runs the original on no synthesized input ({failures[0][1]})")
    if run is None:
        attempt, error = failures[0]
        why = "".join(f"; {note}" for note in notes)  # e.g. why onnxruntime was not used
        raise CannotVerifyError(
            f"cannot verify: the original model fails on seed {seed} at every size tried "
            f"({len(failures)} size set(s); first {attempt.describe()}: {error}{why}); pass inputs it accepts with --inputs"
        )
    attempt, feeds, expected = run
    label = f"seed {seed}"
    if failures:
        notes.append(f"{label}: the original fails at {failures[0][0].describe()} ({failures[0][1]}); used {attempt.describe()}")
    sizes[label] = attempt.describe()
    return (label, feeds, expected), pairs


def _first_that_runs(synthesizer: InputSynthesizer, seed: int, pairs):
    """((attempt, feeds, outputs per engine) or None, [(attempt, error) that failed])."""
    min_len = 0 if all(name == "reference" for name, _, _ in pairs) else 1  # onnxruntime rejects length 0
    failures = []
    for attempt in synthesizer.attempts(seed):
        try:
            feeds = synthesizer.feeds(seed, attempt, min_len=min_len)
        except FeedBudgetError as exc:
            raise CannotVerifyError(f"cannot verify: {exc}") from None
        try:
            expected = {name: runner(feeds) for name, runner, _ in pairs}
        except EngineError as exc:
            failures.append((attempt, exc))
            continue
        return (attempt, feeds, expected), failures
    return None, failures


def _has_non_finite(feeds) -> bool:
    return any(np.asarray(v).dtype.kind in "fc" and not np.all(np.isfinite(v)) for v in feeds.values()
               if not isinstance(v, (list, dict)))


def _where_original_finite(expected: dict, actual: dict) -> dict:
    """``actual`` with the original's value wherever the original's is NaN or infinite, for a
    feed set holding a NaN or inf: how a NaN propagates is not the model's meaning
    (onnxruntime's native GRU clamps it inside its sigmoid), a finite value that changes, a
    value read from a later step, or a NaN where the original is finite is."""
    out = dict(actual)
    for name, want in expected.items():
        got = actual.get(name)
        if isinstance(want, np.ndarray) and isinstance(got, np.ndarray) and want.dtype.kind in "fc" \
                and want.shape == got.shape and got.dtype == want.dtype and not np.all(np.isfinite(want)):
            out[name] = np.where(np.isfinite(want), got, want)
    return out


def _keeps_scan8(model: onnx.ModelProto) -> bool:
    """Whether ``model`` is at an opset whose Scan is Scan-8: onnxruntime runs a Scan-8 over zero
    steps with unset final states, the one departure from the spec a candidate may share."""
    from scanopt.validate import default_opset

    return (default_opset(model) or 0) < 9


def _judge_candidate_by_spec(comp: Comparison, expected: SpecOutputs, candidate, candidate_path, feeds, rtol, atol,
                             notes: list[str]) -> None:
    """Where onnxruntime's original departs from the spec on an edge input and its candidate
    misses the spec too, the candidate's own spec run (the reference executor) judges it: a
    candidate that keeps the op onnxruntime gets wrong (the very model, a Scan-8 over zero
    steps) is no worse than the original there. A candidate the reference executor does not
    run, or that misses the spec there too, keeps its failure."""
    try:
        actual = prepare(candidate, "reference", path=candidate_path)(feeds)
    except EngineError:
        return
    checks = compare_outputs(expected, actual, rtol=rtol, atol=atol)
    if all(c.passed for c in checks):
        comp.checks = checks
        notes.append(f"{comp.inputs}: the candidate's onnxruntime run departs from the spec as the original's does; "
                     "its reference executor run agrees with the spec")


def _run_original(runner: Runner, feeds, label: str) -> dict:
    try:
        return runner(feeds)
    except EngineError as exc:
        raise EngineError(f"the original model fails on {label}: {exc}") from exc


def _run_candidate(runner: Runner | str, feeds, comp: Comparison) -> dict | None:
    if isinstance(runner, str):
        comp.error = runner
        return None
    try:
        return runner(feeds)
    except EngineError as exc:
        comp.error = str(exc)
        return None


def _cross_check(label: str, ran: dict, rtol, atol, steps: int | None, spread: _Spread | None) -> list[Comparison]:
    """onnxruntime against the reference executor on each model (only "both"): the original's
    by the table grown over ``steps`` (its disagreement *is* the spread), the candidate's
    widened by the original's spread like any candidate output."""
    comparisons = []
    for index, model in enumerate(("original", "candidate")):
        ort_out, ref_out = ran["ort"][index], ran["reference"][index]
        if ort_out is None or ref_out is None:
            continue  # the candidate failed to run: already reported
        comp = Comparison(label, (model, "ort"), (model, "reference"))
        comp.checks = compare_outputs(ort_out, ref_out, rtol=rtol, atol=atol, steps=steps if index == 0 else None)
        if index == 1 and spread is not None:
            _widen_by_spread(comp, ort_out, ref_out, spread)
        comparisons.append(comp)
    return comparisons


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return "0" if value == 0 else f"{value:.2e}"


def _value(value) -> str:
    return f"{value:.7g}" if isinstance(value, float) else repr(value)


def _json_float(value: float | None):
    """JSON has no inf or NaN: those become strings."""
    if value is None or math.isfinite(value):
        return value
    return str(value)
