"""fuse, the forms of issue 12: weights behind nodes, Concat([x, h])·W cells (Keras/TF1),
Keras GRU reset_after with a packed bias, coupled input-forget LSTM, biases spread over Adds
and Gemm C, activations with alpha/beta, ScaledTanh, clip. Each is fused into the expected native
op with the expected attributes, equal to the original on both engines, and equal to a native op
written by hand from the same weights (laid out here, independently of the matcher)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import cell_builders as cb
from equivalence import ops, outer_initializers

H, I = cb.H, cb.I
R_ = cb.rand


def _check(model, kind, native, **attrs):
    out = cb.check_fused(model, kind)
    node, got = cb.native(out)
    for key, value in attrs.items():
        assert got.get(key) == value, (key, got.get(key), value)
    cb.assert_same_as_native(out, native)
    cb.assert_same_as_native(model, native, shapes=((7, 2),))  # the original agrees too: the weights here are right
    return out, node


def _model(build, kind, **body_kw):
    body = cb.Body(**body_kw)
    res = build(body)
    if kind == "LSTM":
        return cb.scan_model(body, [("h", res[0], body.H), ("c", res[1], body.H)], ys=[res[0]])
    return cb.scan_model(body, [("h", res, body.H)], ys=[res])


def _rnn_weights(f16=False):
    W, R, Wb, Rb = R_(0, H, I), R_(1, H, H), R_(2, H), R_(3, H)
    if f16:
        W, R, Wb, Rb = (v.astype(np.float16).astype(np.float32) for v in (W, R, Wb, Rb))
    return W, R, np.concatenate([Wb, Rb])


def _gated_weights(gates, f16=False):
    W, R, Wb, Rb = R_(0, gates * H, I), R_(1, gates * H, H), R_(2, gates * H), R_(3, gates * H)
    if f16:
        W, R, Wb, Rb = (v.astype(np.float16).astype(np.float32) for v in (W, R, Wb, Rb))
    return W, R, np.concatenate([Wb, Rb])


WRAPS = ["transpose", "cast16", "reshape", "slice", "split", "concat", "unsqueeze", "identity", "constant"]


@pytest.mark.parametrize("wrap, kind, where", [
    (w, ("RNN", "GRU", "LSTM")[k % 3], ("body", "outer")[k % 2]) for k, w in enumerate(WRAPS)
] + [("transpose", "LSTM", "outer"), ("cast16", "GRU", "body"), ("split", "RNN", "outer")])
def test_weights_behind_nodes_become_new_initializers(wrap, kind, where):
    """The native op reads initializers in its own layout: no Transpose/Cast/... chain is left."""
    where = "body" if wrap == "constant" else where
    model = _model(lambda b: cb.cell(kind, b)[1] if kind != "LSTM" else cb.lstm(b, "x", "h", "c"), kind,
                   wrap=wrap, wrap_where=where)
    f16 = wrap == "cast16"
    W, R, B = _rnn_weights(f16) if kind == "RNN" else _gated_weights(3 if kind == "GRU" else 4, f16)
    attrs = {"linear_before_reset": 0} if kind == "GRU" else {}
    out, node = _check(model, kind, cb.native_model(kind, W, R, B, **attrs), **attrs)
    inits = set(outer_initializers(out))
    assert set(node.input[1:4]) <= inits, node.input
    left = Counter(n.op_type for n in cb.guarded_nodes(out.graph))  # the empty-X guard's branch aside
    assert not any(left[op] for op in ("Cast", "Reshape", "Slice", "Split", "Concat", "Identity", "Constant")), left


def test_concat_rnn_tf1_basic_rnn_cell():
    W, R, Wb = R_(0, H, I), R_(1, H, H), R_(2, H)
    model = _model(lambda b: cb.concat_rnn(b, "x", "h"), "RNN")
    _check(model, "RNN", cb.native_model("RNN", W, R, np.concatenate([Wb, np.zeros(H)])))


@pytest.mark.parametrize("trans_b, alpha, beta", [(1, 1.0, 1.0), (0, 0.5, 2.0)])
def test_concat_rnn_through_gemm(trans_b, alpha, beta):
    """PyTorch's ``Linear(cat([x, h]))``: Gemm(Concat([x, h]), K, b, transB=1), K [H, I+H]
    (and the transB=0 layout, with alpha and beta folded into the weights and the bias)."""
    W, R, Wb = R_(0, H, I), R_(1, H, H), R_(2, H)
    K = np.concatenate([W, R], axis=1) / alpha

    def build(b):
        cat = b.op("Concat", "x", "h", axis=-1)
        gemm = b.op("Gemm", cat, b.const(K if trans_b else K.T), b.const(Wb / beta, "b"), transB=trans_b,
                    alpha=alpha, beta=beta)
        return b.op("Tanh", gemm)

    _check(_model(build, "RNN"), "RNN", cb.native_model("RNN", W, R, np.concatenate([Wb, np.zeros(H)])))


def test_concat_gru_tf1_gru_cell():
    W, R, Wb = R_(0, 3 * H, I), R_(1, 3 * H, H), R_(2, 3 * H)
    model = _model(lambda b: cb.concat_gru(b, "x", "h"), "GRU")
    native = cb.native_model("GRU", W, R, np.concatenate([Wb, np.zeros(3 * H)]), linear_before_reset=0)
    _check(model, "GRU", native, linear_before_reset=0)


def test_concat_lstm_tf1_basic_lstm_cell_with_forget_bias():
    _check(_model(lambda b_: cb.concat_lstm(b_, "x", "h", "c"), "LSTM"), "LSTM", cb.concat_lstm_native())


@pytest.mark.parametrize("bias_cut, rec_cut", [("gather", "split"), ("split", "split"), ("gather", "strided")])
def test_keras_gru_reset_after_with_a_packed_bias(bias_cut, rec_cut):
    """``strided``: Keras 3 through tf2onnx cuts the recurrent gates with TF's ``h[:, a:b]``,
    a Slice over axes [0, 1] whose batch end is INT32_MAX (whole)."""
    W, R, bias = R_(0, 3 * H, I), R_(1, 3 * H, H), R_(2, 2, 3 * H)
    native = cb.native_model("GRU", W, R, bias.reshape(-1), linear_before_reset=1)
    model = _model(lambda b: cb.keras_gru(b, "x", "h", bias_cut=bias_cut, rec_cut=rec_cut), "GRU")
    _check(model, "GRU", native, linear_before_reset=1)


def test_a_slice_that_also_cuts_batch_rows_is_declined():
    """The same Slice keeping only the first 2 batch rows is not a gate cut."""
    model = _model(lambda b: cb.keras_gru(b, "x", "h", rec_cut="strided_rows"), "GRU")
    assert "does not cut the last axis alone" in cb.declined(model)


@pytest.mark.parametrize("write", ["input", "forget"])
def test_coupled_input_forget_lstm(write):
    W, R, Wb = R_(0, 3 * H, I), R_(1, 3 * H, H), R_(2, 3 * H)
    (wa, wg, wo), (ra, rg, ro), (ba, bg, bo) = np.split(W, 3), np.split(R, 3), np.split(Wb, 3)
    s = 1.0 if write == "input" else -1.0  # f = σ(a) means i = 1 - f = σ(-a)
    z, zr, zb = np.zeros_like(wa), np.zeros_like(ra), np.zeros(H)
    native = cb.native_model("LSTM", np.concatenate([s * wa, wo, z, wg]), np.concatenate([s * ra, ro, zr, rg]),
                             np.concatenate([s * ba, bo, zb, bg, np.zeros(4 * H)]), input_forget=1)
    _check(_model(lambda b: cb.coupled_lstm(b, "x", "h", "c", write=write), "LSTM"), "LSTM", native, input_forget=1)


def test_bias_in_gemm_c_and_several_adds():
    W, R = R_(0, H, I), R_(1, H, H)
    b = 0.5 * R_(2, H) + R_(3, H) + R_(4, H)
    model = _model(lambda b_: cb.many_bias_rnn(b_, "x", "h"), "RNN")
    _check(model, "RNN", cb.native_model("RNN", W, R, np.concatenate([b, np.zeros(H)])))


@pytest.mark.parametrize("act, attrs, alpha, beta", [
    ("Relu", {}, [], []),
    ("LeakyRelu", {"alpha": 0.2}, [0.2], []),
    ("Elu", {"alpha": 0.7}, [0.7], []),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, [0.3], [0.4]),
    ("Softsign", {}, [], []),
    ("Softplus", {}, [], []),
])
def test_rnn_activations_with_alpha_and_beta(act, attrs, alpha, beta):
    model = _model(lambda b: cb.rnn(b, "x", "h", act=act, act_attrs=attrs), "RNN")
    native = cb.native_model("RNN", *_rnn_weights(), activations=[act], **(
        {"activation_alpha": alpha} if alpha else {}), **({"activation_beta": beta} if beta else {}))
    _, node = _check(model, "RNN", native, activations=[act.encode()])
    got = {a.name: list(a.floats) for a in node.attribute if a.name.startswith("activation_")}
    assert got.get("activation_alpha", []) == pytest.approx(alpha) and got.get("activation_beta", []) == pytest.approx(beta)


def test_scaled_tanh_and_clip():
    def build(b):
        t = cb.rnn(b, "x", "h", clip=0.8)
        return b.op("Mul", b.const(np.float32(1.7), "alpha", where="body"), t)

    native = cb.native_model("RNN", *_rnn_weights(), activations=["ScaledTanh"], activation_alpha=[1.7],
                             activation_beta=[1.0], clip=0.8)
    _, node = _check(_model(build, "RNN"), "RNN", native, activations=[b"ScaledTanh"])


@pytest.mark.parametrize("acts, attrs", [
    (("HardSigmoid", "Softsign"), ({"alpha": 0.3}, {})),
    (("Sigmoid", "LeakyRelu"), ({}, {"alpha": 0.3})),
])
def test_gru_activation_slots(acts, attrs):
    model = _model(lambda b: cb.gru(b, "x", "h", lbr=1, acts=acts, act_attrs=attrs), "GRU")
    alpha = [v for a in attrs for k, v in a.items() if k == "alpha"]
    extra = {"activation_alpha": alpha} if alpha else {}
    if acts[0] == "HardSigmoid":
        extra["activation_beta"] = [0.5]
    native = cb.native_model("GRU", *_gated_weights(3), linear_before_reset=1, activations=list(acts), **extra)
    _check(model, "GRU", native, activations=[a.encode() for a in acts])


def test_lstm_activation_slots_with_peepholes():
    model = _model(lambda b: cb.lstm(b, "x", "h", "c", peep=True, acts=("HardSigmoid", "Elu", "Softsign")), "LSTM")
    W, R, B = _gated_weights(4)
    native = cb.native_model("LSTM", W, R, B, P=R_(4, 3 * H), activations=["HardSigmoid", "Elu", "Softsign"],
                             activation_alpha=[0.2, 1.0], activation_beta=[0.5])
    _check(model, "LSTM", native)


# -- sequences reversed outside the Scan -------------------------------------------------------

def _reversed_input(model, scan_index=-1, how="reverse_sequence", lens=5):
    """Make Scan ``scan_index`` read X reversed along time (static X [5, 3, I])."""
    from onnx import helper as h
    from onnx import numpy_helper

    g = model.graph
    for v in list(g.input) + list(g.output):
        for d in v.type.tensor_type.shape.dim:
            if d.dim_param in ("seq", "batch"):
                d.dim_value = {"seq": 5, "batch": 3}[d.dim_param]
    scan = [n for n in g.node if n.op_type == "Scan"][scan_index]
    scan.input[-1] = "X_rev"
    if how == "reverse_sequence":
        g.initializer.append(numpy_helper.from_array(np.full(3, lens, np.int64), "lens"))
        node = h.make_node("ReverseSequence", ["X", "lens"], ["X_rev"], time_axis=0, batch_axis=1)
    else:
        for k, v in (("st", -1), ("en", np.iinfo(np.int64).min), ("ax", 0), ("step", -1)):
            g.initializer.append(numpy_helper.from_array(np.array([v], np.int64), k))
        node = h.make_node("Slice", ["X", "st", "en", "ax", "step"], ["X_rev"])
    g.node.insert(0, node)
    return model


@pytest.mark.parametrize("how", ["reverse_sequence", "slice"])
def test_a_scan_over_reversed_x_becomes_a_reverse_native_op(how):
    model = _reversed_input(_model(lambda b: cb.cell("GRU", b, lbr=1)[1], "GRU"), how=how)
    out = cb.check_fused(model, "GRU", inputs=False)
    assert cb.native(out)[1]["direction"] == b"reverse"
    assert ops(out)["ReverseSequence"] == 0


def test_a_partial_reverse_sequence_is_not_a_reversal():
    """Lengths shorter than T leave the tail unreversed: the Scan reads that tensor forward."""
    model = _reversed_input(_model(lambda b: cb.cell("RNN", b)[1], "RNN"), lens=3)
    out = cb.check_fused(model, "RNN", inputs=False)
    assert cb.native(out)[1].get("direction", b"forward") == b"forward"
    assert ops(out)["ReverseSequence"] == 1


def test_forward_scan_and_scan_over_reverse_sequence_merge_into_bidirectional():
    first = _model(lambda b: cb.lstm(b, "x", "h", "c"), "LSTM")
    body = cb.Body(prefix="b_")
    res = cb.lstm(body, "x", "h", "c", seed=7)
    second = cb.scan_model(body, [("h", res[0], H), ("c", res[1], H)], ys=[res[0]])
    model = _reversed_input(cb.two_scans(first, second))
    out = cb.check_fused(model, "LSTM", inputs=False)
    assert cb.native(out)[1]["direction"] == b"bidirectional"


# -- the committed hand-built samples (models/generate_cells.py) -------------------------------

HAND_BUILT = {  # name -> (native op, attributes it must have)
    "keras_gru_reset_after": ("GRU", {"linear_before_reset": 1}),
    "tf1_gru_cell": ("GRU", {"linear_before_reset": 0}),
    "tf1_basic_rnn_cell": ("RNN", {}),
    "coupled_lstm": ("LSTM", {"input_forget": 1}),
    "gru_weights_transposed_outer": ("GRU", {"linear_before_reset": 1}),
    "lstm_fp16_weights": ("LSTM", {}),
    "rnn_packed_slice_leakyrelu_clip": ("RNN", {"activations": [b"LeakyRelu"], "clip": pytest.approx(0.8)}),
    "rnn_bias_gemm_c_adds": ("RNN", {}),
    "keras_concat_lstm": ("LSTM", {}),
}


@pytest.mark.parametrize("name", sorted(HAND_BUILT))
def test_committed_hand_built_samples_fuse(name):
    import os

    import onnx

    model = onnx.load(os.path.join(os.path.dirname(__file__), "..", "models", "cells", f"{name}.onnx"))
    kind, attrs = HAND_BUILT[name]
    out = cb.check_fused(model, kind, inputs=name != "keras_concat_lstm")
    got = cb.native(out)[1]
    for key, value in attrs.items():
        assert value == got.get(key), (key, got.get(key))


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_scan8_cells_with_weights_behind_transposes(kind):
    body = cb.Body(batch=False, wrap="transpose", wrap_where="outer", opset=8)
    states, h_new = cb.cell(kind, body, **({"form": "matvec"} if kind == "RNN" else {}))
    out = cb.check_fused(cb.scan8_model(body, states, ys=[h_new]), kind)
    node, _ = cb.native(out)
    assert set(node.input[1:4]) <= set(outer_initializers(out))
    assert ops(out)["Transpose"] == 2  # X to [T, B, I] and Y back: glue, no weight chain


def test_both_halves_of_a_bidirectional_pair_with_weights_behind_nodes():
    first_body = cb.Body(wrap="transpose")
    states, h_new = cb.cell("GRU", first_body, lbr=1)
    first = cb.scan_model(first_body, states, ys=[h_new])
    second_body = cb.Body(wrap="cast16", prefix="b_")
    states, h_new = cb.cell("GRU", second_body, seed=5, lbr=1)
    second = cb.scan_model(second_body, states, ys=[h_new], in_dir=1)
    out = cb.check_fused(cb.two_scans(first, second), "GRU")
    assert cb.native(out)[1]["direction"] == b"bidirectional"
