"""The optimizer's own cost as the model grows: time per Scan vs the number of Scans, vs
nesting depth, with one rewrite among N that fails verification, and a model with
nothing to do against a bare onnx load + save.

    python benchmarks/bench_scale.py                 # N up to 1,000, depth up to 30
    python benchmarks/bench_scale.py --large         # N up to 3,000
    python benchmarks/bench_scale.py --profile 1000  # cProfile of one run at N=1000
    python benchmarks/bench_scale.py --only n,shared,depth,fail,noop,inspect
    python benchmarks/bench_scale.py --only inspect --inspect-counts 100,250,800,1000,5000

Models: N independent 4-step tanh-RNN Scans (each reads its own Identity copy of X and its
own small weights); the same N Scans all reading X itself (each is a candidate
bidirectional partner of the others as far as X tells); a chain of If nodes `depth` deep with one such Scan per level (weights and X
captured from the top graph). Timed: ``scanopt.optimize`` with verification (the
default), with the verification time (reported by the pipeline) shown separately.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import scanopt
from scanopt import pass_api

F = TP.FLOAT
T, B, I, H = 4, 2, 4, 4


def _rnn_body(tag: str) -> onnx.GraphProto:
    n = h.make_node
    nodes = [
        n("MatMul", ["x_t", f"w_{tag}"], [f"xw_{tag}"]),
        n("MatMul", ["h_in", f"r_{tag}"], [f"hr_{tag}"]),
        n("Add", [f"xw_{tag}", f"hr_{tag}"], [f"pre_{tag}"]),
        n("Tanh", [f"pre_{tag}"], ["h_out"]),
        n("Identity", ["h_out"], ["y_t"]),
    ]
    vi = h.make_tensor_value_info
    return h.make_graph(nodes, f"body_{tag}", [vi("h_in", F, [B, H]), vi("x_t", F, [B, I])],
                        [vi("h_out", F, [B, H]), vi("y_t", F, [B, H])])


def _weights(tag: str, rng) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array((rng.standard_normal((I, H)) * 0.3).astype(np.float32), f"w_{tag}"),
            numpy_helper.from_array((rng.standard_normal((H, H)) * 0.3).astype(np.float32), f"r_{tag}")]


def independent_scans(count: int) -> onnx.ModelProto:
    """``count`` RNN Scans side by side, each over its own copy of X (an Identity: Scans over
one X are candidates for bidirectional pairing, which is fuse's business), all from h0."""
    rng = np.random.default_rng(0)
    vi = h.make_tensor_value_info
    nodes, inits, outputs = [], [], []
    for k in range(count):
        tag = str(k)
        nodes.append(h.make_node("Identity", ["X"], [f"x_{tag}"], name=f"x_{tag}"))
        nodes.append(h.make_node("Scan", ["h0", f"x_{tag}"], [f"h_{tag}", f"y_{tag}"], name=f"scan_{tag}",
                                 num_scan_inputs=1, body=_rnn_body(tag)))
        inits += _weights(tag, rng)
        outputs += [vi(f"h_{tag}", F, [B, H]), vi(f"y_{tag}", F, [T, B, H])]
    graph = h.make_graph(nodes, "independent", [vi("X", F, [T, B, I]), vi("h0", F, [B, H])], outputs, initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def shared_x_scans(count: int) -> onnx.ModelProto:
    """``count`` RNN Scans that all read the graph input X itself (every one is a
    candidate bidirectional partner of every other, as far as X tells)."""
    model = independent_scans(count)
    scans = [node for node in model.graph.node if node.op_type == "Scan"]
    for node in scans:
        node.input[-1] = "X"
    del model.graph.node[:]
    model.graph.node.extend(scans)
    return model


def nested_scans(depth: int) -> onnx.ModelProto:
    """If inside If ``depth`` deep; each level runs one RNN Scan over the top graph's X."""
    rng = np.random.default_rng(0)
    vi = h.make_tensor_value_info
    inits = []

    def level(d: int) -> tuple[list, list]:
        tag = str(d)
        inits.extend(_weights(tag, rng))
        nodes = [h.make_node("Scan", ["h0", "X"], [f"h_{tag}", f"y_{tag}"], name=f"scan_{tag}",
                             num_scan_inputs=1, body=_rnn_body(tag))]
        outs = [f"h_{tag}"]
        if d + 1 < depth:
            then_nodes, then_outs = level(d + 1)
            then_g = h.make_graph(then_nodes, f"then_{tag}", [], [vi(o, F, [B, H]) for o in then_outs])
            else_outs = [f"e_{tag}_{i}" for i in range(len(then_outs))]
            else_g = h.make_graph([h.make_node("Identity", [f"h_{tag}"], [o]) for o in else_outs], f"else_{tag}", [],
                                  [vi(o, F, [B, H]) for o in else_outs])
            deeper = [f"if_{tag}_{i}" for i in range(len(then_outs))]
            nodes.append(h.make_node("If", ["cond"], deeper, name=f"if_{tag}", then_branch=then_g, else_branch=else_g))
            outs += deeper
        return nodes, outs

    nodes, outs = level(0)
    graph = h.make_graph(nodes, "nested", [vi("X", F, [T, B, I]), vi("h0", F, [B, H]), vi("cond", TP.BOOL, [])],
                         [vi(o, F, [B, H]) for o in outs], initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def sabotage(target: str):
    """Register a fuse pass that is wrong on the Scan named ``target`` (negates its X)."""
    import onnx_graphsurgeon as gs

    fuse_cls = pass_api.registered_passes()["fuse"]

    class SabotagedFuse(fuse_cls):
        def rewrite(self, node, match, level, ctx):
            if node.name == target:
                x = node.inputs[-1]
                neg = gs.Variable(ctx.names.fresh("neg_x"), dtype=x.dtype, shape=x.shape)
                level.graph.nodes.append(gs.Node("Neg", inputs=[x], outputs=[neg]))
                node.inputs[-1] = neg
            return super().rewrite(node, match, level, ctx)

    registry = pass_api.registered_passes()
    original = registry["fuse"]
    pass_api._REGISTRY["fuse"] = SabotagedFuse
    return lambda: pass_api._REGISTRY.__setitem__("fuse", original)


def run_optimize(model):
    start = time.perf_counter()
    out, report = scanopt.optimize(model, seeds=1)
    total = time.perf_counter() - start
    verify_s = (report.verification or {}).get("seconds", float("nan"))
    return out, report, total, verify_s


def table(title, rows, header):
    print(f"\n{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def _per_scan_rows(sizes, build):
    """One row per size: optimize ``build(size)`` (size Scans) and divide the time by size."""
    rows = []
    for size in sizes:
        out, report, total, verify_s = run_optimize(build(size))
        fused = sum(1 for o in report.outcomes if o.applied and o.pass_name == "fuse")
        rows.append((str(size), f"{total:.2f}", f"{verify_s:.2f}", f"{1000 * total / size:.1f}",
                     f"{1000 * (total - verify_s) / size:.1f}", str(fused)))
    return rows


def bench_counts(counts):
    table("optimizer time vs N independent Scans (seeds=1)", _per_scan_rows(counts, independent_scans),
          ("N", "total s", "verify s", "ms/Scan", "ms/Scan w/o verify", "fused"))


def bench_shared(counts):
    table("optimizer time vs N Scans over one shared X (seeds=1)", _per_scan_rows(counts, shared_x_scans),
          ("N", "total s", "verify s", "ms/Scan", "ms/Scan w/o verify", "fused"))


def bench_depths(depths):
    table("optimizer time vs nesting depth (one Scan per level)", _per_scan_rows(depths, nested_scans),
          ("depth", "total s", "verify s", "ms/Scan", "ms/Scan w/o verify", "fused"))


def bench_failing(counts):
    rows = []
    for count in counts:
        restore = sabotage(f"scan_{count // 2}")
        try:
            out, report, total, verify_s = run_optimize(independent_scans(count))
        finally:
            restore()
        rolled = report.verification.get("rolled_back", [])
        rows.append((str(count), f"{total:.2f}", f"{verify_s:.2f}", f"{1000 * total / count:.1f}", ", ".join(rolled)))
    table("one failing rewrite among N (rolled back per node)", rows, ("N", "total s", "verify s", "ms/Scan", "rolled back"))


def layers(count: int, width: int = 256) -> onnx.ModelProto:
    """``count`` MatMul + Relu layers ([width, width] weights) and no Scan: a model scanopt
    has nothing to do with."""
    rng = np.random.default_rng(0)
    vi = h.make_tensor_value_info
    nodes, inits, value = [], [], "X"
    for k in range(count):
        inits.append(numpy_helper.from_array((rng.standard_normal((width, width)) * 0.3).astype(np.float32), f"w{k}"))
        nodes += [h.make_node("MatMul", [value, f"w{k}"], [f"m{k}"], name=f"mm{k}"),
                  h.make_node("Relu", [f"m{k}"], [f"r{k}"], name=f"relu{k}")]
        value = f"r{k}"
    graph = h.make_graph(nodes, "layers", [vi("X", F, [B, width])], [vi(value, F, [B, width])], initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def bench_noop(counts):
    """Nothing to do: `scanopt optimize` (CLI, in process) vs onnx.load + onnx.save, on a
    model without Scan and on N Scans every pass declines (bodies scanopt has no rewrite for)."""
    from scanopt.cli import main as cli

    rows = []
    with tempfile.TemporaryDirectory() as tmp:  # warm-up: imports are not the model's cost
        onnx.save(layers(1), os.path.join(tmp, "w.onnx"))
        cli(["optimize", os.path.join(tmp, "w.onnx"), os.path.join(tmp, "o.onnx"), "-q"])
    for label, model in [(f"{counts[-1]} layers of 256x256, no Scan", layers(counts[-1]))] + [
            (f"{n} Scans, all declined", declined_scans(n)) for n in counts]:
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "in.onnx")
            onnx.save(model, src)
            start = time.perf_counter()
            onnx.save(onnx.load(src), os.path.join(tmp, "bare.onnx"))
            bare = time.perf_counter() - start
            start = time.perf_counter()
            cli(["optimize", src, os.path.join(tmp, "out.onnx"), "-q"])
            ours = time.perf_counter() - start
        rows.append((label, f"{bare:.3f}", f"{ours:.3f}", f"{ours / bare:.1f}"))
    table("nothing to do: `scanopt optimize` vs onnx.load + onnx.save", rows, ("model", "load+save s", "optimize s", "ratio"))


def bench_inspect(counts):
    """`scanopt inspect` (CLI, in process, every pass's dry run) on N independent Scans and
    N declined ones: thread CPU time per Scan, and its ratio to the smallest N's."""
    import contextlib
    import io

    from scanopt.cli import main as cli

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, build in [("independent", independent_scans), ("declined", declined_scans)]:
            onnx.save(build(2), os.path.join(tmp, "w.onnx"))
            with contextlib.redirect_stdout(io.StringIO()):  # warm-up: imports
                cli(["inspect", os.path.join(tmp, "w.onnx")])
            first = None
            for count in counts:
                src = os.path.join(tmp, f"{label}{count}.onnx")
                onnx.save(build(count), src)
                start = time.thread_time()
                with contextlib.redirect_stdout(io.StringIO()):
                    cli(["inspect", src])
                per_scan = 1000 * (time.thread_time() - start) / count
                first = first or per_scan
                rows.append((label, str(count), f"{per_scan * count / 1000:.2f}", f"{per_scan:.2f}", f"{per_scan / first:.2f}"))
    table("`scanopt inspect` time vs N Scans (thread CPU time)", rows, ("model", "N", "s", "ms/Scan", "x smallest N"))


def declined_scans(count: int) -> onnx.ModelProto:
    """N Scans whose body (h' = h * x, elementwise) no pass rewrites at a dynamic length."""
    model = independent_scans(count)
    for node in model.graph.node:
        if node.op_type == "Scan":
            body = node.attribute[0].g
            del body.node[:]
            body.node.extend([h.make_node("Mul", ["h_in", "x_t"], ["h_out"]), h.make_node("Identity", ["h_out"], ["y_t"])])
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    for out in model.graph.output:
        if out.name.startswith("y_"):
            out.type.tensor_type.shape.dim[0].dim_param = "T"
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="N up to 3,000")
    parser.add_argument("--profile", type=int, metavar="N", help="cProfile one optimize of N Scans and stop")
    parser.add_argument("--only", default="n,shared,depth,fail,noop,inspect")
    parser.add_argument("--inspect-counts", default="100,250,800,1000", help="N for the inspect table")
    args = parser.parse_args(argv)
    if args.profile:
        model = independent_scans(args.profile)
        prof = cProfile.Profile()
        prof.enable()
        run_optimize(model)
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(40)
        return
    run_optimize(independent_scans(2))  # warm-up: imports and onnxruntime's first session are not per-Scan costs
    counts = [10, 100, 300, 1000] + ([3000] if args.large else [])
    only = args.only.split(",")
    if "n" in only:
        bench_counts(counts)
    if "shared" in only:
        bench_shared(counts)
    if "depth" in only:
        bench_depths([1, 5, 10, 30])
    if "fail" in only:
        bench_failing([10, 100, 300] + ([1000] if args.large else []))
    if "noop" in only:
        bench_noop([10, 1000])
    if "inspect" in only:
        bench_inspect([int(n) for n in args.inspect_counts.split(",")])


if __name__ == "__main__":
    main()
