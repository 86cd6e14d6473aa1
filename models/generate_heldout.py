"""Held-out models: Scan forms none of the other generators write, used by tests/test_heldout.py
as a new user's models would be (nobody tuned a pass for them).

    python models/generate_heldout.py            # all
    python models/generate_heldout.py --only NAME

Hand-written ones use onnx.helper only. torch_* need `pip install torch==2.13.0 onnxscript`,
skl_* need `pip install skl2onnx scikit-learn`; those imports are lazy and the tests never
import them. Each torch/skl model comes with NAME.expected.npz (inputs + the source's outputs).
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from generate import strip_stack_traces

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "heldout")
F, D, H16, I64 = TP.FLOAT, TP.DOUBLE, TP.FLOAT16, TP.INT64


def vi(name, shape, elem=F):
    return h.make_tensor_value_info(name, elem, shape)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def model(graph, opset=17, ir=8):
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=ir,
                        producer_name="scanopt-heldout")


def rng(seed=0):
    return np.random.RandomState(seed)


def multi_dtype_states():
    """Scan-16 with three states of three dtypes (float sum, int64 step counter, float64
    running product) and an int64 scan output (the counter per step)."""
    body = h.make_graph(
        [
            h.make_node("Add", ["s", "x"], ["s2"]),
            h.make_node("Add", ["n", "one"], ["n2"]),
            h.make_node("Cast", ["x"], ["xd"], to=D),
            h.make_node("Mul", ["p", "xd"], ["p2"]),
            h.make_node("Identity", ["n2"], ["n_out"]),
            h.make_node("Identity", ["s2"], ["s_out"]),
        ],
        "body",
        [vi("s", [2]), vi("n", [], I64), vi("p", [2], D), vi("x", [2])],
        [vi("s2", [2]), vi("n2", [], I64), vi("p2", [2], D), vi("s_out", [2]), vi("n_out", [], I64)],
        initializer=[init("one", np.array(1, np.int64))],
    )
    node = h.make_node("Scan", ["s0", "n0", "p0", "X"], ["sT", "nT", "pT", "Y", "N"],
                       body=body, num_scan_inputs=1, name="mixed")
    g = h.make_graph([node], "main",
                     [vi("s0", [2]), vi("n0", [], I64), vi("p0", [2], D), vi("X", ["T", 2])],
                     [vi("sT", [2]), vi("nT", [], I64), vi("pT", [2], D), vi("Y", ["T", 2]),
                      vi("N", ["T"], I64)])
    return model(g, 17)


def int64_map_argmax():
    """A map Scan (no state) whose scan output is int64: ArgMax of each row, and a float max."""
    body = h.make_graph(
        [h.make_node("ArgMax", ["x"], ["am"], axis=0, keepdims=1),
         h.make_node("ReduceMax", ["x"], ["mx"], keepdims=0)],
        "body", [vi("x", [5])], [vi("am", [1], I64), vi("mx", [])])
    node = h.make_node("Scan", ["X"], ["A", "M"], body=body, num_scan_inputs=1, name="argmax_map")
    g = h.make_graph([node], "main", [vi("X", ["N", 5])], [vi("A", ["N", 1], I64), vi("M", ["N"])])
    return model(g, 17)


def nested_inner_captures_outer_state():
    """Outer Scan over X [T, 3, 2] with state s [2]; its body runs an inner Scan over the
    step's [3, 2] whose body reads the OUTER body's state `s` (outer-scope capture of a
    loop-carried value, not of a constant)."""
    inner = h.make_graph(
        [h.make_node("Mul", ["ix", "s"], ["ixs"]), h.make_node("Add", ["is_", "ixs"], ["is2"]),
         h.make_node("Identity", ["is2"], ["iy"])],
        "inner_body", [vi("is_", [2]), vi("ix", [2])], [vi("is2", [2]), vi("iy", [2])])
    outer = h.make_graph(
        [h.make_node("Scan", ["s", "ox"], ["acc", "oy"], body=inner, num_scan_inputs=1, name="inner"),
         h.make_node("Tanh", ["acc"], ["s2"])],
        "outer_body", [vi("s", [2]), vi("ox", [3, 2])], [vi("s2", [2]), vi("oy", [3, 2])])
    node = h.make_node("Scan", ["s0", "X"], ["sT", "Y"], body=outer, num_scan_inputs=1, name="outer")
    g = h.make_graph([node], "main", [vi("s0", [2]), vi("X", ["T", 3, 2])],
                     [vi("sT", [2]), vi("Y", ["T", 3, 3 - 1])])
    return model(g, 16)


def scan_in_if_in_loop():
    """Loop (trip count M) whose body holds an If; the then-branch runs a 3-step Scan reading
    W from the main graph and the Loop's carried value; the else-branch negates."""
    sbody = h.make_graph(
        [h.make_node("Mul", ["x", "W"], ["xw"]), h.make_node("Add", ["s", "xw"], ["s2"]),
         h.make_node("Identity", ["s2"], ["y"])],
        "sbody", [vi("s", [2]), vi("x", [2])], [vi("s2", [2]), vi("y", [2])])
    then_g = h.make_graph(
        [h.make_node("Scan", ["v", "X"], ["t_out", "t_seq"], body=sbody, num_scan_inputs=1, name="scan_in_then")],
        "then", [], [vi("t_out", [2])])
    else_g = h.make_graph([h.make_node("Neg", ["v"], ["e_out"])], "else", [], [vi("e_out", [2])])
    lbody = h.make_graph(
        [h.make_node("If", ["flag"], ["v2"], then_branch=then_g, else_branch=else_g, name="if"),
         h.make_node("Identity", ["cond_in"], ["cond_out"])],
        "lbody", [vi("it", [], I64), vi("cond_in", [], TP.BOOL), vi("v", [2])],
        [vi("cond_out", [], TP.BOOL), vi("v2", [2])])
    loop = h.make_node("Loop", ["M", "", "v0"], ["vT"], body=lbody, name="loop")
    g = h.make_graph([loop], "main",
                     [vi("M", [], I64), vi("flag", [], TP.BOOL), vi("v0", [2]), vi("X", [3, 2])],
                     [vi("vT", [2])],
                     initializer=[init("W", np.array([0.5, -1.5], np.float32))])
    return model(g, 16)


def _lstm_concat_body(I, Hs, n_inputs):
    """TF1 LSTMCell style: z = Concat([x..., h]) @ W + b, Split into i, j, f, o;
    c' = sigmoid(f + 1) * c + sigmoid(i) * tanh(j); h' = sigmoid(o) * tanh(c')."""
    r = rng(3)
    W = (r.randn(I * n_inputs + Hs, 4 * Hs) * 0.4).astype(np.float32)
    b = (r.randn(4 * Hs) * 0.1).astype(np.float32)
    xs = [f"x{k}" for k in range(n_inputs)]
    nodes = [
        h.make_node("Concat", xs + ["h"], ["xh"], axis=0),
        h.make_node("Unsqueeze", ["xh", "ax0"], ["xh2"]),
        h.make_node("MatMul", ["xh2", "W"], ["z0"]),
        h.make_node("Add", ["z0", "b"], ["z1"]),
        h.make_node("Squeeze", ["z1", "ax0"], ["z"]),
        h.make_node("Split", ["z"], ["gi", "gj", "gf", "go"], axis=0, num_outputs=4),
        h.make_node("Add", ["gf", "forget_bias"], ["gf1"]),
        h.make_node("Sigmoid", ["gf1"], ["f"]),
        h.make_node("Sigmoid", ["gi"], ["i"]),
        h.make_node("Tanh", ["gj"], ["j"]),
        h.make_node("Sigmoid", ["go"], ["o"]),
        h.make_node("Mul", ["f", "c"], ["fc"]),
        h.make_node("Mul", ["i", "j"], ["ij"]),
        h.make_node("Add", ["fc", "ij"], ["c2"]),
        h.make_node("Tanh", ["c2"], ["tc"]),
        h.make_node("Mul", ["o", "tc"], ["h2"]),
        h.make_node("Identity", ["h2"], ["y"]),
    ]
    inits = [init("W", W), init("b", b), init("ax0", np.array([0], np.int64)),
             init("forget_bias", np.array(1.0, np.float32))]
    return h.make_graph(nodes, "tf_lstm_body", [vi("h", [Hs]), vi("c", [Hs])] + [vi(x, [I]) for x in xs],
                        [vi("h2", [Hs]), vi("c2", [Hs]), vi("y", [Hs])], initializer=inits)


def _scan8_tf_lstm(n_inputs, directions, opset=8):
    B, I, Hs = 3, 4, 5
    body = _lstm_concat_body(I, Hs, n_inputs)
    # Split with num_outputs is opset 18; write an opset-8-valid body (Split by equal parts, axes attr).
    for n in body.node:
        if n.op_type == "Split":
            del n.attribute[:]
            n.attribute.extend([h.make_attribute("axis", 0)])
        if n.op_type in ("Unsqueeze", "Squeeze"):
            del n.input[1:]
            n.attribute.extend([h.make_attribute("axes", [0])])
    keep = [i for i in body.initializer if i.name != "ax0"]
    del body.initializer[:]
    body.initializer.extend(keep)
    xs = [f"X{k}" for k in range(n_inputs)]
    node = h.make_node("Scan", ["lens", "h0", "c0"] + xs, ["hT", "cT", "Y"], body=body,
                       num_scan_inputs=n_inputs, directions=directions, name="tf_lstm")
    g = h.make_graph([node], "main",
                     [vi("lens", [B], I64), vi("h0", [B, Hs]), vi("c0", [B, Hs])] + [vi(x, [B, "T", I]) for x in xs],
                     [vi("hT", [B, Hs]), vi("cT", [B, Hs]), vi("Y", [B, "T", Hs])])
    return model(g, opset)


def scan8_tf_lstm_b3_fwd():
    """Scan-8, batch 3, symbolic T, sequence_lens, a TF1-style concat-linear LSTM body."""
    return _scan8_tf_lstm(1, [0])


def scan8_tf_lstm_b3_bidir_inputs():
    """The same cell reading two sequences, the second in reverse (directions [0, 1])."""
    return _scan8_tf_lstm(2, [0, 1])


def _rnn_body(dtype_np, elem, I=3, Hs=4, seed=1):
    r = rng(seed)
    Wt = (r.randn(I, Hs) * 0.5).astype(dtype_np)
    Rt = (r.randn(Hs, Hs) * 0.5).astype(dtype_np)
    bias = (r.randn(Hs) * 0.1).astype(dtype_np)
    body = h.make_graph(
        [h.make_node("MatMul", ["x", "Wt"], ["xw"]), h.make_node("MatMul", ["h", "Rt"], ["hr"]),
         h.make_node("Add", ["xw", "hr"], ["a"]), h.make_node("Add", ["a", "bias"], ["a2"]),
         h.make_node("Tanh", ["a2"], ["h2"]), h.make_node("Identity", ["h2"], ["y"])],
        "rnn_body", [vi("h", ["B", Hs], elem), vi("x", ["B", I], elem)],
        [vi("h2", ["B", Hs], elem), vi("y", ["B", Hs], elem)])
    inits = [init("Wt", Wt), init("Rt", Rt), init("bias", bias)]
    return body, inits


def rnn_typed(dtype_np, elem, opset=17):
    body, inits = _rnn_body(dtype_np, elem)
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name="rnn")
    g = h.make_graph([node], "main", [vi("h0", ["B", 4], elem), vi("X", ["T", "B", 3], elem)],
                     [vi("hT", ["B", 4], elem), vi("Y", ["T", "B", 4], elem)], initializer=inits)
    return model(g, opset)


def rnn_f16():
    """A tanh RNN Scan entirely in float16 (onnxruntime's CPU RNN kernel is float only)."""
    return rnn_typed(np.float16, H16)


def rnn_f64():
    """A tanh RNN Scan entirely in float64."""
    return rnn_typed(np.float64, D)


def rnn_opset(opset):
    return rnn_typed(np.float32, F, opset=opset)


def map_shape_gather_reshape():
    """A map Scan whose body reshapes each [R, C] step with a shape it computes:
    Shape(x) -> Gather(0) -> Concat([r, -1]) ... then flattens rows*cols via Reshape to [-1]
    and back with the computed shape. A vectorizer that lifts Shape sees the extra axis."""
    body = h.make_graph(
        [h.make_node("Shape", ["x"], ["shp"]),
         h.make_node("Gather", ["shp", "zero"], ["r"], axis=0),
         h.make_node("Concat", ["minus1"], ["flat_shape"], axis=0),
         h.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
         h.make_node("Relu", ["flat"], ["flat_r"]),
         h.make_node("Unsqueeze", ["r", "ax0"], ["r1"]),
         h.make_node("Concat", ["r1", "minus1"], ["back_shape"], axis=0),
         h.make_node("Reshape", ["flat_r", "back_shape"], ["y"]),
         h.make_node("ReduceSum", ["y", "ax1"], ["rs"], keepdims=0)],
        "body", [vi("x", ["R", "C"])], [vi("y", ["R", "C"]), vi("rs", ["R"])],
        initializer=[init("zero", np.array(0, np.int64)), init("minus1", np.array([-1], np.int64)),
                     init("ax0", np.array([0], np.int64)), init("ax1", np.array([1], np.int64))])
    node = h.make_node("Scan", ["X"], ["Y", "S"], body=body, num_scan_inputs=1, name="dyn_reshape")
    g = h.make_graph([node], "main", [vi("X", ["T", "R", "C"])],
                     [vi("Y", ["T", "R", "C"]), vi("S", ["T", "R"])])
    return model(g, 17)


def odd_dim_names():
    """Symbolic dims named with spaces, punctuation and unicode, one dim left unnamed, and a
    name shared between a Scan axis and a feature axis of another input."""
    body = h.make_graph(
        [h.make_node("Add", ["s", "x"], ["s2"]), h.make_node("Mul", ["s2", "x"], ["y"])],
        "body", [vi("s", ["feature dim"]), vi("x", ["feature dim"])],
        [vi("s2", ["feature dim"]), vi("y", ["feature dim"])])
    node = h.make_node("Scan", ["s0", "X"], ["sT", "Y"], body=body, num_scan_inputs=1, name="odd")
    x_vi = vi("X", ["seq-len (T)", "feature dim"])
    g = h.make_graph([node], "main", [vi("s0", ["feature dim"]), x_vi],
                     [vi("sT", ["feature dim"]), vi("Y", ["seq-len (T)", None])])
    return model(g, 17)


def reverse_out_axis1_bidir():
    """Scan-11 reading X on axis 1 in reverse and X on axis 0 forward, writing one output
    prepended on axis 1 and one appended on axis 0 (every direction/axis at once)."""
    body = h.make_graph(
        [h.make_node("Add", ["s", "a"], ["t"]), h.make_node("Mul", ["t", "b"], ["s2"]),
         h.make_node("Identity", ["s2"], ["y1"]), h.make_node("Sub", ["a", "b"], ["y2"])],
        "body", [vi("s", [3]), vi("a", [3]), vi("b", [3])],
        [vi("s2", [3]), vi("y1", [3]), vi("y2", [3])])
    node = h.make_node("Scan", ["s0", "XA", "XB"], ["sT", "Y1", "Y2"], body=body, num_scan_inputs=2,
                       scan_input_axes=[1, 0], scan_input_directions=[1, 0],
                       scan_output_axes=[1, -2], scan_output_directions=[1, 0], name="axes")
    g = h.make_graph([node], "main", [vi("s0", [3]), vi("XA", [3, 4]), vi("XB", [4, 3])],
                     [vi("sT", [3]), vi("Y1", [3, 4]), vi("Y2", [4, 3])])
    return model(g, 11)


def external_data_rnn():
    """A tanh RNN Scan whose weights live in external data (NAME.onnx.data)."""
    return rnn_typed(np.float32, F, opset=17)


# --- exporters -------------------------------------------------------------------------


def _strip(m):
    strip_stack_traces(m)
    return m


def torch_scan_counter_noopt():
    """torch._higher_order_ops.scan with a float carry and an int64 counter carry, exported
    with dynamo=True and optimize=False; outputs the per-step hidden state and counter."""
    import torch
    from torch._higher_order_ops import scan

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 4)

        def forward(self, x, h0, n0):
            def step(carry, x_t):
                hh, n = carry
                h2 = torch.tanh(self.lin(x_t) + hh)
                n2 = n + 1
                return (h2, n2), (h2.clone(), n2.clone())
            (hT, nT), (ys, ns) = scan(step, (h0, n0), x)
            return ys, ns, hT, nT

    Counter.__module__ = "scanopt_heldout"
    torch.manual_seed(0)
    mod = Counter().eval().requires_grad_(False)  # an int64 carry has no gradient
    x, h0, n0 = torch.randn(6, 2, 4 - 1), torch.randn(2, 4), torch.zeros(2, 1, dtype=torch.int64)
    prog = torch.onnx.export(mod, (x, h0, n0), dynamo=True, optimize=False,
                             input_names=["x", "h0", "n0"], output_names=["ys", "ns", "hT", "nT"],
                             dynamic_shapes={"x": {0: torch.export.Dim("seq")}, "h0": None, "n0": None})
    with torch.no_grad():
        ys, ns, hT, nT = mod(x, h0, n0)
    exp = {"x": x.numpy(), "h0": h0.numpy(), "n0": n0.numpy(), "ys": ys.numpy(), "ns": ns.numpy(),
           "hT": hT.numpy(), "nT": nT.numpy()}
    return _strip(prog.model_proto), exp


def _torch_rnn_module(kind, optimize):
    import torch

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(torch.nn, kind)(3, 4, batch_first=True)

        def forward(self, x):
            y, _ = self.rnn(x)
            return y

    M.__module__ = "scanopt_heldout"
    torch.manual_seed(0)
    mod = M().eval()
    x = torch.randn(2, 5, 3)
    prog = torch.onnx.export(mod, (x,), dynamo=True, optimize=optimize, input_names=["x"],
                             output_names=["y"])
    with torch.no_grad():
        y = mod(x)
    return _strip(prog.model_proto), {"x": x.numpy(), "y": y.numpy()}


def torch_gru_noopt():
    """nn.GRU(batch_first) exported with dynamo=True, optimize=False."""
    return _torch_rnn_module("GRU", False)


def torch_lstm_opt():
    """nn.LSTM(batch_first) exported with dynamo=True (default optimization)."""
    return _torch_rnn_module("LSTM", True)


def _skl(est, x_train, y_train, x, dtype, opset=17, options=None):
    from skl2onnx import to_onnx
    est.fit(x_train, y_train) if y_train is not None else est.fit(x_train)
    m = to_onnx(est, x_train[:1].astype(dtype), target_opset=opset, options=options)
    return m


def skl_knn_regressor_f64():
    """KNeighborsRegressor converted with float64 inputs (DoubleTensorType): a float64 Scan."""
    from sklearn.neighbors import KNeighborsRegressor
    r = rng(5)
    xt, yt = r.randn(30, 4), r.randn(30)
    est = KNeighborsRegressor(n_neighbors=3)
    m = _skl(est, xt, yt, None, np.float64)
    x = r.randn(7, 4)
    return m, {"X": x, "variable": est.predict(x).reshape(-1, 1)}


def skl_nearest_neighbors():
    """NearestNeighbors (euclidean) converted for kneighbors (distances + indices, int64)."""
    from sklearn.neighbors import NearestNeighbors
    r = rng(6)
    xt = r.randn(25, 3).astype(np.float32)
    est = NearestNeighbors(n_neighbors=2)
    est.fit(xt)
    est.radius = None  # skl2onnx refuses radius and n_neighbors both set
    m = _skl(est, xt, None, None, np.float32)
    x = r.randn(5, 3).astype(np.float32)
    dist, idx = est.kneighbors(x)
    return m, {"X": x, "distance": dist.astype(np.float32), "index": idx.astype(np.int64)}


def skl_knn_imputer():
    """KNNImputer (nan_euclidean distances through a Scan)."""
    from sklearn.impute import KNNImputer
    r = rng(7)
    xt = r.randn(20, 3).astype(np.float32)
    xt[r.rand(20, 3) < 0.15] = np.nan
    est = KNNImputer(n_neighbors=2)
    m = _skl(est, xt, None, None, np.float32, opset=18)
    x = r.randn(4, 3).astype(np.float32)
    x[0, 1] = np.nan
    x[2, 0] = np.nan
    return m, {"X": x, "variable": est.transform(x).astype(np.float32)}


# -- cell forms fuse had not seen (issue 12, held out): models/heldout_cells/ ----------------------

CELLS_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "heldout_cells")


def _sig(x):
    return 1 / (1 + np.exp(-x))


def keras_lstm_ifco_peephole_bias_input():
    """Keras gate order i, f, c, o with peepholes (i, f read c; o reads the new c) and the bias
    a graph input (a run-time weight), body with a batch axis, Scan-16."""
    r = rng(11)
    I, Hs = 3, 5
    kernel = (r.randn(I, 4 * Hs) * 0.4).astype(np.float32)
    rkernel = (r.randn(Hs, 4 * Hs) * 0.4).astype(np.float32)
    pi, pf, po = ((r.randn(Hs) * 0.3).astype(np.float32) for _ in range(3))
    body = h.make_graph([
        h.make_node("MatMul", ["x", "kernel"], ["xk"]), h.make_node("MatMul", ["h", "rkernel"], ["hk"]),
        h.make_node("Add", ["xk", "hk"], ["z0"]), h.make_node("Add", ["z0", "bias"], ["z"]),
        h.make_node("Split", ["z", "four"], ["zi", "zf", "zc", "zo"], axis=1),
        h.make_node("Mul", ["c", "pi"], ["ci"]), h.make_node("Add", ["zi", "ci"], ["ai"]), h.make_node("Sigmoid", ["ai"], ["i"]),
        h.make_node("Mul", ["c", "pf"], ["cf"]), h.make_node("Add", ["zf", "cf"], ["af"]), h.make_node("Sigmoid", ["af"], ["f"]),
        h.make_node("Tanh", ["zc"], ["g"]),
        h.make_node("Mul", ["f", "c"], ["fc"]), h.make_node("Mul", ["i", "g"], ["ig"]), h.make_node("Add", ["fc", "ig"], ["c2"]),
        h.make_node("Mul", ["c2", "po"], ["co"]), h.make_node("Add", ["zo", "co"], ["ao"]), h.make_node("Sigmoid", ["ao"], ["o"]),
        h.make_node("Tanh", ["c2"], ["tc"]), h.make_node("Mul", ["o", "tc"], ["h2"]), h.make_node("Identity", ["h2"], ["y"]),
    ], "keras_lstm", [vi("h", ["B", Hs]), vi("c", ["B", Hs]), vi("x", ["B", I])],
        [vi("h2", ["B", Hs]), vi("c2", ["B", Hs]), vi("y", ["B", Hs])],
        initializer=[init("four", np.array([Hs] * 4, np.int64)), init("pi", pi), init("pf", pf), init("po", po)])
    node = h.make_node("Scan", ["h0", "c0", "X"], ["hT", "cT", "Y"], body=body, num_scan_inputs=1, name="keras_lstm")
    g = h.make_graph([node], "main", [vi("h0", ["B", Hs]), vi("c0", ["B", Hs]), vi("X", ["T", "B", I]), vi("bias", [4 * Hs])],
                     [vi("hT", ["B", Hs]), vi("cT", ["B", Hs]), vi("Y", ["T", "B", Hs])],
                     initializer=[init("kernel", kernel), init("rkernel", rkernel)])
    return model(g, 16)


def gru_torch_weights_inputs_transposed_in_body():
    """PyTorch layout: W_ih [3H, I], W_hh [3H, H], biases: graph inputs; the body transposes the
    weights itself (Transpose inside the body of a run-time weight), gates r, z, n, lbr=1."""
    I, Hs = 3, 4
    body = h.make_graph([
        h.make_node("Transpose", ["W_ih"], ["Wt"], perm=[1, 0]), h.make_node("Transpose", ["W_hh"], ["Rt"], perm=[1, 0]),
        h.make_node("MatMul", ["x", "Wt"], ["gx0"]), h.make_node("Add", ["gx0", "b_ih"], ["gx"]),
        h.make_node("MatMul", ["h", "Rt"], ["gh0"]), h.make_node("Add", ["gh0", "b_hh"], ["gh"]),
        h.make_node("Split", ["gx", "three"], ["xr", "xz", "xn"], axis=-1),
        h.make_node("Split", ["gh", "three"], ["hr", "hz", "hn"], axis=-1),
        h.make_node("Add", ["xr", "hr"], ["ar"]), h.make_node("Sigmoid", ["ar"], ["r"]),
        h.make_node("Add", ["xz", "hz"], ["az"]), h.make_node("Sigmoid", ["az"], ["z"]),
        h.make_node("Mul", ["r", "hn"], ["rhn"]), h.make_node("Add", ["xn", "rhn"], ["an"]), h.make_node("Tanh", ["an"], ["n"]),
        h.make_node("Sub", ["h", "n"], ["hmn"]), h.make_node("Mul", ["z", "hmn"], ["zd"]), h.make_node("Add", ["n", "zd"], ["h2"]),
        h.make_node("Identity", ["h2"], ["y"]),
    ], "gru_body", [vi("h", ["B", Hs]), vi("x", ["B", I])], [vi("h2", ["B", Hs]), vi("y", ["B", Hs])],
        initializer=[init("three", np.array([Hs] * 3, np.int64))])
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name="torch_gru_inputs")
    g = h.make_graph([node], "main",
                     [vi("h0", ["B", Hs]), vi("X", ["T", "B", I]), vi("W_ih", [3 * Hs, I]), vi("W_hh", [3 * Hs, Hs]),
                      vi("b_ih", [3 * Hs]), vi("b_hh", [3 * Hs])],
                     [vi("hT", ["B", Hs]), vi("Y", ["T", "B", Hs])])
    return model(g, 17)


def _rnn_scan_node(name, x, h0, outs, I=3, Hs=4, seed=12):
    r = rng(seed)
    W = (r.randn(I, Hs) * 0.5).astype(np.float32)
    R = (r.randn(Hs, Hs) * 0.5).astype(np.float32)
    body = h.make_graph([
        h.make_node("Gemm", ["x", "W", "b"], ["xw"]), h.make_node("Gemm", ["h", "R"], ["hr"]),
        h.make_node("Add", ["xw", "hr"], ["a"]), h.make_node("Relu", ["a"], ["h2"]), h.make_node("Identity", ["h2"], ["y"]),
    ], f"{name}_body", [vi("h", ["B", Hs]), vi("x", ["B", I])], [vi("h2", ["B", Hs]), vi("y", ["B", Hs])],
        initializer=[init("W", W), init("R", R), init("b", (r.randn(Hs) * 0.1).astype(np.float32))])
    return h.make_node("Scan", [h0, x], outs, body=body, num_scan_inputs=1, name=name)


def relu_rnn_in_if_branch():
    """A Gemm Relu-RNN Scan in an If's then-branch (the else-branch returns the initial state),
    reading X and h0 from the main graph."""
    then_g = h.make_graph([_rnn_scan_node("rnn_then", "X", "h0", ["t_h", "t_y"])], "then", [],
                          [vi("t_h", ["B", 4]), vi("t_y", ["T", "B", 4])])
    else_g = h.make_graph([h.make_node("Identity", ["h0"], ["e_h"]), h.make_node("Neg", ["X4"], ["e_y"])], "else", [],
                          [vi("e_h", ["B", 4]), vi("e_y", ["T", "B", 4])])
    nodes = [h.make_node("Pad", ["X", "pads"], ["X4"]),
             h.make_node("If", ["flag"], ["hT", "Y"], then_branch=then_g, else_branch=else_g, name="branch")]
    g = h.make_graph(nodes, "main", [vi("flag", [], TP.BOOL), vi("h0", ["B", 4]), vi("X", ["T", "B", 3])],
                     [vi("hT", ["B", 4]), vi("Y", ["T", "B", 4])],
                     initializer=[init("pads", np.array([0, 0, 0, 0, 0, 1], np.int64))])
    return model(g, 17)


def stacked_rnn_in_loop_body():
    """A Loop running the same Relu-RNN Scan M times (weight-tied stacked layers): layer k reads
    layer k-1's outputs; the Scan sits in the Loop body."""
    body = h.make_graph([
        _rnn_scan_node("rnn_layer", "seq", "h0", ["hk", "out"], I=4, Hs=4),
        h.make_node("Identity", ["cond_in"], ["cond_out"]),
    ], "loop_body", [vi("it", [], I64), vi("cond_in", [], TP.BOOL), vi("seq", ["T", "B", 4])],
        [vi("cond_out", [], TP.BOOL), vi("out", ["T", "B", 4])])
    loop = h.make_node("Loop", ["M", "", "X"], ["Y"], body=body, name="layers")
    g = h.make_graph([loop], "main", [vi("M", [], I64), vi("h0", ["B", 4]), vi("X", ["T", "B", 4])],
                     [vi("Y", ["T", "B", 4])])
    return model(g, 17)


def linear_rnn_reshape_row():
    """A linear RNN (no nonlinearity) in an unbatched body that reshapes Concat([x, h]) to a
    [1, I+H] row, multiplies, reshapes back: Affine through layout-preserving nodes."""
    r = rng(13)
    I, Hs = 3, 4
    K = (r.randn(I + Hs, Hs) * 0.4).astype(np.float32)
    body = h.make_graph([
        h.make_node("Concat", ["x", "h"], ["xh"], axis=0), h.make_node("Reshape", ["xh", "row"], ["xh1"]),
        h.make_node("MatMul", ["xh1", "K"], ["p1"]), h.make_node("Reshape", ["p1", "flat"], ["p"]),
        h.make_node("Add", ["p", "b"], ["h2"]), h.make_node("Identity", ["h2"], ["y"]),
    ], "lin_body", [vi("h", [Hs]), vi("x", [I])], [vi("h2", [Hs]), vi("y", [Hs])],
        initializer=[init("K", K), init("b", (r.randn(Hs) * 0.1).astype(np.float32)),
                     init("row", np.array([1, I + Hs], np.int64)), init("flat", np.array([Hs], np.int64))])
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name="linear_rnn")
    g = h.make_graph([node], "main", [vi("h0", [Hs]), vi("X", ["T", I])], [vi("hT", [Hs]), vi("Y", ["T", Hs])])
    return model(g, 17)


def tf_birnn_reverse_sequence_fill_lengths():
    """A TF-converter bidirectional Relu RNN: the backward half reads ReverseSequence(X, lens) with
    lens = fill([batch], T) computed from Shape(X), and its outputs are re-aligned the same way."""
    nodes = [
        h.make_node("Shape", ["X"], ["shp"]), h.make_node("Gather", ["shp", "i0"], ["T0"], axis=0),
        h.make_node("Gather", ["shp", "i1"], ["B0"], axis=0),
        h.make_node("Unsqueeze", ["B0", "ax0"], ["B1"]), h.make_node("Expand", ["T0", "B1"], ["lens"]),
        h.make_node("ReverseSequence", ["X", "lens"], ["X_rev"], time_axis=0, batch_axis=1),
        _rnn_scan_node("rnn_fw", "X", "h0", ["h_fw", "Y_fw"], seed=14),
        _rnn_scan_node("rnn_bw", "X_rev", "h0", ["h_bw", "Y_bw_rev"], seed=15),
        h.make_node("ReverseSequence", ["Y_bw_rev", "lens"], ["Y_bw"], time_axis=0, batch_axis=1),
        h.make_node("Concat", ["Y_fw", "Y_bw"], ["Y"], axis=-1),
    ]
    g = h.make_graph(nodes, "main", [vi("h0", ["B", 4]), vi("X", ["T", "B", 3])],
                     [vi("Y", ["T", "B", 8]), vi("h_fw", ["B", 4]), vi("h_bw", ["B", 4])],
                     initializer=[init("i0", np.array(0, np.int64)), init("i1", np.array(1, np.int64)),
                                  init("ax0", np.array([0], np.int64))])
    return model(g, 17)


CELLS = {
    "tf_birnn_reverse_sequence_fill_lengths": tf_birnn_reverse_sequence_fill_lengths,
    "keras_lstm_ifco_peephole_bias_input": keras_lstm_ifco_peephole_bias_input,
    "gru_torch_weights_inputs_transposed_in_body": gru_torch_weights_inputs_transposed_in_body,
    "relu_rnn_in_if_branch": relu_rnn_in_if_branch,
    "stacked_rnn_in_loop_body": stacked_rnn_in_loop_body,
    "linear_rnn_reshape_row": linear_rnn_reshape_row,
}


HAND = {
    "multi_dtype_states": multi_dtype_states,
    "int64_map_argmax": int64_map_argmax,
    "nested_inner_captures_outer_state": nested_inner_captures_outer_state,
    "scan_in_if_in_loop": scan_in_if_in_loop,
    "scan8_tf_lstm_b3_fwd": scan8_tf_lstm_b3_fwd,
    "scan8_tf_lstm_b3_bidir_inputs": scan8_tf_lstm_b3_bidir_inputs,
    "rnn_f16": rnn_f16,
    "rnn_f64": rnn_f64,
    "rnn_o21": lambda: rnn_opset(21),
    "rnn_o24": lambda: rnn_opset(24),
    "rnn_o26": lambda: rnn_opset(26),
    "map_shape_gather_reshape": map_shape_gather_reshape,
    "odd_dim_names": odd_dim_names,
    "reverse_out_axis1_bidir": reverse_out_axis1_bidir,
    "external_data_rnn": external_data_rnn,
}
EXPORTED = {
    "torch_scan_counter_noopt": torch_scan_counter_noopt,
    "torch_gru_noopt": torch_gru_noopt,
    "torch_lstm_opt": torch_lstm_opt,
    "skl_knn_regressor_f64": skl_knn_regressor_f64,
    "skl_nearest_neighbors": skl_nearest_neighbors,
    "skl_knn_imputer": skl_knn_imputer,
}


def save(name, m):
    path = os.path.join(OUT, f"{name}.onnx")
    if name == "external_data_rnn":
        if os.path.exists(path + ".data"):
            os.remove(path + ".data")
        onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=f"{name}.onnx.data", size_threshold=0)
    else:
        onnx.save_model(m, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(CELLS_OUT, exist_ok=True)
    for name, make in CELLS.items():
        if not args.only or name == args.only:
            onnx.save_model(make(), os.path.join(CELLS_OUT, f"{name}.onnx"))
    for name, make in {**HAND, **EXPORTED}.items():
        if args.only and name != args.only:
            continue
        result = make()
        if isinstance(result, tuple):
            m, expected = result
            np.savez(os.path.join(OUT, f"{name}.expected.npz"), **expected)
        else:
            m = result
        save(name, m)
        print("wrote", name)



def passthrough_outputs():
    """Body outputs wired with no node: a state output that IS the state input (pass-through),
    a scan output that IS the scan input, and a scan output that is a body initializer."""
    body = h.make_graph(
        [h.make_node("Add", ["s", "x"], ["t"])],
        "body", [vi("s", [2]), vi("x", [2])],
        [vi("s", [2]), vi("x", [2]), vi("t", [2]), vi("k", [2])],
        initializer=[init("k", np.array([3.0, 4.0], np.float32))])
    node = h.make_node("Scan", ["s0", "X"], ["sT", "Xcopy", "Y", "K"], body=body, num_scan_inputs=1, name="pass")
    g = h.make_graph([node], "main", [vi("s0", [2]), vi("X", ["T", 2])],
                     [vi("sT", [2]), vi("Xcopy", ["T", 2]), vi("Y", ["T", 2]), vi("K", ["T", 2])])
    return model(g, 17)


def scan8_short_lens_reverse():
    """Scan-8, batch 3, static T=3, sequence_lens, one reverse and one forward input, two
    states: the in-place Scan-8 unroll case with masking and per-item reverse starts."""
    body = h.make_graph(
        [h.make_node("Add", ["s", "a"], ["s1"]), h.make_node("Mul", ["s1", "b"], ["s2"]),
         h.make_node("Add", ["n", "one"], ["n2"]), h.make_node("Sub", ["a", "b"], ["y"])],
        "body", [vi("s", [2]), vi("n", [1]), vi("a", [2]), vi("b", [2])],
        [vi("s2", [2]), vi("n2", [1]), vi("y", [2])],
        initializer=[init("one", np.array([1.0], np.float32))])
    node = h.make_node("Scan", ["lens", "s0", "n0", "A", "Bx"], ["sT", "nT", "Y"], body=body,
                       num_scan_inputs=2, directions=[1, 0], name="s8")
    g = h.make_graph([node], "main",
                     [vi("lens", [3], I64), vi("s0", [3, 2]), vi("n0", [3, 1]), vi("A", [3, 3, 2]), vi("Bx", [3, 3, 2])],
                     [vi("sT", [3, 2]), vi("nT", [3, 1]), vi("Y", [3, 3, 2])])
    return model(g, 8)


def scan_in_function():
    """A model-local function whose body holds a Scan (skl2onnx and onnxscript write functions)."""
    body = h.make_graph(
        [h.make_node("Add", ["s", "x"], ["s2"]), h.make_node("Identity", ["s2"], ["y"])],
        "body", [vi("s", [2]), vi("x", [2])], [vi("s2", [2]), vi("y", [2])])
    fn = h.make_function("local", "cumsum", ["s0", "X"], ["Y"],
                         [h.make_node("Scan", ["s0", "X"], ["sT", "Y"], body=body, num_scan_inputs=1)],
                         opset_imports=[h.make_opsetid("", 17)])
    g = h.make_graph([h.make_node("cumsum", ["s0", "X"], ["Y"], domain="local")], "main",
                     [vi("s0", [2]), vi("X", [3, 2])], [vi("Y", [3, 2])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("local", 1)], ir_version=8,
                     functions=[fn])
    return m


def unused_scan_output_empty_name():
    """A Scan whose second scan output is omitted with an empty name (optional output)."""
    body = h.make_graph(
        [h.make_node("Add", ["s", "x"], ["s2"]), h.make_node("Mul", ["s2", "x"], ["y"]),
         h.make_node("Neg", ["x"], ["z"])],
        "body", [vi("s", [2]), vi("x", [2])], [vi("s2", [2]), vi("y", [2]), vi("z", [2])])
    node = h.make_node("Scan", ["s0", "X"], ["sT", "Y", ""], body=body, num_scan_inputs=1, name="opt_out")
    g = h.make_graph([node], "main", [vi("s0", [2]), vi("X", [3, 2])], [vi("sT", [2]), vi("Y", [3, 2])])
    return model(g, 17)


HAND.update({
    "passthrough_outputs": passthrough_outputs,
    "scan8_short_lens_reverse": scan8_short_lens_reverse,
    "scan_in_function": scan_in_function,
    "unused_scan_output_empty_name": unused_scan_output_empty_name,
})



def same_value_twice():
    """One outer tensor fed as the initial state and as both scan inputs; a Scan output that
    is a graph output and also read by a later node; a graph output that is a graph input."""
    body = h.make_graph(
        [h.make_node("Add", ["s", "a"], ["t"]), h.make_node("Mul", ["t", "b"], ["s2"]),
         h.make_node("Sub", ["s2", "a"], ["y"])],
        "body", [vi("s", [2]), vi("a", [2]), vi("b", [2])], [vi("s2", [2]), vi("y", [2])])
    node = h.make_node("Scan", ["X0", "X", "X"], ["sT", "Y"], body=body, num_scan_inputs=2, name="twice")
    g = h.make_graph([node, h.make_node("ReduceSum", ["Y"], ["total"], keepdims=0)], "main",
                     [vi("X0", [2]), vi("X", [2, 2])],
                     [vi("sT", [2]), vi("Y", [2, 2]), vi("total", []), vi("X0", [2])])
    return model(g, 17)


def digit_and_empty_dim_names():
    """dim_param spellings that look like something else: "3", "-1", "T*2", and an empty one."""
    body = h.make_graph(
        [h.make_node("Add", ["s", "x"], ["s2"]), h.make_node("Identity", ["s2"], ["y"])],
        "body", [vi("s", ["3"]), vi("x", ["3"])], [vi("s2", ["3"]), vi("y", ["3"])])
    node = h.make_node("Scan", ["s0", "X"], ["sT", "Y"], body=body, num_scan_inputs=1, name="digits")
    x = vi("X", ["T*2", "3"])
    g = h.make_graph([node], "main", [vi("s0", ["3"]), x], [vi("sT", ["-1"]), vi("Y", ["T*2", ""])])
    return model(g, 17)


def loop_in_scan_body_state_trip():
    """A Scan body holding a Loop whose trip count is computed from the scan element (an int64
    scan input): data-dependent inner work per step, outer weight read two levels down."""
    lbody = h.make_graph(
        [h.make_node("Mul", ["acc", "W"], ["acc2"]), h.make_node("Identity", ["c"], ["c2"])],
        "lbody", [vi("i", [], I64), vi("c", [], TP.BOOL), vi("acc", [2])],
        [vi("c2", [], TP.BOOL), vi("acc2", [2])])
    body = h.make_graph(
        [h.make_node("Loop", ["k", "", "s"], ["p"], body=lbody, name="inner_loop"),
         h.make_node("Add", ["p", "x"], ["s2"]), h.make_node("Identity", ["s2"], ["y"])],
        "body", [vi("s", [2]), vi("k", [], I64), vi("x", [2])], [vi("s2", [2]), vi("y", [2])])
    node = h.make_node("Scan", ["s0", "K", "X"], ["sT", "Y"], body=body, num_scan_inputs=2, name="with_loop")
    g = h.make_graph([node], "main", [vi("s0", [2]), vi("K", [3], I64), vi("X", [3, 2])],
                     [vi("sT", [2]), vi("Y", [3, 2])], initializer=[init("W", np.array([0.9, 1.1], np.float32))])
    return model(g, 16)


HAND.update({
    "same_value_twice": same_value_twice,
    "digit_and_empty_dim_names": digit_and_empty_dim_names,
    "loop_in_scan_body_state_trip": loop_in_scan_body_state_trip,
})



def neg_axes_map_unnamed():
    """An unnamed map Scan (hand-written models often leave names empty) reading X [2, 3, T] on
    axis -1 in reverse, writing Y on axis -1 and R prepended on axis 1; MatMul by an outer
    weight, Softmax and ReduceSum on the last axis."""
    body = h.make_graph(
        [h.make_node("MatMul", ["x", "W"], ["xw"]), h.make_node("Softmax", ["xw"], ["y"], axis=-1),
         h.make_node("ReduceSum", ["xw", "ax"], ["r"], keepdims=1)],
        "b", [vi("x", [2, 3])], [vi("y", [2, 4]), vi("r", [2, 1])],
        initializer=[init("ax", np.array([-1], np.int64))])
    node = h.make_node("Scan", ["X"], ["Y", "R"], body=body, num_scan_inputs=1, scan_input_axes=[-1],
                       scan_input_directions=[1], scan_output_axes=[-1, 1], scan_output_directions=[0, 1])
    g = h.make_graph([node], "m", [vi("X", [2, 3, "T"])], [vi("Y", [2, 4, "T"]), vi("R", [2, "T", 1])],
                     initializer=[init("W", rng(9).randn(3, 4).astype(np.float32))])
    return model(g, 16)


HAND["neg_axes_map_unnamed"] = neg_axes_map_unnamed


if __name__ == "__main__":
    main()
