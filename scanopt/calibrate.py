"""Calibrate the analytic cost model on this machine: a short, cached microbenchmark.

Where a Scan cannot be measured (unknown dims, a nested Scan) but measuring is allowed, the
modelled time of each form is scaled by how this machine's onnxruntime runs that form
relative to the committed constants: a tanh RNN and an LSTM cell at two small sizes are built
here, their loop, native and hoisted forms timed (:mod:`scanopt.timing`), and per form the
median of measured / modelled, relative to the loop's, is kept where it is above 1 (the
calibration only makes the model more careful). About a second, once per
onnxruntime version, CPU model and thread count (:mod:`scanopt.tune_cache`). With
``--no-tune`` nothing is measured and the committed constants decide alone, so that output
does not depend on the machine.
"""

from __future__ import annotations

import statistics

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from scanopt import timing, tune_cache

POINTS = (("RNN", 16, 32, 1, 32), ("RNN", 16, 32, 8, 32), ("LSTM", 16, 32, 1, 32), ("LSTM", 16, 32, 8, 32))  # kind, I, H, B, T
SECONDS = 0.15  # per point


def scales(options: dict, run_passes, chosen, measure=timing.measure, notes: list[str] | None = None) -> dict:
    """{"fuse_rnn": x, "fuse_gates": y, "hoist": z}: this machine's time of each form relative
    to the loop's, divided by the committed model's (medians over the points); cached."""
    import onnxruntime as ort

    threads = options.get("threads") or 1  # as scanopt.tune measures: one thread unless the user names more
    directory = tune_cache.cache_dir(options)
    from scanopt.cost import DEFAULT_CONSTANTS, model_seconds

    # the scales are relative to the committed constants: new constants calibrate anew
    entry = "calibration3-" + tune_cache.digest([ort.__version__, tune_cache.cpu_model(), threads, POINTS,
                                                 sorted(DEFAULT_CONSTANTS.items())])
    found = tune_cache.load(directory, entry, malformed_scales, notes, "calibration: ")
    if found is not None:
        return found["scales"]
    ratios: dict[str, list[float]] = {}
    portable = {"target": "portable"}
    by_name = {p.name: p for p in chosen}
    for kind, i, hd, b, t in POINTS:
        model = _cell(kind, i, hd)
        forms = {"loop": model}
        for name in ("fuse", "hoist"):
            if name in by_name:
                selected = [p for p in chosen if p.name in ("canonicalize", name, "cleanup")]
                form, report = run_passes(model, selected, portable, frozenset(), None)
                if report.modified:
                    forms[name] = form
        rng = np.random.default_rng(0)
        feeds = {"X": rng.standard_normal((t, b, i)).astype(np.float32)}
        feeds.update({f"{s}0": np.zeros((b, hd), np.float32) for s in (("h", "c") if kind == "LSTM" else ("h",))})
        timed = measure(forms, feeds, threads=threads, seconds=SECONDS * len(forms), check_budget=False)
        nodes = len(model.graph.node[0].attribute[0].g.node)
        p = dict(T=t, B=b, I=i, H=hd, K=1)
        loop = timed.forms["loop"].seconds / model_seconds("loop", kind, p, nodes, DEFAULT_CONSTANTS)
        for name in forms:
            if name != "loop":
                modelled = model_seconds(name, kind, p, nodes, DEFAULT_CONSTANTS, lifted=1)
                ratios.setdefault(scale_key(name, kind), []).append(timed.forms[name].seconds / modelled / loop)
    # Only ever more careful: the margins (cost.MODEL_MARGIN) were fitted with the committed
    # constants, and a form this machine runs faster than they say is not rewarded (a scale
    # below 1 let a native GRU through that measured 11% slower than the loop at B=32).
    result = {name: max(1.0, round(statistics.median(r), 3)) for name, r in ratios.items() if r}
    tune_cache.store(directory, entry, {"scales": result})
    return result


def malformed_scales(data: dict) -> str | None:
    """Why a cached calibration cannot be used, or None (each scale multiplies a modelled time)."""
    found = data.get("scales")
    if not isinstance(found, dict):
        return "'scales' is missing or not an object"
    if not all(isinstance(k, str) and tune_cache.is_number(v) and v > 0 for k, v in found.items()):
        return "'scales' holds a value that is not a positive number"
    return None


def scale_key(form: str, kind: str) -> str:
    """Native RNN and native GRU/LSTM kernels differ (their activations): scaled apart."""
    return f"{form}_{'rnn' if kind == 'RNN' else 'gates'}" if form == "fuse" else form


def _cell(kind: str, i: int, hd: int) -> onnx.ModelProto:
    """A tanh RNN or an LSTM cell as a Scan over X [T, B, I], symbolic T and B, MatMul form."""
    rng = np.random.default_rng(0)
    g = 4 if kind == "LSTM" else 1
    vi = h.make_tensor_value_info
    n = h.make_node
    nodes = [n("MatMul", ["x_t", "W"], ["xw"]), n("MatMul", ["h_in", "R"], ["hr"]), n("Add", ["xw", "hr"], ["pre0"]),
             n("Add", ["pre0", "bias"], ["pre"])]
    states = ["h"]
    if kind == "RNN":
        nodes.append(n("Tanh", ["pre"], ["h_out"]))
    else:
        states.append("c")
        nodes += [n("Split", ["pre"], ["gi", "go", "gf", "gc"], axis=1, num_outputs=4),
                  n("Sigmoid", ["gi"], ["i"]), n("Sigmoid", ["go"], ["o"]), n("Sigmoid", ["gf"], ["f"]),
                  n("Tanh", ["gc"], ["cc"]), n("Mul", ["f", "c_in"], ["fc"]), n("Mul", ["i", "cc"], ["ic"]),
                  n("Add", ["fc", "ic"], ["c_out"]), n("Tanh", ["c_out"], ["ct"]), n("Mul", ["o", "ct"], ["h_out"])]
    nodes.append(n("Identity", ["h_out"], ["y_t"]))
    body = h.make_graph(nodes, "body", [vi(f"{s}_in", TP.FLOAT, ["B", hd]) for s in states] + [vi("x_t", TP.FLOAT, ["B", i])],
                        [vi(f"{s}_out", TP.FLOAT, ["B", hd]) for s in states] + [vi("y_t", TP.FLOAT, ["B", hd])])
    scan = n("Scan", [f"{s}0" for s in states] + ["X"], [f"{s}_n" for s in states] + ["Y"], num_scan_inputs=1, body=body)
    k = 1 / np.sqrt(hd)
    inits = [numpy_helper.from_array(rng.uniform(-k, k, shape).astype(np.float32), name)
             for name, shape in (("W", (i, g * hd)), ("R", (hd, g * hd)), ("bias", (g * hd,)))]
    graph = h.make_graph([scan], "calibration", [vi("X", TP.FLOAT, ["T", "B", i])] + [vi(f"{s}0", TP.FLOAT, ["B", hd]) for s in states],
                         [vi(f"{s}_n", TP.FLOAT, ["B", hd]) for s in states] + [vi("Y", TP.FLOAT, ["T", "B", hd])],
                         initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=8)
