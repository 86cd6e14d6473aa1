"""linrec's run-time dispatch on a symbolic length (module passes/loopfree/dispatch): unmeasured
and without shapes, the Scan sits in the then branch of If(T < threshold) (hoisted by the
pipeline), the chunked form in the else branch; both give the loop's outputs, verification
reaches both (the seeds run the loop, the 1024-step weak spot the chunked form), and declared
shapes or --target portable keep the plain forms."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import helper as h

import linrec_builders as lb
import scanopt
from scanopt.engines import run
from scanopt.passes.loopfree.dispatch import THRESHOLD
from scanopt.pass_api import FALLBACK_MARK
from scanopt.pipeline import optimize
from scanopt.verify import compare_models

HELDOUT = os.path.join(os.path.dirname(__file__), "..", "models", "heldout_linrec")
BUILDS = {
    "ema": lambda: lb.ema(T="T", H=8),
    "mingru": lambda: lb.mingru(T="T", I=4, H=6, B=2),
}


def _feeds(model, steps: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal([d.dim_value if d.dim_value else steps for d in v.type.tensor_type.shape.dim])
            .astype(np.float32) for v in model.graph.input}


def _linrec(report):
    return [o for o in report.outcomes if o.pass_name == "linrec" and o.node == "Scan->hT"]


def _dispatches(model: onnx.ModelProto) -> list:
    """The main graph's Ifs other than the overflow guards (whose then branch is the Scan as
    a fallback, FALLBACK_MARK): the run-time dispatches on the length."""
    return [n for n in model.graph.node if n.op_type == "If" and not any(
        FALLBACK_MARK in m.name for a in n.attribute if a.name == "then_branch" for m in a.g.node)]


def _dispatched(model, **options):
    out, report = optimize(model, verify=False, options={"tune": False, **options})
    return out, report


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_symbolic_length_without_shapes_dispatches_at_run_time(name):
    m = BUILDS[name]()
    out, report = _dispatched(m)
    done = _linrec(report)
    assert done and done[0].applied and f"behind If(T < {THRESHOLD})" in done[0].detail, report.format()
    assert "run-time If on the length" in done[0].expected
    assert [n.op_type for n in out.graph.node] == ["Shape", "Gather", "Less", "If"]
    branches = {a.name: a.g for a in out.graph.node[-1].attribute}
    loop = [n for n in branches["then_branch"].node if n.op_type == "Scan"]
    assert len(loop) == 1 and len(loop[0].attribute[0].g.node) == 3  # the Scan, hoisted: a*h + b left
    assert "Scan" not in {n.op_type for n in branches["then_branch"].node[:-1]}
    hoisted = [o for o in report.outcomes if o.pass_name == "hoist" and o.applied]
    assert hoisted, report.format()
    for steps in (1, 5, THRESHOLD - 1, THRESHOLD, THRESHOLD + 37, 300):
        feeds = _feeds(m, steps, seed=steps)
        want, got = run(m, feeds), run(out, feeds)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5, err_msg=f"{key} at T={steps}")


@pytest.mark.parametrize("model", ["ema", "dyn_gla"])
def test_loop_branch_is_not_rewritten_again_by_linrec(model):
    """Nor through module absorb: once hoist has moved producers out of the loop branch's body,
    absorbing them builds a new Scan, which must not reopen the question (dyn_gla: a dispatch
    inside the loop branch each round, 8 deep, 764 ops for 16)."""
    m = BUILDS[model]() if model in BUILDS else onnx.load(os.path.join(HELDOUT, f"{model}.onnx"))
    out, report = _dispatched(m)
    again = [o for o in report.outcomes if o.pass_name == "linrec" and not o.applied and "loop branch" in o.detail]
    assert again, report.format()
    assert sum(1 for o in report.outcomes if o.pass_name == "linrec" and o.applied) == 1
    assert len(_dispatches(out)) == 1
    for steps in (5, THRESHOLD + 3):
        feeds = _feeds(m, steps, seed=steps)
        want, got = run(m, feeds), run(out, feeds)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-5, err_msg=f"{key} at T={steps}")


@pytest.mark.parametrize("options", [{"target": "portable"}, {"linrec_chunk": 8, "target": "portable"}])
def test_portable_keeps_the_plain_chunked_form(options):
    out, report = _dispatched(BUILDS["ema"](), **options)
    done = _linrec(report)
    assert done[0].applied and "no Scan left" in done[0].detail and not _dispatches(out), report.format()


@pytest.mark.parametrize("steps, applied", [(256, True), (16, False)])
def test_declared_length_keeps_the_plain_choice(steps, applied):
    """Declared shapes: the length is known, so the plain form is chosen (unmeasured in the
    suite: by the measured bound) and no If is written."""
    m = BUILDS["ema"]()
    out, report = scanopt.optimize(m, verify=False, input_shapes={"X": [steps, 8], "h0": [8]}, options={"tune": False})
    done = _linrec(report)
    assert done[0].applied is applied and not _dispatches(out), report.format()


def _scaled_branch(model: onnx.ModelProto, branch: str) -> onnx.ModelProto:
    """``model`` (dispatched) with the first output of one If branch times 1.01."""
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    node = wrong.graph.node[-1]
    graph = next(a.g for a in node.attribute if a.name == branch)
    first = graph.output[0]
    graph.node.append(h.make_node("Mul", [first.name, "scale_wrong"], [first.name + "_wrong"]))
    graph.initializer.append(onnx.numpy_helper.from_array(np.array(1.01, np.float32), "scale_wrong"))
    first.name = first.name + "_wrong"
    return wrong


@pytest.mark.parametrize("branch", ["then_branch", "else_branch"])
def test_verification_reaches_both_branches(branch):
    """A wrong loop branch fails on the seeds (short lengths); a wrong chunked branch fails on
    the 1024-step weak spot alone: verification runs both sides of the If."""
    m = BUILDS["ema"]()
    out, _ = _dispatched(m)
    good = compare_models(m, out, engine="ort", seeds=2)
    assert good.passed, good.summary
    lengths = [int(v.split("=")[1]) for v in good.sizes.values()]
    assert lengths and all(t < THRESHOLD for t in lengths), good.sizes
    result = compare_models(m, _scaled_branch(out, branch), engine="ort", seeds=2)
    assert not result.passed
    failed = [c.inputs for c in result.comparisons if not c.passed]
    if branch == "then_branch":
        assert any(label.startswith("seed") for label in failed), failed
    else:
        assert failed and all("1024" in label for label in failed), failed


def _runs_loop(model: onnx.ModelProto, feeds: dict) -> bool:
    """The dispatch If's condition on ``feeds`` (True: the loop branch runs)."""
    (node,) = _dispatches(model)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(h.make_tensor_value_info(node.input[0], onnx.TensorProto.BOOL, []))
    return bool(run(probe, feeds)[node.input[0]])


def test_a_symbolic_state_width_is_tested_at_run_time():
    """Mamba's state [B, D, N] with D and N symbolic: the crossover was measured on states up to
    256 elements per batch row, so the chunked form runs only where T >= 128 and the state is
    that narrow (at D=64, N=16 it measured 0.59x the loop at T=1024); before, a symbolic width
    counted as 1 and the chunked form ran at every width."""
    m = onnx.load(os.path.join(HELDOUT, "..", "heldout_mamba", "einsum_outside_os.onnx"))
    out, report = _dispatched(m)
    (done,) = [o for o in report.outcomes if o.pass_name == "linrec" and o.applied]
    assert f"If(T < {THRESHOLD} or a state over 256 elements per batch row" in done.detail, report.format()
    rng = np.random.default_rng(3)
    for steps, d, n, loop in ((THRESHOLD + 2, 3, 5, False), (THRESHOLD + 2, 16, 16, False), (THRESHOLD + 2, 64, 16, True),
                              (THRESHOLD - 1, 3, 5, True), (THRESHOLD + 2, 257, 1, True)):
        sizes = {"B": 2, "L": steps, "D": d, "N": n}
        feeds = {v.name: (rng.standard_normal([sizes[x.dim_param] for x in v.type.tensor_type.shape.dim]) * 0.3)
                 .astype(np.float32) for v in m.graph.input}
        assert _runs_loop(out, feeds) == loop, sizes
        want, got = run(m, feeds), run(out, feeds)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-5, err_msg=f"{key} at {sizes}")
