"""fuse and the activations whose spec needs care (issue 12): Affine (a cell with no
nonlinearity, or ``alpha·pre + beta`` written with Mul/Add) and ThresholdedRelu.

Affine is always emitted with explicit alpha/beta (onnxruntime's defaults differ from the spec,
tests/test_reference_rnn.py). Each fused form equals the original on both engines and a native op
written by hand with explicit ``activation_alpha``/``activation_beta``. Purely elementwise linear
recurrences (EMA, running sum) stay loops, and ThresholdedRelu is declined because the op and the
recurrent activation differ at x == alpha per the spec; the x == alpha case is built and run here."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import cell_builders as cb
from scanopt.engines import run as run_engine

H, I = cb.H, cb.I
R_ = cb.rand
AFFINE = dict(activations=["Affine"], activation_alpha=[1.0], activation_beta=[0.0])


def _rnn_scan(build):
    body = cb.Body()
    h_new = build(body)
    return cb.scan_model(body, [("h", h_new, H)], ys=[h_new])


def _affine_attrs(node):
    return {a.name: list(a.floats) if a.floats else [s.decode() for s in a.strings]
            for a in node.attribute if a.name.startswith("activation")}


@pytest.mark.parametrize("form", ["matmul", "gemm", "bias_first"])
def test_linear_rnn_fuses_as_affine(form):
    """h' = x·Wᵀ + h·Rᵀ + b: RNN with Affine(1, 0), equal to a hand-written RNN with the same weights."""
    W, R, Wb, Rb = R_(0, H, I), R_(1, H, H), R_(2, H), R_(3, H)

    def build(b):
        return b.op("Add", b.linear("x", W, Wb, form=form), b.linear("h", R, Rb, form=form))

    model = _rnn_scan(build)
    out = cb.check_fused(model, "RNN")
    node, _ = cb.native(out)
    assert _affine_attrs(node) == {"activations": ["Affine"], "activation_alpha": [1.0], "activation_beta": [0.0]}
    native = cb.native_model("RNN", W, R, np.concatenate([Wb, Rb]), **AFFINE)
    cb.assert_same_as_native(out, native)
    cb.assert_same_as_native(model, native, shapes=((5, 2),))


def test_alpha_pre_plus_beta_written_with_mul_add_equals_native_affine_with_those_values():
    """h' = 0.5·(x·Wᵀ + h·Rᵀ + b) + 0.25 (Mul/Add after the pre-activation) equals the native RNN
    with activations=[Affine], alpha=0.5, beta=0.25 written by hand (the fused op folds the scale
    into its weights)."""
    W, R, Wb = R_(0, H, I), R_(1, H, H), R_(2, H)

    def build(b):
        pre = b.op("Add", b.linear("x", W, Wb), b.linear("h", R))
        scaled = b.op("Mul", pre, b.const(np.float32(0.5), "alpha", where="body"))
        return b.op("Add", scaled, b.const(np.float32(0.25), "beta", where="body"))

    model = _rnn_scan(build)
    out = cb.check_fused(model, "RNN")
    native = cb.native_model("RNN", W, R, np.concatenate([Wb, np.zeros(H)]), activations=["Affine"],
                             activation_alpha=[0.5], activation_beta=[0.25])
    cb.assert_same_as_native(out, native)
    cb.assert_same_as_native(model, native, shapes=((5, 2),))


def test_affine_rnn_reading_a_run_time_weight_fuses():
    W, R, Wb = R_(0, H, I), R_(1, H, H), R_(2, H)
    model = cb.weights_as_inputs(_rnn_scan(lambda b: b.op("Add", b.linear("x", W, Wb), b.linear("h", R))))
    cb.check_fused(model, "RNN")


@pytest.mark.parametrize("write", ["ema", "running_sum"])
def test_elementwise_linear_recurrences_stay_loops(write):
    """EMA h' = a⊙h + (1-a)⊙x·W and a running sum h' = h + x·W are linear, but in h they are
    elementwise: a native RNN would do an H×H product per step for O(H) work."""
    def build(b):
        xw = b.linear("x", R_(0, H, I))
        if write == "running_sum":
            return b.op("Add", "h", xw)
        return b.op("Add", b.op("Mul", b.const(np.float32(0.8), "a", where="body"), "h"),
                    b.op("Mul", b.const(np.float32(0.2), "a2", where="body"), xw))

    reason = cb.declined(_rnn_scan(build))
    assert "h read elementwise only" in reason and "H×H products" in reason, reason


def test_lstm_without_output_activation_fuses_with_affine_h():
    """h' = o ⊙ c' (no tanh on the cell state): LSTM with activations [Sigmoid, Tanh, Affine]."""
    W, R, Wb, Rb = R_(0, 4 * H, I), R_(1, 4 * H, H), R_(2, 4 * H), R_(3, 4 * H)
    body = cb.Body()
    h_new, c_new = cb.lstm(body, "x", "h", "c", acts=("Sigmoid", "Tanh", "Identity"))
    model = cb.scan_model(body, [("h", h_new, H), ("c", c_new, H)], ys=[h_new])
    out = cb.check_fused(model, "LSTM")
    node, attrs = cb.native(out)
    assert [a.decode() for a in attrs["activations"]] == ["Sigmoid", "Tanh", "Affine"]
    native = cb.native_model("LSTM", W, R, np.concatenate([Wb, Rb]), activations=["Sigmoid", "Tanh", "Affine"],
                             activation_alpha=[1.0], activation_beta=[0.0])
    cb.assert_same_as_native(out, native)
    cb.assert_same_as_native(model, native, shapes=((5, 2),))


def test_gru_with_a_linear_candidate_is_declined_with_the_reason():
    """A GRU whose candidate has no tanh (g = Affine) is not matched: the update expands through
    the candidate's matrix products; the reason says so (minGRU-like forms, a near-miss)."""
    body = cb.Body()
    h_new = cb.gru(body, "x", "h", acts=("Sigmoid", "Identity"))
    reason = cb.declined(cb.scan_model(body, [("h", h_new, H)], ys=[h_new]))
    assert "matrix product outside any activation" in reason, reason


# -- ThresholdedRelu at x == alpha -----------------------------------------------------------

def test_thresholded_relu_spec_texts_differ_at_alpha():
    """The operator: y = x for x > alpha; the recurrent ops' activation list: x if x >= alpha."""
    op_doc = onnx.defs.get_schema("ThresholdedRelu").doc
    assert "y = x for x > alpha, y = 0 otherwise" in " ".join(op_doc.split())
    for kind in ("RNN", "GRU", "LSTM"):
        assert "ThresholdedRelu(x) - x if x >= alpha else 0" in " ".join(onnx.defs.get_schema(kind).doc.split())


def test_thresholded_relu_cell_at_x_equal_alpha_is_declined_and_differs_from_the_spec_activation():
    """A cell whose pre-activation is exactly alpha (W = R = 0, bias = alpha): the body's
    ThresholdedRelu op gives 0 (both engines), the recurrent activation per the spec keeps alpha;
    fuse declines and its reason says which side zeroes x == alpha."""
    alpha = 0.5
    body = cb.Body()
    pre = body.op("Add", body.linear("x", np.zeros((H, I), np.float32)), body.linear("h", np.zeros((H, H), np.float32)))
    pre = body.op("Add", pre, body.const(np.full(H, alpha, np.float32), "b"))
    h_new = body.op("ThresholdedRelu", pre, alpha=alpha)
    model = cb.scan_model(body, [("h", h_new, H)], ys=[h_new])
    (feeds,) = cb.feeds(model, T=3, B=2)
    for engine in ("ort", "reference"):
        got = run_engine(model, feeds, engine)
        np.testing.assert_array_equal(got["Y0"], np.zeros((3, 2, H), np.float32))  # the op zeroes x == alpha
    spec_activation = np.where(np.float32(alpha) >= alpha, np.float32(alpha), 0)  # x if x >= alpha else 0
    assert spec_activation == alpha  # ...the recurrent activation keeps it
    reason = cb.declined(model)
    assert "zeroes x == alpha" in reason and "keeps it (x if x >= alpha)" in reason, reason


@pytest.mark.parametrize("h_act", ["Tanh", "Identity"])
def test_lstm_with_a_linear_cell_candidate_fuses_with_affine_g(h_act):
    """g = Affine: c' = f⊙c + i⊙(x·W + h·R + b); with h_act Identity too (h = o⊙c')."""
    W, R, Wb, Rb = R_(0, 4 * H, I), R_(1, 4 * H, H), R_(2, 4 * H), R_(3, 4 * H)
    body = cb.Body()
    h_new, c_new = cb.lstm(body, "x", "h", "c", acts=("Sigmoid", "Identity", h_act))
    model = cb.scan_model(body, [("h", h_new, H), ("c", c_new, H)], ys=[h_new])
    out = cb.check_fused(model, "LSTM")
    acts = ["Sigmoid", "Affine", "Affine" if h_act == "Identity" else "Tanh"]
    assert [a.decode() for a in cb.native(out)[1]["activations"]] == acts
    n_affine = acts.count("Affine")
    native = cb.native_model("LSTM", W, R, np.concatenate([Wb, Rb]), activations=acts,
                             activation_alpha=[1.0] * n_affine, activation_beta=[0.0] * n_affine)
    cb.assert_same_as_native(out, native)
    cb.assert_same_as_native(model, native, shapes=((5, 2),))
