"""Measuring a Scan too slow to time whole: the same Scan at two short lengths, extrapolated.

Loops, native ops and loop-free forms cost a setup plus an amount per step (linear in T past
the setup), so timing every form at :data:`STEPS` and twice that many steps (same widths and
batch, interleaved, with an A/A pair at each length) gives each round's estimate at the full
length: ``t(T) = t(S) + (T - S) * (t(2S) - t(S)) / S``, never less than ``t(2S)``. Those
per-round estimates are judged exactly as whole runs are (:func:`scanopt.timing.decide`).
"""

from __future__ import annotations

import onnx

from scanopt.timing import AA, Timings, summarize

STEPS = 16
LONGER = " @2S"  # suffix of a form's name at twice the steps


def shortened(sub: onnx.ModelProto, node: onnx.NodeProto, opset: int, shapes: dict, steps: int):
    """(the subgraph with its scan inputs cut to ``steps``, its input shapes, the full length T),
    or why it cannot be: the scan inputs must be the subgraph's own inputs, one length, no
    sequence_lens."""
    from scanopt.scan_view import ScanView

    view = ScanView.from_proto(node, opset, lambda name: shapes[name][1] if name in shapes else None)
    if view.sequence_lens:
        return "it has sequence_lens"
    axes = {}
    for name, axis in zip(view.scan_inputs, view.input_axes):
        if name not in shapes:
            return f"its scan input '{name}' is computed before it"
        axes[name] = axis % len(shapes[name][1])
    lengths = {shapes[name][1][axis] for name, axis in axes.items()}
    if len(lengths) != 1:
        return "its scan inputs differ in length"
    total = lengths.pop()
    if total <= steps:
        return f"its length {total} is already short"
    short = onnx.ModelProto()
    short.CopyFrom(sub)
    cut = dict(shapes)
    for value in short.graph.input:
        if value.name in axes:
            value.type.tensor_type.shape.dim[axes[value.name]].dim_value = steps
            elem, shape = shapes[value.name]
            cut[value.name] = (elem, tuple(steps if k == axes[value.name] else d for k, d in enumerate(shape)))
    for value in short.graph.output:  # inference gives the outputs' shapes at the new length
        value.type.tensor_type.ClearField("shape")
    del short.graph.value_info[:]
    return short, cut, total


def extrapolate(timings: Timings, names: list[str], steps: int, total: int) -> Timings:
    """Per-round times of ``names`` (the original first) at ``total`` steps from their times at
    ``steps`` and at twice that (``name + LONGER``; the original's A/A pair at both lengths)."""
    raw = timings.samples or {name: [t.seconds] for name, t in timings.forms.items()}
    grow = (total - steps) / steps

    def at_total(short: list[float], longer: list[float]) -> list[float]:
        return [max(a + grow * (b - a), b) for a, b in zip(short, longer)]

    per_round = {name: at_total(raw[name], raw[name + LONGER]) for name in names}
    if AA in raw and AA + LONGER in raw:
        per_round[AA] = at_total(raw[AA], raw[AA + LONGER])
    return summarize(per_round, timings.clock)


def timed_forms(short_forms: dict, longer_forms: dict) -> dict:
    """The models one interleaved measurement runs: every form at both lengths, the original
    first, and the original once more at the longer length (its A/A pair there)."""
    first = next(iter(short_forms))
    forms = dict(short_forms)
    forms.update((name + LONGER, model) for name, model in longer_forms.items())
    forms[AA + LONGER] = longer_forms[first]
    return forms
