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
