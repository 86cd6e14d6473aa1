"""fuse, GRU cells: linear_before_reset is read from the graph (never assumed), ONNX and
PyTorch gate orders, fused or per-gate matmuls, Split or Slice, every way of writing
(1-z)⊙h̃ + z⊙h; the numbers match in onnxruntime and the reference executor."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import helper as h

import cell_builders as cb
from equivalence import assert_equivalent, ops
from scanopt.verify import compare_models

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")
CELLS = os.path.join(MODELS, "cells")  # written by models/generate_cells.py


def gru_model(batch=True, where="body", opset=17, scan=None, **cell):
    body = cb.Body(batch=batch, where=where, opset=opset)
    h_new = cb.gru(body, "x", "h", **cell)
    return cb.scan_model(body, [("h", h_new, cb.H)], ys=[h_new], opset=opset, **(scan or {}))


def check_fused(model, inputs=True):
    return cb.check_fused(model, "GRU", inputs)


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize(
    "order, fused, cut, update, form",
    [
        ("onnx", True, "split", "standard", "matmul"),
        ("torch", True, "split", "standard", "gemm"),  # PyTorch GRUCell, one matmul per source
        ("torch", True, "slice", "lerp", "matmul"),
        ("onnx", False, "split", "expanded", "bias_first"),
        ("torch", False, "split", "lerp", "gemm"),
        ("onnx", True, "split_pos", "expanded", "gemm_t"),
    ],
)
def test_gru_forms_fuse_with_the_right_linear_before_reset(lbr, order, fused, cut, update, form):
    out = check_fused(gru_model(lbr=lbr, order=order, fused=fused, cut=cut, update=update, form=form))
    node, attrs = cb.native(out)
    assert attrs["linear_before_reset"] == lbr
    assert attrs["activations"] == [b"Sigmoid", b"Tanh"]


@pytest.mark.parametrize("lbr", [0, 1])
def test_the_wrong_linear_before_reset_would_be_caught(lbr):
    """The classic silent GRU conversion bug: the test setup must be able to see it."""
    model = gru_model(lbr=lbr)
    out = check_fused(model, inputs=False)
    node, _ = cb.native(out)
    attr = next(a for a in node.attribute if a.name == "linear_before_reset")
    attr.i = 1 - lbr
    result = compare_models(model, out, inputs=cb.feeds(model, T=7, B=3), engine="ort")
    assert not result.passed


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_without_batch_axis(lbr):
    check_fused(gru_model(batch=False, lbr=lbr, form="matvec", fused=False))


@pytest.mark.parametrize("scan", [{"in_axis": 1, "in_dir": 1, "out_axes": [1]}, {"in_dir": 1, "out_dirs": [1]},
                                  {"in_axis": 2, "out_axes": [2], "out_dirs": [1]}])
def test_gru_axes_and_directions(scan):
    check_fused(gru_model(lbr=1, order="torch", scan=scan))


@pytest.mark.parametrize("where", ["outer", "node"])
def test_gru_weights_from_outer_scope_and_constant_nodes(where):
    check_fused(gru_model(where=where, lbr=1, order="torch"))


@pytest.mark.parametrize("name, lbr", [("scan_gru", 0), ("scan_gru_lbr1", 1)])
def test_sample_models_fuse(name, lbr):
    out = check_fused(onnx.load(os.path.join(MODELS, f"{name}.onnx")), inputs=False)
    assert cb.native(out)[1]["linear_before_reset"] == lbr


@pytest.mark.parametrize("name, lbr", [("torch_scan_gru", 1), ("torch_scan_gru_unbatched", 1)])
def test_torch_grucell_exports_fuse_as_linear_before_reset_1(name, lbr):
    """PyTorch's GRUCell (gates r, z, n; Split with num_outputs; h̃ + z⊙(h - h̃)) is ONNX lbr=1."""
    out = check_fused(onnx.load(os.path.join(CELLS, f"{name}.onnx")), inputs=False)
    assert cb.native(out)[1]["linear_before_reset"] == lbr
    cb.matches_torch(out, name, CELLS)


def test_torch_manual_gru_reversed_on_dim1_fuses_after_canonicalize():
    import scanopt

    model = onnx.load(os.path.join(CELLS, "torch_scan_gru_manual_rev.onnx"))
    out, report = scanopt.optimize(model, verify=False, options={"target": "portable"})
    fused = [o for o in report.outcomes if o.pass_name == "fuse"]
    assert [o.applied for o in fused] == [True] and "reverse" in fused[0].detail
    assert ops(out)["Scan"] == 0 and ops(out)["GRU"] == 1
    _, attrs = cb.native(out)
    assert attrs["linear_before_reset"] == 0 and attrs["direction"] == b"reverse"
    assert_equivalent(model, out)
    cb.matches_torch(out, "torch_scan_gru_manual_rev", CELLS)


def _custom_gru(update, gate_act="Sigmoid", r_act=None, candidate=None):
    """A GRU body with its own update and candidate: ``update(b, z, n, h)``,
    ``candidate(b, xn, hn_lin, r)`` -> tanh input."""
    b = cb.Body()
    W, R = cb.rand(1, 3 * cb.H, cb.I), cb.rand(2, 3 * cb.H, cb.H)
    xz, xr, xn = (b.linear("x", W[k * cb.H:(k + 1) * cb.H], cb.rand(3 + k, cb.H)) for k in range(3))
    hz, hr = (b.linear("h", R[k * cb.H:(k + 1) * cb.H]) for k in range(2))
    z = b.op(gate_act, b.op("Add", xz, hz))
    r = b.op(r_act or gate_act, b.op("Add", xr, hr))
    rn = R[2 * cb.H:]
    pre = candidate(b, xn, rn, r) if candidate else b.op("Add", xn, b.op("Mul", r, b.linear("h", rn, cb.rand(9, cb.H))))
    n = b.op("Tanh", pre)
    out = update(b, z, n, "h")
    return cb.scan_model(b, [("h", out, cb.H)], ys=[out])


def _complement(b, z, n, hs):  # h' = (1 - z)⊙h + z⊙h̃
    one = b.const(np.float32(1.0), "one")
    return b.op("Add", b.op("Mul", b.op("Sub", one, z), hs), b.op("Mul", z, n))


def test_complemented_update_gate_fuses_for_sigmoid():
    out = check_fused(_custom_gru(_complement))
    assert cb.native(out)[1]["linear_before_reset"] == 1


def test_reset_gate_times_the_bias_alone_is_linear_before_reset():
    """r⊙(h·Rᵀ) + r⊙b, distributed: still linear_before_reset=1 with Rbh = b."""
    def candidate(b, xn, rn, r):
        return b.op("Add", b.op("Add", xn, b.op("Mul", r, b.linear("h", rn))), b.op("Mul", b.const(cb.rand(9, cb.H)), r))

    out = check_fused(_custom_gru(lambda b, z, n, hs: b.op("Add", n, b.op("Mul", z, b.op("Sub", hs, n))), candidate=candidate))
    assert cb.native(out)[1]["linear_before_reset"] == 1


# -- declines ------------------------------------------------------------------------------

def declined(model) -> str:
    out, outcomes = cb.fuse(model)
    assert [o.applied for o in outcomes] == [False]
    assert ops(out)["Scan"] == 1
    return outcomes[0].detail


def _standard(b, z, n, hs):
    return b.op("Add", n, b.op("Mul", z, b.op("Sub", hs, n)))


def test_complement_with_a_non_sigmoid_gate_is_declined():
    reason = declined(_custom_gru(_complement, gate_act="HardSigmoid"))
    assert "only Sigmoid has 1-f(a) = f(-a)" in reason


def test_different_gate_activations_are_declined():
    reason = declined(_custom_gru(_standard, r_act="HardSigmoid"))
    assert "the update gate uses Sigmoid but the reset gate HardSigmoid" in reason


def test_reset_gate_in_both_positions_is_declined():
    def candidate(b, xn, rn, r):
        both = b.op("Add", b.op("Mul", r, b.linear("h", rn)), b.linear(b.op("Mul", r, "h"), rn))
        return b.op("Add", xn, both)

    assert "neither linear_before_reset" in declined(_custom_gru(_standard, candidate=candidate))


def test_reset_gate_multiplying_the_input_is_declined():
    def candidate(b, xn, rn, r):
        return b.op("Mul", r, b.op("Add", xn, b.linear("h", rn)))

    reason = declined(_custom_gru(_standard, candidate=candidate))
    assert "the term the reset gate multiplies reads x" in reason


def test_update_with_an_extra_term_is_declined():
    reason = declined(_custom_gru(lambda b, z, n, hs: b.op("Add", _standard(b, z, n, hs), b.op("Mul", z, z))))
    assert "the new state expands to" in reason and "in any arrangement" in reason


def test_update_with_a_wrong_sign_is_declined():
    """h̃ + z⊙(h̃ - h): one sign off from the GRU update."""
    reason = declined(_custom_gru(lambda b, z, n, hs: b.op("Add", n, b.op("Mul", z, b.op("Sub", n, hs)))))
    assert "in any arrangement" in reason


def test_candidate_reading_h_outside_the_reset_gate_is_declined():
    def candidate(b, xn, rn, r):
        return b.op("Add", b.op("Add", xn, b.op("Mul", r, b.linear("h", rn))), b.linear("h", cb.rand(11, cb.H, cb.H)))

    assert "the candidate reads h ('h')" in declined(_custom_gru(_standard, candidate=candidate))


def test_update_gate_with_unsupported_activation_is_declined():
    reason = declined(_custom_gru(_standard, gate_act="Selu"))
    assert "is a Selu output: Selu is not among the recurrent ops' activations" in reason


def test_extra_scan_output_of_the_reset_gate_is_declined():
    model = gru_model()
    body = next(a.g for a in model.graph.node[0].attribute if a.name == "body")
    sig = next(n for n in body.node if n.op_type == "Sigmoid")
    body.output.append(h.make_tensor_value_info(sig.output[0], onnx.TensorProto.FLOAT, ["batch", cb.H]))
    model.graph.node[0].output.append("Y_r")
    model.graph.output.append(h.make_tensor_value_info("Y_r", onnx.TensorProto.FLOAT, ["seq", "batch", cb.H]))
    assert "scan output 1 is" in declined(model) and "(Sigmoid output), not the hidden state" in declined(model)


def test_clip_on_one_gate_only_is_declined():
    def candidate(b, xn, rn, r):
        pre = b.op("Add", xn, b.op("Mul", r, b.linear("h", rn)))
        return b.op("Clip", pre, b.const(np.float32(-1.0), "lo"), b.const(np.float32(1.0), "hi"))

    reason = declined(_custom_gru(_standard, candidate=candidate))
    assert "clips differ across the gates (z None, r None, h̃ 1.0); GRU clips all or none" in reason


def test_update_plus_a_constant_is_declined():
    reason = declined(_custom_gru(lambda b, z, n, hs: b.op("Add", _standard(b, z, n, hs), b.const(np.float32(0.5), "c"))))
    assert "the new state adds a constant" in reason


def test_candidate_with_two_gate_products_is_declined():
    def candidate(b, xn, rn, r):
        other = b.op("Sigmoid", b.linear("x", cb.rand(12, cb.H, cb.I)))
        both = b.op("Add", b.op("Mul", r, b.linear("h", rn)), b.op("Mul", other, b.linear("h", rn)))
        return b.op("Add", xn, both)

    assert "has no single reset gate" in declined(_custom_gru(_standard, candidate=candidate))
