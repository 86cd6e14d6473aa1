"""Does ``--execution-provider P`` choose the fastest form on P? Issue 30's grid, per provider.

    python benchmarks/bench_providers.py [--providers cuda,cpu] [--threads 1] [--seconds 1.5]
                                         [--cells RNN:100x4x64x128,GRU0:512x64x512x512,...]

For each cell (kind:TxBxIxH; GRU0/GRU1 = linear_before_reset 0/1; bodies as
tests/cell_builders.py writes them at PyTorch's init scale, T and B static) and each provider
this onnxruntime runs (default: cuda where available, then cpu), these forms are timed on the
same inputs, interleaved (scanopt.timing.measure with the provider list: wall clock on a
device, numpy feeds through session.run), an A/A pair giving the noise: the Scan, the native
op written by hand, and scanopt's output for that provider (``execution_providers=[P]``,
measured there). The table prints each form's speed-up over the Scan and whether scanopt's
choice is within 10% of the fastest. The cells default to ../shared/perf/GPU-AND-QUIET-CPU.md's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import cell_builders as cb  # noqa: E402

import scanopt  # noqa: E402
from scanopt.providers import CPU, available_providers, resolve, session_providers, short_name  # noqa: E402
from scanopt.timing import measure  # noqa: E402

CELLS = ("RNN:100x8x3x4,LSTM:100x8x3x4,RNN:100x4x64x128,GRU0:100x4x64x128,LSTM:100x4x64x128,"
         "LSTM:200x16x128x256,GRU1:50x64x256x256,LSTM:512x64x512x512,GRU0:512x64x512x512,RNN:1000x1x128x128")


def cell_models(kind: str, T: int, B: int, I: int, H: int, seed: int = 0):
    """(Scan model, native model) with T and B written into the inputs."""
    k = 1 / np.sqrt(H)
    cb.rand = lambda s, *shape, scale=None: np.random.default_rng(s).uniform(-k, k, shape).astype(np.float32)
    base = "GRU" if kind.startswith("GRU") else kind
    attrs = {"lbr": int(kind[-1])} if base == "GRU" else {}
    body = cb.Body(hidden=H, inputs=I)
    states, y = cb.cell(base, body, seed=seed, **attrs)
    g = {"RNN": 1, "GRU": 3, "LSTM": 4}[base]
    W, R = cb.rand(seed, g * H, I), cb.rand(seed + 1, g * H, H)
    bias = np.concatenate([cb.rand(seed + 2, g * H), cb.rand(seed + 3, g * H)])
    native = cb.native_model(base, W, R, bias, **({"linear_before_reset": attrs["lbr"]} if attrs else {}))
    return _static(cb.scan_model(body, states, ys=(y,)), T, B), _static(native, T, B)


def _static(model, T, B):
    for value in list(model.graph.input) + list(model.graph.output):
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param in ("seq", "batch"):
                d.dim_value = {"seq": T, "batch": B}[d.dim_param]
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = ",".join(p for p in ("cuda", "cpu") if resolve([p])[0] in available_providers())
    parser.add_argument("--providers", default=default)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--cells", default=CELLS)
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="bench-providers-")
    print(f"{'cell':<24}{'provider':<10}{'Scan ms':>9}{'native':>9}{'scanopt':>9}  chose        ok")
    for spec in args.cells.split(","):
        kind, sizes = spec.split(":")
        T, B, I, H = (int(v) for v in sizes.split("x"))
        scan, native = cell_models(kind, T, B, I, H)
        feeds = {v.name: (np.random.default_rng(0).standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim])
                          * 0.5).astype(np.float32) for v in scan.graph.input}
        for name in args.providers.split(","):
            provider = resolve([name])[0]
            if provider not in available_providers():
                print(f"{spec:<24}{short_name(provider):<10}  not available in this onnxruntime: not timed")
                continue
            chosen, report = scanopt.optimize(scan, options={"execution_providers": [provider], "threads": args.threads,
                                                             "tune": True, "tune_cache": cache}, seeds=1)
            ops = sorted({n.op_type for n in chosen.graph.node} & {"Scan", "Loop", "RNN", "GRU", "LSTM"})
            forms = {"scan": scan, "native": native, "scanopt": chosen}
            t = measure(forms, {k: v for k, v in feeds.items()}, threads=args.threads, seconds=args.seconds,
                        check_budget=False, providers=None if provider == CPU else session_providers([provider]))
            if isinstance(t, str):
                print(f"{spec:<24}{short_name(provider):<10}  not timed: {t}")
                continue
            speed = {f: 1 / t.forms[f].ratio for f in forms}
            ok = speed["scanopt"] >= 0.9 * max(speed.values())
            print(f"{spec:<24}{short_name(provider):<10}{t.forms['scan'].seconds * 1e3:>9.3g}{speed['native']:>8.2f}x"
                  f"{speed['scanopt']:>8.2f}x  {'+'.join(ops) or 'loop-free':<12} {'yes' if ok else 'NO'}"
                  f"  (noise {t.noise * 100:.0f}%; {report.target or 'cpu: measured'})"[:200], flush=True)


if __name__ == "__main__":
    main()
