"""Print what scanopt does with each model of models/heldout_producers/ (issue 20's counts).

    python models/evaluate_heldout_producers.py            # portable target and declared shapes
    python models/evaluate_heldout_producers.py --seeds 3  # verification over three seeds

Per model and mode: the loop ops before and after, whether onnxruntime on the result
reproduces the source framework's stored outputs, whether verification passed, the (T, B)
each verification seed ran at, and the outcome lines of loop_to_scan, fuse, vectorize and
any rewrite the cost policy measured. Declared shapes are T=16, B=4.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort

import scanopt
from generate_heldout_producers import BATCH_FIRST, OUT

LOOP_OPS = ("Scan", "Loop", "RNN", "GRU", "LSTM")


def _batch_major(name: str) -> bool:
    return name in BATCH_FIRST or name.startswith("keras")


def _seed_sizes(model, name, verification) -> list[tuple[int, int]]:
    """(T, B) per verification seed, read from the sizes the report names by x's dims."""
    x = next(i for i in model.graph.input if i.name == "x")
    dims = [d.dim_param for d in x.type.tensor_type.shape.dim]
    t_dim, b_dim = (dims[1], dims[0]) if _batch_major(name) else (dims[0], dims[1])
    found = []
    for text in ((verification or {}).get("details") or {}).get("sizes", {}).values():
        sizes = dict(part.split("=") for part in text.split())
        found.append((int(sizes.get(t_dim, -1)), int(sizes.get(b_dim, -1))))
    return found


def _declared(model, stored, name) -> dict:
    shapes = {i.name: [4, *stored[i.name].shape[1:]] for i in model.graph.input if i.name != "x"}
    shapes["x"] = [4, 16, 3] if _batch_major(name) else [16, 4, 3]
    return shapes


def evaluate(name: str, mode: str, seeds: int) -> None:
    model = onnx.load(os.path.join(OUT, f"{name}.onnx"))
    stored = np.load(os.path.join(OUT, f"{name}.expected.npz"))
    if mode == "portable":
        out, report = scanopt.optimize(model, options={"target": "portable"}, seeds=seeds)
    else:
        out, report = scanopt.optimize(model, input_shapes=_declared(model, stored, name), seeds=seeds)
    feeds = {i.name: stored[i.name] for i in model.graph.input}
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    equal = all(np.allclose(got, stored[o.name], rtol=1e-4, atol=1e-5)
                for got, o in zip(session.run(None, feeds), model.graph.output))
    before, after = Counter(n.op_type for n in model.graph.node), Counter(n.op_type for n in out.graph.node)
    show = lambda c: {op: c[op] for op in LOOP_OPS if c[op]}  # noqa: E731
    passed = (report.verification or {}).get("passed")
    print(f"{name:27s} {mode:8s} {show(before)} -> {show(after)} equal={equal} verified={passed} "
          f"T,B per seed={_seed_sizes(model, name, report.verification)}")
    for o in report.outcomes:
        if o.pass_name in ("loop_to_scan", "fuse", "vectorize") or o.measured:
            print(f"    {o.pass_name}: {'applied' if o.applied else 'skipped'}: {o.detail[:160]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=2)
    args = p.parse_args()
    names = sorted(f[:-5] for f in os.listdir(OUT) if f.endswith(".onnx"))
    for name in names:
        for mode in ("portable", "declared"):
            evaluate(name, mode, args.seeds)


if __name__ == "__main__":
    main()
