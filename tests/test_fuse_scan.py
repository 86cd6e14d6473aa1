"""fuse, the Scan around the cell, for RNN, GRU and LSTM alike: scan axes, input and output
directions, layout, Scan-8 with sequence_lens, zero-length sequences, loop-invariant
states, nesting, and a forward and a reverse Scan merged into one bidirectional op."""

from __future__ import annotations

import os

import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import cell_builders as cb
from equivalence import assert_equivalent, ops

KINDS = ["RNN", "GRU", "LSTM"]
CELL = {"RNN": {}, "GRU": {"lbr": 1, "order": "torch"}, "LSTM": {"peep": True, "order": "torch"}}


def model(kind, batch=True, opset=17, prefix="", seed=0, ys=1, cell=None, **scan):
    body = cb.Body(batch=batch, opset=opset, prefix=prefix)
    states, h_new = cb.cell(kind, body, seed=seed, **(CELL[kind] if cell is None else cell))
    return cb.scan_model(body, states, ys=[h_new] * ys, opset=opset, **scan)


check_fused = cb.check_fused


def declined(m) -> str:
    out, outcomes = cb.fuse(m)
    assert not any(o.applied for o in outcomes)
    assert ops(out)["Scan"] == len(outcomes)
    return outcomes[0].detail


# -- axes, directions, layout ----------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch, in_axis", [(True, 0), (True, 1), (True, 2), (False, 0), (False, 1)])
@pytest.mark.parametrize("in_dir", [0, 1])
def test_every_axis_and_output_direction(kind, batch, in_axis, in_dir):
    """Two copies of Y: one appended on the input's axis, one prepended on another axis."""
    last = 2 if batch else 1
    m = model(kind, batch, ys=2, in_axis=in_axis, in_dir=in_dir, out_axes=[in_axis, last - in_axis % 2], out_dirs=[0, 1])
    out = check_fused(m, kind)
    _, attrs = cb.native(out)
    assert attrs.get("direction", b"forward") == (b"reverse" if in_dir else b"forward")
    assert ops(out)["Slice"] == 1  # one reversal: the output running against the input


def test_scan_axis_1_is_transposed_by_default():
    """onnxruntime 1.31 rejects layout=1 for RNN/GRU/LSTM, so the default is Transpose."""
    out = check_fused(model("GRU", in_axis=1, out_axes=[1]), "GRU")
    assert cb.native(out)[1].get("layout", 0) == 0
    assert ops(out)["Transpose"] == 2


@pytest.mark.parametrize("opset, layout", [(13, 0), (14, 1), (17, 1)])
def test_layout_1_on_request_from_opset_14(opset, layout):
    import scanopt

    m = model("LSTM", opset=opset, in_axis=1, out_axes=[1])
    out, _ = scanopt.optimize(m, passes=["fuse", "cleanup"], verify=False, options={"fuse_layout": 1})
    assert ops(out)["Scan"] == 0
    assert cb.native(out)[1].get("layout", 0) == layout
    assert ops(out)["Transpose"] == (0 if layout else 2)
    engine = "reference" if layout else "both"  # onnxruntime cannot load layout=1
    assert_equivalent(m, out, engine=engine, inputs=cb.feeds(m, T=7, B=3))


def test_reversal_before_opset_10_is_declined():
    assert "reversing it needs Slice steps (opset 10+)" in declined(model("RNN", opset=9, in_dir=1))


def test_reverse_input_with_prepending_output_needs_no_reversal():
    out = check_fused(model("RNN", opset=10, in_dir=1, out_dirs=[1]), "RNN")
    assert ops(out)["Slice"] == 0


def test_two_scan_inputs_are_declined():
    m = onnx.load(os.path.join(os.path.dirname(__file__), "..", "models", "scan_axes_directions.onnx"))
    assert declined(m).startswith("2 scan inputs; the native ops read one sequence X (or projections")


def test_input_without_batch_axis_beside_a_batched_state_is_declined():
    """x [I] broadcast over h [B, H]: valid for the Scan, no native op reads it that way."""
    b = cb.Body()
    h_new = b.op("Tanh", b.op("Add", b.linear("x", cb.rand(1, cb.H, cb.I)), b.linear("h", cb.rand(2, cb.H, cb.H))))
    m = cb.scan_model(b, [("h", h_new, cb.H)], ys=[h_new])
    body = next(a.g for a in m.graph.node[0].attribute if a.name == "body")
    for v in (body.input[1], m.graph.input[0]):  # x_t [I], X [seq, I]
        dims = v.type.tensor_type.shape.dim
        del dims[-2]
    m.graph.output[1].type.tensor_type.shape.dim[1].dim_param = "batch"
    assert "x has rank 1 and the states [2] in the body" in declined(m)
    assert_equivalent(m, cb.fuse(m)[0])  # untouched, and still runs


# -- zero-length sequences ------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_zero_length_sequence_keeps_the_initial_states(kind):
    """A Scan over no steps returns its initial states; the native op would return zeros."""
    m = model(kind)
    out = check_fused(m, kind)
    # the empty-X branch of the guard gives the initial states itself: no per-call select after it
    assert ops(out)["Where"] == 0
    # onnxruntime cannot run a zero-length Scan; the reference executor can.
    assert_equivalent(m, out, engine="reference", inputs=cb.feeds(m, T=0, B=2))


def test_static_trip_count_needs_no_zero_length_select():
    m = model("GRU")
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 5  # X [5, batch, I]
    out = check_fused(m, "GRU", inputs=False)
    top = [n.op_type for n in out.graph.node]
    assert "Where" not in top and "Shape" not in top
    assert "If" in top  # the batch may still be 0: the native op stays behind the empty-X guard
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 3  # X [5, 3, I]: never empty
    assert ops(check_fused(m, "GRU", inputs=False))["If"] == 0


# -- Scan-8 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lens, reverse, finals, ys", [
    (True, False, True, 1), (True, False, False, 1), (True, True, True, 0), (False, False, True, 1), (False, True, True, 0),
])
def test_scan8_fuses_with_sequence_lens(kind, lens, reverse, finals, ys):
    body = cb.Body(batch=False, opset=8)
    states, h_new = cb.cell(kind, body, **({"lbr": 1, "order": "torch", "form": "matvec"} if kind == "GRU" else {}))
    m = cb.scan8_model(body, states, ys=[h_new] * ys, lens=lens, reverse=reverse, finals=finals)
    out = check_fused(m, kind, lens=[3, 7, 1] if lens else None)
    node, attrs = cb.native(out)
    assert (node.input[4] != "") == lens and attrs.get("direction", b"forward") == (b"reverse" if reverse else b"forward")
    # The reference executor also runs length-0 items (onnxruntime's Scan-8 refuses them).
    assert_equivalent(m, out, engine="reference", inputs=cb.feeds(m, T=5, B=4, lens=[0, 5, 2, 0] if lens else None))


def test_scan8_reverse_scan_output_is_declined():
    body = cb.Body(batch=False, opset=8)
    states, h_new = cb.cell("RNN", body)
    m = cb.scan8_model(body, states, ys=[h_new], reverse=True)
    assert "Scan-8 reverse scan outputs need ReverseSequence (opset 10)" in declined(m)


# -- loop-invariant states and nesting --------------------------------------------------------

def test_loop_invariant_state_passes_through():
    body = cb.Body()
    states, h_new = cb.cell("GRU", body, **CELL["GRU"])
    body.nodes.append(h.make_node("Identity", ["k"], ["k_out"]))
    m = cb.scan_model(body, states + [("k", "k_out", cb.H)], ys=[h_new])
    out = check_fused(m, "GRU")
    assert "k_n" in [o.name for o in out.graph.output]


def test_cell_scan_nested_in_an_outer_scan_body_fuses():
    """Outer Scan over Z [steps, seq, batch, I]; its body runs the LSTM Scan over one z_t,
    carrying (h, c) across the outer steps."""
    inner = model("LSTM", prefix="in_")
    inputs = {v.name: v for v in inner.graph.input}
    outer_body = h.make_graph([inner.graph.node[0]], "outer_body", [inputs["h0"], inputs["c0"], inputs["X"]],
                              list(inner.graph.output), initializer=list(inner.graph.initializer))
    vi = h.make_tensor_value_info
    scan = h.make_node("Scan", ["h00", "c00", "Z"], ["h_fin", "c_fin", "Ys"], name="outer", num_scan_inputs=1, body=outer_body)
    g = h.make_graph([scan], "nested", [vi("h00", TP.FLOAT, ["batch", cb.H]), vi("c00", TP.FLOAT, ["batch", cb.H]),
                                        vi("Z", TP.FLOAT, ["steps", "seq", "batch", cb.I])],
                     [vi("h_fin", TP.FLOAT, ["batch", cb.H]), vi("c_fin", TP.FLOAT, ["batch", cb.H]),
                      vi("Ys", TP.FLOAT, ["steps", "seq", "batch", cb.H])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    out, outcomes = cb.fuse(m)
    assert [(o.node, o.applied) for o in outcomes] == [("cell_scan", True), ("outer", False)], [o.detail for o in outcomes]
    assert ops(out)["Scan"] == 1 and ops(out)["LSTM"] == 1
    assert_equivalent(m, out)


# -- bidirectional ----------------------------------------------------------------------------

def pair(kind, batch=True, forward=None, backward=None):
    f = model(kind, batch, prefix="f_", seed=0, cell=forward)
    r = model(kind, batch, prefix="r_", seed=10, in_dir=1, out_dirs=[1], cell=backward)
    return cb.two_scans(f, r)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch", [True, False])
def test_forward_and_reverse_scans_merge_into_one_bidirectional_op(kind, batch):
    m = pair(kind, batch)
    out, outcomes = cb.fuse(m)
    assert [o.applied for o in outcomes] == [True] and "merged with Scan 'cell_scan_b'" in outcomes[0].detail
    assert ops(out)["Scan"] == 0 and ops(out)[kind] == 1
    assert cb.native(out)[1]["direction"] == b"bidirectional"
    assert_equivalent(m, out)
    assert_equivalent(m, out, inputs=cb.feeds(m, T=6, B=2))


def test_directions_may_differ_in_activations_and_peepholes():
    m = pair("LSTM", forward={"peep": True}, backward={"peep": False, "acts": ("HardSigmoid", "Softsign", "Tanh")})
    out, outcomes = cb.fuse(m)
    assert [o.applied for o in outcomes] == [True]
    assert cb.native(out)[1]["activations"] == [b"Sigmoid", b"Tanh", b"Tanh", b"HardSigmoid", b"Softsign", b"Tanh"]
    assert_equivalent(m, out, inputs=cb.feeds(m, T=6, B=2))


def test_incompatible_directions_fuse_separately():
    """linear_before_reset is one attribute for both directions: two GRUs, not one."""
    m = pair("GRU", forward={"lbr": 0}, backward={"lbr": 1})
    out, outcomes = cb.fuse(m)
    assert [o.applied for o in outcomes] == [True, True]
    assert ops(out)["GRU"] == 2 and all("merged" not in o.detail for o in outcomes)
    assert_equivalent(m, out)


# -- run-time weights ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind, cell", [
    ("RNN", {"form": "matmul"}),
    ("RNN", {"form": "gemm", "bias": "merged"}),
    ("GRU", {"lbr": 1, "order": "torch", "form": "gemm"}),  # Split of a run-time Gemm (weights and bias)
    ("GRU", {"lbr": 0, "fused": False, "form": "matmul"}),
    ("LSTM", {"order": "torch", "peep": True, "form": "gemm"}),  # run-time peepholes too
])
def test_weights_from_graph_inputs_become_runtime_inputs_of_the_native_op(kind, cell):
    body = cb.Body(where="outer")
    states, h_new = cb.cell(kind, body, **cell)
    m = cb.weights_as_inputs(cb.scan_model(body, states, ys=[h_new]))
    out = check_fused(m, kind)
    node, _ = cb.native(out)
    assert not any(i.name == node.input[1] for i in out.graph.initializer)  # W is computed at run time


def test_loop_invariant_state_as_weight_becomes_a_runtime_input():
    """A state passed through unchanged and read as the recurrent weight (skl2onnx style)."""
    b = cb.Body()
    hr = b.op("MatMul", "h", "Rs")
    h_new = b.op("Tanh", b.op("Add", b.linear("x", cb.rand(1, cb.H, cb.I), cb.rand(2, cb.H)), hr))
    b.nodes.append(h.make_node("Identity", ["Rs"], ["Rs_out"]))
    m = cb.scan_model(b, [("h", h_new, cb.H), ("Rs", "Rs_out", cb.H)], ys=[h_new])
    for v in list(m.graph.input) + list(next(a.g for a in m.graph.node[0].attribute if a.name == "body").input):
        if v.name in ("Rs0", "Rs"):
            v.type.tensor_type.shape.dim[0].dim_value = cb.H  # [H, H], not [batch, H]
            v.type.tensor_type.shape.dim[0].ClearField("dim_param")
    for v in list(m.graph.output) + list(next(a.g for a in m.graph.node[0].attribute if a.name == "body").output):
        if v.name in ("Rs_n", "Rs_out"):
            v.type.tensor_type.shape.dim[0].dim_value = cb.H
            v.type.tensor_type.shape.dim[0].ClearField("dim_param")
    out = check_fused(m, "RNN")
    assert "Rs_n" in [o.name for o in out.graph.output]


def test_runtime_weight_times_a_sum_is_declined():
    b = cb.Body(where="outer")
    xs = b.op("Add", "x", b.const(cb.rand(3, cb.I), "shift"))
    h_new = b.op("Tanh", b.op("Add", b.op("MatMul", xs, b.const(cb.rand(1, cb.I, cb.H))), b.linear("h", cb.rand(2, cb.H, cb.H))))
    m = cb.weights_as_inputs(cb.scan_model(b, [("h", h_new, cb.H)], ys=[h_new]))
    assert "multiplies a sum, not a single value" in declined(m)


def test_runtime_elementwise_weight_on_h_is_declined():
    b = cb.Body(where="outer")
    scaled = b.op("Mul", "h", b.const(cb.rand(3, cb.H), "s"))
    h_new = b.op("Tanh", b.op("Add", b.linear("x", cb.rand(1, cb.H, cb.I)), scaled))
    m = cb.weights_as_inputs(cb.scan_model(b, [("h", h_new, cb.H)], ys=[h_new]))
    assert "only LSTM peepholes may be elementwise run-time weights" in declined(m)


# -- determinism and untouched declines -------------------------------------------------------

def test_same_input_gives_byte_identical_output():
    m = pair("LSTM")
    first, second = cb.fuse(m)[0], cb.fuse(m)[0]
    assert first.SerializeToString() == second.SerializeToString()


def test_a_declined_scan_leaves_the_model_as_it_was():
    import scanopt

    m = model("RNN", opset=9, in_dir=1)  # declined: the reversal needs opset 10
    before = m.SerializeToString()
    out, report = scanopt.optimize(m, passes=["fuse"], verify=False)
    assert out is m and not report.modified and m.SerializeToString() == before


def test_scan8_cell_with_sequence_lens_fuses_when_migrating():
    """--target-opset: the cell fuses at opset 8 (sequence_lens straight into the native
    op), then the model migrates; upgrade's masking would hide the cell from fuse."""
    from scanopt.pipeline import optimize

    body = cb.Body(batch=False, opset=8)
    states, h_new = cb.cell("GRU", body, lbr=1, order="torch", form="matvec")
    m = cb.scan8_model(body, states, ys=[h_new], lens=True)
    out, report = optimize(m, options={"target_opset": 17, "target": "portable"}, seeds=2)
    assert out.opset_import[0].version == 17
    assert ops(out)["GRU"] == 1 and "Scan" not in ops(out)
    assert any(o.pass_name == "fuse" and o.applied for o in report.outcomes)
    assert_equivalent(m, out, inputs=cb.feeds(m, T=5, B=3, lens=[5, 2, 1]))
