"""Regenerate models/heldout_producers/: real-exporter models written after the matchers.

    python models/generate_heldout_producers.py          # the torch ones (torch 2.13 + onnxscript)
    TF_USE_LEGACY_KERAS=0 /path/to/tf-venv/bin/python models/generate_heldout_producers.py   # the tf ones

Issue 20's held-out set: forms of the producers that models/tf2onnx, loops, functions, cells
and skl do not hold, to measure fuse / vectorize / loop_to_scan on output nobody tuned them
against. Without --only, the script writes the group its interpreter can import (torch or
tensorflow). Each sample comes with <name>.expected.npz: inputs and the source's outputs.

PyTorch 2.13 dynamo exporter, ``torch._higher_order_ops.scan``:
- dyn_scan_gru_nobias:     nn.GRUCell(bias=False)
- dyn_scan_lstm_nobias:    nn.LSTMCell(bias=False), (h, c) carry
- dyn_scan_gru_two_layer:  two GRUCells, layer 2 scans layer 1's outputs (two Scans)
- dyn_scan_rnn_multi_out:  tanh RNN emitting h and relu(h) * 2 per step
- dyn_scan_gru_batch_first: nn.GRUCell scanned over x [B, T, I] with dim=1
TorchScript exporter (``torch.onnx.export(torch.jit.script(m), ..., dynamo=False)``):
- ts_rnn_range_reverse:    ``for i in range(x.size(0) - 1, -1, -1)`` (a negative-step range)
- ts_gru_size1_stack:      GRU (chunk(3)) over ``x[:, i]`` for i in range(x.size(1)), stack(outs, 1)
- ts_lstm_nobias_reverse:  LSTM without biases reading ``x[x.size(0) - 1 - i]``
- ts_map_size1:            per-step MLP over ``x[:, i]``, stacked on axis 1 (a map)
- ts_rnn_two_lists:        tanh RNN appending h and h * 0.5 to two lists, both stacked
Dynamo exporter, ``torch._higher_order_ops.while_loop``:
- dyn_while_gru:           a GRU written with chunk(3), counter i < x.size(0)
tf2onnx 1.17 with Keras 3 (tf.function over x [B, T, 3] unless noted, opset 17):
- keras_simplernn_backwards: SimpleRNN(go_backwards=True, return_sequences=True)
- keras_gru_last:          GRU(return_sequences=False)
- keras_lstm_seq:          LSTM(return_sequences=True)
- keras_stacked:           SimpleRNN -> GRU, both return_sequences
- tf_scan_cumsum:          ``tf.scan(lambda a, x_t: a + x_t * w, x, initializer=zeros)`` over x [T, B, 3]
                           (without an initializer tf2onnx 1.17 leaves a TensorListReserve)
- tf_map_fn_tanh:          ``tf.map_fn(lambda x_t: tanh(x_t W + b), x)`` over x [T, B, 3]
- tf_scan_pair:            ``tf.scan`` with a (h, s) pair state: tanh RNN plus a running sum
"""

from __future__ import annotations

import os

import numpy as np

from generate import HERE, export_torch_sample, run_generator, save_npz

OUT = os.path.join(HERE, "heldout_producers")
T, B, I, H = 5, 3, 3, 4

TORCH_DYN = ["dyn_scan_gru_nobias", "dyn_scan_lstm_nobias", "dyn_scan_gru_two_layer", "dyn_scan_rnn_multi_out",
             "dyn_scan_gru_batch_first", "dyn_while_gru"]
TORCH_TS = ["ts_rnn_range_reverse", "ts_gru_size1_stack", "ts_lstm_nobias_reverse", "ts_map_size1", "ts_rnn_two_lists"]
TF = ["keras_simplernn_backwards", "keras_gru_last", "keras_lstm_seq", "keras_stacked", "tf_scan_cumsum",
      "tf_map_fn_tanh", "tf_scan_pair"]
NAMES = TORCH_DYN + TORCH_TS + TF
BATCH_FIRST = {"dyn_scan_gru_batch_first", "ts_gru_size1_stack", "ts_map_size1"}


def _dynamo_modules():
    import torch
    from torch import nn
    from torch._higher_order_ops import scan
    from torch._higher_order_ops.while_loop import while_loop

    class GRUNoBias(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = nn.GRUCell(I, H, bias=False)

        def forward(self, x, h0):
            def step(h, x_t):
                h = self.cell(x_t, h)
                return h, h.clone()
            h_n, y = scan(step, h0, x)
            return y, h_n

    class LSTMNoBias(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = nn.LSTMCell(I, H, bias=False)

        def forward(self, x, h0, c0):
            def step(carry, x_t):
                h, c = self.cell(x_t, carry)
                return (h, c), h.clone()
            (h_n, c_n), y = scan(step, (h0, c0), x)
            return y, h_n, c_n

    class GRUTwoLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = nn.GRUCell(I, H), nn.GRUCell(H, H)

        def forward(self, x, h0):
            def layer(cell):
                def step(h, x_t):
                    h = cell(x_t, h)
                    return h, h.clone()
                return step
            h1, y1 = scan(layer(self.l1), h0, x)
            h2, y2 = scan(layer(self.l2), h0, y1)
            return y2, h1, h2

    class RNNMultiOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, H), nn.Linear(H, H)

        def forward(self, x, h0):
            def step(h, x_t):
                h = torch.tanh(self.wi(x_t) + self.wh(h))
                return h, (h.clone(), torch.relu(h) * 2.0)
            h_n, (y, z) = scan(step, h0, x)
            return y, z, h_n

    class GRUBatchFirst(GRUNoBias):
        def __init__(self):
            nn.Module.__init__(self)
            self.cell = nn.GRUCell(I, H)

        def forward(self, x, h0):
            def step(h, x_t):
                h = self.cell(x_t, h)
                return h, h.clone()
            h_n, y = scan(step, h0, x, dim=1)
            return y.transpose(0, 1), h_n

    class WhileGRU(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, 3 * H), nn.Linear(H, 3 * H)

        def forward(self, x, h0):
            def body(i, h):
                x_t = x.index_select(0, i.reshape(1)).squeeze(0)
                i_r, i_z, i_n = self.wi(x_t).chunk(3, 1)
                h_r, h_z, h_n = self.wh(h).chunk(3, 1)
                r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
                n = torch.tanh(i_n + r * h_n)
                return i + 1, (1 - z) * n + z * h
            _, h = while_loop(lambda i, h: i < x.size(0), body, (torch.tensor(0), h0))
            return (h,)

    return dict(dyn_scan_gru_nobias=GRUNoBias, dyn_scan_lstm_nobias=LSTMNoBias, dyn_scan_gru_two_layer=GRUTwoLayer,
                dyn_scan_rnn_multi_out=RNNMultiOut, dyn_scan_gru_batch_first=GRUBatchFirst, dyn_while_gru=WhileGRU)


def _script_modules():
    import torch
    from torch import nn

    class RNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, H), nn.Linear(H, H)

        def forward(self, x, h):
            outs = []
            for i in range(x.size(0) - 1, -1, -1):
                h = torch.tanh(self.wi(x[i]) + self.wh(h))
                outs.append(h)
            return torch.stack(outs), h

    class RNNTwoLists(RNN):
        def forward(self, x, h):
            ys, zs = [], []
            for i in range(x.size(0)):
                h = torch.tanh(self.wi(x[i]) + self.wh(h))
                ys.append(h)
                zs.append(h * 0.5)
            return torch.stack(ys), torch.stack(zs), h

    class GRUSize1(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, 3 * H), nn.Linear(H, 3 * H)

        def forward(self, x, h):
            outs = []
            for i in range(x.size(1)):
                i_r, i_z, i_n = self.wi(x[:, i]).chunk(3, 1)
                h_r, h_z, h_n = self.wh(h).chunk(3, 1)
                r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
                n = torch.tanh(i_n + r * h_n)
                h = (1 - z) * n + z * h
                outs.append(h)
            return torch.stack(outs, 1), h

    class LSTMNoBiasReverse(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, 4 * H, bias=False), nn.Linear(H, 4 * H, bias=False)

        def forward(self, x, h, c):
            outs = []
            for i in range(x.size(0)):
                g_i, g_f, g_g, g_o = (self.wi(x[x.size(0) - 1 - i]) + self.wh(h)).chunk(4, 1)
                c = torch.sigmoid(g_f) * c + torch.sigmoid(g_i) * torch.tanh(g_g)
                h = torch.sigmoid(g_o) * torch.tanh(c)
                outs.append(h)
            return torch.stack(outs), h, c

    class MapSize1(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(I, H), nn.Linear(H, 2)

        def forward(self, x):
            outs = []
            for i in range(x.size(1)):
                outs.append(self.b(torch.sigmoid(self.a(x[:, i]))))
            return torch.stack(outs, 1)

    return dict(ts_rnn_range_reverse=RNN, ts_gru_size1_stack=GRUSize1, ts_lstm_nobias_reverse=LSTMNoBiasReverse,
                ts_map_size1=MapSize1, ts_rnn_two_lists=RNNTwoLists)


def _torch_inputs(name):
    import torch

    torch.manual_seed(0)
    x = torch.randn(B, T, I) if name in BATCH_FIRST else torch.randn(T, B, I)
    if name == "ts_map_size1":
        return {"x": x}
    feeds = {"x": x, "h0": torch.randn(B, H)}
    if "lstm" in name:
        feeds["c0"] = torch.randn(B, H)
    return feeds


OUTPUTS = {"dyn_scan_gru_two_layer": ["y", "h1_n", "h2_n"], "dyn_scan_rnn_multi_out": ["y", "z", "h_n"],
           "dyn_while_gru": ["h_n"], "ts_map_size1": ["y"], "ts_rnn_two_lists": ["y", "z", "h_n"]}


def write_torch(name):
    import torch

    feeds = _torch_inputs(name)
    torch.manual_seed(1)
    scripted = name.startswith("ts_")
    module = (_script_modules() if scripted else _dynamo_modules())[name]().eval()
    module.__module__ = "scanopt_samples"
    batch_axis, seq_axis = (0, 1) if name in BATCH_FIRST else (1, 0)
    seq, batch = ("T", "B") if scripted else ("seq", "batch")
    axes = {k: ({seq_axis: seq, batch_axis: batch} if k == "x" else {0: batch}) for k in feeds}
    outputs = OUTPUTS.get(name, ["y", "h_n", "c_n"][: 2 + ("lstm" in name)])
    export_torch_sample(module, feeds, outputs, os.path.join(OUT, f"{name}.onnx"), scripted=scripted, axes=axes)


def _tf_function(name):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    w_value = rng.uniform(-0.5, 0.5, (I, H)).astype(np.float32)
    r_value = rng.uniform(-0.5, 0.5, (H, H)).astype(np.float32)
    b_value = rng.uniform(-0.5, 0.5, (H,)).astype(np.float32)
    v_value = rng.uniform(-1, 1, (I,)).astype(np.float32)
    # Constants made inside the traced function: tf2onnx turns captured ones into graph inputs.
    if name == "tf_scan_cumsum":
        return tf.function(lambda x: tf.scan(lambda a, x_t: a + x_t * tf.constant(v_value), x,
                                             initializer=tf.zeros([tf.shape(x)[1], I])))
    if name == "tf_map_fn_tanh":
        return tf.function(lambda x: tf.map_fn(lambda x_t: tf.tanh(x_t @ tf.constant(w_value) + tf.constant(b_value)), x))
    if name == "tf_scan_pair":
        def f(x):
            w, r = tf.constant(w_value), tf.constant(r_value)
            h0 = tf.zeros([tf.shape(x)[1], H])

            def step(carry, x_t):
                h, s = carry
                h = tf.tanh(x_t @ w + h @ r)
                return h, s + h
            hs, ss = tf.scan(step, x, initializer=(h0, h0))
            return hs, ss
        return tf.function(f)
    L = keras.layers
    if name == "keras_stacked":
        model = keras.Sequential([L.Input((None, I)), L.SimpleRNN(H, return_sequences=True), L.GRU(H, return_sequences=True)])
        return tf.function(lambda x: model(x))
    layer = {"keras_simplernn_backwards": lambda: L.SimpleRNN(H, go_backwards=True, return_sequences=True),
             "keras_gru_last": lambda: L.GRU(H), "keras_lstm_seq": lambda: L.LSTM(H, return_sequences=True)}[name]()
    layer.build((None, None, I))
    return tf.function(lambda x: layer(x))


def write_tf(name):
    import onnx
    import tensorflow as tf
    import tf2onnx

    fn = _tf_function(name)
    shape = (T, B, I) if name.startswith("tf_") else (B, T, I)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    spec = (tf.TensorSpec([None, None, I], tf.float32, name="x"),)
    model, _ = tf2onnx.convert.from_function(fn, input_signature=spec, opset=17)
    model.producer_version = tf2onnx.__version__
    onnx.save(model, os.path.join(OUT, f"{name}.onnx"))
    got = fn(x)
    got = got if isinstance(got, (tuple, list)) else (got,)
    save_npz(os.path.join(OUT, f"{name}.expected.npz"),
             {"x": x, **{o.name: g.numpy() for o, g in zip(model.graph.output, got)}})


def write(name):
    (write_tf if name in TF else write_torch)(name)


if __name__ == "__main__":
    import importlib.util
    import sys

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    group = TF if importlib.util.find_spec("tensorflow") else TORCH_DYN + TORCH_TS
    run_generator(__file__, __doc__, NAMES, write, OUT, argv=None if "--only" in sys.argv else sys.argv[1:] + [
        a for n in group for a in ("--only", n)])
