"""Print what scanopt does with issue 32's linear-attention samples at T=1024: the onnxscript
models (models/heldout_linattn_onnxscript, opset 27) and the PyTorch 2.13 exports
(models/heldout_linattn, TorchScript Loops at opset 17 and dynamo scans at opset 18, moved with
``--target-opset 27``).

    python models/evaluate_heldout_linattn.py                  # every model, every mode
    python models/evaluate_heldout_linattn.py --only delta_es --mode portable

Modes: *portable* (``--target portable --portable-runtime onnxruntime``: OpenVINO has no
LinearAttention-27), *default* (``scanopt optimize in out``: T symbolic,
so nothing can be measured) and *measured* (the default with ``--input-shape`` at B=2, T=1024,
one thread: the chooser times the loop, LinearAttention and any other form). Per model and mode:
LinearAttention nodes and Scans/Loops left (graph, bodies and model-local functions), the form
the chooser kept and its timing line, and the error of the optimized model against the original
on three input sets at T=1024 (seeds 0, 1, 2; onnxruntime CPU): max |optimized - original| /
max |original| over every output (the done-when bound: 1e-4). For the onnxscript models the
original's own float32 error against the float64 recurrence is printed beside it.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort

import generate_heldout_linattn_onnxscript as gen_os
import scanopt
from evaluate_heldout_producers import running_nodes
from generate import HERE

T, B, SEEDS = 1024, 2, (0, 1, 2)
SETS = {"onnxscript": os.path.join(HERE, "heldout_linattn_onnxscript"), "pytorch": os.path.join(HERE, "heldout_linattn")}
MODES = ("portable", "default", "measured")


def models() -> list[tuple[str, str]]:
    return [(src, p[:-5]) for src, d in SETS.items() for p in sorted(os.listdir(d)) if p.endswith(".onnx")]


def feeds(src: str, name: str, model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    """Inputs at B=2, T=1024: the onnxscript generator's (gates and keys as it draws them), or
    normal values in the PyTorch samples' stored shapes with T (axis 2) made 1024."""
    if src == "onnxscript":
        return gen_os.feeds(name, B, T, seed=seed)
    stored = np.load(os.path.join(SETS[src], f"{name}.expected.npz"))
    rng = np.random.default_rng(seed)
    out = {}
    for inp in model.graph.input:
        shape = list(stored[inp.name].shape)
        shape[2] = T
        out[inp.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def run(model: onnx.ModelProto, inputs: dict) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, inputs)


def optimize(model: onnx.ModelProto, mode: str, inputs: dict):
    options = {"target_opset": 27}
    if mode == "portable":
        options["target"] = "portable"
        options["portable_runtimes"] = ["onnxruntime"]  # LinearAttention-27: OpenVINO has no conversion
    shapes = None
    if mode == "measured":
        shapes = {k: list(v.shape) for k, v in inputs.items()}
        options["threads"] = 1
    return scanopt.optimize(model, input_shapes=shapes, options=options)


def counts(model: onnx.ModelProto) -> dict[str, int]:
    found = Counter(n.op_type for n in running_nodes(model))
    return {op: found[op] for op in ("LinearAttention", "Scan", "Loop") if found[op]}


def chosen(report) -> str:
    applied = [o for o in report.outcomes if o.applied and o.pass_name not in ("canonicalize", "cleanup", "upgrade")]
    return ", ".join(sorted({o.pass_name for o in applied})) or "loop kept"


def evaluate(src: str, name: str, modes) -> list[dict]:
    model = onnx.load(os.path.join(SETS[src], f"{name}.onnx"))
    sets = [feeds(src, name, model, s) for s in SEEDS]
    originals = [run(model, x) for x in sets]
    truth = ""
    if src == "onnxscript":
        own = 0.0
        for x, got in zip(sets, originals):
            want = gen_os.reference(name, x)
            for o, g in zip(model.graph.output, got):
                own = max(own, float(np.max(np.abs(g - want[o.name])) / np.max(np.abs(want[o.name]))))
        truth = f" (original vs float64: {own:.1e})"
    rows = []
    for mode in modes:
        out, report = optimize(model, mode, sets[0])
        err = 0.0
        for x, want in zip(sets, originals):
            for g, w in zip(run(out, x), want):
                err = max(err, float(np.max(np.abs(g - w)) / np.max(np.abs(w))))
        verified = (report.verification or {}).get("passed")
        print(f"{src:10s} {name:16s} {mode:8s} {counts(model)} -> {counts(out)} kept: {chosen(report)}; "
              f"max rel error {err:.1e}{truth}; verified={verified}")
        for line in report.tuning:
            print(f"    {line}")
        for o in report.outcomes:
            if o.pass_name == "linattn":
                print(f"    linattn: {'applied' if o.applied else 'skipped'}: {o.detail[:160]}")
        rows.append({"src": src, "name": name, "mode": mode, "err": err, "after": counts(out)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append", help="evaluate only these models")
    p.add_argument("--mode", action="append", choices=MODES)
    args = p.parse_args()
    rows = []
    for src, name in models():
        if not args.only or name in args.only:
            rows += evaluate(src, name, args.mode or MODES)
    for mode in args.mode or MODES:
        mine = [r for r in rows if r["mode"] == mode]
        one = sum(r["after"].get("LinearAttention", 0) >= 1 and not r["after"].get("Scan") for r in mine)
        print(f"== {mode}: LinearAttention and no Scan left {one}/{len(mine)}; worst max rel error "
              f"{max((r['err'] for r in mine), default=0):.1e}")


if __name__ == "__main__":
    main()
