"""onnxruntime latency of a cell Scan, its fused form, and a hand-written native op.

    python benchmarks/bench_fuse.py [--sizes 16x1x16x16,64x8x32x64] [--seconds 0.5] [--threads 1]
    python benchmarks/bench_fuse.py --forms [--form-size 64x4]    # models/cells + models/heldout_cells

``--forms`` times every committed cell sample (PyTorch exports with and without the exporter's
optimization, Keras/TF1-style and hand-written forms: weights behind Transpose/Cast/Slice,
Concat([x, h]) cells, coupled LSTM, bidirectional pairs) as the Scan and as fused (passes
canonicalize, fuse, cleanup with ``--target portable``, so the cost policy does not veto; no
verification) at one T x B, and the optimizer's own time per model.

Cells are written as PyTorch's dynamo exporter writes nn.RNNCell / GRUCell / LSTMCell bodies
(Gemm transB=1 per source against outer-scope weights, one Split into r, z, n or i, f, g, o).
For each kind and size (T, B, I, H) three models run on the same inputs (checked equal
first): the Scan, the fuse pass's output (scanopt.optimize with passes fuse + cleanup and
``--target portable``: the fused form whatever the cost policy would choose, which
bench_policy.py checks), and a native RNN/GRU/LSTM written by hand from the same weights.
Timing is scanopt.timing's (thread CPU time, runs interleaved one by one, ~``--seconds`` per
model and size, medians, paired ratios, an A/A pair of two sessions of the Scan). Ratios from
the same run: scan/fused (speed-up) and fused/native (should be ~1).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import scanopt
from scanopt.timing import measure

F = TP.FLOAT
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_SIZES = "16x1x16x16,64x1x64x64,64x8x32x64,128x16x64x128,32x32x128x256"


def vi(name, shape):
    return h.make_tensor_value_info(name, F, shape)


def torch_weights(kind, i, hd, seed=0):
    """PyTorch layout: weight_ih [G*H, I], weight_hh [G*H, H], biases [G*H], torch gate order."""
    rng = np.random.default_rng(seed)
    g = GATES[kind]
    k = 1 / np.sqrt(hd)
    return [rng.uniform(-k, k, s).astype(np.float32) for s in ((g * hd, i), (g * hd, hd), (g * hd,), (g * hd,))]


def scan_model(kind, i, hd, wts):
    w_ih, w_hh, b_ih, b_hh = wts
    n = h.make_node
    nodes = [n("Gemm", ["x_t", "w_ih", "b_ih"], ["gi"], transB=1), n("Gemm", ["h_in", "w_hh", "b_hh"], ["gh"], transB=1)]
    states = ["h"] + (["c"] if kind == "LSTM" else [])
    if kind == "RNN":
        nodes += [n("Add", ["gi", "gh"], ["pre"]), n("Tanh", ["pre"], ["h_out"])]
    elif kind == "GRU":  # PyTorch GRUCell: r, z, n; n = tanh(i_n + r * h_n); h' = n + z * (h - n)
        nodes += [n("Split", ["gi"], ["i_r", "i_z", "i_n"], axis=1, num_outputs=3),
                  n("Split", ["gh"], ["h_r", "h_z", "h_n"], axis=1, num_outputs=3),
                  n("Add", ["i_r", "h_r"], ["r_pre"]), n("Sigmoid", ["r_pre"], ["r"]),
                  n("Add", ["i_z", "h_z"], ["z_pre"]), n("Sigmoid", ["z_pre"], ["z"]),
                  n("Mul", ["r", "h_n"], ["rh"]), n("Add", ["i_n", "rh"], ["n_pre"]), n("Tanh", ["n_pre"], ["nn"]),
                  n("Sub", ["h_in", "nn"], ["d"]), n("Mul", ["z", "d"], ["zd"]), n("Add", ["nn", "zd"], ["h_out"])]
    else:  # PyTorch LSTMCell: i, f, g, o
        nodes += [n("Add", ["gi", "gh"], ["gates"]),
                  n("Split", ["gates"], ["gi_", "gf_", "gg_", "go_"], axis=1, num_outputs=4),
                  n("Sigmoid", ["gi_"], ["ig"]), n("Sigmoid", ["gf_"], ["fg"]), n("Tanh", ["gg_"], ["gg"]),
                  n("Sigmoid", ["go_"], ["og"]), n("Mul", ["fg", "c_in"], ["fc"]), n("Mul", ["ig", "gg"], ["ic"]),
                  n("Add", ["fc", "ic"], ["c_out"]), n("Tanh", ["c_out"], ["ct"]), n("Mul", ["og", "ct"], ["h_out"])]
    nodes.append(n("Identity", ["h_out"], ["y_t"]))
    body = h.make_graph(nodes, "body", [vi(f"{s}_in", ["B", hd]) for s in states] + [vi("x_t", ["B", i])],
                        [vi(f"{s}_out", ["B", hd]) for s in states] + [vi("y_t", ["B", hd])])
    scan = n("Scan", [f"{s}0" for s in states] + ["X"], [f"{s}_n" for s in states] + ["Y"], num_scan_inputs=1, body=body)
    g = h.make_graph([scan], "cell", [vi("X", ["T", "B", i])] + [vi(f"{s}0", ["B", hd]) for s in states],
                     [vi("Y", ["T", "B", hd])] + [vi(f"{s}_n", ["B", hd]) for s in states],
                     initializer=[numpy_helper.from_array(a, k) for a, k in zip(wts, ("w_ih", "w_hh", "b_ih", "b_hh"))])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=8)


def native_model(kind, i, hd, wts):
    """The same cell as one RNN/GRU/LSTM node, weights reordered by hand to ONNX's gate order."""
    w_ih, w_hh, b_ih, b_hh = wts
    order = {"RNN": [0], "GRU": [1, 0, 2], "LSTM": [0, 3, 1, 2]}[kind]  # torch -> ONNX (z,r,h) / (i,o,f,c)

    def reorder(a):
        return np.concatenate([a[k * hd:(k + 1) * hd] for k in order])

    W, R = reorder(w_ih)[None], reorder(w_hh)[None]
    B = np.concatenate([reorder(b_ih), reorder(b_hh)])[None]
    states = ["h"] + (["c"] if kind == "LSTM" else [])
    n = h.make_node
    nodes = [n("Unsqueeze", [f"{s}0", "zero"], [f"{s}0u"]) for s in states]
    attrs = {"hidden_size": hd}
    if kind == "GRU":
        attrs["linear_before_reset"] = 1
    outs = ["Yd", "Yh"] + (["Yc"] if kind == "LSTM" else [])
    nodes.append(n(kind, ["X", "W", "R", "Bias", ""] + [f"{s}0u" for s in states], outs, **attrs))
    nodes.append(n("Squeeze", ["Yd", "one"], ["Y"]))
    nodes += [n("Squeeze", [o, "zero"], [f"{s}_n"]) for o, s in zip(outs[1:], states)]
    inits = [numpy_helper.from_array(a, k) for a, k in ((W, "W"), (R, "R"), (B, "Bias"),
                                                         (np.array([0], np.int64), "zero"), (np.array([1], np.int64), "one"))]
    g = h.make_graph(nodes, "native", [vi("X", ["T", "B", i])] + [vi(f"{s}0", ["B", hd]) for s in states],
                     [vi("Y", ["T", "B", hd])] + [vi(f"{s}_n", ["B", hd]) for s in states], initializer=inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=8)


def _ops(graph):
    """Op types in a graph and every body in it."""
    for n in graph.node:
        yield n.op_type
        for a in n.attribute:
            if a.g.node:
                yield from _ops(a.g)


def _form_feeds(model, t, b):
    """T x B feeds: float inputs random, int64 [B] sequence lengths full, int64 scalars 2 (a Loop's
    trip count), bools True (an If takes its then-branch, where the Scan is)."""
    import onnx

    rng = np.random.default_rng(1)
    feeds = {}
    for v in model.graph.input:
        dims = [t if d.dim_param in ("seq", "T") else b if d.dim_param in ("batch", "B") else (d.dim_value or b)
                for d in v.type.tensor_type.shape.dim]
        elem = v.type.tensor_type.elem_type
        if elem == onnx.TensorProto.BOOL:
            feeds[v.name] = np.array(True)
        elif elem == onnx.TensorProto.INT64:
            feeds[v.name] = np.full(dims, t, np.int64) if dims else np.array(2, np.int64)
        else:
            feeds[v.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def forms(size: str, seconds: float, threads: int, dirs=("cells", "heldout_cells")) -> None:
    """Scan vs fused latency for every sample in models/cells and models/heldout_cells."""
    import glob
    import os

    import onnx

    t, b = (int(v) for v in size.split("x"))
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models")
    print(f"models/{{{','.join(dirs)}}} at T={t}, B={b}; thread CPU time, median ms per run; scan/fused: median of "
          "paired ratios; A/A: noise of two sessions of the scan")
    print(f"{'sample':44} {'fused into':24} | {'optimize ms':>11} | {'scan ms':>9} {'fused ms':>9} | {'scan/fused':>10}"
          f" | {'A/A':>4}")
    for path in [p for d in dirs for p in sorted(glob.glob(os.path.join(root, d, "*.onnx")))]:
        name = os.path.basename(path)[:-5]
        model = onnx.load(path)
        start = time.perf_counter()
        fused, report = scanopt.optimize(model, passes=["canonicalize", "fuse", "cleanup"], verify=False,
                                         options={"target": "portable"})
        took = (time.perf_counter() - start) * 1e3
        applied = [o for o in report.outcomes if o.pass_name == "fuse" and o.applied]
        what = ", ".join(sorted({op for op in _ops(fused.graph) if op in GATES})) or "not fused"
        if applied and "bidirectional" in applied[0].detail:
            what += " (bidirectional)"
        feeds = _form_feeds(model, t, b)
        want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
                     for m in (model, fused))
        for a, c in zip(want, got):
            np.testing.assert_allclose(c, a, rtol=1e-4, atol=1e-4)
        timed = measure({"scan": model, "fused": fused}, feeds, threads=threads, seconds=2 * seconds, check_budget=False)
        ms = [timed.forms[k].seconds * 1e3 for k in ("scan", "fused")]
        print(f"{name:44} {what:24} | {took:>11.1f} | {ms[0]:>9.3f} {ms[1]:>9.3f} | {1 / timed.forms['fused'].ratio:>10.2f}"
              f" | {timed.noise:>4.2f}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--forms", action="store_true", help="time the models/cells and models/heldout_cells samples instead")
    p.add_argument("--form-dirs", default="cells,heldout_cells", help="folders under models/ for --forms")
    p.add_argument("--form-size", default="64x4", help="TxB for --forms")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated TxBxIxH")
    p.add_argument("--kinds", default="RNN,GRU,LSTM")
    p.add_argument("--seconds", type=float, default=0.5, help="measuring time per model and size")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.forms:
        print(f"onnxruntime {ort.__version__}, intra-op threads {args.threads}")
        return forms(args.form_size, args.seconds, args.threads, tuple(args.form_dirs.split(",")))
    print(f"onnxruntime {ort.__version__}, intra-op threads {args.threads}; thread CPU time, median ms per run; "
          "scan/fused: median of paired ratios ± half their interquartile range; A/A: noise of two sessions of the scan")
    print(f"{'cell':5} {'T':>4} {'B':>3} {'I':>4} {'H':>4} | {'scan ms':>9} {'fused ms':>9} {'native ms':>9} |"
          f" {'scan/fused':>11} {'fused/native':>12} | {'A/A':>4}")
    for kind in args.kinds.split(","):
        for size in args.sizes.split(","):
            t, b, i, hd = (int(v) for v in size.split("x"))
            wts = torch_weights(kind, i, hd)
            scan = scan_model(kind, i, hd, wts)
            # target portable: this times the fused form; whether the default picks it is bench_policy.py's
            fused, report = scanopt.optimize(scan, passes=["fuse", "cleanup"], verify=False, options={"target": "portable"})
            if not any(o.applied for o in report.outcomes if o.pass_name == "fuse"):
                raise SystemExit(f"{kind} {size}: not fused: {[o.detail for o in report.outcomes]}")
            native = native_model(kind, i, hd, wts)
            rng = np.random.default_rng(1)
            feeds = {"X": rng.standard_normal((t, b, i)).astype(np.float32)}
            feeds.update({f"{s}0": rng.standard_normal((b, hd)).astype(np.float32) for s in ["h", "c"][:1 + (kind == "LSTM")]})
            models = {"scan": scan, "fused": fused, "native": native}
            results = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
                       for m in models.values()]
            for other in results[1:]:
                for want, got in zip(results[0], other):
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
            timed = measure(models, feeds, threads=args.threads, seconds=args.seconds * len(models), check_budget=False)
            if isinstance(timed, str):
                print(f"{kind:5} {t:>4} {b:>3} {i:>4} {hd:>4} | {timed}")
                continue
            ms = [timed.forms[k].seconds * 1e3 for k in models]
            fused_t, native_t = timed.forms["fused"], timed.forms["native"]
            print(f"{kind:5} {t:>4} {b:>3} {i:>4} {hd:>4} | {ms[0]:>9.3f} {ms[1]:>9.3f} {ms[2]:>9.3f} |"
                  f" {1 / fused_t.ratio:>6.2f} ±{fused_t.spread / fused_t.ratio ** 2:<4.2f}"
                  f" {fused_t.ratio / native_t.ratio:>12.2f} | {timed.noise:>4.2f}", flush=True)


if __name__ == "__main__":
    main()
