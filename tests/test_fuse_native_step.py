"""fuse, Scan bodies that run one step of a native RNN/GRU/LSTM (TorchScript exports
nn.LSTMCell in a scripted loop this way): the Scan becomes that op over the whole sequence
(passes/fuse/native_step.py). Equal on both engines; what is not provably one step of the op
is declined with the reason."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import cell_builders as cb
from equivalence import assert_equivalent, ops

CELLS = os.path.join(os.path.dirname(__file__), "..", "models", "cells")
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def one_step_model(kind="LSTM", peep=False, lens=False, alpha=False, start="h", **attrs):
    """A Scan whose body is Squeeze(kind(Unsqueeze(x, 0), W, R, B, ..., Unsqueeze(h, 0)).Y_h, 0)."""
    b = cb.Body()
    H, g = cb.H, GATES[kind]
    axes = b.const(np.array([0], np.int64), "axes")
    x1 = b.op("Unsqueeze", "x", axes)
    h1 = b.op("Unsqueeze", start, axes)
    inputs = [x1, b.const(cb.rand(1, 1, g * H, cb.I)), b.const(cb.rand(2, 1, g * H, H)), b.const(cb.rand(3, 1, 2 * g * H)),
              b.const(np.full([1], 1, np.int32), "lens") if lens else "", h1]
    if kind == "LSTM":
        inputs.append(b.op("Unsqueeze", "c", axes))
        if peep:
            inputs.append(b.const(cb.rand(4, 1, 3 * H), "p"))
    if alpha:
        attrs.update(activations=["LeakyRelu"], activation_alpha=[0.3])
    outs = b.op(kind, *inputs, outputs=3 if kind == "LSTM" else 2, hidden_size=H, **attrs)
    h_new = b.op("Squeeze", outs[1], axes)
    states = [("h", h_new, H)]
    if kind == "LSTM":
        states.append(("c", b.op("Squeeze", outs[2], axes), H))
    return cb.scan_model(b, states, ys=[h_new], in_dir=1)


@pytest.mark.parametrize("kind, kw", [
    ("LSTM", {}),
    ("LSTM", {"peep": True, "clip": 0.8}),
    ("LSTM", {"input_forget": 1}),
    ("GRU", {"linear_before_reset": 1}),
    ("GRU", {"activations": ["Sigmoid", "Relu"]}),
    ("RNN", {"activations": ["Relu"]}),
    ("RNN", {"direction": "reverse"}),  # one step reads the same either way
])
def test_a_one_step_native_op_in_the_body_becomes_the_op_over_the_sequence(kind, kw):
    m = one_step_model(kind, **kw)
    out, outcomes = cb.fuse(m)
    assert outcomes[0].applied and f"one-step {kind} in the body" in outcomes[0].detail, outcomes[0].detail
    assert ops(out)["Scan"] == 0 and ops(out)[kind] == 1
    assert_equivalent(m, out)
    assert_equivalent(m, out, inputs=cb.feeds(m, T=9, B=3))


@pytest.mark.parametrize("kw, reason", [
    ({"lens": True}, "has sequence_lens"),
    ({"alpha": True, "kind": "RNN"}, "sets activation_alpha/beta"),
    ({"direction": "bidirectional", "kind": "GRU"}, "is bidirectional"),
])
def test_what_is_not_one_plain_step_is_declined(kw, reason):
    m = one_step_model(**kw)
    out, outcomes = cb.fuse(m)
    assert [o.applied for o in outcomes] == [False], [o.detail for o in outcomes]
    assert reason in outcomes[0].detail, outcomes[0].detail
    assert ops(out)["Scan"] == 1


def test_a_step_that_starts_from_something_else_than_the_state_is_declined():
    b = cb.Body()
    H = cb.H
    axes = b.const(np.array([0], np.int64), "axes")
    zero = b.const(np.zeros([1, 1, H], np.float32), "zero")  # every step from zeros: no recurrence
    outs = b.op("RNN", b.op("Unsqueeze", "x", axes), b.const(cb.rand(1, 1, H, cb.I)), b.const(cb.rand(2, 1, H, H)), "", "",
                zero, outputs=2, hidden_size=H)
    h_new = b.op("Squeeze", outs[1], axes)
    m = cb.scan_model(b, [("h", h_new, H)], ys=[h_new])
    out, outcomes = cb.fuse(m)
    assert not outcomes[0].applied and "does not start from Unsqueeze(state, 0)" in outcomes[0].detail, outcomes[0].detail


def test_torchscript_lstmcell_loop_stacking_h_and_c():
    """models/cells/torch_script_lstmcell_hc: nn.LSTMCell in a scripted loop is a one-step LSTM in
    the Loop; loop_to_scan makes it a Scan, fuse the LSTM over the sequence plus the c sequence.
    That c sequence is recomputed from x: NaN from a NaN step on, where the original's per-step
    LSTM stays finite (onnxruntime's kernel clamps it), so verification's NaN step in x (the
    sequence the Loop reads, tests/test_loop_edges.py) rolls the fusion back."""
    import scanopt

    name = "torch_script_lstmcell_hc"
    m = onnx.load(os.path.join(CELLS, f"{name}.onnx"))
    out, report = scanopt.optimize(m, options={"target": "portable"}, verify=False)
    (fused,) = [o for o in report.outcomes if o.pass_name == "fuse" and o.applied]
    assert "one-step LSTM in the body" in fused.detail and "the per-step cell state" in fused.detail
    assert ops(out)["LSTM"] == 1 and ops(out)["Loop"] == 0
    cb.matches_torch(out, name, CELLS)
    out, report = scanopt.optimize(m, options={"target": "portable"})
    if report.verification["rolled_back"]:  # where onnxruntime's LSTM keeps a NaN step finite
        assert report.verification["rolled_back"] == ["fuse on /Loop"]
        failed = [c["inputs"] for c in report.verification["details"]["comparisons"] if not c["passed"]]
        assert failed and all(" with nan at step " in f for f in failed), failed
    cb.matches_torch(out, name, CELLS)
