"""fuse near-misses (issue 12): recurrences that look like cells but that no native op computes
stay loops, each with a reason that names what differs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import cell_builders as cb
from equivalence import ops

H, I = cb.H, cb.I
vi = h.make_tensor_value_info


def declined(model) -> str:
    out, outcomes = cb.fuse(model)
    assert [o.applied for o in outcomes] == [False], [o.detail for o in outcomes]
    assert ops(out)["Scan"] == 1
    return outcomes[0].detail


def one_state(build):
    body = cb.Body()
    res = build(body)
    if isinstance(res, tuple):
        return cb.scan_model(body, [("h", res[0], H), ("c", res[1], H)], ys=[res[0]])
    return cb.scan_model(body, [("h", res, H)], ys=[res])


def _one(b):
    return b.const(np.float32(1), "one", where="body")


def layer_norm_gru(b):
    pre = b.op("LayerNormalization", b.op("Add", b.linear("x", cb.rand(0, 3 * H, I)), b.linear("h", cb.rand(1, 3 * H, H))),
               b.const(np.ones(3 * H, np.float32), "gamma"), axis=-1)
    z_pre, r_pre, n_pre = b.split(pre, 3)
    z, r = b.op("Sigmoid", z_pre), b.op("Sigmoid", r_pre)
    n = b.op("Tanh", b.op("Add", n_pre, b.op("Mul", r, b.linear("h", cb.rand(2, H, H)))))
    return b.op("Add", b.op("Mul", b.op("Sub", _one(b), z), n), b.op("Mul", z, "h"))


def min_gru(b):
    """minGRU: z and the candidate read x only (no activation on the candidate)."""
    z = b.op("Sigmoid", b.linear("x", cb.rand(0, H, I), cb.rand(1, H)))
    cand = b.linear("x", cb.rand(2, H, I), cb.rand(3, H))
    return b.op("Add", b.op("Mul", b.op("Sub", _one(b), z), "h"), b.op("Mul", z, cand))


def scaled_carry(b):
    return b.op("Add", b.op("Mul", b.const(np.float32(0.9), "k", where="body"), "h"), cb.rnn(b, "x", "h"))


def projected_lstm(b):
    hn, cn = cb.lstm(b, "x", "h", "c")
    return b.op("MatMul", hn, b.const(cb.rand(9, H, H))), cn


def ema(b):
    x_proj = b.linear("x", cb.rand(0, H, I))
    return b.op("Add", b.op("Mul", b.const(np.float32(0.8), "a", where="body"), "h"),
                b.op("Mul", b.const(np.float32(0.2), "a2", where="body"), x_proj))


@pytest.mark.parametrize("build, reason", [
    (layer_norm_gru, "(Split of a LayerNormalization output)"),
    (min_gru, "the new state has a matrix product outside any activation"),
    (scaled_carry, "the new state expands to 0.9·h + 'tanh_"),
    (projected_lstm, "the new hidden state has a matrix product outside any activation"),
    (ema, "h read elementwise only (a diagonal recurrence such as an EMA or a running sum)"),
])
def test_near_miss_cells_stay_loops(build, reason):
    assert reason in declined(one_state(build))


def _unbatched_scan(nodes, states, ys, x_size=I):
    """A Scan-9+ over X [seq, x_size] whose body has states [(in, out, shape)] and scan outputs ys."""
    body = h.make_graph(nodes, "b", [vi(i, TP.FLOAT, s) for i, _, s in states] + [vi("x", TP.FLOAT, [x_size])],
                        [vi(o, TP.FLOAT, s) for _, o, s in states] + [vi(y, TP.FLOAT, [H]) for y in ys])
    scan = h.make_node("Scan", [f"{i}0" for i, _, _ in states] + ["X"], [f"{i}_n" for i, _, _ in states] + ["Y"],
                       num_scan_inputs=1, body=body)
    g = h.make_graph([scan], "m", [vi(f"{i}0", TP.FLOAT, s) for i, _, s in states] + [vi("X", TP.FLOAT, ["seq", x_size])],
                     [vi(f"{i}_n", TP.FLOAT, s) for i, _, s in states] + [vi("Y", TP.FLOAT, ["seq", H])],
                     initializer=[cb.numpy_helper.from_array(cb.rand(0, H, I), "W"),
                                  cb.numpy_helper.from_array(np.float32(0.99), "decay")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_a_recurrent_weight_that_changes_per_step_stays_a_loop():
    """h' = tanh(W·x + R·h) with R' = 0.99·R carried as a second state."""
    nodes = [h.make_node("MatMul", ["W", "x"], ["wx"]), h.make_node("MatMul", ["R", "h"], ["rh"]),
             h.make_node("Add", ["wx", "rh"], ["pre"]), h.make_node("Tanh", ["pre"], ["h2"]),
             h.make_node("Mul", ["R", "decay"], ["R2"]), h.make_node("Identity", ["h2"], ["y"])]
    reason = declined(_unbatched_scan(nodes, [("h", "h2", [H]), ("R", "R2", [H, H])], ["y"]))
    assert "no LSTM cell" in reason and "expands to 0.99·c" in reason


def test_linear_attention_stays_a_loop():
    """S' = S + k⊗v, y = Sᵀ·q with k, v, q projections of x."""
    nodes = [h.make_node("MatMul", ["W", "x"], ["k"]), h.make_node("Tanh", ["k"], ["v"]), h.make_node("Sigmoid", ["k"], ["q"]),
             h.make_node("Unsqueeze", ["k", "ax1"], ["kc"]), h.make_node("Unsqueeze", ["v", "ax0"], ["vr"]),
             h.make_node("MatMul", ["kc", "vr"], ["kv"]), h.make_node("Add", ["S", "kv"], ["S2"]),
             h.make_node("MatMul", ["q", "S2"], ["y"])]
    model = _unbatched_scan(nodes, [("S", "S2", [H, H])], ["y"])
    body = model.graph.node[0].attribute[0].g
    body.initializer.extend([cb.numpy_helper.from_array(np.array([1], np.int64), "ax1"),
                             cb.numpy_helper.from_array(np.array([0], np.int64), "ax0")])
    reason = declined(model)
    assert "multiplies by 'vr', which is not a constant" in reason


def test_two_stacked_cells_in_one_loop_are_named_in_the_reason():
    """TF1 MultiRNNCell: h1' = tanh(W·x + h1), h2' = tanh(h1' + h2): no LSTM, and the reason
    says which state never reads the other."""
    nodes = [h.make_node("MatMul", ["W", "x"], ["wx"]), h.make_node("Add", ["wx", "h1"], ["p1"]),
             h.make_node("Tanh", ["p1"], ["h1n"]), h.make_node("Add", ["h1n", "h2"], ["p2"]),
             h.make_node("Tanh", ["p2"], ["h2n"]), h.make_node("Identity", ["h2n"], ["y"])]
    reason = declined(_unbatched_scan(nodes, [("h1", "h1n", [H]), ("h2", "h2n", [H])], ["y"]))
    assert "no LSTM cell" in reason and "two separate recurrences ('h1' never reads 'h2')" in reason


def test_two_states_that_read_each_other_get_no_stacking_note():
    """c' = c + 0.99·h and h' = tanh(c'·(W·x + h)): each state reads the other (as an LSTM's
    h and c do), so the reason adds no note about separate recurrences."""
    nodes = [h.make_node("MatMul", ["W", "x"], ["wx"]), h.make_node("Add", ["wx", "h"], ["pre"]),
             h.make_node("Mul", ["h", "decay"], ["hd"]), h.make_node("Add", ["c", "hd"], ["c2"]),
             h.make_node("Mul", ["c2", "pre"], ["mix"]), h.make_node("Tanh", ["mix"], ["h2"]),
             h.make_node("Identity", ["h2"], ["y"])]
    reason = declined(_unbatched_scan(nodes, [("h", "h2", [H]), ("c", "c2", [H])], ["y"]))
    assert "no LSTM cell" in reason and "separate recurrences" not in reason
