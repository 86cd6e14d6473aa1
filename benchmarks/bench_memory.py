"""Peak memory and CPU time of `scanopt optimize` on a model with big weights, against a
bare onnx.load + onnx.save of the same file.

    python benchmarks/bench_memory.py                 # 256 MB of weights
    python benchmarks/bench_memory.py --size-mb 1024  # the issue's 1 GB (external data)
    python benchmarks/bench_memory.py --projection    # the big weight read whole by a MatMul
    python benchmarks/bench_memory.py --inline --size-mb 200  # weights inline: inspect, optimize, --target portable
    python benchmarks/bench_memory.py --hostile       # tiny models declaring 10**12 and 2**63-1

The model (generated in a temp dir, weights in external data): an embedding table
[V, 16] (the big initializer) gathered into X, then a tanh RNN written as a Scan at batch 1
(fused by the default policy). Each command runs in a fresh process; peak = its VmHWM (the
peak resident set of that process image), CPU s = its user + system time (all its threads;
not wall time, which on a shared machine measures the neighbours). Ratios are against the
model's size on disk.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile

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


def measure(code: str, args: list[str], check: bool = True) -> tuple[float, float, int]:
    """(peak RSS in MB, CPU seconds, exit code) of ``code`` run in a fresh Python process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", REPORT + code, *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode and check:
        raise SystemExit(f"{' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    peak = [line for line in done.stderr.splitlines() if line.startswith("MAXRSS")]
    if not peak:  # killed, or its exit report failed too (out of memory)
        return float("nan"), cpu, done.returncode
    return int(peak[-1].split()[1]) / 1024, cpu, done.returncode  # kB


def hostile_model(dim: int, form: str) -> onnx.ModelProto:
    """A running-sum Scan, a few hundred bytes, declaring ``dim``: as its input's length
    (``input``), or as the limit of a Range whose steps a Cast reads (``range``: onnx's data
    propagation made one element per step)."""
    vi = h.make_tensor_value_info
    n = h.make_node
    width = 2 if form == "input" else 1
    body = h.make_graph([n("Add", ["s", "x"], ["s2"]), n("Identity", ["s2"], ["y"])], "body",
                        [vi("s", TP.FLOAT, [width]), vi("x", TP.FLOAT, [width])],
                        [vi("s2", TP.FLOAT, [width]), vi("y", TP.FLOAT, [width])])
    scan = n("Scan", ["s0", "X"], ["s_n", "Y"], name="scan", num_scan_inputs=1, body=body)
    inputs = [vi("s0", TP.FLOAT, [width])]
    if form == "input":
        nodes, inits = [scan], []
        inputs.append(vi("X", TP.FLOAT, [dim, 2]))
    else:
        const = lambda name, v: n("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.int64)))  # noqa: E731
        nodes = [const("zero", 0), const("limit", dim), const("one", 1), n("Range", ["zero", "limit", "one"], ["r"]),
                 n("Cast", ["r"], ["rf"], to=TP.FLOAT), n("Unsqueeze", ["rf", "axis"], ["X"]), scan]
        inits = [numpy_helper.from_array(np.array([1], np.int64), "axis")]
    graph = h.make_graph(nodes, "hostile", inputs, [vi("s_n", TP.FLOAT, [width]), vi("Y", TP.FLOAT, None)],
                         initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


# a cap on the address space the command may add to what the interpreter and imports take
CAPPED = ("import resource\n"
          "import scanopt.cli, scanopt.pipeline, onnxruntime\n"
          "vm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmSize')) * 1024\n"
          "resource.setrlimit(resource.RLIMIT_AS, (vm + {cap} * 2**20, resource.RLIM_INFINITY))\n")


def bench_hostile(cap_mb: int) -> None:
    print(f"tiny hostile models, each command in a fresh process capped at imports + {cap_mb} MB of address space\n")
    print("| model | bytes | command | exit | peak RSS MB | CPU s |\n|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for dim_label, dim in (("10^12", 10**12), ("2^63-1", 2**63 - 1)):
            for form in ("input", "range"):
                src = os.path.join(tmp, f"{form}.onnx")
                onnx.save(hostile_model(dim, form), src)
                for command in (["inspect", src], ["optimize", src, os.path.join(tmp, "out.onnx"), "-q"]):
                    code = CAPPED.format(cap=cap_mb) + "from scanopt.cli import main; sys.exit(main(sys.argv[1:]))"
                    peak, cpu, rc = measure(code, command, check=False)
                    print(f"| {form}, {dim_label} | {os.path.getsize(src)} | {command[0]} | {rc} | {peak:.0f} | {cpu:.1f} |",
                          flush=True)


def bench_inline(size_mb: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "big.onnx")
        onnx.save(big_model(size_mb), src)
        size = os.path.getsize(src) / 2**20
        print(f"model: {size:.0f} MB on disk (inline weights)\n")
        print("| command | peak RSS MB | peak / model size | CPU s |\n|---|---|---|---|")
        runs = [("onnx.load", "import onnx; onnx.load(sys.argv[1])", [src]),
                ("scanopt inspect", SCANOPT, ["inspect", src]),
                ("scanopt optimize", SCANOPT, ["optimize", src, os.path.join(tmp, "o.onnx"), "-q"]),
                ("scanopt optimize --target portable", SCANOPT,
                 ["optimize", src, os.path.join(tmp, "p.onnx"), "-q", "--target", "portable"])]
        for label, code, cmd_args in runs:
            peak, cpu, _ = measure(code, cmd_args)
            print(f"| {label} | {peak:.0f} | {peak / size:.2f} | {cpu:.1f} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--projection", action="store_true",
                        help="the big weight is an output projection every run reads whole, not an embedding table")
    parser.add_argument("--inline", action="store_true", help="weights inline in the model file")
    parser.add_argument("--hostile", action="store_true", help="tiny models declaring huge dims")
    parser.add_argument("--cap-mb", type=int, default=3072, help="--hostile: address space allowed beyond imports")
    args = parser.parse_args(argv)
    if args.hostile:
        return bench_hostile(args.cap_mb)
    if args.inline:
        return bench_inline(args.size_mb)
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
        print("| command | peak RSS MB | peak / model size | CPU s |\n|---|---|---|---|")
        for label, code, cmd_args in runs:
            peak, cpu, _ = measure(code, cmd_args)
            print(f"| {label} | {peak:.0f} | {peak / size:.2f} | {cpu:.1f} |", flush=True)


if __name__ == "__main__":
    main()
