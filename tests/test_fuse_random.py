"""fuse on hypothesis-generated cells: random sizes (1..5), batch axis or not, scan axis,
input and output directions, number of scan outputs, opset, weight placement (body,
outer scope, Constant nodes, graph inputs = run-time weights), the nodes a constant weight
is computed by (Transpose, Cast from float16, Reshape, Slice, Split, Concat, Unsqueeze,
Identity, Constant; in the body or the main graph), the written form of the cell (a linear
cell = Affine) and the layout-preserving nodes between Concat([x, h]) and its MatMul. Every generated body is a true cell, so each must fuse into
exactly one native op that matches the Scan in onnxruntime and the reference executor."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cell_builders as cb
from equivalence import assert_equivalent, ops

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def scan_setup(draw):
    batch = draw(st.booleans())
    rank = 2 if batch else 1
    outputs = draw(st.integers(0, 2))
    return {
        "batch": batch,
        "hidden": draw(st.integers(1, 5)),
        "inputs": draw(st.integers(1, 5)),
        "opset": draw(st.sampled_from([11, 13, 17, 18])),
        "where": draw(st.sampled_from(["body", "outer", "node", "runtime"])),
        "wrap": draw(st.sampled_from([None, None, "transpose", "cast16", "reshape", "slice", "split", "concat",
                                      "unsqueeze", "identity", "constant"])),
        "wrap_where": draw(st.sampled_from(["body", "outer"])),
        "in_axis": draw(st.integers(0, rank)),
        "in_dir": draw(st.integers(0, 1)),
        "out_axes": [draw(st.integers(0, rank)) for _ in range(outputs)],
        "out_dirs": [draw(st.integers(0, 1)) for _ in range(outputs)],
        "finals": outputs == 0 or draw(st.booleans()),
        "T": draw(st.integers(1, 6)),
        "B": draw(st.integers(1, 4)),
        "seed": draw(st.integers(0, 1000)),
    }


def forms(batch):
    return st.sampled_from(["matmul", "bias_first", "gemm", "gemm_t"] if batch else ["matmul", "bias_first", "matvec"])


def run(setup, kind, make):
    runtime = setup["where"] == "runtime"  # weights as graph inputs: run-time inputs of the native op
    body = cb.Body(batch=setup["batch"], where="outer" if runtime else setup["where"], opset=setup["opset"],
                   hidden=setup["hidden"], inputs=setup["inputs"], wrap=None if runtime else setup["wrap"],
                   wrap_where=setup["wrap_where"])
    states, h_new = make(body)
    ys = [h_new] * len(setup["out_axes"])
    model = cb.scan_model(body, states, ys=ys, in_axis=setup["in_axis"], out_axes=setup["out_axes"] or None,
                          in_dir=setup["in_dir"], out_dirs=setup["out_dirs"] or None, finals=setup["finals"])
    if runtime:
        cb.weights_as_inputs(model)
    out, outcomes = cb.fuse(model)
    assert [o.applied for o in outcomes] == [True], [o.detail for o in outcomes]
    counts = ops(out)
    assert counts["Scan"] == 0 and counts[kind] == 1, counts
    assert_equivalent(model, out, inputs=cb.feeds(model, T=setup["T"], B=setup["B"], seed=setup["seed"]))


@SETTINGS
@given(setup=scan_setup(), data=st.data())
def test_random_rnn_cells_fuse(setup, data):
    cell = {
        "act": data.draw(st.sampled_from(["Tanh", "Relu", "Sigmoid", "Softsign", "Identity"])),  # Identity: Affine
        "form": data.draw(forms(setup["batch"])),
        "bias": data.draw(st.sampled_from(["split", "merged", "none"])),
        "order": data.draw(st.sampled_from(["xh", "hx"])),
        "seed": setup["seed"],
    }

    def make(body):
        h_new = cb.rnn(body, "x", "h", **cell)
        return [("h", h_new, body.H)], h_new

    run(setup, "RNN", make)


@SETTINGS
@given(setup=scan_setup(), data=st.data())
def test_random_gru_cells_fuse(setup, data):
    cell = {
        "lbr": data.draw(st.integers(0, 1)),
        "order": data.draw(st.sampled_from(["onnx", "torch"])),
        "fused": data.draw(st.booleans()),
        "cut": data.draw(st.sampled_from(["split", "slice", "split_pos"])),
        "update": data.draw(st.sampled_from(["standard", "lerp", "expanded"])),
        "form": data.draw(forms(setup["batch"])),
        "seed": setup["seed"],
    }

    def make(body):
        h_new = cb.gru(body, "x", "h", **cell)
        return [("h", h_new, body.H)], h_new

    run(setup, "GRU", make)


@SETTINGS
@given(setup=scan_setup(), data=st.data())
def test_random_lstm_cells_fuse(setup, data):
    cell = {
        "order": data.draw(st.sampled_from(["onnx", "torch"])),
        "cut": data.draw(st.sampled_from(["split", "slice", "split_pos"])),
        "peep": data.draw(st.booleans()),
        "form": data.draw(forms(setup["batch"])),
        "acts": data.draw(st.sampled_from([("Sigmoid", "Tanh", "Tanh"), ("Sigmoid", "Identity", "Tanh"),
                                            ("Sigmoid", "Tanh", "Identity")])),  # Identity: Affine g / h
        "seed": setup["seed"],
    }
    c_first = data.draw(st.booleans())

    def make(body):
        h_new, c_new = cb.lstm(body, "x", "h", "c", **cell)
        states = [("h", h_new, body.H), ("c", c_new, body.H)]
        return (states[::-1] if c_first else states), h_new

    run(setup, "LSTM", make)


@SETTINGS
@given(setup=scan_setup(), data=st.data())
def test_random_concat_cells_through_layout_nodes_fuse(setup, data):
    if setup["where"] == "runtime":  # Concat·W with a run-time W is declined (tests/test_fuse_layout.py)
        setup = dict(setup, where="outer")
    kind = data.draw(st.sampled_from(["RNN", "LSTM"]))
    via = data.draw(st.sampled_from((None,) + cb.VIAS))

    def make(body):
        if kind == "RNN":
            h_new = cb.concat_rnn(body, "x", "h", seed=setup["seed"], via=via)
            return [("h", h_new, body.H)], h_new
        h_new, c_new = cb.concat_lstm(body, "x", "h", "c", seed=setup["seed"], via=via)
        return [("h", h_new, body.H), ("c", c_new, body.H)], h_new

    run(setup, kind, make)
