"""Regenerate the tf2onnx while-loop samples in models/while_loops/ (loop_to_scan's counter tests).

    python models/generate_while_loops_tf.py      # in a venv with tensorflow-cpu and tf2onnx

tf2onnx 1.17 (TensorFlow 2.21) writes ``tf.while_loop`` as a Loop with no trip count (or
``maximum_iterations`` as M), an int32 counter carried from its start, the test
``Cast(i + 1, float) < Cast(n, float)`` (initially ``Cast(start, float) < Cast(n, float)``),
``x[i]`` as ``Slice(x, [i], max(i + 1, 10**9), [0], [10**9])`` of x carried through the loop,
and a TensorArray written at i as the Loop's scan output. Each is a tf.function over
x [T, B, 3] running a tanh RNN, with <name>.expected.npz:
- tf_while_from_1:       ``i = 1; while i < n`` reading ``x[i]``
- tf_while_le:           ``while i <= n - 1``
- tf_while_bound_input:  ``while i < n`` with n an int32 input (n <= T)
- tf_while_max_iter:     ``while i < n`` with ``maximum_iterations=m`` (an int32 input)
- tf_while_gather:       ``tf.gather(x, i)`` instead of ``x[i]``
- tf_while_step2:        ``i += 2`` (stays: a counter step other than 1)
Unlike the PyTorch samples, a rerun is not byte-identical (tf2onnx names its folded
constants differently from run to run).
"""

from __future__ import annotations

import os

import numpy as np

from generate import run_generator, save_npz
from generate_while_loops import OUT

T, B, I, H = 6, 2, 3, 4
NAMES = ["tf_while_from_1", "tf_while_le", "tf_while_bound_input", "tf_while_max_iter", "tf_while_gather",
         "tf_while_step2"]


def _function(name):
    import tensorflow as tf

    w_value = np.random.default_rng(0).uniform(-0.5, 0.5, (I, H)).astype(np.float32)
    r_value = np.random.default_rng(1).uniform(-0.5, 0.5, (H, H)).astype(np.float32)
    start = 1 if name == "tf_while_from_1" else 0
    step = 2 if name == "tf_while_step2" else 1

    def run(x, n, **kwargs):
        w, r = tf.constant(w_value), tf.constant(r_value)  # made inside: captured ones become inputs
        ta = tf.TensorArray(tf.float32, size=0, dynamic_size=True)

        def body(i, k, h, ta):
            x_t = tf.gather(x, i) if name == "tf_while_gather" else x[i]
            h = tf.tanh(x_t @ w + h @ r)
            return i + step, k + 1, h, ta.write(k, h)

        test = (lambda i, k, h, ta: i <= n - 1) if name == "tf_while_le" else (lambda i, k, h, ta: i < n)
        _, _, h, ta = tf.while_loop(test, body, (start, 0, tf.zeros([tf.shape(x)[1], H]), ta), **kwargs)
        return ta.stack(), h

    if name == "tf_while_bound_input":
        return lambda x, n: run(x, n)
    if name == "tf_while_max_iter":
        return lambda x, m: run(x, tf.shape(x)[0], maximum_iterations=m)
    return lambda x: run(x, tf.shape(x)[0])


def write(name):
    import onnx
    import tensorflow as tf
    import tf2onnx

    fn = tf.function(_function(name))
    x = np.random.default_rng(2).standard_normal((T, B, I)).astype(np.float32)
    feeds = {"x": x}
    spec = [tf.TensorSpec([None, None, I], tf.float32, name="x")]
    if name == "tf_while_bound_input":
        feeds["n"] = np.array(T - 2, np.int32)
        spec.append(tf.TensorSpec([], tf.int32, name="n"))
    if name == "tf_while_max_iter":
        feeds["m"] = np.array(T - 1, np.int32)
        spec.append(tf.TensorSpec([], tf.int32, name="m"))
    model, _ = tf2onnx.convert.from_function(fn, input_signature=tuple(spec), opset=17)
    model.producer_version = tf2onnx.__version__
    onnx.save(model, os.path.join(OUT, f"{name}.onnx"))
    got = fn(*feeds.values())
    save_npz(os.path.join(OUT, f"{name}.expected.npz"),
             {**feeds, **{o.name: g.numpy() for o, g in zip(model.graph.output, got)}})


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    run_generator(__file__, __doc__, NAMES, write, OUT)
