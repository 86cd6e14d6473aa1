"""fuse reads through layout-preserving nodes (issue 12): Identity, a Cast to the same dtype,
Unsqueeze/Squeeze off the last axis, Flatten at the last axis and a Reshape that keeps the
last dimension, between Concat([x, h]) and its MatMul (TF1 converters write Unsqueeze/Squeeze
around it) and around the product. Each form fuses and equals the original and a native op
written by hand; forms whose layout cannot be proven kept are declined with the reason."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP

import cell_builders as cb

H, I = cb.H, cb.I
R_ = cb.rand


def _rnn_native():
    W, R, Wb = R_(0, H, I), R_(1, H, H), R_(2, H)
    return cb.native_model("RNN", W, R, np.concatenate([Wb, np.zeros(H)]))


def _model(kind, via, batch=True, opset=17):
    body = cb.Body(batch=batch, opset=opset)
    if kind == "LSTM":
        h_new, c_new = cb.concat_lstm(body, "x", "h", "c", via=via)
        return cb.scan_model(body, [("h", h_new, H), ("c", c_new, H)], ys=[h_new])
    h_new = cb.concat_rnn(body, "x", "h", via=via)
    return cb.scan_model(body, [("h", h_new, H)], ys=[h_new])


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
@pytest.mark.parametrize("via", cb.VIAS)
def test_concat_cell_through_layout_nodes_fuses(kind, via):
    model = _model(kind, via)
    out = cb.check_fused(model, kind)
    native = cb.concat_lstm_native() if kind == "LSTM" else _rnn_native()
    cb.assert_same_as_native(out, native)
    cb.assert_same_as_native(model, native, shapes=((5, 2),))  # the builder's weights are the native ones


@pytest.mark.parametrize("via", ["unsqueeze", "reshape", "identity"])
def test_unbatched_body_through_layout_nodes_fuses(via):
    cb.check_fused(_model("LSTM", via, batch=False), "LSTM")


def test_scan8_tf1_lstm_through_unsqueeze_fuses_with_sequence_lens():
    body = cb.Body(batch=False, opset=8)
    h_new, c_new = cb.concat_lstm(body, "x", "h", "c", via="unsqueeze")
    model = cb.scan8_model(body, [("h", h_new, H), ("c", c_new, H)], ys=[h_new])
    out = cb.check_fused(model, "LSTM", lens=[7, 3, 1])
    assert cb.native(out)[0].input[4], "sequence_lens passed to the native op"


def _concat_rnn_via(body, relayout):
    """A TF1 BasicRNNCell whose Concat([x, h]) goes through ``relayout(body, cat)`` to its MatMul;
    (the model, the re-laid value)."""
    cat = body.op("Concat", "x", "h", axis=-1)
    moved = relayout(body, cat)
    W, R, Wb = R_(0, H, I), R_(1, H, H), R_(2, H)
    h_new = body.op("Tanh", body.op("Add", body.op("MatMul", moved, body.const(np.concatenate([W.T, R.T]))),
                                    body.const(Wb, "b")))
    return cb.scan_model(body, [("h", h_new, H)], ys=[h_new]), moved


def test_reshape_with_a_run_time_target_is_declined_with_the_reshape_named():
    """Reshape(Concat, Shape(...)): the target is not constant, so the kept layout cannot be
    proven; the cell is declined and the reason names the Reshape output."""
    model, row = _concat_rnn_via(cb.Body(), lambda b, cat: b.op("Reshape", cat, b.op("Shape", cat)))
    assert f"'{row}' (Reshape output)" in cb.declined(model)


def test_cast_to_another_dtype_is_not_read_through():
    """Cast float32 -> float16 -> float32 rounds the values: not a re-layout, so the Cast output
    is a leaf of the algebra and the cell is declined naming it."""
    model, back = _concat_rnn_via(cb.Body(), lambda b, cat: b.op("Cast", b.op("Cast", cat, to=TP.FLOAT16), to=TP.FLOAT))
    assert f"'{back}' (Cast output)" in cb.declined(model)


def test_reshape_that_regroups_rows_is_declined():
    """[B, I+H] reshaped to [-1, H] splits each row in two and [2B, H] back to [B, 2H] joins
    two rows: neither keeps the last dimension, so the value cut into the gate is a leaf, named."""
    body = cb.Body(inputs=H)  # I = H, so [B, 2H] -> [2B, H] is a valid reshape
    cat = body.op("Concat", "x", "h", axis=-1)
    rows = body.op("Reshape", cat, body.const(np.array([-1, H], np.int64), "shape", where="body"))
    prod = body.op("MatMul", rows, body.const(R_(0, H, H)))
    back = body.op("Reshape", prod, body.const(np.array([-1, 2 * H], np.int64), "shape", where="body"))
    half = body.split(back, 2)[0]
    h_new = body.op("Tanh", half)
    detail = cb.declined(cb.scan_model(body, [("h", h_new, H)], ys=[h_new]))
    assert f"cuts '{back}' itself" in detail, detail


@pytest.mark.parametrize("rank, axis, keeps", [(1, 0, True), (1, 1, False), (2, 1, True), (2, -1, True),
                                               (2, 0, False), (3, 2, True), (3, 1, False)])
def test_flatten_keeps_rows_only_at_the_last_axis(rank, axis, keeps):
    """Flatten -> [prod(d[:axis]), prod(d[axis:])]: rows are kept only for axis = rank - 1 (a [K]
    vector at axis 1 becomes the column [K, 1])."""
    import onnx_graphsurgeon as gs

    from scanopt.passes.fuse.algebra import Algebra
    from scanopt.passes.fuse.layout import keeps_rows

    data = gs.Variable("v", np.float32, [2] * (rank - 1) + [7])
    out = gs.Variable("f", np.float32)
    node = gs.Node("Flatten", attrs={"axis": axis}, inputs=[data], outputs=[out])
    why = keeps_rows(Algebra(rank=lambda t: len(t.shape) if t.shape else None), node)
    assert (why is None) == keeps, why


def test_concat_times_a_run_time_weight_is_declined_with_the_reason():
    body = cb.Body(where="outer")
    h_new = cb.concat_rnn(body, "x", "h", via="unsqueeze")
    model = cb.weights_as_inputs(cb.scan_model(body, [("h", h_new, H)], ys=[h_new]))
    assert "splitting a run-time weight's rows between the Concat's pieces is not supported" in cb.declined(model)
