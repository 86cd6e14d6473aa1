"""Loop against LinearAttention (passes/linattn) on onnxruntime CPU, one intra-op thread.

    python benchmarks/bench_linattn.py [--T 1024] [--D 64] [--H 2] [--B 1]

Prints per rule the Scan's and the rewritten model's median time and their ratio, timed by
scanopt.timing.measure (the tuner's own protocol: one intra-op thread, thread CPU time, the
forms interleaved round by round, an A/A row of the loop against itself for the noise)."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import linattn_builders as lab  # noqa: E402
from scanopt.pipeline import optimize  # noqa: E402
from scanopt.timing import AA, measure  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--H", type=int, default=2)
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--seconds", type=float, default=3.0, help="timing budget per rule")
    a = p.parse_args()
    rng = np.random.default_rng(0)
    for rule in ("linear", "gated", "delta", "gated_delta"):
        model = lab.attention(rule, B=a.B, H=a.H, DK=a.D, DV=a.D, T=a.T)
        out, _ = optimize(model, passes=["linattn"], verify=False, options={"target": "portable", "portable_runtimes": ["onnxruntime"]})
        feeds = {v.name: (rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim]) * 0.1)
                 .astype(np.float32) for v in model.graph.input}
        timings = measure({"loop": model, "LinearAttention": out}, feeds, threads=1, seconds=a.seconds,
                          check_budget=False)
        loop, op = timings.forms["loop"], timings.forms["LinearAttention"]
        print(f"{rule:12s} T={a.T} B={a.B} H={a.H} D={a.D}: loop {loop.seconds * 1e3:8.2f} ms  LinearAttention "
              f"{op.seconds * 1e3:8.2f} ms  ({op.ratio:.2f}x the loop's time, spread {op.spread:.2f}; "
              f"{AA} noise {timings.noise:.0%}, {timings.rounds} rounds, {timings.clock})")

if __name__ == "__main__":
    main()
