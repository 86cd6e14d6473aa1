"""fuse, RNN cells: every form fuses to one RNN that matches the Scan numerically in
onnxruntime and the reference executor; near-misses are declined with their reason."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import cell_builders as cb
from equivalence import assert_equivalent, ops

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")


def rnn_model(batch=True, where="body", opset=17, ys=None, finals=True, scan=None, **cell):
    body = cb.Body(batch=batch, where=where, opset=opset)
    h_new = cb.rnn(body, "x", "h", **cell)
    return cb.scan_model(body, [("h", h_new, cb.H)], ys=[h_new] if ys is None else ys, opset=opset,
                         finals=finals, **(scan or {}))


def check_fused(model, kind="RNN", inputs=True, **feed_kw):
    return cb.check_fused(model, kind, inputs, **feed_kw)


@pytest.mark.parametrize(
    "form, where, bias, order",
    [
        ("matmul", "body", "split", "xh"),
        ("matmul", "outer", "split", "hx"),
        ("bias_first", "node", "split", "xh"),
        ("gemm", "outer", "split", "xh"),  # PyTorch's nn.Linear export
        ("gemm", "body", "merged", "hx"),
        ("gemm_t", "node", "none", "xh"),
        ("matmul", "body", "merged", "sum"),
    ],
)
def test_rnn_forms_fuse(form, where, bias, order):
    out = check_fused(rnn_model(form=form, where=where, bias=bias, order=order))
    node, attrs = cb.native(out)
    assert attrs["activations"] == [b"Tanh"] and attrs["hidden_size"] == cb.H


@pytest.mark.parametrize(
    "act, attrs",
    [("Relu", None), ("Sigmoid", None), ("LeakyRelu", {"alpha": 0.2}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
     ("Elu", {"alpha": 0.7}), ("Softsign", None), ("Softplus", None)],
)
def test_rnn_activations_fuse_with_their_parameters(act, attrs):
    out = check_fused(rnn_model(act=act, act_attrs=attrs))
    _, native_attrs = cb.native(out)
    assert native_attrs["activations"] == [act.encode()]
    if attrs and "alpha" in attrs:
        assert native_attrs["activation_alpha"] == pytest.approx([attrs["alpha"]])


@pytest.mark.parametrize("form", ["matmul", "matvec"])
def test_rnn_without_batch_axis(form):
    check_fused(rnn_model(batch=False, form=form))


@pytest.mark.parametrize("opset", [9, 11, 13, 14, 20])
def test_emitted_ops_are_valid_at_the_model_opset(opset):
    out = check_fused(rnn_model(opset=opset), inputs=False)
    assert out.opset_import[0].version == opset


def test_only_y_read_gives_an_rnn_without_y_h():
    out = check_fused(rnn_model(finals=False))
    node, _ = cb.native(out)
    assert len(node.output) == 1


def test_only_final_state_read_gives_an_rnn_without_y():
    out = check_fused(rnn_model(ys=()))
    node, _ = cb.native(out)
    assert node.output[0] == "" and node.output[1]


def test_symmetric_clip_becomes_the_clip_attribute():
    out = check_fused(rnn_model(clip=0.3))
    assert cb.native(out)[1]["clip"] == pytest.approx(0.3)


def test_torch_exported_rnn_fuses_and_matches_torch():
    path = os.path.join(MODELS, "torch_scan_rnn.onnx")
    model = onnx.load(path)
    out = check_fused(model, inputs=False)
    cb.matches_torch(out, "torch_scan_rnn", MODELS)


def test_torch_reverse_dim1_rnn_fuses_after_canonicalize():
    import scanopt

    model = onnx.load(os.path.join(MODELS, "torch_scan_rnn_rev_dim1.onnx"))
    out, report = scanopt.optimize(model, verify=False, options={"target": "portable"})
    fused = [o for o in report.outcomes if o.pass_name == "fuse"]
    assert [o.applied for o in fused] == [True] and "reverse" in fused[0].detail
    assert ops(out)["Scan"] == 0 and ops(out)["Slice"] == 0
    assert_equivalent(model, out)
    expected = np.load(os.path.join(MODELS, "torch_scan_rnn_rev_dim1.expected.npz"))
    sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(["y"], {"x": expected["x"], "h0": expected["h0"]})
    np.testing.assert_allclose(y, expected["y"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["scan_rnn", "scan_short_static"])
def test_sample_models_fuse(name):
    check_fused(onnx.load(os.path.join(MODELS, f"{name}.onnx")), inputs=False)


# -- declines ------------------------------------------------------------------------------

def declined(model) -> str:
    out, outcomes = cb.fuse(model)
    assert [o.applied for o in outcomes] == [False]
    assert ops(out)["Scan"] == 1
    return outcomes[0].detail


def _rnn_then(edit):
    """An RNN body whose new state is ``edit(body, tanh output, tanh input)``."""
    body = cb.Body()
    h_new = cb.rnn(body, "x", "h")
    out = edit(body, h_new, body.nodes[-1].input[0])
    return cb.scan_model(body, [("h", out, cb.H)], ys=[out])


def test_extra_op_after_the_activation_is_declined():
    reason = declined(_rnn_then(lambda b, hn, pre: b.op("Relu", hn)))
    assert "the pre-activation of Relu reads 'tanh_" in reason and "(Tanh output)" in reason


def test_activation_of_only_part_of_the_sum_is_declined():
    def edit(b, hn, pre):
        x_only = b.op("Tanh", b.linear("x", cb.rand(5, cb.H, cb.I)))
        return b.op("Add", x_only, b.linear("h", cb.rand(6, cb.H, cb.H)))

    reason = declined(_rnn_then(edit))
    assert "the new state has a matrix product outside any activation: 'tanh_" in reason


def test_state_update_that_is_no_cell_is_declined():
    reason = declined(_rnn_then(lambda b, hn, pre: b.op("Mul", hn, b.op("Sigmoid", "h"))))
    assert "the new state expands to" in reason and "not an activation (RNN), nor (1-z)⊙h̃ + z⊙h" in reason


def test_asymmetric_clip_is_declined():
    def edit(b, hn, pre):
        return b.op("Tanh", b.op("Clip", pre, b.const(np.float32(-1.0), "lo"), b.const(np.float32(2.0), "hi")))

    assert "bounds [-1.0, 2.0] are not a symmetric ±c" in declined(_rnn_then(edit))


def test_thresholded_relu_is_declined():
    reason = declined(rnn_model(act="ThresholdedRelu"))
    assert "is a ThresholdedRelu output" in reason and "zeroes x == alpha" in reason and "x >= alpha" in reason


def test_pre_activation_as_extra_scan_output_is_declined():
    body = cb.Body()
    h_new = cb.rnn(body, "x", "h")
    pre = body.nodes[-1].input[0]
    model = cb.scan_model(body, [("h", h_new, cb.H)], ys=[h_new, pre])
    assert "scan output 1 is" in declined(model) and "not the hidden state" in declined(model)


def test_unprovable_batch_sizes_fuse_with_both_expanded_to_the_common_batch():
    """Broadcasting batches are checked in tests/test_tf2onnx.py; here the form and the numbers."""
    # nothing ties the batches: names differ outside and in the body (the body's one symbol,
    # or h_n's [batch, H], would promise them equal), and x.W + h.R only broadcasts
    model = rnn_model()
    model.graph.input[1].type.tensor_type.shape.dim[0].dim_param = "other"
    body = next(a.g for a in model.graph.node[0].attribute if a.name == "body")
    body.input[-1].type.tensor_type.shape.dim[0].dim_param = "other_x"
    for k, value in enumerate(model.graph.output):
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param:
                dim.dim_param = f"out{k}_{axis}"
    out = check_fused(model, "RNN", inputs=False)
    assert ops(out)["Expand"] == 2


def test_batch_sizes_named_apart_outside_but_one_symbol_in_the_body_fuse():
    # the body declares x and h with one batch symbol: the Scan contract carries it outside
    model = rnn_model()
    model.graph.input[1].type.tensor_type.shape.dim[0].dim_param = "other"
    out, outcomes = cb.fuse(model)
    assert [o.applied for o in outcomes] == [True], outcomes[0].detail


def test_double_cell_is_declined():
    model = rnn_model()
    body = next(a.g for a in model.graph.node[0].attribute if a.name == "body")
    for graph in (model.graph, body):
        for v in list(graph.input) + list(graph.output):
            v.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
        for i, init in enumerate(graph.initializer):
            if init.data_type == onnx.TensorProto.FLOAT:
                graph.initializer[i].CopyFrom(onnx.numpy_helper.from_array(
                    onnx.numpy_helper.to_array(init).astype(np.float64), init.name))
    assert "only float32 cells are fused" in declined(model)


def test_three_recurrent_states_are_declined():
    body = cb.Body()
    h_new = cb.rnn(body, "x", "h")
    g_new = body.op("Tanh", body.op("Add", "g", "h"))
    k_new = body.op("Tanh", body.op("Add", "k", "g"))
    m = cb.scan_model(body, [("h", h_new, cb.H), ("g", g_new, cb.H), ("k", k_new, cb.H)], ys=[h_new])
    assert declined(m) == "not fused: 3 recurrent states: RNN/GRU carry one, LSTM two"


def test_runtime_value_added_outside_the_activation_is_declined():
    m = cb.weights_as_inputs(_rnn_then(lambda b, hn, pre: b.op("Add", hn, b.const(cb.rand(9, cb.H), "shift", where="outer"))))
    assert "the new state reads run-time value 'shift_" in declined(m) and "outside any gate" in declined(m)


def test_clip_with_runtime_bounds_is_declined():
    model = cb.weights_as_inputs(rnn_model(where="outer", clip=0.5))
    assert "bounds are not constant" in declined(model)


def test_size_1_input_added_elementwise_broadcasts_as_a_weight_column():
    """h' = tanh(x + h·Rᵀ) with I = 1: x broadcasts over the gate, W is a column of ones."""
    b = cb.Body(inputs=1)
    h_new = b.op("Tanh", b.op("Add", "x", b.linear("h", cb.rand(2, cb.H, cb.H))))
    check_fused(cb.scan_model(b, [("h", h_new, cb.H)], ys=[h_new]))
