"""``--tune``: time the candidate forms of each Scan on synthesized inputs, keep the fastest.

Each top-level Scan that some pass proposes to rewrite is cut out into a model of its
own (its inputs, the outer values its body reads, its outputs), and onnxruntime times the
Scan as it is and each candidate form (the pipeline run with only that pass allowed on
it), interleaved, within a time budget shared by all nodes. The result is a measured
speed-up per (pass, node) that :class:`scanopt.cost.CostPolicy` uses instead of its
prediction. Nested Scans and Scans whose values have no known type keep the prediction.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import onnx

from scanopt.cost import NEUTRAL_PASSES, NOISE
from scanopt.protos import attribute_graphs, outer_names, proto_node_label
from scanopt.shapes import ShapeTable

DEFAULT_SECONDS = 10.0


def tune(model: onnx.ModelProto, run_passes: Callable, chosen, options: dict, seconds: float = DEFAULT_SECONDS):
    """(measured speed-ups {(pass, label): x}, one report line per tuned or skipped node)."""
    portable = dict(options, target="portable")
    portable.pop("measured", None)
    _, proposed = run_passes(model, chosen, portable, frozenset(), None)
    candidates: dict[str, list[str]] = {}
    notes = []
    for o in proposed.outcomes:
        if o.applied and o.pass_name not in NEUTRAL_PASSES:
            if o.path:
                notes.append(f"{o.node}: not tuned (nested in {o.path}); predicted cost used")
            elif o.pass_name not in candidates.setdefault(o.node, []):
                candidates[o.node].append(o.pass_name)
    measured: dict[tuple[str, str], float] = {}
    if not candidates:
        return measured, notes
    shapes = ShapeTable(model)
    nodes = {proto_node_label(n): n for n in model.graph.node}
    deadline = time.perf_counter() + seconds
    for k, (label, passes) in enumerate(candidates.items()):
        share = (deadline - time.perf_counter()) / (len(candidates) - k)
        if share < 0.05 or label not in nodes:
            notes.append(f"{label}: not tuned (time budget of {seconds:g} s spent); predicted cost used")
            continue
        sub = _extract(model, nodes[label], shapes)
        if isinstance(sub, str):
            notes.append(f"{label}: not tuned ({sub}); predicted cost used")
            continue
        forms = {"scan": sub}
        for name in passes:
            denied = frozenset((other, label) for other in passes if other != name)
            form, report = run_passes(sub, chosen, portable, denied, None)
            if any(o.applied and o.pass_name == name for o in report.outcomes):
                forms[name] = form
        try:
            times = _time(forms, share)
        except Exception as exc:  # noqa: BLE001 - a form onnxruntime cannot run is not a winner
            notes.append(f"{label}: not tuned (onnxruntime: {str(exc).splitlines()[0][:120]}); predicted cost used")
            continue
        speedups = {name: times["scan"] / t for name, t in times.items() if name != "scan"}
        best = max(speedups, key=speedups.get) if speedups else None
        for name, speedup in speedups.items():
            measured[(name, label)] = speedup if name == best else min(speedup, 1 - 2 * NOISE)
        listing = ", ".join(f"{name} {t * 1e3:.3f} ms" for name, t in times.items())
        keep = best if best and speedups[best] >= 1 - NOISE else "scan"
        notes.append(f"{label}: {listing} -> {keep}" + (f" ({speedups[best]:.2f}x)" if keep != "scan" else ""))
    return measured, notes


def _extract(model: onnx.ModelProto, node: onnx.NodeProto, shapes: ShapeTable):
    """A model computing just ``node`` (its reads as inputs or initializers), or why not."""
    reads = [n for n in node.input if n]
    for attr in node.attribute:
        for g in attribute_graphs(attr):
            reads += [n for n in outer_names(g) if n not in reads]
    inits = {t.name: t for t in model.graph.initializer}
    inputs, initializers = [], []
    for name in dict.fromkeys(reads):
        if name in inits:
            initializers.append(inits[name])
            continue
        value = _typed(name, shapes)
        if value is None:
            return f"type of '{name}' unknown"
        inputs.append(value)
    outputs = []
    for name in node.output:
        if name:
            value = _typed(name, shapes)
            if value is None:
                return f"type of '{name}' unknown"
            outputs.append(value)
    graph = onnx.helper.make_graph([node], "tune", inputs, outputs, initializer=initializers)
    sub = onnx.helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return sub


def _typed(name: str, shapes: ShapeTable) -> onnx.ValueInfoProto | None:
    elem, shape = shapes.type_of(name)
    if not elem or shape is None:
        return None
    dims = [d if isinstance(d, int) else (d or f"{name}_d{i}") for i, d in enumerate(shape)]
    return onnx.helper.make_tensor_value_info(name, elem, dims)


def _time(forms: dict, seconds: float) -> dict[str, float]:
    """Median seconds per run of each model on the same synthesized feeds, interleaved."""
    import onnxruntime as ort

    from scanopt.inputs import synthesize_inputs

    feeds = synthesize_inputs(forms["scan"], 0)
    from scanopt.engines import ort_source

    def session(m):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        model_bytes, kept = ort_source(m, options, prepack=True)
        made = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        made.scanopt_weights = kept  # alive as long as the session
        return made

    sessions = {name: session(m) for name, m in forms.items()}
    for s in sessions.values():
        s.run(None, feeds)
    samples: dict[str, list[float]] = {name: [] for name in sessions}
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(samples["scan"]) < 3:
        for name, s in sessions.items():
            start = time.perf_counter()
            s.run(None, feeds)
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(v) for name, v in samples.items()}

