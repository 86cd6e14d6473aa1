"""fuse, LSTM cells: ONNX (i, o, f, c) and PyTorch (i, f, g, o) gate orders from one fused
matmul cut by Split or Slice, peepholes, the cell state as a second Scan state in either
position; numbers match in onnxruntime and the reference executor."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import cell_builders as cb
from equivalence import assert_equivalent, ops

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")
CELLS = os.path.join(MODELS, "cells")  # written by models/generate_cells.py


def lstm_model(batch=True, where="body", opset=17, c_first=False, ys="h", scan=None, **cell):
    body = cb.Body(batch=batch, where=where, opset=opset)
    h_new, c_new = cb.lstm(body, "x", "h", "c", **cell)
    states = [("h", h_new, cb.H), ("c", c_new, cb.H)]
    if c_first:
        states.reverse()
    y = {"h": [h_new], "none": [], "c": [c_new]}[ys]
    return cb.scan_model(body, states, ys=y, opset=opset, **(scan or {}))


def check_fused(model, inputs=True):
    return cb.check_fused(model, "LSTM", inputs)


@pytest.mark.parametrize(
    "order, cut, form, where",
    [
        ("onnx", "split", "matmul", "body"),
        ("torch", "split", "gemm", "outer"),  # PyTorch LSTMCell: i, f, g, o
        ("torch", "slice", "matmul", "node"),
        ("onnx", "slice", "gemm_t", "outer"),
        ("torch", "split_pos", "bias_first", "body"),
    ],
)
def test_lstm_gate_orders_and_forms_fuse(order, cut, form, where):
    out = check_fused(lstm_model(order=order, cut=cut, form=form, where=where))
    node, attrs = cb.native(out)
    assert attrs["activations"] == [b"Sigmoid", b"Tanh", b"Tanh"]
    assert len(node.input) < 8  # no peepholes


@pytest.mark.parametrize("order", ["onnx", "torch"])
def test_peepholes_fuse_into_p(order):
    out = check_fused(lstm_model(order=order, peep=True))
    node, _ = cb.native(out)
    assert len(node.input) == 8 and node.input[7]


def test_cell_state_may_be_the_first_state():
    check_fused(lstm_model(c_first=True, peep=True))


@pytest.mark.parametrize("scan", [{"in_axis": 1, "in_dir": 1, "out_axes": [1]}, {"in_dir": 1}, {"out_dirs": [1]}])
def test_lstm_axes_and_directions(scan):
    check_fused(lstm_model(peep=True, order="torch", scan=scan))


def test_lstm_without_batch_axis():
    check_fused(lstm_model(batch=False, form="matvec"))


def test_lstm_with_only_final_states_read():
    out = check_fused(lstm_model(ys="none"))
    node, _ = cb.native(out)
    assert node.output[0] == "" and node.output[1] and node.output[2]


def test_other_activations_fuse():
    out = check_fused(lstm_model(acts=("HardSigmoid", "Softsign", "Relu")))
    assert cb.native(out)[1]["activations"] == [b"HardSigmoid", b"Softsign", b"Relu"]


def test_sample_model_fuses():
    check_fused(onnx.load(os.path.join(MODELS, "scan_lstm.onnx")), inputs=False)


def test_torch_lstmcell_export_fuses():
    out = check_fused(onnx.load(os.path.join(CELLS, "torch_scan_lstm.onnx")), inputs=False)
    cb.matches_torch(out, "torch_scan_lstm", CELLS)


def test_keras_style_concat_lstm_with_forget_bias_fuses():
    """One MatMul of Concat([x, h]) by a [I+H, 4H] kernel, gates i, c, f, o, +1 on f."""
    model = onnx.load(os.path.join(CELLS, "keras_concat_lstm.onnx"))
    out = check_fused(model, inputs=False)
    assert_equivalent(model, out, inputs=cb.feeds(model, T=7, B=3))


# -- declines ------------------------------------------------------------------------------

def declined(model) -> str:
    out, outcomes = cb.fuse(model)
    assert [o.applied for o in outcomes] == [False]
    assert ops(out)["Scan"] == 1
    return outcomes[0].detail


def test_cell_state_as_scan_output_with_peepholes_on_i_and_f_is_declined():
    # without them it fuses (tests/test_fuse_cell_states.py): c's update is then linear in c
    reason = declined(lstm_model(ys="c", peep=True))
    assert "scan output 0 is the cell state of every step" in reason and "(peepholes)" in reason, reason


def _lstm_custom(h_of, c_of, o_act="Sigmoid", o_peep=None, f_extra=None):
    """An LSTM-like body: ``c_of(b, i, f, g, c)`` is the new cell state, ``h_of(b, o, c_new)``
    the new hidden state; ``o_peep`` is the state the output gate peeks at elementwise."""
    b = cb.Body()
    xw = b.linear("x", cb.rand(1, 4 * cb.H, cb.I), cb.rand(2, 4 * cb.H))
    gates = b.op("Add", xw, b.linear("h", cb.rand(3, 4 * cb.H, cb.H)))
    i, o, f, g = b.split(gates, 4)
    if f_extra:  # one more term in the forget gate's pre-activation
        f = b.op("Add", f, f_extra(b))
    i, f, g = b.op("Sigmoid", i), b.op("Sigmoid", f), b.op("Tanh", g)
    if o_peep:
        o = b.op("Add", o, b.op("Mul", b.const(cb.rand(7, cb.H)), o_peep))
    o = b.op(o_act, o)
    c_new = c_of(b, i, f, g, "c")
    h_new = h_of(b, o, c_new)
    return cb.scan_model(b, [("h", h_new, cb.H), ("c", c_new, cb.H)], ys=[h_new])


def _c(b, i, f, g, c):
    return b.op("Add", b.op("Mul", f, c), b.op("Mul", i, g))


def _h(b, o, c_new):
    return b.op("Mul", o, b.op("Tanh", c_new))


def test_the_plain_custom_lstm_fuses():
    check_fused(_lstm_custom(_h, _c))


def test_coupled_input_forget_gate_fuses_with_input_forget():
    one = lambda b: b.const(np.float32(1.0), "one")  # noqa: E731
    def coupled(b, i, f, g, c):  # (1 - i)⊙c + i⊙g
        return b.op("Add", b.op("Mul", b.op("Sub", one(b), i), c), b.op("Mul", i, g))

    out = check_fused(_lstm_custom(_h, coupled))
    assert cb.native(out)[1]["input_forget"] == 1


def test_hidden_state_without_output_activation_fuses_as_affine_h():
    """h' = o ⊙ c' was declined ('not o ⊙ h(new cell state)'); it is h = Affine(1, 0)
    (tests/test_fuse_activations.py compares it with a hand-written native op)."""
    out = check_fused(_lstm_custom(lambda b, o, c_new: b.op("Mul", o, c_new), _c))
    assert cb.native(out)[1]["activations"][2] == b"Affine"


def test_hidden_state_scaled_by_a_non_gate_is_declined():
    reason = declined(_lstm_custom(lambda b, o, c_new: b.op("Mul", o, b.op("Mul", c_new, c_new)), _c))
    assert "not o⊙h(c_new)" in reason or "not o ⊙ h(new cell state)" in reason, reason


def test_clip_before_the_output_activation_is_declined():
    def h_of(b, o, c_new):
        lo, hi = b.const(np.float32(-1.0), "lo"), b.const(np.float32(1.0), "hi")
        return b.op("Mul", o, b.op("Tanh", b.op("Clip", c_new, lo, hi)))

    assert "the LSTM clip attribute does not apply there" in declined(_lstm_custom(h_of, _c))


def test_output_gate_peeking_at_the_old_cell_state_is_declined():
    reason = declined(_lstm_custom(_h, _c, o_peep="c"))
    assert "the output gate reads c ('c')" in reason


def test_gate_activations_that_differ_are_declined():
    reason = declined(_lstm_custom(_h, _c, o_act="HardSigmoid"))
    assert reason.startswith("not fused: no LSTM cell: with 'c' as the cell state:")
    assert "LSTM applies one f to all" in reason


def test_input_factor_without_the_gate_activation_is_declined():
    def c_of(b, i, f, g, c):
        node = b.nodes[[n.output[0] for n in b.nodes].index(i)]
        node.op_type = "Tanh"  # i⊙g with both factors Tanh, f Sigmoid
        return _c(b, i, f, g, c)

    assert "neither factor of i⊙g uses the forget gate's activation Sigmoid" in declined(_lstm_custom(_h, c_of))


def test_peephole_through_a_matrix_is_declined():
    reason = declined(_lstm_custom(_h, _c, f_extra=lambda b: b.linear("c", cb.rand(5, cb.H, cb.H))))
    assert "the forget gate multiplies the cell state by a matrix; LSTM peepholes are elementwise" in reason
