"""Regenerate models/heldout_producers_2/: a second real-exporter held-out set (issue 20).

    python models/generate_heldout_producers_2.py     # torch 2.13, onnxscript, skl2onnx ones
    /path/to/tf-venv/bin/python models/generate_heldout_producers_2.py   # tf2onnx 1.17 ones

models/heldout_producers/ was measured and then fixed against; this set holds forms neither it
nor models/tf2onnx, loops, functions, cells, skl hold, written before anyone tuned a pass on
them. Sizes T=7, B=3, I=5, H=6 (no two equal, so a wrong axis shows). Each sample comes with
<name>.expected.npz: its inputs and the source framework's outputs.

PyTorch 2.13 dynamo exporter, ``torch._higher_order_ops.scan`` / ``while_loop``:
- dyn_scan_gru_zrn:        GRU with gate order (z, r, n) from one Linear over cat([x, h]) for z, r
- dyn_scan_lstm_ifog:      LSTM chunked (i, f, o, g), one Linear per operand, two outputs (h, c)
- dyn_scan_rnn_layernorm:  h = tanh(LayerNorm(W x + U h)) (not an ONNX cell: must stay, with a reason)
- dyn_scan_rnn_flip:       reverse RNN written as flip(x) -> scan -> flip(y)
- dyn_scan_map_mlp:        a scan whose carry passes through unchanged: a per-step MLP (a map)
- dyn_while_lstm:          LSTM under while_loop, counter i < x.size(0), final (h, c)
TorchScript exporter (``torch.onnx.export(torch.jit.script(m), ..., dynamo=False)``):
- ts_lstm_cat_grow:        LSTM whose output grows by torch.cat([out, h[None]]) from an empty tensor
- ts_map_two_inputs:       per-step f(x[i], u[i]) over two sequences, stacked (a map)
- ts_gru_while:            GRU under ``while i < x.size(0)`` (a TorchScript while loop)
- ts_rnn_relu_stack_dim1:  relu RNN over seq-major x, outputs stacked on dim 1
- ts_map_residual:         x[i] + relu(W x[i]) per step, stacked (a map)
onnxscript (models/heldout2_onnxscript.py):
- os_fn_gru_twice:         GRU-gated Scan in a function whose weights are inputs, called twice
- os_fn_nested_map_if:     map Scan in a function called by a function called from both If branches
skl2onnx 1.20 / scikit-learn 1.9 (the regressors in float64: tensor(double) Scans):
- skl_knn_classifier_zipmap_manhattan: KNeighborsClassifier(metric="manhattan"), default ZipMap output
- skl_knn_regressor_cosine: KNeighborsRegressor(metric="cosine")
- skl_gp_ard_rbf:          GaussianProcessRegressor(C * RBF(per-feature length scales) + WhiteKernel)
- skl_pipeline_minmax_pca_knn_regressor: MinMaxScaler -> PCA(whiten=True) -> KNeighborsRegressor
tf2onnx 1.17 + TensorFlow 2.21, TF1 ``tf.compat.v1`` graphs (tf-keras cells):
- tf1_lstm_cell_time_major:    LSTMCell, time_major=True, final h
- tf1_gru_cell_lengths:        GRUCell with sequence_length
- tf1_multi_rnn_cell:          MultiRNNCell of two BasicRNNCells (H=6, then 4)
- tf1_bidi_gru_time_major:     bidirectional_dynamic_rnn of GRUCells, time_major=True
Keras 3 layers via tf.function (x [B, T, 5], opset 17):
- keras_gru_reset_before:      GRU(reset_after=False, return_sequences=True)
- keras_lstm_return_state:     LSTM(return_sequences=True, return_state=True)
- keras_bidi_simplernn:        Bidirectional(SimpleRNN(return_sequences=True))
- keras_masking_gru:           Masking(0.0) -> GRU (x holds zero padding)
TF2 control flow (x [T, B, 5]):
- tf_scan_tuple_two_out:       tf.scan with an (h, s) state and outputs (h, s) and a projection
- tf_map_fn_two_inputs:        tf.map_fn over (x, u) -> tanh(x W) * u
- tf_while_loop_rnn:           tf.while_loop writing a TensorArray, tanh RNN
"""

from __future__ import annotations

import os

import numpy as np

from generate import (HERE, export_tf1_sample, export_tf_function_sample, export_torch_sample,
                      run_producer_generator, save_npz)

OUT = os.path.join(HERE, "heldout_producers_2")
T, B, I, H = 7, 3, 5, 6

TORCH_DYN = ["dyn_scan_gru_zrn", "dyn_scan_lstm_ifog", "dyn_scan_rnn_layernorm", "dyn_scan_rnn_flip",
             "dyn_scan_map_mlp", "dyn_while_lstm"]
TORCH_TS = ["ts_lstm_cat_grow", "ts_map_two_inputs", "ts_gru_while", "ts_rnn_relu_stack_dim1", "ts_map_residual"]
ONNXSCRIPT = ["os_fn_gru_twice", "os_fn_nested_map_if"]
SKL = ["skl_knn_classifier_zipmap_manhattan", "skl_knn_regressor_cosine", "skl_gp_ard_rbf",
       "skl_pipeline_minmax_pca_knn_regressor"]
TF1 = ["tf1_lstm_cell_time_major", "tf1_gru_cell_lengths", "tf1_multi_rnn_cell", "tf1_bidi_gru_time_major"]
KERAS = ["keras_gru_reset_before", "keras_lstm_return_state", "keras_bidi_simplernn", "keras_masking_gru"]
TF2 = ["tf_scan_tuple_two_out", "tf_map_fn_two_inputs", "tf_while_loop_rnn"]
TF = TF1 + KERAS + TF2
NAMES = TORCH_DYN + TORCH_TS + ONNXSCRIPT + SKL + TF
# the models whose loops are maps (every other loop is a recurrence)
MAPS = {"dyn_scan_map_mlp", "ts_map_two_inputs", "ts_map_residual", "os_fn_nested_map_if", "tf_map_fn_two_inputs",
        *SKL}
# x laid out [B, T, I] (every other recurrent x is [T, B, I]); skl inputs are X [N, F]
BATCH_FIRST = {"tf1_gru_cell_lengths", "tf1_multi_rnn_cell", *KERAS}


# ---------------------------------------------------------------- PyTorch
def _dynamo_modules():
    import torch
    from torch import nn
    from torch._higher_order_ops import scan
    from torch._higher_order_ops.while_loop import while_loop

    class GRUZrn(nn.Module):
        def __init__(self):
            super().__init__()
            self.zr, self.xn, self.hn = nn.Linear(I + H, 2 * H), nn.Linear(I, H), nn.Linear(H, H)

        def forward(self, x, h0):
            def step(h, x_t):
                z, r = torch.sigmoid(self.zr(torch.cat([x_t, h], 1))).chunk(2, 1)
                n = torch.tanh(self.xn(x_t) + r * self.hn(h))
                h = z * h + (1 - z) * n
                return h, h.clone()
            h_n, y = scan(step, h0, x)
            return y, h_n

    class LSTMIfog(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, 4 * H), nn.Linear(H, 4 * H)

        def forward(self, x, h0, c0):
            def step(carry, x_t):
                h, c = carry
                i, f, o, g = (self.wi(x_t) + self.wh(h)).chunk(4, 1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                return (h, c), (h.clone(), c.clone())
            (h_n, c_n), (y, cs) = scan(step, (h0, c0), x)
            return y, cs, h_n, c_n

    class RNNLayerNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh, self.norm = nn.Linear(I, H), nn.Linear(H, H, bias=False), nn.LayerNorm(H)

        def forward(self, x, h0):
            def step(h, x_t):
                h = torch.tanh(self.norm(self.wi(x_t) + self.wh(h)))
                return h, h.clone()
            h_n, y = scan(step, h0, x)
            return y, h_n

    class RNNFlip(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, H), nn.Linear(H, H)

        def forward(self, x, h0):
            def step(h, x_t):
                h = torch.tanh(self.wi(x_t) + self.wh(h))
                return h, h.clone()
            h_n, y = scan(step, h0, torch.flip(x, [0]))
            return torch.flip(y, [0]), h_n

    class MapMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(I, H), nn.Linear(H, 2)

        def forward(self, x, h0):
            def step(h, x_t):
                return h.clone(), self.b(torch.relu(self.a(x_t)))
            _, y = scan(step, h0, x)
            return (y,)

    class WhileLSTM(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, 4 * H), nn.Linear(H, 4 * H)

        def forward(self, x, h0, c0):
            def body(i, h, c):
                x_t = x.index_select(0, i.reshape(1)).squeeze(0)
                g_i, g_f, g_g, g_o = (self.wi(x_t) + self.wh(h)).chunk(4, 1)
                c = torch.sigmoid(g_f) * c + torch.sigmoid(g_i) * torch.tanh(g_g)
                return i + 1, torch.sigmoid(g_o) * torch.tanh(c), c
            _, h, c = while_loop(lambda i, h, c: i < x.size(0), body, (torch.tensor(0), h0, c0))
            return h, c

    return dict(dyn_scan_gru_zrn=GRUZrn, dyn_scan_lstm_ifog=LSTMIfog, dyn_scan_rnn_layernorm=RNNLayerNorm,
                dyn_scan_rnn_flip=RNNFlip, dyn_scan_map_mlp=MapMLP, dyn_while_lstm=WhileLSTM)


def _script_modules():
    import torch
    from torch import nn

    class LSTMCatGrow(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, 4 * H), nn.Linear(H, 4 * H)

        def forward(self, x, h, c):
            out = torch.zeros(0, x.size(1), h.size(1))
            for i in range(x.size(0)):
                g_i, g_f, g_g, g_o = (self.wi(x[i]) + self.wh(h)).chunk(4, 1)
                c = torch.sigmoid(g_f) * c + torch.sigmoid(g_i) * torch.tanh(g_g)
                h = torch.sigmoid(g_o) * torch.tanh(c)
                out = torch.cat([out, h.unsqueeze(0)], 0)
            return out, h, c

    class MapTwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Linear(I, H)

        def forward(self, x, u):
            outs = []
            for i in range(x.size(0)):
                outs.append(torch.tanh(self.w(x[i])) * u[i])
            return torch.stack(outs)

    class GRUWhile(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, 3 * H), nn.Linear(H, 3 * H)

        def forward(self, x, h):
            outs = []
            i = 0
            while i < x.size(0):
                i_r, i_z, i_n = self.wi(x[i]).chunk(3, 1)
                h_r, h_z, h_n = self.wh(h).chunk(3, 1)
                r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
                h = (1 - z) * torch.tanh(i_n + r * h_n) + z * h
                outs.append(h)
                i += 1
            return torch.stack(outs), h

    class ReluRNNDim1(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, H), nn.Linear(H, H)

        def forward(self, x, h):
            outs = []
            for i in range(x.size(0)):
                h = torch.relu(self.wi(x[i]) + self.wh(h))
                outs.append(h)
            return torch.stack(outs, 1), h

    class MapResidual(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Linear(I, I)

        def forward(self, x):
            outs = []
            for i in range(x.size(0)):
                outs.append(x[i] + torch.relu(self.w(x[i])))
            return torch.stack(outs)

    return dict(ts_lstm_cat_grow=LSTMCatGrow, ts_map_two_inputs=MapTwoInputs, ts_gru_while=GRUWhile,
                ts_rnn_relu_stack_dim1=ReluRNNDim1, ts_map_residual=MapResidual)


def _torch_inputs(name):
    import torch

    torch.manual_seed(0)
    x = torch.randn(T, B, I)
    if name in ("ts_map_residual",):
        return {"x": x}
    if name == "ts_map_two_inputs":
        return {"x": x, "u": torch.randn(T, B, H)}
    feeds = {"x": x, "h0": torch.randn(B, H)}
    if "lstm" in name:
        feeds["c0"] = torch.randn(B, H)
    return feeds


OUTPUTS = {"dyn_scan_lstm_ifog": ["y", "c_seq", "h_n", "c_n"], "dyn_scan_map_mlp": ["y"], "dyn_while_lstm": ["h_n", "c_n"],
           "ts_map_two_inputs": ["y"], "ts_map_residual": ["y"]}


def write_torch(name):
    import torch

    feeds = _torch_inputs(name)
    torch.manual_seed(1)
    scripted = name.startswith("ts_")
    module = (_script_modules() if scripted else _dynamo_modules())[name]().eval()
    module.__module__ = "scanopt_samples"
    seq, batch = ("T", "B") if scripted else ("seq", "batch")
    axes = {k: ({0: seq, 1: batch} if v.dim() == 3 else {0: batch}) for k, v in feeds.items()}
    outputs = OUTPUTS.get(name, ["y", "h_n", "c_n"][: 2 + ("lstm" in name)])
    export_torch_sample(module, feeds, outputs, os.path.join(OUT, f"{name}.onnx"), scripted=scripted, axes=axes)


# ---------------------------------------------------------------- onnxscript
def write_onnxscript(name):
    import onnx
    import onnxruntime as ort
    from heldout2_onnxscript import MODELS

    model = MODELS[name].to_model_proto()
    model.ir_version = 8
    onnx.checker.check_model(model)
    rng = np.random.default_rng(3)
    u = lambda *s: rng.uniform(-0.5, 0.5, s).astype(np.float32)  # noqa: E731
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    if name == "os_fn_gru_twice":
        feeds = {"x": x, "h0": u(B, H), "h1": u(B, H), "w": u(I, 3 * H), "r": u(H, 3 * H), "b": u(3 * H)}
    else:
        feeds = {"x": x, "w": u(I, H), "flag": np.array(False)}
    # onnxscript has no eager executor of its own for Scan in functions: onnxruntime is the source's runtime
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    onnx.save(model, os.path.join(OUT, f"{name}.onnx"))
    save_npz(os.path.join(OUT, f"{name}.expected.npz"),
             {**feeds, **{o.name: g for o, g in zip(model.graph.output, got)}})


# ---------------------------------------------------------------- skl2onnx
def write_skl(name):
    import onnx
    from skl2onnx import to_onnx
    from sklearn.datasets import make_classification, make_regression
    from sklearn.decomposition import PCA
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
    from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import MinMaxScaler

    options = None
    if "classifier" in name:
        X, y = make_classification(n_samples=40, n_features=5, n_informative=3, n_classes=3, random_state=0)
    else:
        X, y = make_regression(n_samples=40, n_features=5, random_state=0)
    # float32 leaves skl2onnx's GP regressor percents off sklearn; ZipMap takes only float
    # probabilities. (skl2onnx 1.20 writes weights="distance" KNNs as uniform ones: not used.)
    dtype = np.float32 if "classifier" in name else np.float64
    X = X.astype(dtype)
    if name == "skl_knn_classifier_zipmap_manhattan":
        est = KNeighborsClassifier(n_neighbors=4, metric="manhattan").fit(X, y)
    elif name == "skl_knn_regressor_cosine":
        est = KNeighborsRegressor(n_neighbors=3, metric="cosine").fit(X, y)
    elif name == "skl_gp_ard_rbf":
        est = GaussianProcessRegressor(ConstantKernel() * RBF(np.ones(5)) + WhiteKernel(), random_state=0).fit(X, y / 100)
    else:
        est = make_pipeline(MinMaxScaler(), PCA(n_components=3, whiten=True, random_state=0),
                            KNeighborsRegressor(n_neighbors=3)).fit(X, y)
    model = to_onnx(est, X[:1], target_opset=17, options=options)
    Xt = np.random.default_rng(4).standard_normal((B, 5)).astype(dtype)
    if hasattr(est, "predict_proba"):
        got = [est.predict(Xt), est.predict_proba(Xt)]
    else:
        got = [est.predict(Xt).reshape(-1, 1)]
    onnx.save(model, os.path.join(OUT, f"{name}.onnx"))
    save_npz(os.path.join(OUT, f"{name}.expected.npz"),
             {"X": Xt, **{o.name: np.asarray(g) for o, g in zip(model.graph.output, got)}})


# ---------------------------------------------------------------- TensorFlow
def _rng_consts(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in shapes]


def write_tf1(name):
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_control_flow_v2()
    cells = v1.nn.rnn_cell
    graph = tf.Graph()
    batch_first = name in BATCH_FIRST
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((B, T, I) if batch_first else (T, B, I)).astype(np.float32)
    feeds = {"x:0": xs}
    with graph.as_default():
        v1.set_random_seed(7)
        x = v1.placeholder(tf.float32, [None, None, I], name="x")
        if name == "tf1_lstm_cell_time_major":
            out, state = v1.nn.dynamic_rnn(cells.LSTMCell(H), x, dtype=tf.float32, time_major=True)
            state = state.h
        elif name == "tf1_gru_cell_lengths":
            lens = v1.placeholder(tf.int32, [None], name="lens")
            feeds["lens:0"] = np.array([T, 3, 5], np.int32)
            out, state = v1.nn.dynamic_rnn(cells.GRUCell(H), x, sequence_length=lens, dtype=tf.float32)
        elif name == "tf1_multi_rnn_cell":
            cell = cells.MultiRNNCell([cells.BasicRNNCell(H), cells.BasicRNNCell(4)])
            out, state = v1.nn.dynamic_rnn(cell, x, dtype=tf.float32)
            state = state[1]
        else:
            (o_fw, o_bw), (s_fw, s_bw) = v1.nn.bidirectional_dynamic_rnn(
                cells.GRUCell(H), cells.GRUCell(H), x, dtype=tf.float32, time_major=True)
            out, state = tf.concat([o_fw, o_bw], axis=-1), tf.concat([s_fw, s_bw], axis=-1)
        tf.identity(out, name="y")
        tf.identity(state, name="h_n")
    export_tf1_sample(graph, feeds, ["y", "h_n"], os.path.join(OUT, f"{name}.onnx"))


def _tf2_function(name):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    w_value, r_value, v_value = _rng_consts(0, (I, H), (H, H), (H, 2))
    L = keras.layers
    if name == "tf_scan_tuple_two_out":
        def f(x):
            w, r, v = tf.constant(w_value), tf.constant(r_value), tf.constant(v_value)
            zeros = tf.zeros([tf.shape(x)[1], H])

            def step(carry, x_t):
                h, s, _ = carry
                h = tf.tanh(x_t @ w + h @ r)
                return h, s * 0.5 + h, h @ v
            hs, ss, ps = tf.scan(step, x, initializer=(zeros, zeros, tf.zeros([tf.shape(x)[1], 2])))
            return hs, ss, ps
        return f
    if name == "tf_map_fn_two_inputs":
        return lambda x, u: tf.map_fn(lambda a: tf.tanh(a[0] @ tf.constant(w_value)) * a[1], (x, u),
                                      fn_output_signature=tf.float32)
    if name == "tf_while_loop_rnn":
        def f(x):
            w, r = tf.constant(w_value), tf.constant(r_value)
            n = tf.shape(x)[0]
            ta = tf.TensorArray(tf.float32, size=n)

            def body(i, h, ta):
                h = tf.tanh(x[i] @ w + h @ r)
                return i + 1, h, ta.write(i, h)
            _, h, ta = tf.while_loop(lambda i, h, ta: i < n, body, (0, tf.zeros([tf.shape(x)[1], H]), ta))
            return ta.stack(), h
        return f
    if name == "keras_bidi_simplernn":
        layer = L.Bidirectional(L.SimpleRNN(H, return_sequences=True))
    elif name == "keras_masking_gru":
        model = keras.Sequential([L.Input((None, I)), L.Masking(0.0), L.GRU(H, return_sequences=True)])
        return lambda x: model(x)
    else:
        layer = {"keras_gru_reset_before": lambda: L.GRU(H, reset_after=False, return_sequences=True),
                 "keras_lstm_return_state": lambda: L.LSTM(H, return_sequences=True, return_state=True)}[name]()
    layer.build((None, None, I))
    return lambda x: layer(x)


def write_tf2(name):
    import tensorflow as tf

    fn = tf.function(_tf2_function(name))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((B, T, I) if name in BATCH_FIRST else (T, B, I)).astype(np.float32)
    if name == "keras_masking_gru":
        x[1, 5:] = 0.0  # item 1 padded after step 5
        x[2, 3:] = 0.0
    feeds = {"x": x}
    spec = [tf.TensorSpec([None, None, I], tf.float32, name="x")]
    if name == "tf_map_fn_two_inputs":
        feeds["u"] = rng.standard_normal((T, B, H)).astype(np.float32)
        spec.append(tf.TensorSpec([None, None, H], tf.float32, name="u"))
    export_tf_function_sample(fn, feeds, spec, os.path.join(OUT, f"{name}.onnx"))


def _writers() -> dict:
    return {**{n: write_tf1 for n in TF1}, **{n: write_tf2 for n in TF if n not in TF1},
            **{n: write_onnxscript for n in ONNXSCRIPT}, **{n: write_skl for n in SKL},
            **{n: write_torch for n in TORCH_DYN + TORCH_TS}}


if __name__ == "__main__":
    run_producer_generator(__file__, __doc__, {n: _writers()[n] for n in NAMES}, OUT, TF, TF1)
