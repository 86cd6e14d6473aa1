"""fuse through scan inputs to their outer producers: a Scan whose scan inputs are X·W + b
computed outside the loop (whole, or cut per gate) fuses with the native op reading X and
the projection folded into W and B. Hand-built forms (MatMul + Add, Gemm, per-gate Split
into several scan inputs, an LSTM whose recurrent Gemm takes the projected input as C) and
the hoist pass's own output of the committed cells; each compared with the original."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import cell_builders as cb
import scanopt
from equivalence import assert_equivalent, ops

CELLS = Path(__file__).resolve().parent.parent / "models" / "cells"
H, I = 4, 3
vi = h.make_tensor_value_info


def _w(seed, *shape):
    return cb.rand(seed, *shape)


def _model(body_nodes, body_inits, n_inputs, outer_nodes, outer_inits, *, batched=True, lstm=False, width=H):
    """X [seq, batch, I] (or [seq, I]) -> outer projection nodes -> Scan over ``n_inputs``
    projected inputs xp0.. (body names xp_t0..) with state h (and c)."""
    lead = ["batch"] if batched else []
    states = [("h", "h_new")] + ([("c", "c_new")] if lstm else [])
    body = h.make_graph(
        body_nodes + [h.make_node("Identity", ["h_new"], ["y_t"])], "body",
        [vi(s, TP.FLOAT, lead + [H]) for s, _ in states] + [vi(f"xp_t{k}", TP.FLOAT, lead + [width]) for k in range(n_inputs)],
        [vi(o, TP.FLOAT, lead + [H]) for _, o in states] + [vi("y_t", TP.FLOAT, lead + [H])], initializer=body_inits)
    scan = h.make_node("Scan", [f"{s}0" for s, _ in states] + [f"xp{k}" for k in range(n_inputs)],
                       [f"{s}_n" for s, _ in states] + ["Y"], name="scan", body=body, num_scan_inputs=n_inputs)
    graph = h.make_graph(
        outer_nodes + [scan], "projected",
        [vi("X", TP.FLOAT, ["seq"] + lead + [I])] + [vi(f"{s}0", TP.FLOAT, lead + [H]) for s, _ in states],
        [vi(f"{s}_n", TP.FLOAT, lead + [H]) for s, _ in states] + [vi("Y", TP.FLOAT, ["seq"] + lead + [H])],
        initializer=outer_inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def _fused(model, kind):
    out, outcomes = cb.fuse(model)
    assert [o.applied for o in outcomes] == [True], [o.detail for o in outcomes]
    assert "input projection of 'X' folded into W and B" in outcomes[0].detail
    counts = ops(out)
    assert counts["Scan"] == 0 and counts[kind] == 1, counts
    node, _ = cb.native(out)
    assert node.input[0] in ("X",) or ops(out)["MatMul"] == 0  # the native op reads X, not the projection
    assert_equivalent(model, out)
    assert_equivalent(model, out, inputs=cb.feeds(model, T=6, B=3))
    return out


def test_rnn_over_an_outer_matmul_plus_bias():
    model = _model([h.make_node("MatMul", ["h", "R"], ["hr"]), h.make_node("Add", ["xp_t0", "hr"], ["pre"]),
                    h.make_node("Tanh", ["pre"], ["h_new"])], [_init("R", _w(1, H, H))], 1,
                   [h.make_node("MatMul", ["X", "W"], ["xw"]), h.make_node("Add", ["b", "xw"], ["xp0"])],
                   [_init("W", _w(2, I, H)), _init("b", _w(3, H))])
    out = _fused(model, "RNN")
    assert ops(out)["MatMul"] == 0 and ops(out)["Add"] == 0  # the projection went with the Scan


def test_the_projection_stays_where_something_else_reads_it():
    model = _model([h.make_node("MatMul", ["h", "R"], ["hr"]), h.make_node("Add", ["xp_t0", "hr"], ["pre"]),
                    h.make_node("Tanh", ["pre"], ["h_new"])], [_init("R", _w(1, H, H))], 1,
                   [h.make_node("MatMul", ["X", "W"], ["xw"]), h.make_node("Add", ["xw", "b"], ["xp0"])],
                   [_init("W", _w(2, I, H)), _init("b", _w(3, H))])
    model.graph.output.append(vi("xp0", TP.FLOAT, ["seq", "batch", H]))
    out = _fused(model, "RNN")
    assert ops(out)["MatMul"] == 1 and "xp0" in [o.name for o in out.graph.output]


def test_unbatched_rnn_over_an_outer_gemm():
    model = _model([h.make_node("MatMul", ["h", "R"], ["hr"]), h.make_node("Add", ["hr", "xp_t0"], ["pre"]),
                    h.make_node("Relu", ["pre"], ["h_new"])], [_init("R", _w(1, H, H))], 1,
                   [h.make_node("Gemm", ["X", "W", "b"], ["xp0"], transB=1, alpha=0.5)],
                   [_init("W", _w(2, H, I)), _init("b", _w(3, H))], batched=False)
    _fused(model, "RNN")


def test_gru_with_its_projection_split_per_gate_into_three_scan_inputs():
    """PyTorch gate order r, z, n (linear_before_reset=1), the projection cut by Split outside."""
    nodes = [
        h.make_node("MatMul", ["h", "Rr"], ["hr_r"]), h.make_node("Add", ["xp_t0", "hr_r"], ["pr"]),
        h.make_node("Sigmoid", ["pr"], ["r"]),
        h.make_node("MatMul", ["h", "Rz"], ["hr_z"]), h.make_node("Add", ["xp_t1", "hr_z"], ["pz"]),
        h.make_node("Sigmoid", ["pz"], ["z"]),
        h.make_node("MatMul", ["h", "Rn"], ["hr_n"]), h.make_node("Add", ["hr_n", "bn"], ["hr_nb"]),
        h.make_node("Mul", ["r", "hr_nb"], ["rh"]), h.make_node("Add", ["xp_t2", "rh"], ["pn"]),
        h.make_node("Tanh", ["pn"], ["n"]),
        h.make_node("Sub", ["n", "h"], ["d"]), h.make_node("Mul", ["z", "d"], ["zd"]),
        h.make_node("Sub", ["n", "zd"], ["h_new"]),
    ]
    inits = [_init("Rr", _w(1, H, H)), _init("Rz", _w(2, H, H)), _init("Rn", _w(3, H, H)), _init("bn", _w(4, H))]
    outer = [h.make_node("MatMul", ["X", "W"], ["xw"]), h.make_node("Add", ["xw", "b"], ["xwb"]),
             h.make_node("Split", ["xwb", "sizes"], ["xp0", "xp1", "xp2"], axis=-1)]
    outer_inits = [_init("W", _w(5, I, 3 * H)), _init("b", _w(6, 3 * H)),
                   numpy_helper.from_array(np.array([H, H, H], np.int64), "sizes")]
    _fused(_model(nodes, inits, 3, outer, outer_inits), "GRU")


def test_lstm_whose_recurrent_gemm_takes_the_projected_input_as_c():
    nodes = _LSTM_OVER_XP_T0
    inits = [_init("R", _w(1, 4 * H, H)), numpy_helper.from_array(np.array([H] * 4, np.int64), "sizes")]
    outer = [h.make_node("MatMul", ["X", "W"], ["xw"]), h.make_node("Add", ["xw", "b"], ["xp0"])]
    _fused(_model(nodes, inits, 1, outer, [_init("W", _w(2, I, 4 * H)), _init("b", _w(3, 4 * H))], lstm=True,
                  width=4 * H), "LSTM")


def test_scan_inputs_projected_from_different_sequences_are_declined():
    nodes = [h.make_node("MatMul", ["h", "R"], ["hr"]), h.make_node("Add", ["xp_t0", "hr"], ["a"]),
             h.make_node("Add", ["a", "xp_t1"], ["pre"]), h.make_node("Tanh", ["pre"], ["h_new"])]
    outer = [h.make_node("MatMul", ["X", "W"], ["xp0"]), h.make_node("Neg", ["X"], ["nx"]),
             h.make_node("MatMul", ["nx", "W"], ["xp1"])]
    model = _model(nodes, [_init("R", _w(1, H, H))], 2, outer, [_init("W", _w(2, I, H))])
    assert "2 scan inputs; the native ops read one sequence X" in cb.declined(model)


def test_a_run_time_projection_weight_is_not_folded():
    nodes = [h.make_node("MatMul", ["h", "R"], ["hr"]), h.make_node("Add", ["xp_t0", "hr"], ["a"]),
             h.make_node("Add", ["a", "xp_t1"], ["pre"]), h.make_node("Tanh", ["pre"], ["h_new"])]
    outer = [h.make_node("MatMul", ["X", "Wrt"], ["xw"]), h.make_node("Split", ["xw", "sizes"], ["xp0", "xp1"], axis=-1)]
    model = _model(nodes, [_init("R", _w(1, H, H))], 2, outer, [numpy_helper.from_array(np.array([H, H], np.int64), "sizes")])
    model.graph.input.append(vi("Wrt", TP.FLOAT, [I, 2 * H]))
    assert "2 scan inputs" in cb.declined(model)


HOISTED = ["coupled_lstm", "gru_weights_transposed_outer", "keras_gru_reset_after", "lstm_fp16_weights",
           "rnn_bias_gemm_c_adds", "torch_scan_gru", "torch_scan_lstm", "torch_lstm_cell_noopt", "torch_bigru"]


@pytest.mark.parametrize("name", HOISTED)
def test_hoisted_committed_cells_fuse_again(name):
    """scanopt's hoist writes the projection outside the loop; fusing its output gives the
    native op over X again, equal to the original model."""
    original = onnx.load(str(CELLS / f"{name}.onnx"))
    hoisted, report = scanopt.optimize(original, passes=["canonicalize", "hoist", "cleanup"], verify=False,
                                       options={"target": "portable"})
    assert any(o.applied for o in report.outcomes if o.pass_name == "hoist")
    out, outcomes = cb.fuse(hoisted)
    assert outcomes and all(o.applied for o in outcomes), [o.detail for o in outcomes]
    assert any("input projection of" in o.detail for o in outcomes)
    assert ops(out)["Scan"] == 0
    assert_equivalent(original, out)


def test_batch_major_reverse_scan_over_a_projection():
    """X [batch, seq, I] projected outside, the Scan reading axis 1 in reverse."""
    model = _model([h.make_node("MatMul", ["h", "R"], ["hr"]), h.make_node("Add", ["xp_t0", "hr"], ["pre"]),
                    h.make_node("Tanh", ["pre"], ["h_new"])], [_init("R", _w(1, H, H))], 1,
                   [h.make_node("MatMul", ["X", "W"], ["xw"]), h.make_node("Add", ["xw", "b"], ["xp0"])],
                   [_init("W", _w(2, I, H)), _init("b", _w(3, H))])
    g = model.graph
    g.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    g.input[0].type.tensor_type.shape.dim[1].dim_param = "seq"
    (scan,) = [n for n in g.node if n.op_type == "Scan"]
    scan.attribute.extend([h.make_attribute("scan_input_axes", [1]), h.make_attribute("scan_input_directions", [1])])
    out = _fused(model, "RNN")
    _, attrs = cb.native(out)
    assert attrs["direction"] == b"reverse" or attrs["direction"] == "reverse"


def test_a_hoisted_bidirectional_pair_merges_into_one_native_op():
    """PyTorch's bidirectional GRU: after hoist the reverse Scan reads a projection of the
    reversed X; both are read through to X and merge into one bidirectional GRU."""
    original = onnx.load(str(CELLS / "torch_bigru.onnx"))
    hoisted, _ = scanopt.optimize(original, passes=["canonicalize", "hoist", "cleanup"], verify=False,
                                  options={"target": "portable"})
    out, outcomes = cb.fuse(hoisted)
    assert ops(out)["GRU"] == 1 and ops(out)["Scan"] == 0, [o.detail for o in outcomes]
    assert cb.native(out)[1]["direction"] == b"bidirectional"
    assert_equivalent(original, out)


def _i64(name, value):
    return numpy_helper.from_array(np.array(value, np.int64), name)


_LSTM_OVER_XP_T0 = [
    h.make_node("Gemm", ["h", "R", "xp_t0"], ["g"], transB=1),
    h.make_node("Split", ["g", "sizes"], ["gi", "gf", "gc", "go"], axis=1),
    h.make_node("Sigmoid", ["gi"], ["i"]), h.make_node("Sigmoid", ["gf"], ["f"]),
    h.make_node("Tanh", ["gc"], ["cc"]), h.make_node("Sigmoid", ["go"], ["o"]),
    h.make_node("Mul", ["f", "c"], ["fc"]), h.make_node("Mul", ["i", "cc"], ["ic"]),
    h.make_node("Add", ["fc", "ic"], ["c_new"]), h.make_node("Tanh", ["c_new"], ["tc"]),
    h.make_node("Mul", ["o", "tc"], ["h_new"])]


def _dense_through_reshape(back, back_inits, *, lstm):
    """A Dense layer as tf2onnx / Keras write it: ``Reshape(X, [-1, I])``, a Gemm with
    transB=1 and a [1, G] bias row, then a Reshape to ``back``."""
    g = 4 * H if lstm else H
    outer = [h.make_node("Reshape", ["X", "flat"], ["x2"]), h.make_node("Gemm", ["x2", "Wt", "b_row"], ["p2"], transB=1),
             *back, h.make_node("Reshape", ["p2", "back"], ["xp0"])]
    inits = [_init("Wt", _w(2, g, I)), _init("b_row", _w(3, 1, g)), _i64("flat", [-1, I])] + back_inits
    if lstm:
        body_inits = [_init("R", _w(1, 4 * H, H)), _i64("sizes", [H] * 4)]
        return _model(_LSTM_OVER_XP_T0, body_inits, 1, outer, inits, lstm=True, width=g)
    body = [h.make_node("MatMul", ["h", "R"], ["hr"]), h.make_node("Add", ["xp_t0", "hr"], ["pre"]),
            h.make_node("Tanh", ["pre"], ["h_new"])]
    return _model(body, [_init("R", _w(1, H, H))], 1, outer, inits)


def _back_to_x_leading_dims(width):
    """``Concat(Shape(X)[0:2], [G])``."""
    return ([h.make_node("Shape", ["X"], ["sx"]), h.make_node("Slice", ["sx", "s0", "s2"], ["lead"]),
             h.make_node("Concat", ["lead", "g_dim"], ["back"], axis=0)],
            [_i64("s0", [0]), _i64("s2", [2]), _i64("g_dim", [width])])


@pytest.mark.parametrize("lstm", [False, True])
def test_a_projection_of_flattened_rows_reshaped_back_to_x_is_folded(lstm):
    model = _dense_through_reshape(*_back_to_x_leading_dims(4 * H if lstm else H), lstm=lstm)
    out = _fused(model, "LSTM" if lstm else "RNN")
    assert ops(out)["Gemm"] == 0 and ops(out)["Reshape"] == 0


def test_a_projection_reshaped_to_dims_not_proven_x_s_is_not_read_through():
    """Back to a constant batch of 2 while X's batch is symbolic: the rows are not proven
    X's, so the per-gate cut of the projected input stays unexplained and the Scan stays."""
    model = _dense_through_reshape([], [_i64("back", [-1, 2, 4 * H])], lstm=True)
    assert "cuts 'xp_t0' itself" in cb.declined(model)
