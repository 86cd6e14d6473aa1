"""Peak memory and wall time of `scanopt optimize` on a model with big weights, against a
bare onnx.load + onnx.save of the same file.

    python benchmarks/bench_memory.py                 # 256 MB of weights
    python benchmarks/bench_memory.py --size-mb 1024  # the issue's 1 GB (external data)

The model (generated in a temp dir, weights in external data): an embedding table
[V, 16] (the big initializer) gathered into X, then a tanh RNN written as a Scan at batch 1
(fused by the default policy). Each command runs in a fresh process; peak = its maximum
resident set size. Ratios are against the model's size on disk.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

E, H, T = 16, 16, 8


def big_model(size_mb: int) -> onnx.ModelProto:
    rows = size_mb * 2**20 // (4 * E)
    rng = np.random.default_rng(0)
    table = rng.standard_normal((rows, E), dtype=np.float32)
    vi = h.make_tensor_value_info
    n = h.make_node
    body = h.make_graph(
        [n("MatMul", ["x_t", "W"], ["xw"]), n("MatMul", ["h_in", "R"], ["hr"]), n("Add", ["xw", "hr"], ["pre"]),
         n("Tanh", ["pre"], ["h_out"]), n("Identity", ["h_out"], ["y_t"])],
        "body", [vi("h_in", TP.FLOAT, [1, H]), vi("x_t", TP.FLOAT, [1, E])],
        [vi("h_out", TP.FLOAT, [1, H]), vi("y_t", TP.FLOAT, [1, H])])
    nodes = [n("Gather", ["table", "ids"], ["X"], name="embed"),
             n("Scan", ["h0", "X"], ["h_n", "Y"], name="rnn", num_scan_inputs=1, body=body)]
    inits = [numpy_helper.from_array(table, "table"),
             numpy_helper.from_array((rng.standard_normal((E, H)) * 0.1).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((H, H)) * 0.1).astype(np.float32), "R")]
    graph = h.make_graph(nodes, "big", [vi("ids", TP.INT64, [T, 1]), vi("h0", TP.FLOAT, [1, H])],
                         [vi("h_n", TP.FLOAT, [1, H]), vi("Y", TP.FLOAT, [T, 1, H])], initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


REPORT = ("import atexit, resource, sys\n"
          "atexit.register(lambda: sys.stderr.write(f'MAXRSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n'))\n")
BARE = "import onnx; m = onnx.load(sys.argv[1]); onnx.save(m, sys.argv[2], save_as_external_data=True, location='bare.onnx.data')"
SCANOPT = "from scanopt.cli import main; sys.exit(main(sys.argv[1:]))"


def measure(code: str, args: list[str]) -> tuple[float, float]:
    """(peak RSS in MB, wall seconds) of ``code`` run in a fresh Python process."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", REPORT + code, *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    wall = time.perf_counter() - start
    peak = [line for line in done.stderr.splitlines() if line.startswith("MAXRSS ")][-1]
    return int(peak.split()[1]) / 1024, wall


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "big.onnx")
        onnx.save(big_model(args.size_mb), src, save_as_external_data=True, location="big.onnx.data")
        size = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp)) / 2**20
        runs = [
            ("onnx.load + onnx.save", BARE, [src, os.path.join(tmp, "bare.onnx")]),
            ("scanopt optimize --no-verify", SCANOPT, ["optimize", src, os.path.join(tmp, "nv.onnx"), "-q", "--no-verify"]),
            ("scanopt optimize", SCANOPT, ["optimize", src, os.path.join(tmp, "opt.onnx"), "-q"]),
        ]
        print(f"model: {size:.0f} MB on disk (external data)\n")
        print("| command | peak RSS MB | peak / model size | wall s |\n|---|---|---|---|")
        for label, code, cmd_args in runs:
            peak, wall = measure(code, cmd_args)
            print(f"| {label} | {peak:.0f} | {peak / size:.2f} | {wall:.1f} |", flush=True)

if __name__ == "__main__":
    main()
