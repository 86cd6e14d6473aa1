"""Peak memory and wall time of `scanopt optimize` on a model with big weights, against a
bare onnx.load + onnx.save of the same file.

    python benchmarks/bench_memory.py                 # 256 MB of weights
    python benchmarks/bench_memory.py --size-mb 1024  # the issue's 1 GB (external data)
    python benchmarks/bench_memory.py --projection    # the big weight read whole by a MatMul

The model (generated in a temp dir, weights in external data): an embedding table
[V, 16] (the big initializer) gathered into X, then a tanh RNN written as a Scan at batch 1
(fused by the default policy). Each command runs in a fresh process; peak = its VmHWM (the
peak resident set of that process image). Ratios are against the model's size on disk.
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


def big_model(size_mb: int, projection: bool = False) -> onnx.ModelProto:
    """The embedding table is the big weight; with ``projection`` it is instead an output
    projection [H, V] of the final state, which every run reads whole."""
    rows = size_mb * 2**20 // (4 * E)
    rng = np.random.default_rng(0)
    vi = h.make_tensor_value_info
    n = h.make_node
    body = h.make_graph(
        [n("MatMul", ["x_t", "W"], ["xw"]), n("MatMul", ["h_in", "R"], ["hr"]), n("Add", ["xw", "hr"], ["pre"]),
         n("Tanh", ["pre"], ["h_out"]), n("Identity", ["h_out"], ["y_t"])],
        "body", [vi("h_in", TP.FLOAT, [1, H]), vi("x_t", TP.FLOAT, [1, E])],
        [vi("h_out", TP.FLOAT, [1, H]), vi("y_t", TP.FLOAT, [1, H])])
    nodes = [n("Gather", ["table", "ids"], ["X"], name="embed"),
             n("Scan", ["h0", "X"], ["h_n", "Y"], name="rnn", num_scan_inputs=1, body=body)]
    outputs = [vi("h_n", TP.FLOAT, [1, H]), vi("Y", TP.FLOAT, [T, 1, H])]
    table_rows = 1000 if projection else rows
    inits = [numpy_helper.from_array(rng.standard_normal((table_rows, E), dtype=np.float32), "table"),
             numpy_helper.from_array((rng.standard_normal((E, H)) * 0.1).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((H, H)) * 0.1).astype(np.float32), "R")]
    if projection:
        nodes.append(n("MatMul", ["h_n", "P"], ["logits"], name="project"))
        outputs.append(vi("logits", TP.FLOAT, [1, rows]))
        inits.append(numpy_helper.from_array(rng.standard_normal((H, rows), dtype=np.float32), "P"))
    graph = h.make_graph(nodes, "big", [vi("ids", TP.INT64, [T, 1]), vi("h0", TP.FLOAT, [1, H])], outputs,
                         initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


# VmHWM: the peak resident set of this process image. (getrusage's ru_maxrss would carry
# over the peak of the benchmark process that forked it, which holds the generated model.)
REPORT = ("import atexit, sys\n"
          "atexit.register(lambda: sys.stderr.write(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).replace('VmHWM:', 'MAXRSS')))\n")
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
    peak = [line for line in done.stderr.splitlines() if line.startswith("MAXRSS")][-1]
    return int(peak.split()[1]) / 1024, wall  # kB


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--projection", action="store_true",
                        help="the big weight is an output projection every run reads whole, not an embedding table")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "big.onnx")
        onnx.save(big_model(args.size_mb, args.projection), src, save_as_external_data=True, location="big.onnx.data")
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
