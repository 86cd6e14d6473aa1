"""Regenerate the tf2onnx samples: TF1 ``tf.compat.v1.nn.dynamic_rnn`` graphs converted by
tf2onnx, the forms its custom-RNN rewriter writes as Scan (unknown dims named ``unk__N``).

Runs in a TensorFlow venv, never in scanopt's (TensorFlow is no dependency of scanopt):
    python -m venv /tmp/tf && /tmp/tf/bin/pip install tensorflow-cpu tf-keras tf2onnx
    TF_USE_LEGACY_KERAS=1 /tmp/tf/bin/python models/tf2onnx/generate.py
Each sample NAME.onnx comes with NAME.expected.npz: the inputs and TensorFlow's own outputs
(tests compare onnxruntime's run of the original and the optimized model with them).
Written with TensorFlow 2.21, tf-keras 2.21 and tf2onnx 1.17.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # TF1 rnn_cell classes live in tf-keras
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
import tf2onnx

HERE = Path(__file__).resolve().parent
T, B, I, H = 5, 3, 4, 6
v1 = tf.compat.v1
v1.disable_control_flow_v2()  # TF1 graphs: Enter/Merge/Switch loops, which tf2onnx's RNN rewriters read


class ConcatCell(v1.nn.rnn_cell.RNNCell):
    """h' = act(Concat([x, h])·W + b): the custom cell people write for dynamic_rnn."""

    def __init__(self, units, act, seed):
        super().__init__()
        self.units, self.act, self.seed = units, act, seed

    @property
    def state_size(self):
        return self.units

    @property
    def output_size(self):
        return self.units

    def __call__(self, x, h, scope=None):
        rng = np.random.default_rng(self.seed)
        w = tf.constant(rng.uniform(-0.5, 0.5, (I + self.units, self.units)).astype(np.float32))
        b = tf.constant(rng.uniform(-0.5, 0.5, (self.units,)).astype(np.float32))
        new = self.act(tf.matmul(tf.concat([x, h], axis=1), w) + b)
        return new, new


def _uniform(rng, *shape):
    return tf.constant(rng.uniform(-0.5, 0.5, shape).astype(np.float32))


class ConcatGruCell(ConcatCell):
    """TF1 GRUCell's math written out (tf2onnx rewrites the library GRUCell/LSTMCell into
    native ops itself; a hand-written cell becomes a Scan): [r, u] = σ(Concat([x, h])·Wg + bg),
    c = tanh(Concat([x, r⊙h])·Wc + bc), h' = u⊙h + (1-u)⊙c."""

    def __init__(self, units, seed):
        super().__init__(units, None, seed)

    def __call__(self, x, h, scope=None):
        rng, n = np.random.default_rng(self.seed), self.units
        wg, bg, wc, bc = _uniform(rng, I + n, 2 * n), _uniform(rng, 2 * n), _uniform(rng, I + n, n), _uniform(rng, n)
        r, u = tf.split(tf.sigmoid(tf.matmul(tf.concat([x, h], 1), wg) + bg), 2, axis=1)
        c = tf.tanh(tf.matmul(tf.concat([x, r * h], 1), wc) + bc)
        new = u * h + (1 - u) * c
        return new, new


class ConcatLstmCell(ConcatCell):
    """TF1 BasicLSTMCell's math written out: [i, j, f, o] = Concat([x, h])·W + b,
    c' = c⊙σ(f + 1) + σ(i)⊙tanh(j), h' = tanh(c')⊙σ(o)."""

    def __init__(self, units, seed):
        super().__init__(units, None, seed)

    @property
    def state_size(self):
        return v1.nn.rnn_cell.LSTMStateTuple(self.units, self.units)

    def __call__(self, x, state, scope=None):
        rng, n = np.random.default_rng(self.seed), self.units
        c, h = state
        w, b = _uniform(rng, I + n, 4 * n), _uniform(rng, 4 * n)
        i, j, f, o = tf.split(tf.matmul(tf.concat([x, h], 1), w) + b, 4, axis=1)
        new_c = c * tf.sigmoid(f + 1.0) + tf.sigmoid(i) * tf.tanh(j)
        new_h = tf.tanh(new_c) * tf.sigmoid(o)
        return new_h, v1.nn.rnn_cell.LSTMStateTuple(new_c, new_h)


def build(kind: str):
    """(graph, input names, output names) of one TF1 dynamic_rnn graph."""
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(7)
        x = v1.placeholder(tf.float32, [None, None, I], name="x")
        if kind == "tanh":
            out, state = v1.nn.dynamic_rnn(ConcatCell(H, tf.tanh, 1), x, dtype=tf.float32)
        elif kind == "tanh_h0":  # the caller passes the initial state: its batch is another unk__N
            h0 = v1.placeholder(tf.float32, [None, H], name="h0")
            out, state = v1.nn.dynamic_rnn(ConcatCell(H, tf.tanh, 1), x, initial_state=h0)
        elif kind == "tanh_lens":  # per-item lengths: TF zeroes outputs past each and keeps the state
            lens = v1.placeholder(tf.int32, [None], name="lens")
            out, state = v1.nn.dynamic_rnn(ConcatCell(H, tf.tanh, 1), x, sequence_length=lens, dtype=tf.float32)
        elif kind in ("gru_lens", "lstm_lens"):  # the same masks around a GRU / an LSTM state tuple
            lens = v1.placeholder(tf.int32, [None], name="lens")
            cell = ConcatGruCell(H, 9) if kind == "gru_lens" else ConcatLstmCell(H, 10)
            out, state = v1.nn.dynamic_rnn(cell, x, sequence_length=lens, dtype=tf.float32)
            state = state if kind == "gru_lens" else state.h
        elif kind == "lstm_bidi":
            fw, bw = ConcatLstmCell(H, 7), ConcatLstmCell(H, 8)
            (o_fw, o_bw), (s_fw, s_bw) = v1.nn.bidirectional_dynamic_rnn(fw, bw, x, dtype=tf.float32)
            out, state = tf.concat([o_fw, o_bw], axis=-1), tf.concat([s_fw.h, s_bw.h], axis=-1)
        elif kind == "relu":
            out, state = v1.nn.dynamic_rnn(ConcatCell(H, tf.nn.relu, 2), x, dtype=tf.float32)
        elif kind == "gru":
            out, state = v1.nn.dynamic_rnn(ConcatGruCell(H, 3), x, dtype=tf.float32)
        elif kind == "lstm":
            out, state = v1.nn.dynamic_rnn(ConcatLstmCell(H, 4), x, dtype=tf.float32)
            state = state.h
        elif kind == "bidi":
            fw, bw = ConcatCell(H, tf.tanh, 5), ConcatCell(H, tf.tanh, 6)
            (o_fw, o_bw), (s_fw, s_bw) = v1.nn.bidirectional_dynamic_rnn(fw, bw, x, dtype=tf.float32)
            out, state = tf.concat([o_fw, o_bw], axis=-1), tf.concat([s_fw, s_bw], axis=-1)
        else:
            raise ValueError(kind)
        tf.identity(out, name="y")
        tf.identity(state, name="h_n")
    return graph


SAMPLES = {  # name: (cell kind, opset)
    "dynamic_rnn_concat_tanh": ("tanh", 13),
    "dynamic_rnn_concat_tanh_h0": ("tanh_h0", 13),
    "dynamic_rnn_concat_relu": ("relu", 13),
    "dynamic_rnn_concat_gru": ("gru", 13),
    "dynamic_rnn_concat_lstm": ("lstm", 13),
    "bidirectional_dynamic_rnn": ("bidi", 13),
    "bidirectional_dynamic_rnn_lstm": ("lstm_bidi", 13),
    "dynamic_rnn_concat_tanh_lengths": ("tanh_lens", 13),
    "dynamic_rnn_concat_gru_lengths": ("gru_lens", 13),
    "dynamic_rnn_concat_lstm_lengths": ("lstm_lens", 13),
    "dynamic_rnn_concat_tanh_opset8": ("tanh", 8),
}


def generate(name, kind, opset):
    graph = build(kind)
    with v1.Session(graph=graph) as sess:
        sess.run(v1.global_variables_initializer())
        rng = np.random.default_rng(11)
        xs = rng.standard_normal((B, T, I)).astype(np.float32)
        h0 = rng.standard_normal((B, H)).astype(np.float32)
        names = {op.name + ":0" for op in graph.get_operations()}
        feeds = {"x:0": xs} if "h0:0" not in names else {"x:0": xs, "h0:0": h0}
        if "lens:0" in names:
            feeds["lens:0"] = np.array([T, 2, 4] if kind == "tanh_lens" else [T, 0, 3], np.int32)  # 0: no step
        y, h_n = sess.run(["y:0", "h_n:0"], feeds)
        frozen = v1.graph_util.convert_variables_to_constants(sess, graph.as_graph_def(), ["y", "h_n"])
    model, _ = tf2onnx.convert.from_graph_def(frozen, input_names=list(feeds), output_names=["y:0", "h_n:0"],
                                              opset=opset)
    (HERE / f"{name}.onnx").write_bytes(model.SerializeToString())
    np.savez(HERE / f"{name}.expected.npz", **feeds, **{"y:0": y, "h_n:0": h_n})
    ops = sorted({n.op_type for n in model.graph.node})
    print(f"{name}: opset {opset}, ops {ops}")


if __name__ == "__main__":
    wanted = sys.argv[1:] or list(SAMPLES)
    for name in wanted:
        generate(name, *SAMPLES[name])
