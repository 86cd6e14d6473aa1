"""fuse's run-time dispatch on an unknown batch (issue 28): without shapes, a native RNN that
is modelled faster than the loop at small batches and slower at large ones is written behind
If(B >= threshold) with the Scan in the then branch and the native op in the else branch.
Both branches run and give the original's outputs; declared shapes and --target portable give
the plain native op."""

from __future__ import annotations

import re

import numpy as np
import onnxruntime as ort
import pytest

import cell_builders as cb
from scanopt.pipeline import optimize

pytestmark = pytest.mark.usefixtures("no_tune")


@pytest.fixture
def no_tune(monkeypatch):
    monkeypatch.setenv("SCANOPT_TUNE", "0")


def _rnn(hidden=64):
    return cb.rnn_model(hidden=hidden, inputs=hidden)  # X [seq, batch, I], h0 [batch, H]


def _batch_if(model):
    """The top-level If whose then branch holds a Scan and else branch an RNN, or None."""
    for node in model.graph.node:
        if node.op_type != "If":
            continue
        branches = {a.name: a.g for a in node.attribute}
        then_ops = {n.op_type for n in branches["then_branch"].node}
        else_ops = {n.op_type for n in branches["else_branch"].node}
        if "Scan" in then_ops and ("RNN" in else_ops or any(n.op_type == "If" for n in branches["else_branch"].node)):
            return node
    return None


def _run_inputs(T, B, hidden=64, seed=0):
    rng = np.random.default_rng(seed)
    return {"X": rng.standard_normal((T, B, hidden)).astype(np.float32),
            "h0": rng.standard_normal((B, hidden)).astype(np.float32)}


def _run(model, T, B):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, _run_inputs(T, B))


def test_an_rnn_without_shapes_is_native_below_the_threshold_and_the_loop_from_it():
    model = _rnn()
    out, report = optimize(model)
    fuse = [o for o in report.outcomes if o.pass_name == "fuse" and o.applied]
    assert len(fuse) == 1 and report.verification["passed"] is True, report.format()
    below = int(re.search(r"behind If\(B >= (\d+)\)", fuse[0].detail).group(1))
    assert below > 1 and "written behind a run-time If on the batch" in fuse[0].expected
    assert _batch_if(out) is not None
    # the Scan kept as the loop branch is not fused again
    assert any("loop branch of fuse's run-time dispatch" in o.detail for o in report.outcomes if o.pass_name == "fuse")
    for T, B in ((7, 1), (7, below - 1), (7, below), (7, 8), (0, 1), (0, 8), (5, 0)):
        try:
            want = _run(model, T, B)
        except ort.capi.onnxruntime_pybind11_state.Fail:  # onnxruntime's Scan at zero steps
            assert T == 0
            want = [_run_inputs(T, B)["h0"], np.zeros((0, B, 64), np.float32)]  # the spec: h0, an empty Y
            try:
                got = _run(out, T, B)
            except ort.capi.onnxruntime_pybind11_state.Fail:
                continue  # the loop branch: the same failure as the original
        else:
            got = _run(out, T, B)
        assert [w.shape for w in want] == [g.shape for g in got], (T, B)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"T={T} B={B}")


def test_declared_shapes_and_target_portable_give_the_plain_native_op():
    model = _rnn()
    declared, report = optimize(model, verify=False, options={"input_shapes": {"X": [50, 1, 64]}})
    assert _batch_if(declared) is None
    assert [o.pass_name for o in report.outcomes if o.applied] == ["fuse"]
    portable, report = optimize(model, verify=False, options={"target": "portable"})
    assert _batch_if(portable) is None
    assert not any("behind If(B" in o.detail for o in report.outcomes)


def test_a_batch_the_native_op_wins_at_everywhere_needs_no_dispatch():
    """A GRU at I=H=64: modelled faster at every batch of the range within its bound: the native
    op as it is, no If on the batch."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    from bench_policy import cell_model

    model, _ = cell_model("GRU0", 64, 64)
    out, report = optimize(model, verify=False)
    assert [o.pass_name for o in report.outcomes if o.applied] == ["fuse"]
    assert not any("behind If(B" in o.detail for o in report.outcomes)
