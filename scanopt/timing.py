"""Timing candidate forms so that a shared machine cannot fool the comparison.

Every form runs once per round, rounds interleave the forms (in a rotating order), and
the original runs twice per round in two sessions: the A/A pair, whose paired ratio shows
what the machine's noise alone does. A form's result is the median of its paired ratios to
the original (same round, so a busy neighbour slows both) and their spread. With one
intra-op thread the clock is the calling thread's CPU time (``time.thread_time``: another
process's load does not count); with more, work runs on onnxruntime's pool threads, so the
clock is wall time (latency is what the threads buy).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import onnx

AA = "loop (A/A)"
MIN_ROUNDS = 5
MAX_ROUNDS = 61
NOISE_FLOOR = 0.02  # below this, a difference is not trusted whatever the samples say


@dataclass(frozen=True)
class FormTime:
    seconds: float  # median per run
    ratio: float  # median of per-round ratios to the original (1 for the original)
    spread: float  # half the interquartile range of those ratios (about 0.67 standard deviations)


@dataclass(frozen=True)
class Timings:
    forms: dict  # name -> FormTime; the first is the original
    noise: float  # relative: the A/A pair's deviation from 1 and spread, at least NOISE_FLOOR
    rounds: int
    clock: str  # "thread CPU" or "wall"


def session(model: onnx.ModelProto, threads: int | None, providers: list[str] | None = None):
    """An onnxruntime session with ``threads`` intra-op threads (None: its default), on the CPU
    provider or the ``providers`` list (scanopt.providers)."""
    import onnxruntime as ort

    from scanopt.engines import ort_source

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or 0
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # its notes and its error log lines are not ours: errors come back as exceptions
    model_bytes, kept = ort_source(model, options, prepack=True)
    made = ort.InferenceSession(model_bytes, options, providers=providers or ["CPUExecutionProvider"])
    made.scanopt_weights = kept  # alive as long as the session
    return made


def measure(forms: dict, feeds: dict, *, threads: int | None, seconds: float, check_budget: bool = True,
            providers: list[str] | None = None) -> Timings | str:
    """Time ``forms`` (name -> model; the first is the original) on ``feeds``, interleaved,
    for about ``seconds`` (at least MIN_ROUNDS rounds, at most MAX_ROUNDS). With
    ``check_budget``, returns why not instead when MIN_ROUNDS rounds would take more than
    twice ``seconds`` (known after the first round). ``providers``: a session provider list
    other than the CPU's (a device's work is not the calling thread's CPU time: wall clock)."""
    device = providers is not None and list(providers) != ["CPUExecutionProvider"]
    clock = time.thread_time if threads == 1 and not device else time.perf_counter
    names = list(forms)
    original = names[0]
    sessions = {name: session(model, threads, providers) for name, model in forms.items()}
    sessions[AA] = session(forms[original], threads, providers)
    order = names + [AA]
    for s in sessions.values():  # warm-up: allocations, prepacking, first-run caches
        s.run(None, feeds)
    samples: dict[str, list[float]] = {name: [] for name in order}
    deadline = time.perf_counter() + seconds
    rounds = 0
    while rounds < MIN_ROUNDS or (rounds < MAX_ROUNDS and time.perf_counter() < deadline):
        if rounds == 1 and check_budget:
            spent = seconds - (deadline - time.perf_counter())
            if spent * MIN_ROUNDS > 2 * seconds:
                return f"one run of every form takes {spent:.2f} s, over the time budget of {seconds:g} s"
        shift = rounds % len(order)
        for name in order[shift:] + order[:shift]:
            begin = clock()
            sessions[name].run(None, feeds)
            samples[name].append(max(clock() - begin, 1e-9))
        rounds += 1
    base = samples[original]
    result = {name: _form_time(samples[name], base) for name in order}
    aa = result.pop(AA)
    noise = max(NOISE_FLOOR, abs(aa.ratio - 1) + _uncertainty(aa, rounds))
    return Timings(forms=result, noise=noise, rounds=rounds, clock="thread CPU" if clock is time.thread_time else "wall")


def _form_time(samples: list[float], base: list[float]) -> FormTime:
    ratios = sorted(s / b for s, b in zip(samples, base))
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else (ratios[0],) * 3
    return FormTime(statistics.median(samples), statistics.median(ratios), (q3 - q1) / 2)


def best_form(timings: Timings) -> str:
    """The fastest form whose advantage over the original is beyond the noise, else the
    original (the first form)."""
    names = list(timings.forms)
    best = min(names[1:], key=lambda n: timings.forms[n].ratio, default=None)
    if best is None:
        return names[0]
    t = timings.forms[best]
    return best if t.ratio < 1 - max(timings.noise, _uncertainty(t, timings.rounds)) else names[0]


def _uncertainty(t: FormTime, rounds: int) -> float:
    """How far a median of ``rounds`` paired ratios may sit from the true ratio (about two
    standard errors, from the interquartile range)."""
    return 2 * 1.5 * t.spread / max(rounds, 1) ** 0.5
