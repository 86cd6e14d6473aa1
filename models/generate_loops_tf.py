"""Regenerate the tf2onnx Loop samples in models/loops/ (the loop_to_scan pass's).

    python models/generate_loops_tf.py      # in a venv with tensorflow-cpu, tf-keras, tf2onnx

tf2onnx 1.17 writes TF2 control flow as Loop: a trip count from Shape(x) through int32
Casts, a condition ``0 < T`` and ``i < T and c + 1 < T`` compared as floats, an int32
counter c of its own reading ``Gather(x, c)``, loop-invariant weights carried through, and
the outputs as the Loop's scan outputs. Each sample is a tf.function over x [T, B, 3]
(Keras layers: [B, T, 3], transposed by the layer) with <name>.expected.npz:
- tf_scan_rnn:     ``tf.scan(lambda h, x_t: tanh(x_t W + h R), x, initializer=zeros)``
- tf_map_fn:       ``tf.map_fn(lambda x_t: relu(x_t W), x)``
- keras_simplernn: Keras 3 ``SimpleRNN(4, return_sequences=True)``
- keras_gru:       Keras 3 ``GRU(4, return_sequences=True)`` (reset_after)
Unlike the PyTorch samples, a rerun is not byte-identical: tf2onnx names and orders its
folded constants differently from run to run (the graphs are the same).
"""

from __future__ import annotations

import os

import numpy as np

from generate import run_generator, save_npz
from generate_loops import OUT

T, B, I, H = 5, 2, 3, 4
NAMES = ["tf_scan_rnn", "tf_map_fn", "keras_simplernn", "keras_gru"]


def _function(name):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    w_value = np.random.default_rng(0).uniform(-0.5, 0.5, (I, H)).astype(np.float32)
    r_value = np.random.default_rng(1).uniform(-0.5, 0.5, (H, H)).astype(np.float32)
    # Constants made inside the traced function: tf2onnx turns captured ones into graph inputs.
    if name == "tf_scan_rnn":
        def f(x):
            w, r = tf.constant(w_value), tf.constant(r_value)
            h0 = tf.zeros([tf.shape(x)[1], H])
            return tf.scan(lambda h, x_t: tf.tanh(x_t @ w + h @ r), x, initializer=h0)
        return tf.function(f)
    if name == "tf_map_fn":
        def g(x):
            w = tf.constant(w_value)
            return tf.map_fn(lambda x_t: tf.nn.relu(x_t @ w), x)
        return tf.function(g)
    layer = (keras.layers.SimpleRNN if name == "keras_simplernn" else keras.layers.GRU)(H, return_sequences=True)
    layer.build((None, None, I))
    return tf.function(lambda x: layer(x))


def write(name):
    import onnx
    import tensorflow as tf
    import tf2onnx

    fn = _function(name)
    keras_layer = name.startswith("keras")
    shape = (B, T, I) if keras_layer else (T, B, I)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    spec = (tf.TensorSpec([None, None, I], tf.float32, name="x"),)
    model, _ = tf2onnx.convert.from_function(fn, input_signature=spec, opset=17)
    model.producer_version = tf2onnx.__version__
    onnx.save(model, os.path.join(OUT, f"{name}.onnx"))
    save_npz(os.path.join(OUT, f"{name}.expected.npz"), {"x": x, model.graph.output[0].name: fn(x).numpy()})


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    run_generator(__file__, __doc__, NAMES, write, OUT)
