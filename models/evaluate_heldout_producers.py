"""Print what scanopt does with each model of a held-out producer set (issue 20's counts).

    python models/evaluate_heldout_producers.py            # models/heldout_producers/, both modes
    python models/evaluate_heldout_producers.py heldout_producers_2 --seeds 3

The directory (under models/) names its generator, generate_<dir>.py, whose BATCH_FIRST, T and
B say how each x is laid out. Per model and mode: the loop ops before and after, whether
onnxruntime on the result reproduces the source framework's stored outputs, whether
verification passed, the (T, B) each verification seed ran at, and the outcome lines of
loop_to_scan, fuse, vectorize and any rewrite the cost policy measured. Declared shapes are
T=16, B=4, with one intra-op thread (the tuner then times in thread CPU time, not wall clock).

Two counts per mode. *Loop ops*: Scans and Loops before minus after, so a loop a rewrite
emits (linrec's chunked form runs T/C steps in two small Loops; fuse's per-step cell state
is a two-node Scan) counts against it. *Per recurrence*: the model's own loops (by node name;
loop_to_scan keeps the name) that no longer run, whatever the rewrite emitted instead, and
those still there that the cost policy measured faster than the loop as it was (hoisted).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort

import scanopt
from scanopt.pass_api import FALLBACK_MARK
from scanopt.protos import attribute_graphs
from scanopt.verify import tolerance

LOOP_OPS = ("Scan", "Loop", "RNN", "GRU", "LSTM")
HERE = os.path.dirname(os.path.abspath(__file__))
DECLARED_T, DECLARED_B = 16, 4


class HeldOutSet:
    """One held-out directory and its generator's layout facts."""

    def __init__(self, directory: str = "heldout_producers"):
        gen = importlib.import_module(f"generate_{directory}")
        self.out, self.batch_first = gen.OUT, gen.BATCH_FIRST
        self.t, self.b = getattr(gen, "T", 5), getattr(gen, "B", 3)
        self.maps = getattr(gen, "MAPS", None)

    def is_map(self, name: str) -> bool:
        """Whether the model's loops are maps (else recurrences), as its generator says."""
        return name in self.maps if self.maps is not None else "map" in name

    def names(self) -> list[str]:
        return sorted(f[:-5] for f in os.listdir(self.out) if f.endswith(".onnx"))

    def batch_major(self, name: str) -> bool:
        return name in self.batch_first or name.startswith("keras")

    def seq_input(self, model):
        """The sequence input: x (x:0 for TF1 graphs) or skl's X [N, F]."""
        return next((i for i in model.graph.input if i.name in ("x", "x:0", "X")), None)

    def declared(self, model, stored, name) -> dict:
        """Stored shapes with each symbolic dim at the stored T made 16 and at the stored B made 4."""
        x = self.seq_input(model)
        t_axis, b_axis = (1, 0) if self.batch_major(name) else (0, 1)
        shapes = {}
        for inp in model.graph.input:
            shape = list(stored[inp.name].shape)
            dims = inp.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                continue
            for k, d in enumerate(dims):
                if d.HasField("dim_value"):
                    continue
                if inp is x and len(shape) == 3:
                    shape[k] = {t_axis: DECLARED_T, b_axis: DECLARED_B}.get(k, shape[k])
                elif shape[k] == self.b:
                    shape[k] = DECLARED_B
                elif shape[k] == self.t:
                    shape[k] = DECLARED_T
            shapes[inp.name] = shape
        return shapes

    def seed_sizes(self, model, name, verification) -> list[tuple[int, int]]:
        """(T, B) per verification seed, read from the sizes the report names by x's dims
        (T None: x has no sequence axis; -1: the report names no size for the dim)."""
        x = self.seq_input(model)
        if x is None:
            return []
        dims = [d.dim_param or f"{x.name}[{k}]" for k, d in enumerate(x.type.tensor_type.shape.dim)]
        if len(dims) == 3:
            t_dim, b_dim = (dims[1], dims[0]) if self.batch_major(name) else (dims[0], dims[1])
        else:
            t_dim, b_dim = None, dims[0]
        found = []
        for text in _seed_size_texts(verification):
            sizes = dict(part.split("=") for part in text.split())
            found.append((int(sizes.get(t_dim, -1)) if t_dim else None, int(sizes.get(b_dim, -1))))
        return found


def running_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every node of the graph, nested bodies and model-local functions, but a Scan a rewrite
    keeps as its own fallback (FALLBACK_MARK: linrec's chunked forms run the original loop
    behind an If where the state is not finite) and what is nested in it: the loop-like ops
    counted are those of the form that runs on finite values."""
    stack = [model.graph] + [g for fn in model.functions for top in fn.node for a in top.attribute
                             for g in attribute_graphs(a)]
    nodes = [n for fn in model.functions for n in fn.node if FALLBACK_MARK not in n.name]
    while stack:
        graph = stack.pop()
        for node in graph.node:
            if FALLBACK_MARK in node.name:
                continue
            nodes.append(node)
            stack.extend(g for a in node.attribute for g in attribute_graphs(a))
    return nodes


def loop_ops(model: onnx.ModelProto) -> dict[str, int]:
    """Loop-like ops anywhere (the graph, nested bodies and model-local functions) but in the
    fallbacks (:func:`running_nodes`)."""
    counts = Counter(n.op_type for n in running_nodes(model))
    return {op: counts[op] for op in LOOP_OPS if counts[op]}


def feeds_of(model: onnx.ModelProto, stored) -> dict:
    """The stored inputs, each in the rank the model declares (the npz writer stores a scalar as [1])."""
    feeds = {}
    for inp in model.graph.input:
        dims = inp.type.tensor_type.shape.dim
        static = all(d.HasField("dim_value") for d in dims)
        feeds[inp.name] = stored[inp.name].reshape([d.dim_value for d in dims]) if static else stored[inp.name]
    return feeds


def _seed_size_texts(verification) -> list[str]:
    """'T=8 B=3' per seed: the report's details, or (a rewritten function's check, which
    reports only its summary) the summary's "sizes seed 0 T=8 B=3; seed 1 ..." text."""
    verification = verification or {}
    sizes = (verification.get("details") or {}).get("sizes")
    if sizes:
        return list(sizes.values())
    return re.findall(r"seed \d+ ((?:[^ ;)]+=\d+ ?)+)", verification.get("summary") or "")


def as_array(value) -> np.ndarray:
    """An onnxruntime result as an array: a ZipMap's list of {class: probability} as [rows, classes]."""
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return np.array([[row[k] for k in sorted(row)] for row in value])
    return np.asarray(value)


def source_tolerance(dtype) -> tuple[float, float]:
    """(rtol, atol) of a comparison with the source framework: 1e-4 / 1e-5, widened to the
    verifier's table for a coarser dtype (float16 rounds at 1e-3: a loop in numpy and one in
    onnxruntime differ by an ulp); exact dtypes exactly."""
    rtol, atol = tolerance(dtype)
    return (max(rtol, 1e-4), max(atol, 1e-5)) if (rtol, atol) != (0.0, 0.0) else (0.0, 0.0)


def assert_equal_to_source(model, out, stored) -> None:
    """onnxruntime on ``out`` at the stored inputs gives the source's stored outputs."""
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, output in zip(session.run(None, feeds_of(model, stored)), model.graph.output):
        want = stored[output.name]
        rtol, atol = source_tolerance(want.dtype)
        np.testing.assert_allclose(as_array(got).astype(want.dtype), want, rtol=rtol, atol=atol, err_msg=output.name)


def outputs_equal(model, out, stored) -> bool:
    try:
        assert_equal_to_source(model, out, stored)
    except AssertionError:
        return False
    return True


def assert_reproduces_source(held: HeldOutSet, name: str, model, out, report) -> None:
    """The held-out tests' check of one optimized model: wherever it changed, verification
    passed and bound T >= 2 and B >= 2 at some seed; onnxruntime on ``out`` reproduces the
    source framework's stored outputs."""
    if report.modified:
        assert report.verification["passed"] is True, report.verification
        sizes = held.seed_sizes(model, name, report.verification)
        assert any((t is None or t >= 2) and b >= 2 for t, b in sizes), sizes
    assert_equal_to_source(model, out, np.load(os.path.join(held.out, f"{name}.expected.npz")))


def loop_names(model: onnx.ModelProto) -> set[str]:
    """The names of every Scan and Loop (the graph, nested bodies and model-local functions)
    but in the fallbacks (:func:`running_nodes`)."""
    return {n.name for n in running_nodes(model) if n.op_type in ("Scan", "Loop")}


def loops(counts: dict[str, int]) -> int:
    return counts.get("Scan", 0) + counts.get("Loop", 0)


def evaluate(held: HeldOutSet, name: str, mode: str, seeds: int) -> dict:
    model = onnx.load(os.path.join(held.out, f"{name}.onnx"))
    stored = np.load(os.path.join(held.out, f"{name}.expected.npz"))
    if mode == "portable":
        out, report = scanopt.optimize(model, options={"target": "portable"}, seeds=seeds)
    else:
        out, report = scanopt.optimize(model, input_shapes=held.declared(model, stored, name), seeds=seeds,
                                       options={"threads": 1})  # measured in thread CPU time, one intra-op thread
    equal = outputs_equal(model, out, stored)
    passed = (report.verification or {}).get("passed")
    before, after = loop_ops(model), loop_ops(out)
    sizes = held.seed_sizes(model, name, report.verification)
    print(f"{name:27s} {mode:8s} {before} -> {after} equal={equal} verified={passed} T,B per seed={sizes}")
    for o in report.outcomes:
        if o.pass_name in ("loop_to_scan", "fuse", "vectorize") or o.measured:
            speed = f" [measured {o.speedup:.2f}x]" if o.measured and o.speedup else ""
            print(f"    {o.pass_name}: {'applied' if o.applied else 'skipped'}{speed}: {o.detail[:160]}")
    kept_faster = {o.node for o in report.outcomes if o.applied and o.measured and o.pass_name == "hoist"}
    gone = loops(before) - loops(after)
    own, left = loop_names(model), loop_names(out)
    return {"map": held.is_map(name), "loops": loops(before), "gone": gone,
            "faster": min(len(kept_faster), loops(after)),
            "own": len(own), "replaced": len(own - left), "own_faster": len(own & left & kept_faster), "equal": equal, "verified": passed,
            "sizes_ok": None if not sizes else any((t is None or t >= 2) and b >= 2 for t, b in sizes)}


def summarize(mode: str, rows: dict[str, dict]) -> None:
    """Issue 20's four Done-when numbers for one mode."""
    rec = {n: r for n, r in rows.items() if not r["map"] and r["loops"]}
    maps = {n: r for n, r in rows.items() if r["map"] and r["loops"]}
    total = lambda rs, key: sum(r[key] for r in rs.values())  # noqa: E731
    sized = {n: r for n, r in rows.items() if r["sizes_ok"] is not None}
    print(f"== {mode}: per recurrence: replaced {total(rec, 'replaced')}/{total(rec, 'own')}, kept and measured "
          f"faster {total(rec, 'own_faster')}; maps replaced {total(maps, 'replaced')}/{total(maps, 'own')}")
    print(f"== {mode}: loop ops: recurrences fused or loop-free {total(rec, 'gone')}/{total(rec, 'loops')}, "
          f"+ kept in a form measured faster {total(rec, 'faster')}; maps vectorized "
          f"{total(maps, 'gone')}/{total(maps, 'loops')}; equal to the source {sum(r['equal'] for r in rows.values())}"
          f"/{len(rows)}; verification failed {[n for n, r in rows.items() if r['verified'] is False]}; "
          f"T>=2 and B>=2 at some seed {sum(r['sizes_ok'] for r in sized.values())}/{len(sized)} "
          f"(not: {[n for n, r in sized.items() if not r['sizes_ok']]})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directory", nargs="?", default="heldout_producers", help="a folder of models/")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--only", action="append", help="evaluate only these models")
    args = p.parse_args()
    held = HeldOutSet(args.directory)
    rows = {mode: {} for mode in ("portable", "declared")}
    for name in args.only or held.names():
        for mode in rows:
            rows[mode][name] = evaluate(held, name, mode, args.seeds)
    for mode, by_name in rows.items():
        summarize(mode, by_name)


if __name__ == "__main__":
    main()
