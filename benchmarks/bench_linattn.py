"""Loop against LinearAttention (passes/linattn) on onnxruntime CPU, one intra-op thread.

    python benchmarks/bench_linattn.py [--T 1024] [--D 64] [--H 2] [--B 1]

Prints per rule the Scan's and the rewritten model's median time (thread CPU time is not
separable here: wall time, interleaved, median of rounds) and their ratio."""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import linattn_builders as lab  # noqa: E402
from scanopt.pipeline import optimize  # noqa: E402


def session(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--H", type=int, default=2)
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    for rule in ("linear", "gated", "delta", "gated_delta"):
        model = lab.attention(rule, B=a.B, H=a.H, DK=a.D, DV=a.D, T=a.T)
        out, _ = optimize(model, passes=["linattn"], verify=False, options={"target": "portable"})
        feeds = {v.name: (rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim]) * 0.1)
                 .astype(np.float32) for v in model.graph.input}
        sessions = {"loop": session(model), "LinearAttention": session(out)}
        times = {k: [] for k in sessions}
        for _ in range(a.rounds):
            for name, s in sessions.items():
                start = time.perf_counter()
                s.run(None, feeds)
                times[name].append(time.perf_counter() - start)
        loop, op = (float(np.median(times[k])) for k in ("loop", "LinearAttention"))
        print(f"{rule:12s} T={a.T} B={a.B} H={a.H} D={a.D}: loop {loop * 1e3:8.2f} ms  LinearAttention "
              f"{op * 1e3:8.2f} ms  ({op / loop:.2f}x the loop's time)")


if __name__ == "__main__":
    main()
