"""Regenerate models/heldout_producers_3/: a third, smaller real-exporter held-out set (issue 20).

    python models/generate_heldout_producers_3.py     # torch 2.13, onnxscript, skl2onnx ones
    /path/to/tf-venv/bin/python models/generate_heldout_producers_3.py   # tf2onnx 1.17 ones

Written blind: passes were fixed against models/heldout_producers and heldout_producers_2, not
against this set. Forms no other folder of models/ holds. Sizes T=6, B=2, I=3, H=5 (no two
equal, so a wrong axis shows). Each sample comes with <name>.expected.npz: its inputs and the
source framework's outputs.

PyTorch 2.13 dynamo exporter, ``torch._higher_order_ops.scan``:
- dyn_scan_gru_addmm:      GRU written with torch.addmm per gate (r, z, n), reset after the product
- dyn_scan_two_seqs:       h = tanh(x_t W + u_t V + h R): a cell reading two sequences
- dyn_scan_ema_beside_cell: carry (h, m): tanh RNN h and an EMA m = 0.9 m + 0.1 h beside it
- dyn_scan_logits:         tanh RNN whose per-step output is a Linear head's logits, not h
TorchScript exporter (``torch.onnx.export(torch.jit.script(m), ..., dynamo=False)``):
- ts_rnn_skip_continue:    ``for i in range(x.size(0))`` that ``continue``s past a step whose x sums below 0
- ts_lstm_cell_module:     nn.LSTMCell called in the loop, list append, torch.stack
- ts_map_cat_grow:         relu(W x[i]) grown by torch.cat from an empty tensor (a map)
onnxscript (models/heldout3_onnxscript.py):
- os_fn_gru_rzn_once:      GRU-like Scan (r, z, n; reset after the product) in a function called once
skl2onnx 1.20 / scikit-learn 1.9 (float32):
- skl_knn_classifier_uniform_euclid_k3: KNeighborsClassifier(3, weights="uniform", metric="euclidean"), ZipMap
- skl_pipeline_robust_knn_regressor_k2: RobustScaler -> KNeighborsRegressor(2)
tf2onnx 1.17 + TensorFlow 2.21:
- tf1_gru_initial_state:   TF1 dynamic_rnn(GRUCell) with initial_state a placeholder h0
- keras_simplernn_relu:    Keras 3 SimpleRNN(activation="relu", return_sequences=True)
- keras_gru_return_state:  Keras 3 GRU(return_state=True): (last output, state)
- keras_lstm_go_backwards: Keras 3 LSTM(go_backwards=True, return_sequences=True)
- tf_scan_init_tuple3:     tf.scan with an initializer tuple of three states (h, running sum, count)
- tf_map_fn_dtype_change:  tf.map_fn from float rows to int64 argmax (fn_output_signature=tf.int64)
"""

from __future__ import annotations

import os

import numpy as np

from generate import (HERE, export_tf1_sample, export_tf_function_sample, export_torch_sample,
                      run_producer_generator, save_npz)
from generate_heldout_producers_2 import _rng_consts

OUT = os.path.join(HERE, "heldout_producers_3")
T, B, I, H = 6, 2, 3, 5

TORCH_DYN = ["dyn_scan_gru_addmm", "dyn_scan_two_seqs", "dyn_scan_ema_beside_cell", "dyn_scan_logits"]
TORCH_TS = ["ts_rnn_skip_continue", "ts_lstm_cell_module", "ts_map_cat_grow"]
ONNXSCRIPT = ["os_fn_gru_rzn_once"]
SKL = ["skl_knn_classifier_uniform_euclid_k3", "skl_pipeline_robust_knn_regressor_k2"]
TF1 = ["tf1_gru_initial_state"]
TF = TF1 + ["keras_simplernn_relu", "keras_gru_return_state", "keras_lstm_go_backwards", "tf_scan_init_tuple3",
            "tf_map_fn_dtype_change"]
NAMES = TORCH_DYN + TORCH_TS + ONNXSCRIPT + SKL + TF
# the models whose loops are maps (every other loop is a recurrence)
MAPS = {"ts_map_cat_grow", "tf_map_fn_dtype_change", *SKL}
# x laid out [B, T, I] (every other recurrent x is [T, B, I]); skl inputs are X [N, F]
BATCH_FIRST = {"tf1_gru_initial_state", "keras_simplernn_relu", "keras_gru_return_state", "keras_lstm_go_backwards"}


# ---------------------------------------------------------------- PyTorch
def _dynamo_modules():
    import torch
    from torch import nn
    from torch._higher_order_ops import scan

    class GRUAddmm(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, I, H) * 0.4)
            self.r = nn.Parameter(torch.randn(3, H, H) * 0.4)
            self.bw, self.br = nn.Parameter(torch.randn(3, H) * 0.1), nn.Parameter(torch.randn(3, H) * 0.1)

        def forward(self, x, h0):
            def step(h, x_t):
                xr, xz, xn = (torch.addmm(self.bw[k], x_t, self.w[k]) for k in range(3))
                hr, hz, hn = (torch.addmm(self.br[k], h, self.r[k]) for k in range(3))
                r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
                h = (1 - z) * torch.tanh(xn + r * hn) + z * h
                return h, h.clone()
            h_n, y = scan(step, h0, x)
            return y, h_n

    class TwoSeqs(nn.Module):
        def __init__(self):
            super().__init__()
            self.wx, self.wu, self.wh = nn.Linear(I, H), nn.Linear(2, H, bias=False), nn.Linear(H, H, bias=False)

        def forward(self, x, u, h0):
            def step(h, xs):
                x_t, u_t = xs
                h = torch.tanh(self.wx(x_t) + self.wu(u_t) + self.wh(h))
                return h, h.clone()
            h_n, y = scan(step, h0, (x, u))
            return y, h_n

    class EMABesideCell(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, H), nn.Linear(H, H)

        def forward(self, x, h0):
            def step(carry, x_t):
                h, m = carry
                h = torch.tanh(self.wi(x_t) + self.wh(h))
                m = 0.9 * m + 0.1 * h
                return (h, m), h.clone()
            (h_n, m_n), y = scan(step, (h0, torch.zeros_like(h0)), x)
            return y, h_n, m_n

    class Logits(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh, self.head = nn.Linear(I, H), nn.Linear(H, H), nn.Linear(H, 4)

        def forward(self, x, h0):
            def step(h, x_t):
                h = torch.tanh(self.wi(x_t) + self.wh(h))
                return h, self.head(h)
            h_n, logits = scan(step, h0, x)
            return logits, h_n

    return dict(dyn_scan_gru_addmm=GRUAddmm, dyn_scan_two_seqs=TwoSeqs, dyn_scan_ema_beside_cell=EMABesideCell,
                dyn_scan_logits=Logits)


def _script_modules():
    import torch
    from torch import nn

    class RNNSkipContinue(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, H), nn.Linear(H, H)

        def forward(self, x, h0):
            h = h0
            for i in range(x.size(0)):
                if bool(x[i].sum() < 0.0):
                    continue
                h = torch.tanh(self.wi(x[i]) + self.wh(h))
            return h

    class LSTMCellModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = nn.LSTMCell(I, H)

        def forward(self, x, h0, c0):
            h, c = h0, c0
            outs = []
            for i in range(x.size(0)):
                h, c = self.cell(x[i], (h, c))
                outs.append(h)
            return torch.stack(outs), h, c

    class MapCatGrow(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Linear(I, H)

        def forward(self, x):
            out = torch.zeros(0, x.size(1), self.w.weight.size(0))
            for i in range(x.size(0)):
                out = torch.cat([out, torch.relu(self.w(x[i])).unsqueeze(0)], 0)
            return out

    return dict(ts_rnn_skip_continue=RNNSkipContinue, ts_lstm_cell_module=LSTMCellModule, ts_map_cat_grow=MapCatGrow)


OUTPUTS = {"dyn_scan_ema_beside_cell": ["y", "h_n", "m_n"], "dyn_scan_logits": ["logits", "h_n"],
           "ts_rnn_skip_continue": ["h_n"], "ts_lstm_cell_module": ["y", "h_n", "c_n"],
           "ts_map_cat_grow": ["y"]}


def write_torch(name):
    import torch

    torch.manual_seed(0)
    feeds = {"x": torch.randn(T, B, I)}
    if name == "dyn_scan_two_seqs":
        feeds["u"] = torch.randn(T, B, 2)
    if name != "ts_map_cat_grow":
        feeds["h0"] = torch.randn(B, H) * 0.5
    if name == "ts_lstm_cell_module":
        feeds["c0"] = torch.randn(B, H) * 0.5
    torch.manual_seed(1)
    scripted = name.startswith("ts_")
    module = (_script_modules() if scripted else _dynamo_modules())[name]().eval()
    module.__module__ = "scanopt_samples"
    seq, batch = ("T", "B") if scripted else ("seq", "batch")
    axes = {k: ({0: seq, 1: batch} if v.dim() == 3 else {0: batch}) for k, v in feeds.items()}
    export_torch_sample(module, feeds, OUTPUTS.get(name, ["y", "h_n"]), os.path.join(OUT, f"{name}.onnx"),
                        scripted=scripted, axes=axes)


# ---------------------------------------------------------------- onnxscript
def write_onnxscript(name):
    import onnx
    import onnxruntime as ort
    from heldout3_onnxscript import MODELS

    model = MODELS[name].to_model_proto()
    model.ir_version = 8
    onnx.checker.check_model(model)
    rng = np.random.default_rng(3)
    u = lambda *s: rng.uniform(-0.5, 0.5, s).astype(np.float32)  # noqa: E731
    feeds = {"x": rng.standard_normal((T, B, I)).astype(np.float32), "h0": u(B, H), "w": u(I, 3 * H),
             "r": u(H, 3 * H), "bw": u(3 * H), "br": u(3 * H)}
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
    from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import RobustScaler

    F = 4
    if "classifier" in name:
        X, y = make_classification(n_samples=30, n_features=F, n_informative=3, n_redundant=0, n_classes=2,
                                   random_state=1)
        est = KNeighborsClassifier(n_neighbors=3, weights="uniform", metric="euclidean")
    else:
        X, y = make_regression(n_samples=30, n_features=F, random_state=1)
        est = make_pipeline(RobustScaler(), KNeighborsRegressor(n_neighbors=2))
    X = X.astype(np.float32)
    est.fit(X, y)
    model = to_onnx(est, X[:1], target_opset=17)
    Xt = np.random.default_rng(4).standard_normal((B + 3, F)).astype(np.float32)
    if hasattr(est, "predict_proba"):
        got = [est.predict(Xt), est.predict_proba(Xt)]
    else:
        got = [est.predict(Xt).reshape(-1, 1)]
    onnx.save(model, os.path.join(OUT, f"{name}.onnx"))
    save_npz(os.path.join(OUT, f"{name}.expected.npz"),
             {"X": Xt, **{o.name: np.asarray(g) for o, g in zip(model.graph.output, got)}})


# ---------------------------------------------------------------- TensorFlow
def write_tf1(name):
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_control_flow_v2()
    graph = tf.Graph()
    rng = np.random.default_rng(5)
    feeds = {"x:0": rng.standard_normal((B, T, I)).astype(np.float32),
             "h0:0": rng.uniform(-0.5, 0.5, (B, H)).astype(np.float32)}
    with graph.as_default():
        v1.set_random_seed(7)
        x = v1.placeholder(tf.float32, [None, None, I], name="x")
        h0 = v1.placeholder(tf.float32, [None, H], name="h0")
        out, state = v1.nn.dynamic_rnn(v1.nn.rnn_cell.GRUCell(H), x, initial_state=h0)
        tf.identity(out, name="y")
        tf.identity(state, name="h_n")
    export_tf1_sample(graph, feeds, ["y", "h_n"], os.path.join(OUT, f"{name}.onnx"))


def _tf2_function(name):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    w_value, r_value = _rng_consts(0, (I, H), (H, H))
    L = keras.layers
    if name == "tf_scan_init_tuple3":
        def f(x):
            w, r = tf.constant(w_value), tf.constant(r_value)
            b = tf.shape(x)[1]

            def step(carry, x_t):
                h, s, n = carry
                h = tf.tanh(x_t @ w + h @ r)
                return h, s + h, n + 1.0
            hs, ss, ns = tf.scan(step, x, initializer=(tf.zeros([b, H]), tf.zeros([b, H]), tf.zeros([b, 1])))
            return hs, ss[-1] / ns[-1]
        return f
    if name == "tf_map_fn_dtype_change":
        return lambda x: tf.map_fn(lambda a: tf.argmax(a @ tf.constant(w_value), axis=-1), x,
                                   fn_output_signature=tf.int64)
    layer = {"keras_simplernn_relu": lambda: L.SimpleRNN(H, activation="relu", return_sequences=True),
             "keras_gru_return_state": lambda: L.GRU(H, return_state=True),
             "keras_lstm_go_backwards": lambda: L.LSTM(H, go_backwards=True, return_sequences=True)}[name]()
    layer.build((None, None, I))
    return lambda x: layer(x)


def write_tf2(name):
    import tensorflow as tf

    rng = np.random.default_rng(2)
    x = rng.standard_normal((B, T, I) if name in BATCH_FIRST else (T, B, I)).astype(np.float32)
    export_tf_function_sample(tf.function(_tf2_function(name)), {"x": x},
                              [tf.TensorSpec([None, None, I], tf.float32, name="x")], os.path.join(OUT, f"{name}.onnx"))


def _writers() -> dict:
    return {**{n: write_tf1 for n in TF1}, **{n: write_tf2 for n in TF if n not in TF1},
            **{n: write_onnxscript for n in ONNXSCRIPT}, **{n: write_skl for n in SKL},
            **{n: write_torch for n in TORCH_DYN + TORCH_TS}}


if __name__ == "__main__":
    run_producer_generator(__file__, __doc__, {n: _writers()[n] for n in NAMES}, OUT, TF, TF1)
