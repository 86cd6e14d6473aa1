"""fuse, the cells users write that the matcher used to miss (issue 32), each built the way its
producer writes it and compared with the Scan and with the native op written by hand.

Clip as the activation (ReLU6, hardtanh): the recurrent ops' ``clip`` clips the pre-activation
to [-c, c] before the activation, so Clip(p, 0, c) = Relu(clip(p)) and Clip(p, -c, c) =
Affine(1, 0)(clip(p)) exactly; a Clip on the stacked pre-activation before the gate Split is the
clip of every gate it feeds."""

from __future__ import annotations

import numpy as np
import pytest

import cell_builders as cb

H, I = cb.H, cb.I
AFFINE = dict(activation_alpha=[1.0], activation_beta=[0.0])


def big(seed, *shape):
    """Weights large enough that pre-activations reach past the clip bounds on normal feeds."""
    return cb.rand(seed, *shape, scale=3.0)


def _clip(b, value, lo, hi):
    bound = lambda v: b.const(np.float32(v), "bound", where="body") if v is not None else ""  # noqa: E731
    return b.op("Clip", value, bound(lo), bound(hi))


def _rnn_scan(build, opset=17):
    body = cb.Body(opset=opset)
    h_new = build(body)
    return cb.scan_model(body, [("h", h_new, H)], ys=[h_new])


# -- 1. a Clip as the activation ---------------------------------------------------------------

@pytest.mark.parametrize("lo, hi, act, clip", [
    (0.0, 6.0, "Relu", 6.0),  # ReLU6: F.relu6 / nn.Hardtanh(0, 6) export as Clip(p, 0, 6)
    (-1.0, 1.0, "Affine", 1.0),  # hardtanh
    (0.0, None, "Relu", None),  # clamp(min=0)
])
def test_clip_activation_fuses_to_the_native_activation_with_clip(lo, hi, act, clip):
    W, R, Wb, Rb = big(0, H, I), big(1, H, H), big(2, H), big(3, H)
    model = _rnn_scan(lambda b: _clip(b, b.op("Add", b.linear("x", W, Wb, form="gemm"), b.linear("h", R, Rb, form="gemm")), lo, hi))
    out = cb.check_fused(model, "RNN")
    _, attrs = cb.native(out)
    assert attrs["activations"] == [act.encode()] and attrs.get("clip") == clip
    native = cb.native_model("RNN", W, R, np.concatenate([Wb, Rb]), activations=[act],
                             **({"clip": clip} if clip is not None else {}), **(AFFINE if act == "Affine" else {}))
    cb.assert_same_as_native(out, native)
    cb.assert_same_as_native(model, native, shapes=((9, 3),))


def test_tf1_basic_rnn_cell_with_relu6_fuses():
    """TF1 ``BasicRNNCell(activation=tf.nn.relu6)`` through tf2onnx: relu6(Concat([x, h]) @ K + b),
    Relu6 written as Clip(·, 0, 6) with its bounds as Constant inputs."""
    W, R, Wb = big(0, H, I), big(1, H, H), big(2, H)
    K = np.concatenate([W.T, R.T])

    def build(b):
        pre = b.op("Add", b.op("MatMul", b.op("Concat", "x", "h", axis=1), b.const(K, "kernel")), b.const(Wb, "bias"))
        lo, hi = (b.const(np.float32(v), "relu6", where="node") for v in (0.0, 6.0))
        return b.op("Clip", pre, lo, hi)

    model = _rnn_scan(build, opset=13)
    out = cb.check_fused(model, "RNN")
    assert cb.native(out)[1]["clip"] == 6.0
    cb.assert_same_as_native(out, cb.native_model("RNN", W, R, np.concatenate([Wb, np.zeros(H)]), activations=["Relu"], clip=6.0))


def test_relu_then_clip_fuses_as_relu6():
    """onnx-tf's Relu6: Clip(Relu(p), 0, 6) = min(relu(p), 6)."""
    W, R, Wb = big(0, H, I), big(1, H, H), big(2, H)
    model = _rnn_scan(lambda b: _clip(b, b.op("Relu", b.op("Add", b.linear("x", W, Wb), b.linear("h", R))), 0.0, 6.0))
    out = cb.check_fused(model, "RNN")
    cb.assert_same_as_native(out, cb.native_model("RNN", W, R, np.concatenate([Wb, np.zeros(H)]), activations=["Relu"], clip=6.0))


@pytest.mark.parametrize("lo, hi", [(-1.0, 2.0), (0.5, 6.0), (None, 6.0)])
def test_asymmetric_clip_activation_is_declined(lo, hi):
    W, R = big(0, H, I), big(1, H, H)
    reason = cb.declined(_rnn_scan(lambda b: _clip(b, b.op("Add", b.linear("x", W), b.linear("h", R)), lo, hi)))
    assert f"is Clip(·, {lo}, {hi}): the recurrent ops clip the pre-activation to a symmetric [-c, c]" in reason


def test_hardtanh_gru_candidate_with_unclipped_gates_is_declined():
    """clip applies to every gate: a hardtanh candidate beside unclipped sigmoid gates is no GRU clip."""
    body = cb.Body()
    h_new = cb.gru(body, "x", "h", acts=("Sigmoid", "Clip"), act_attrs=({}, {}))
    # the builder's "Clip" candidate has no bounds; give it ±1
    clip = next(n for n in body.nodes if n.op_type == "Clip")
    clip.input.extend([body.const(np.float32(-1.0), "lo", where="body"), body.const(np.float32(1.0), "hi", where="body")])
    reason = cb.declined(cb.scan_model(body, [("h", h_new, H)], ys=[h_new]))
    assert "clips differ across the gates (z None, r None, h̃ 1.0)" in reason


# -- 2. a Clip on the stacked pre-activation, before the gate Split ----------------------------

def _clipped_lstm(c, *, order="torch", unclipped=()):
    """PyTorch-style LSTM cell with ``gates = clamp(x·Wᵀ + h·Rᵀ + b, -c, c)`` split into i, f, g, o;
    gates named in ``unclipped`` read the Split of the unclipped sum instead. Returns the model
    and the native LSTM (ONNX order i, o, f, c) with the same weights."""
    W, R, Wb, Rb = big(0, 4 * H, I), big(1, 4 * H, H), big(2, 4 * H), big(3, 4 * H)
    names = ["i", "f", "c", "o"] if order == "torch" else ["i", "o", "f", "c"]
    onnx_order = ["i", "o", "f", "c"]
    rows = lambda a, g: a[onnx_order.index(g) * H:(onnx_order.index(g) + 1) * H]  # noqa: E731
    stack = lambda a: np.concatenate([rows(a, g) for g in names])  # noqa: E731
    body = cb.Body()
    pre = body.op("Add", body.linear("x", stack(W), stack(Wb), form="gemm"), body.linear("h", stack(R), stack(Rb), form="gemm"))
    clipped = dict(zip(names, body.split(_clip(body, pre, -c, c), 4)))
    if unclipped:
        raw = dict(zip(names, body.split(pre, 4)))
        clipped.update({g: raw[g] for g in unclipped})
    i, f, o = (body.op("Sigmoid", clipped[g]) for g in "ifo")
    g = body.op("Tanh", clipped["c"])
    c_new = body.op("Add", body.op("Mul", f, "c"), body.op("Mul", i, g))
    h_new = body.op("Mul", o, body.op("Tanh", c_new))
    model = cb.scan_model(body, [("h", h_new, H), ("c", c_new, H)], ys=[h_new])
    native = cb.native_model("LSTM", W, R, np.concatenate([Wb, Rb]), clip=c)
    return model, native


@pytest.mark.parametrize("order", ["torch", "onnx"])
def test_clip_before_the_gate_split_is_the_lstm_clip(order):
    model, native = _clipped_lstm(2.5, order=order)
    out = cb.check_fused(model, "LSTM")
    assert cb.native(out)[1]["clip"] == 2.5
    cb.assert_same_as_native(out, native)
    cb.assert_same_as_native(model, native, shapes=((9, 3),))


def test_clip_before_the_split_read_by_some_gates_only_is_declined():
    model, _ = _clipped_lstm(2.5, unclipped=("o",))
    assert "clips differ across the gates; LSTM clips all or none" in cb.declined(model)


def test_asymmetric_clip_before_the_gate_split_is_declined():
    body = cb.Body()
    pre = body.op("Add", body.linear("x", big(0, 3 * H, I)), body.linear("h", big(1, 3 * H, H)))
    a, g, o = body.split(_clip(body, pre, -1.0, 3.0), 3)
    c_new = body.op("Add", body.op("Mul", body.op("Sigmoid", a), "c"), body.op("Mul", body.op("Sigmoid", a), body.op("Tanh", g)))
    h_new = body.op("Mul", body.op("Sigmoid", o), body.op("Tanh", c_new))
    reason = cb.declined(cb.scan_model(body, [("h", h_new, H), ("c", c_new, H)], ys=[h_new]))
    assert "bounds [-1.0, 3.0] are not a symmetric ±c (the clip attribute)" in reason
