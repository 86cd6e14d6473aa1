"""The committed samples in models/ hold the Scan they advertise and compute the math they claim.

Every expected value comes from outside the model under test: numpy written here from the
equations in DESIGN.md (Scan semantics, ONNX RNN/GRU/LSTM), or, for exported samples, the source
framework's own outputs saved at generation time in <name>.expected.npz. The numpy cells are
themselves checked against onnxruntime's native RNN/GRU/LSTM kernels, so a Scan sample that
matches them is exactly what a fusion pass may replace with the native op.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

MODELS = Path(__file__).resolve().parent.parent / "models"
RTOL, ATOL = 1e-5, 1e-6  # float32; every sample is a handful of float32 ops per element
T, B, I, H = 5, 2, 3, 4  # sizes the recurrent samples were built with (models/generate.py)

# file stem -> (default-domain opset, IR version, producer)
SAMPLES = {
    "scan8_sum": (8, 8, "hand"),
    "scan8_sum_seqlens": (8, 8, "hand"),
    "scan8_reverse_seqlens": (8, 8, "hand"),
    "scan9_sum": (9, 8, "hand"),
    "scan_axes_directions": (16, 8, "hand"),
    "scan_short_static": (16, 8, "hand"),
    "scan_rnn": (16, 8, "hand"),
    "scan_gru": (16, 8, "hand"),
    "scan_gru_lbr1": (16, 8, "hand"),
    "scan_lstm": (16, 8, "hand"),
    "scan_nested": (16, 8, "hand"),
    "torch_scan_rnn": (20, 10, "torch"),
    "torch_scan_rnn_rev_dim1": (20, 10, "torch"),
    "skl_knn_regressor": (17, 8, "skl2onnx"),
}


# ---------------------------------------------------------------- helpers
def load(name: str) -> onnx.ModelProto:
    return onnx.load(str(MODELS / f"{name}.onnx"))


def run(name: str, **feeds) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(MODELS / f"{name}.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def default_opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def only_scan(graph: onnx.GraphProto) -> onnx.NodeProto:
    scans = [n for n in graph.node if n.op_type == "Scan"]
    assert len(scans) == 1, [n.name for n in scans]
    return scans[0]


def attrs(n: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


def inits(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in graph.initializer}


def subgraphs(graph: onnx.GraphProto):
    """graph and every graph nested in it, depth first."""
    yield graph
    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from subgraphs(a.g)


def close(actual, expected, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# ---------------------------------------------------------------- numpy references
def scan8_cumsum(init, x, lens, reverse=False):
    """Scan-8 running sum per batch item over its own len[b] steps; reverse reads positions
    len-1 .. 0; outputs in processing order, zeros at and past len[b]."""
    y, z = init.copy(), np.zeros_like(x)
    for b, n in enumerate(lens):
        s = init[b].copy()
        for step, t in enumerate(range(n - 1, -1, -1) if reverse else range(n)):
            s = s + x[b, t]
            z[b, step] = s
        y[b] = s
    return y, z


def rnn(X, h, W, R, Wb, Rb):
    """ONNX RNN, Tanh: H_t = tanh(X_t W^T + H_{t-1} R^T + Wb + Rb)."""
    ys = []
    for x in X:
        h = np.tanh(x @ W.T + h @ R.T + Wb + Rb)
        ys.append(h)
    return np.stack(ys), h


def gru(X, h, W, R, Wb, Rb, linear_before_reset):
    """ONNX GRU, gate order z, r, h."""
    Wz, Wr, Wh = np.split(W, 3)
    Rz, Rr, Rh = np.split(R, 3)
    Wbz, Wbr, Wbh = np.split(Wb, 3)
    Rbz, Rbr, Rbh = np.split(Rb, 3)
    ys = []
    for x in X:
        z = sigmoid(x @ Wz.T + h @ Rz.T + Wbz + Rbz)
        r = sigmoid(x @ Wr.T + h @ Rr.T + Wbr + Rbr)
        if linear_before_reset:
            ht = np.tanh(x @ Wh.T + r * (h @ Rh.T + Rbh) + Wbh)
        else:
            ht = np.tanh(x @ Wh.T + (r * h) @ Rh.T + Rbh + Wbh)
        h = (1 - z) * ht + z * h
        ys.append(h)
    return np.stack(ys), h


def lstm(X, h, c, W, R, Wb, Rb):
    """ONNX LSTM, gate order i, o, f, c, no peepholes."""
    ys = []
    for x in X:
        i, o, f, g = np.split(x @ W.T + h @ R.T + Wb + Rb, 4, axis=-1)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        ys.append(h)
    return np.stack(ys), h, c


def native(op, X, W, R, Wb, Rb, h0, c0=None, **attrs):
    """Run onnxruntime's native RNN/GRU/LSTM (one direction) on the same weights."""
    feeds = {"X": X, "W": W[None], "R": R[None], "B": np.concatenate([Wb, Rb])[None],
             "initial_h": h0[None]}
    outs = ["Y", "Y_h"]
    if c0 is not None:
        feeds["initial_c"], outs = c0[None], outs + ["Y_c"]
    ins = ["X", "W", "R", "B", "", "initial_h"] + (["initial_c"] if c0 is not None else [])
    node = helper.make_node(op, ins, outs, hidden_size=H, **attrs)
    vi = [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v.shape) for k, v in feeds.items()]
    out_vi = [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, None) for k in outs]
    m = helper.make_model(helper.make_graph([node], op, vi, out_vi),
                          opset_imports=[helper.make_opsetid("", 16)], ir_version=8)
    res = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    return [res[0][:, 0]] + [r[0] for r in res[1:]]  # drop the direction axis


# ---------------------------------------------------------------- every sample
def test_every_sample_is_listed_small_and_typed():
    """A new sample needs a test here; files stay small; versions are what the README says."""
    assert {p.stem for p in MODELS.glob("*.onnx")} == set(SAMPLES)
    for name, (opset, ir, producer) in SAMPLES.items():
        assert (MODELS / f"{name}.onnx").stat().st_size < 200_000, name
        m = load(name)
        assert (default_opset(m), m.ir_version) == (opset, ir), name
        assert any(n.op_type == "Scan" for n in m.graph.node), name
        if producer != "hand":
            continue
        for g in subgraphs(m.graph):
            assert all(n.name for n in g.node), f"{name}: unnamed node in {g.name}"
        for v in list(m.graph.input) + list(m.graph.output):
            tt = v.type.tensor_type
            assert tt.elem_type and tt.HasField("shape"), (name, v.name)
            assert all(d.HasField("dim_value") or d.HasField("dim_param") for d in tt.shape.dim)


# ---------------------------------------------------------------- running sums
def test_scan8_sum_is_the_backend_test():
    m = load("scan8_sum")
    scan = only_scan(m.graph)
    assert scan.input[0] == "" and attrs(scan)["num_scan_inputs"] == 1
    assert "directions" not in attrs(scan)
    out = run("scan8_sum", initial=np.zeros((1, 2), np.float32),
              x=np.arange(1, 7, dtype=np.float32).reshape(1, 3, 2))
    np.testing.assert_array_equal(out["y"], [[9, 12]])
    np.testing.assert_array_equal(out["z"], [[[1, 2], [4, 6], [9, 12]]])


def test_scan8_sum_batched_random():
    rng = np.random.default_rng(0)
    init, x = randn(rng, 3, 2), randn(rng, 3, 6, 2)
    y, z = scan8_cumsum(init, x, [6, 6, 6])
    out = run("scan8_sum", initial=init, x=x)
    close(out["y"], y)
    close(out["z"], z)


def test_scan8_sum_seqlens_zeroes_past_each_length():
    scan = only_scan(load("scan8_sum_seqlens").graph)
    assert scan.input[0] == "sequence_lens"
    rng = np.random.default_rng(1)
    init, x = randn(rng, 4, 2), randn(rng, 4, 6, 2)
    lens = np.array([6, 1, 3, 5], np.int64)  # onnxruntime rejects 0
    y, z = scan8_cumsum(init, x, lens)
    out = run("scan8_sum_seqlens", sequence_lens=lens, initial=init, x=x)
    close(out["y"], y)
    close(out["z"], z)
    assert not out["z"][1, 1:].any() and not out["z"][2, 3:].any()


def test_scan8_reverse_seqlens_starts_each_item_at_its_length():
    scan = only_scan(load("scan8_reverse_seqlens").graph)
    assert attrs(scan)["directions"] == [0, 1] and list(scan.input[-2:]) == ["x", "x"]
    rng = np.random.default_rng(2)
    f0, b0, x = randn(rng, 3, 2), randn(rng, 3, 2), randn(rng, 3, 5, 2)
    lens = np.array([2, 5, 1], np.int64)
    out = run("scan8_reverse_seqlens", sequence_lens=lens, init_fwd=f0, init_bwd=b0, x=x)
    y_fwd, z_fwd = scan8_cumsum(f0, x, lens)
    y_bwd, z_bwd = scan8_cumsum(b0, x, lens, reverse=True)
    for key, want in dict(y_fwd=y_fwd, z_fwd=z_fwd, y_bwd=y_bwd, z_bwd=z_bwd).items():
        close(out[key], want)
    close(out["z_bwd"][0, 0], b0[0] + x[0, 1])  # len 2: reads position 1 first


def test_scan9_sum_is_the_backend_test():
    m = load("scan9_sum")
    assert attrs(only_scan(m.graph)).keys() == {"body", "num_scan_inputs"}
    out = run("scan9_sum", initial=np.zeros(2, np.float32),
              x=np.arange(1, 7, dtype=np.float32).reshape(3, 2))
    np.testing.assert_array_equal(out["y"], [9, 12])
    np.testing.assert_array_equal(out["z"], [[1, 2], [4, 6], [9, 12]])
    rng = np.random.default_rng(3)
    init, x = randn(rng, 2), randn(rng, 7, 2)
    y, z = scan8_cumsum(init[None], x[None], [7])
    out = run("scan9_sum", initial=init, x=x)
    close(out["y"], y[0])
    close(out["z"], z[0])


def test_scan_axes_directions():
    a = attrs(only_scan(load("scan_axes_directions").graph))
    assert (a["scan_input_axes"], a["scan_input_directions"]) == ([1, -1], [0, 1])
    assert (a["scan_output_axes"], a["scan_output_directions"]) == ([-1, 1], [1, 0])
    rng = np.random.default_rng(4)
    n = 6
    s0, xa, xb = randn(rng, 2, 3), randn(rng, 2, n, 3), randn(rng, 2, 3, n)
    s, o1, o2 = s0.copy(), np.zeros((2, 3, n), np.float32), np.zeros((2, n, 3), np.float32)
    for t in range(n):
        at, bt = xa[:, t, :], xb[:, :, n - 1 - t]  # b is read backwards along its last axis
        s = s + at * bt
        o1[:, :, n - 1 - t] = s  # prepended along the last axis
        o2[:, t, :] = at - bt  # appended along axis 1
    out = run("scan_axes_directions", s0=s0, a=xa, b=xb)
    close(out["s_final"], s)
    close(out["o1"], o1)
    close(out["o2"], o2)


def test_scan_short_static_has_trip_count_four():
    m = load("scan_short_static")
    scan = only_scan(m.graph)
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in m.graph.input}
    assert dims == {"h0": [2, 3], "x": [4, 2, 3]}
    w = inits(attrs(scan)["body"])["W"]
    rng = np.random.default_rng(5)
    h, x = randn(rng, 2, 3), randn(rng, 4, 2, 3)
    out = run("scan_short_static", h0=h, x=x)
    ys = []
    for xt in x:
        h = np.tanh(xt @ w + h)
        ys.append(h)
    close(out["y"], np.stack(ys))
    close(out["h_final"], h)


def test_scan_nested_captures_across_two_levels():
    m = load("scan_nested")
    outer = attrs(only_scan(m.graph))["body"]
    inner = attrs(only_scan(outer))["body"]
    scale = inits(m.graph)["scale"]
    assert "scale" not in inits(inner) and "scale" in {i for n in inner.node for i in n.input}
    rng = np.random.default_rng(6)
    s0, x = randn(rng), randn(rng, 4, 3)
    acc, y = s0, []
    for e in x.ravel():
        acc = np.float32(acc + e * scale)
        y.append(acc)
    out = run("scan_nested", s0=s0, x=x)
    close(out["y"], np.reshape(y, x.shape))
    close(out["total"], acc)


# ---------------------------------------------------------------- recurrent cells
def rnn_weights():
    """RNN: W, R, Wb, Rb are outer-scope initializers in the native layouts."""
    m = load("scan_rnn")
    body = attrs(only_scan(m.graph))["body"]
    w = inits(m.graph)
    assert not body.initializer and {"W", "R"} <= {i for n in body.node for i in n.input}
    return m, (w["W"], w["R"], w["Wb"], w["Rb"])


def gru_weights(name):
    """GRU: every weight is a body initializer, stored transposed for MatMul."""
    m = load(name)
    assert not m.graph.initializer
    w = inits(attrs(only_scan(m.graph))["body"])
    if "R_T" in w:  # linear_before_reset=1 keeps R whole
        R, Rb = w["R_T"].T, w["Rb"]
    else:
        R, Rb = np.concatenate([w["R_zr_T"].T, w["R_h_T"].T]), np.concatenate([w["Rb_zr"], w["Rb_h"]])
    return m, (w["W_T"].T, R, w["Wb"], Rb)


def lstm_weights():
    """LSTM: W, R outer-scope initializers; biases body initializers."""
    m = load("scan_lstm")
    outer, body = inits(m.graph), inits(attrs(only_scan(m.graph))["body"])
    assert set(outer) == {"W", "R"} and {"Wb", "Rb"} <= set(body)
    return m, (outer["W"], outer["R"], body["Wb"], body["Rb"])


CELLS = {  # name -> (weights loader, numpy cell, native op attributes)
    "scan_rnn": (rnn_weights, rnn, ("RNN", {})),
    "scan_gru": (lambda: gru_weights("scan_gru"), lambda *a: gru(*a, linear_before_reset=0),
                 ("GRU", {"linear_before_reset": 0})),
    "scan_gru_lbr1": (lambda: gru_weights("scan_gru_lbr1"), lambda *a: gru(*a, linear_before_reset=1),
                      ("GRU", {"linear_before_reset": 1})),
}


@pytest.mark.parametrize("name", list(CELLS))
@pytest.mark.parametrize("t,b", [(T, B), (7, 3)])
def test_rnn_and_gru_scans_follow_the_onnx_equations(name, t, b):
    load_weights, cell, _ = CELLS[name]
    _, weights = load_weights()
    rng = np.random.default_rng(7)
    X, h0 = randn(rng, t, b, I), randn(rng, b, H)
    y, h_n = cell(X, h0, *weights)
    out = run(name, X=X, h_0=h0)
    close(out["Y"], y)
    close(out["h_n"], h_n)


@pytest.mark.parametrize("t,b", [(T, B), (7, 3)])
def test_lstm_scan_follows_the_onnx_equations(t, b):
    _, weights = lstm_weights()
    rng = np.random.default_rng(8)
    X, h0, c0 = randn(rng, t, b, I), randn(rng, b, H), randn(rng, b, H)
    y, h_n, c_n = lstm(X, h0, c0, *weights)
    out = run("scan_lstm", X=X, h_0=h0, c_0=c0)
    close(out["Y"], y)
    close(out["h_n"], h_n)
    close(out["c_n"], c_n)


@pytest.mark.parametrize("name", list(CELLS) + ["scan_lstm"])
def test_numpy_cells_match_native_ops(name):
    """Ties the numpy references (and so the Scan samples) to onnxruntime's native kernels."""
    rng = np.random.default_rng(9)
    X, h0, c0 = randn(rng, T, B, I), randn(rng, B, H), randn(rng, B, H)
    if name == "scan_lstm":
        _, weights = lstm_weights()
        want = lstm(X, h0, c0, *weights)
        got = native("LSTM", X, *weights, h0, c0)
    else:
        load_weights, cell, (op, op_attrs) = CELLS[name]
        _, weights = load_weights()
        want = cell(X, h0, *weights)
        got = native(op, X, *weights, h0, **op_attrs)
    for g, w in zip(got, want):
        close(g, w)


# ---------------------------------------------------------------- exported samples
def expected(name):
    with np.load(MODELS / f"{name}.expected.npz") as f:
        return dict(f)


def torch_weights(m):
    w = inits(m.graph)
    return w["ih.weight"], w["hh.weight"], w["ih.bias"], w["hh.bias"]


def test_torch_scan_rnn_matches_torch_and_is_an_elman_rnn():
    """Dynamo export of torch._higher_order_ops.scan: a forward axis-0 Scan-16 whose Gemm body
    reads the Linear weights from the outer graph."""
    m = load("torch_scan_rnn")
    scan = only_scan(m.graph)
    a = attrs(scan)
    assert a["num_scan_inputs"] == 1 and a["scan_input_directions"] == [0]
    assert [n.op_type for n in a["body"].node] == ["Gemm", "Gemm", "Add", "Tanh", "Identity"]
    assert not a["body"].initializer and {"ih.weight", "hh.weight"} <= set(inits(m.graph))
    exp = expected("torch_scan_rnn")
    out = run("torch_scan_rnn", x=exp["x"], h0=exp["h0"])
    close(out["y"], exp["y"])
    close(out["h_n"], exp["h_n"])
    rng = np.random.default_rng(10)  # symbolic seq/batch: a different shape runs too
    x, h0 = randn(rng, 7, 3, I), randn(rng, 3, H)
    y, h_n = rnn(x, h0, *torch_weights(m))
    out = run("torch_scan_rnn", x=x, h0=h0)
    close(out["y"], y)
    close(out["h_n"], h_n)


def test_torch_scan_rnn_rev_dim1_wraps_a_forward_scan():
    """scan(dim=1, reverse=True) exports as Transpose + Slice(flip) around a forward Scan."""
    m = load("torch_scan_rnn_rev_dim1")
    a = attrs(only_scan(m.graph))
    assert a["scan_input_directions"] == [0] and "scan_input_axes" not in a
    assert [n.op_type for n in m.graph.node] == ["Transpose", "Slice", "Scan", "Slice", "Transpose"]
    exp = expected("torch_scan_rnn_rev_dim1")
    out = run("torch_scan_rnn_rev_dim1", x=exp["x"], h0=exp["h0"])
    close(out["y"], exp["y"])
    close(out["h_n"], exp["h_n"])
    # torch's reverse scan: read x[:, T-1] first, write each state at its input's position
    y, h_n = rnn(exp["x"].transpose(1, 0, 2)[::-1], exp["h0"], *torch_weights(m))
    close(exp["y"], y[::-1].transpose(1, 0, 2))
    close(exp["h_n"], h_n)


def test_skl_knn_regressor_matches_sklearn():
    """skl2onnx's pairwise distance: the Scan's state is passed through unchanged (loop-invariant)."""
    m = load("skl_knn_regressor")
    assert {o.domain: o.version for o in m.opset_import} == {"": 17, "ai.onnx.ml": 1}
    body = attrs(only_scan(m.graph))["body"]
    passthrough = [n for n in body.node if n.op_type == "Identity" and n.output[0] == body.output[0].name]
    assert passthrough and passthrough[0].input[0] == body.input[0].name
    exp = expected("skl_knn_regressor")
    out = run("skl_knn_regressor", X=exp["X"])
    close(out["variable"], exp["variable"])
