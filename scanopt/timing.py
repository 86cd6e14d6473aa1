"""Timing candidate forms so that a shared machine cannot fool the comparison.

Every form runs once per round, rounds interleave the forms (in a rotating order), and
the original runs twice per round in two sessions: the A/A pair, whose paired ratio shows
what the machine's noise alone does. A form is judged by its per-round ratios to the
original (same round, so a busy neighbour slows both), in log space: the median log-ratio
and a distribution-free confidence interval of it (order statistics). The noise is the A/A
pair's median log-ratio plus two standard errors from its median absolute deviation: an
outlier round cannot inflate it. Without a thread count the clock is one intra-op thread's
CPU time (``time.thread_time``: another process's load does not count); with N > 1 threads
work runs on onnxruntime's pool threads, so the clock is wall time (latency is what the
threads buy), and a busy machine shows in the noise.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import onnx

AA = "loop (A/A)"
MIN_ROUNDS = 5
MAX_ROUNDS = 61
NOISE_FLOOR = 0.05  # below this, a difference is not trusted whatever the samples say, nor worth a
#                    rewrite: a 2-4% "win" flips with the machine's state (bench_policy --load both)
HIGH_NOISE = 0.25  # a decision taken above this noise is not cached as final
Z = 1.96  # two-sided 95%: the order statistics bounding a median, and the A/A standard errors


@dataclass(frozen=True)
class FormTime:
    seconds: float  # median per run
    ratio: float  # median of per-round ratios to the original (1 for the original)
    spread: float  # half the interquartile range of those ratios (about 0.67 standard deviations)
    low: float | None = None  # the ratio's 95% confidence interval (None: from ``spread``)
    high: float | None = None

    def bounds(self, rounds: int) -> tuple[float, float]:
        """The confidence interval of the median ratio (from the spread where the samples are gone)."""
        if self.low is not None and self.high is not None:
            return self.low, self.high
        wide = 2 * 1.5 * self.spread / max(rounds, 1) ** 0.5 / max(self.ratio, 1e-12)
        return self.ratio * math.exp(-wide), self.ratio * math.exp(wide)


@dataclass(frozen=True)
class Timings:
    forms: dict  # name -> FormTime; the first is the original
    noise: float  # relative: how far two identical forms' medians may differ here, at least NOISE_FLOOR
    rounds: int
    clock: str  # "thread CPU" or "wall"
    samples: dict | None = field(default=None, compare=False, repr=False)  # {form: per-round seconds}, A/A included


@dataclass(frozen=True)
class Verdict:
    """What the samples say: ``form`` wins ("faster"), no form clearly beats the original
    ("no gain"), or the noise hides the answer ("undecided": the caller must not default to
    the original; it decides otherwise and says so)."""

    form: str
    outcome: str  # "faster", "no gain" or "undecided"
    final: bool  # cacheable: decided, under at most HIGH_NOISE


def clock_name(threads: int | None) -> str:
    return "thread CPU" if (threads or 1) == 1 else "wall"


def session(model: onnx.ModelProto, threads: int | None, providers: list[str] | None = None):
    """An onnxruntime session with ``threads`` intra-op threads (None: one), on the CPU
    provider or the ``providers`` list (scanopt.providers)."""
    import onnxruntime as ort

    from scanopt.engines import ort_source

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # its notes and its error log lines are not ours: errors come back as exceptions
    model_bytes, kept = ort_source(model, options, prepack=True)
    made = ort.InferenceSession(model_bytes, options, providers=providers or ["CPUExecutionProvider"])
    made.scanopt_weights = kept  # alive as long as the session
    return made


def measure(forms: dict, feeds: dict, *, threads: int | None, seconds: float, check_budget: bool = True,
            patience: float | None = None, form_feeds: dict | None = None,
            providers: list[str] | None = None) -> Timings | str:
    """Time ``forms`` (name -> model; the first is the original) on ``feeds``, interleaved,
    for about ``seconds`` (at least MIN_ROUNDS rounds, at most MAX_ROUNDS); while the verdict
    is undecided, up to ``patience`` seconds more (default: ``seconds`` again). With
    ``check_budget``, returns why not instead when MIN_ROUNDS rounds would take more than
    twice ``seconds`` (known after the first round). ``threads`` None: one thread.
    ``form_feeds``: {form: its own feeds} for forms that take other inputs (another length).
    ``providers``: a session provider list other than the CPU's (a device's work is not the
    calling thread's CPU time: wall clock)."""
    threads = threads or 1
    device = providers is not None and list(providers) != ["CPUExecutionProvider"]
    clock_label = "wall" if device else clock_name(threads)
    clock = time.thread_time if clock_label == "thread CPU" else time.perf_counter
    names = list(forms)
    died = _dies(forms, feeds, form_feeds or {})
    if died:
        return died
    sessions = {name: session(model, threads, providers) for name, model in forms.items()}
    sessions[AA] = session(forms[names[0]], threads, providers)
    order = names + [AA]
    fed = {name: (form_feeds or {}).get(name, feeds) for name in names}
    fed[AA] = fed[names[0]]
    warm = time.perf_counter()
    for count, (name, s) in enumerate(sessions.items(), 1):  # warm-up: allocations, prepacking, first-run caches
        s.run(None, fed[name])
        spent = time.perf_counter() - warm
        if check_budget and spent * MIN_ROUNDS > 2 * seconds:  # a big Scan: known before every form ran once
            return (f"one run of every form takes {'' if count == len(sessions) else 'over '}{spent:.2f} s, over "
                    f"the time budget of {seconds:g} s")
    samples: dict[str, list[float]] = {name: [] for name in order}
    start = time.perf_counter()
    deadline = start + seconds
    extended = deadline + (seconds if patience is None else patience)
    rounds = 0
    while rounds < MAX_ROUNDS:
        now = time.perf_counter()
        if rounds >= MIN_ROUNDS and now >= deadline and (
                now >= extended or decide(summarize(samples, clock_label)).outcome != "undecided"):
            break
        if rounds == 1 and check_budget:
            spent = now - start
            if spent * MIN_ROUNDS > 2 * seconds:
                return f"one run of every form takes {spent:.2f} s, over the time budget of {seconds:g} s"
        shift = rounds % len(order)
        for name in order[shift:] + order[:shift]:
            begin = clock()
            sessions[name].run(None, fed[name])
            samples[name].append(max(clock() - begin, 1e-9))
        rounds += 1
    return summarize(samples, clock_label)


def _dies(forms: dict, feeds: dict, form_feeds: dict) -> str | None:
    """Why a form must not run in this process: onnxruntime's process died running it once in
    a child (scanopt.isolated.first_run: a malformed model onnxruntime accepts, or a rewrite
    it crashes on); None when every form survived."""
    from scanopt.isolated import first_run

    groups: dict[int, list[str]] = {}
    for name in forms:
        groups.setdefault(id(form_feeds.get(name, feeds)), []).append(name)
    for names in groups.values():
        fed = form_feeds.get(names[0], feeds)
        for name, how in zip(names, first_run([forms[n] for n in names], fed)):
            if how:
                return f"onnxruntime's process dies running the form '{name}' ({how})"
    return None


def summarize(samples: dict[str, list[float]], clock: str) -> Timings:
    """Timings from per-round seconds {form: [s, ...]} (the first form is the original; the
    A/A session under :data:`AA`), paired by round."""
    names = [n for n in samples if n != AA]
    base = samples[names[0]]
    forms = {name: _form_time(samples[name], base) for name in names}
    noise = NOISE_FLOOR
    if samples.get(AA):
        logs = [math.log(a / b) for a, b in zip(samples[AA], base)]
        middle = statistics.median(logs)
        mad = statistics.median(abs(x - middle) for x in logs)
        standard_error = 1.2533 * 1.4826 * mad / len(logs) ** 0.5  # of a median, from a robust sigma
        noise = max(NOISE_FLOOR, math.expm1(abs(middle) + 2 * standard_error))
    return Timings(forms=forms, noise=noise, rounds=len(base), clock=clock, samples=samples)


def _form_time(samples: list[float], base: list[float]) -> FormTime:
    logs = sorted(math.log(s / b) for s, b in zip(samples, base))
    ratios = [math.exp(x) for x in logs]
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else (ratios[0],) * 3
    k = max(0, int((len(logs) - Z * len(logs) ** 0.5) / 2))  # order statistics around the median
    return FormTime(statistics.median(samples), math.exp(statistics.median(logs)), (q3 - q1) / 2,
                    math.exp(logs[k]), math.exp(logs[len(logs) - 1 - k]))


def decide(timings: Timings) -> Verdict:
    """The fastest form whose ratio's upper confidence bound is below 1 / (1 + noise) (a
    multiplicative margin: a 99x win clears any noise), else the original where no form can
    be faster by more than the noise (the interval is narrow), else undecided — always
    undecided above HIGH_NOISE (a 2x gain read as "within 123% noise" kept the loop at
    --threads 2 on a busy 2-core machine)."""
    names = list(timings.forms)
    original, others = names[0], names[1:]
    if not others:
        return Verdict(original, "no gain", True)
    margin = math.log1p(timings.noise)
    bounds = {n: timings.forms[n].bounds(timings.rounds) for n in others}
    clear = [n for n in others if math.log(bounds[n][1]) < -margin]
    calm = timings.noise <= HIGH_NOISE
    if clear:
        return Verdict(min(clear, key=lambda n: timings.forms[n].ratio), "faster", calm)
    if not calm:  # a machine this noisy cannot show that a gain is small either: the model decides
        return Verdict(original, "undecided", False)
    best = min(others, key=lambda n: timings.forms[n].ratio)
    low, high = bounds[best]
    if math.log(low) >= -margin or math.log(high / low) <= 2 * math.log(1.05):  # any gain is small
        return Verdict(original, "no gain", calm)
    return Verdict(original, "undecided", False)


