"""Regenerate the samples of the loop-free passes (vectorize, hoist), deterministically.

    python models/generate_maps.py                 # all of them
    python models/generate_maps.py --only skl/knn_regressor_manhattan

models/skl/: every scikit-learn estimator (and metric) whose skl2onnx converter emits a Scan,
fitted on 20 rows of 3 features, with ``<name>.expected.npz`` (inputs and sklearn's outputs).
They need `pip install skl2onnx scikit-learn` and run in a fresh process with
PYTHONHASHSEED=0 (skl2onnx orders opset_import by string hash). Checked and found to emit no
Scan (skl2onnx 1.20, scikit-learn 1.9): KNeighbors* with metric='cosine', KernelPCA with
linear/poly/cosine kernels, GaussianProcessRegressor with DotProduct, SVR, KMeans, KNNImputer.
GaussianProcessClassifier(RBF) emits the same Scan but also com.microsoft Solve, which
onnxruntime 1.31 cannot load, so it is not kept. skl2onnx's radius converters index -1 (which
onnxruntime refuses) for every training row outside the radius, so the radius samples use a
radius that holds every training row.
models/maps/: hand-written map Scans (vectorize) and non-fusable recurrent cells with
per-step input work (hoist); onnx and numpy only.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from generate import export_in_fresh_process, save_npz  # noqa: E402 - one home for the npz writer and the isolated export

IR_VERSION = 8
F = TP.FLOAT


# ---------------------------------------------------------------- skl2onnx
def _fit(name):
    from sklearn import decomposition, gaussian_process as gp, neighbors
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, Matern, RationalQuadratic, WhiteKernel

    rng = np.random.RandomState(0)
    x = rng.randn(20, 3).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32)).astype(np.float32)
    labels = (y > 0).astype(np.int64)
    fitted = {
        "knn_regressor_manhattan": lambda: neighbors.KNeighborsRegressor(3, metric="manhattan").fit(x, y),
        "knn_regressor_minkowski3": lambda: neighbors.KNeighborsRegressor(3, p=3).fit(x, y),
        "knn_regressor_distance": lambda: neighbors.KNeighborsRegressor(3, weights="distance").fit(x, y),
        "knn_classifier": lambda: neighbors.KNeighborsClassifier(3).fit(x, labels),
        "radius_regressor": lambda: neighbors.RadiusNeighborsRegressor(10.0).fit(x, y),
        "radius_classifier": lambda: neighbors.RadiusNeighborsClassifier(10.0).fit(x, labels),
        "local_outlier_factor": lambda: neighbors.LocalOutlierFactor(n_neighbors=3, novelty=True).fit(x),
        "knn_transformer": lambda: neighbors.KNeighborsTransformer(n_neighbors=3).fit(x),
        "kernel_pca_rbf": lambda: decomposition.KernelPCA(2, kernel="rbf").fit(x),
        "gp_regressor_rbf_std": lambda: gp.GaussianProcessRegressor(RBF()).fit(x, y),
        "gp_regressor_matern": lambda: gp.GaussianProcessRegressor(Matern(nu=1.5)).fit(x, y),
        "gp_regressor_rational_quadratic": lambda: gp.GaussianProcessRegressor(RationalQuadratic()).fit(x, y),
        "gp_regressor_sum": lambda: gp.GaussianProcessRegressor(ConstantKernel() * RBF() + WhiteKernel()).fit(x, y),
    }[name]
    return fitted(), rng.randn(5, 3).astype(np.float32)


SKL = [
    "knn_regressor_manhattan", "knn_regressor_minkowski3", "knn_regressor_distance", "knn_classifier",
    "radius_regressor", "radius_classifier", "local_outlier_factor", "knn_transformer", "kernel_pca_rbf",
    "gp_regressor_rbf_std", "gp_regressor_matern", "gp_regressor_rational_quadratic", "gp_regressor_sum",
]


def skl_model(name):
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    warnings.filterwarnings("ignore")
    est, x = _fit(name)
    options = None
    if name.startswith("gp_regressor_rbf_std"):
        options = {id(est): {"return_std": True}}
    elif "classifier" in name:
        options = {id(est): {"zipmap": False}}
    m = to_onnx(est, initial_types=[("X", FloatTensorType([None, 3]))], target_opset=17, options=options)
    expected = {"X": x}
    names = [o.name for o in m.graph.output]
    if name == "gp_regressor_rbf_std":
        mean, std = est.predict(x, return_std=True)
        values = [mean.reshape(-1, 1), std]
    elif name == "local_outlier_factor":
        values = [est.predict(x), est.score_samples(x)]
    elif name == "knn_transformer":
        values = [est.transform(x).toarray()]
    elif name == "kernel_pca_rbf":
        values = [est.transform(x)]
    elif "classifier" in name:
        values = [est.predict(x), est.predict_proba(x)]
    else:
        values = [est.predict(x).reshape(-1, 1)]
    for out, value in zip(names, values):
        expected[out] = np.asarray(value)
    return m, expected


# ---------------------------------------------------------------- hand-written maps
def vi(name, shape, elem=F):
    return h.make_tensor_value_info(name, elem, shape)


def const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def weights(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in shapes]


def hand(nodes, body_in, body_out, scan_in, scan_out, graph_in, graph_out, inits=(), body_inits=(), opset=17, **attrs):
    body = h.make_graph(nodes, "body", body_in, body_out, initializer=list(body_inits))
    scan = h.make_node("Scan", scan_in, scan_out, name="scan_map", body=body, **attrs)
    graph = h.make_graph([scan], "main", graph_in, graph_out, initializer=list(inits))
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=IR_VERSION,
                     producer_name="scanopt-samples")
    onnx.checker.check_model(m, full_check=True)
    return m


def map_elementwise():
    """y_t = tanh(x_t * a + b) with body constants; x [seq, 4]."""
    a, b = weights(1, [4], [4])
    return hand(
        [h.make_node("Mul", ["x", "a"], ["xa"]), h.make_node("Add", ["xa", "b"], ["xab"]),
         h.make_node("Tanh", ["xab"], ["y"])],
        [vi("x", [4])], [vi("y", [4])], ["X"], ["Y"], [vi("X", ["seq", 4])], [vi("Y", ["seq", 4])],
        body_inits=[const("a", a), const("b", b)], num_scan_inputs=1)


def map_matmul_outer():
    """y_t = x_t @ W + c per row block, W and c outer initializers; x [seq, batch, 4]."""
    w, c = weights(2, [4, 5], [5])
    return hand(
        [h.make_node("MatMul", ["x", "W"], ["xw"]), h.make_node("Add", ["xw", "c"], ["y"])],
        [vi("x", ["batch", 4])], [vi("y", ["batch", 5])], ["X"], ["Y"],
        [vi("X", ["seq", "batch", 4])], [vi("Y", ["seq", "batch", 5])],
        inits=[const("W", w), const("c", c)], num_scan_inputs=1)


def map_softmax_rows():
    """y_t = softmax(x_t @ W) for each row; the softmax runs on the last axis."""
    (w,) = weights(3, [6, 3])
    return hand(
        [h.make_node("MatMul", ["x", "W"], ["z"]), h.make_node("Softmax", ["z"], ["y"], axis=-1)],
        [vi("x", [6])], [vi("y", [3])], ["X"], ["Y"], [vi("X", ["seq", 6])], [vi("Y", ["seq", 3])],
        inits=[const("W", w)], num_scan_inputs=1)


def map_axis1():
    """Scan over axis 1 of x [batch, seq, 4], output stacked on axis 1: y_t = relu(x_t) * 2."""
    return hand(
        [h.make_node("Relu", ["x"], ["r"]), h.make_node("Mul", ["r", "two"], ["y"])],
        [vi("x", ["batch", 4])], [vi("y", ["batch", 4])], ["X"], ["Y"],
        [vi("X", ["batch", "seq", 4])], [vi("Y", ["batch", "seq", 4])],
        body_inits=[const("two", np.float32(2.0))], num_scan_inputs=1, scan_input_axes=[1], scan_output_axes=[1])


def map_reverse():
    """Two inputs, one read in reverse; one output prepended, one appended on axis -1:
    m_t = mean(x_t * u_t), d_t = x_t - u_t."""
    return hand(
        [h.make_node("Mul", ["x", "u"], ["xu"]),
         h.make_node("ReduceMean", ["xu"], ["m"], axes=[-1], keepdims=0),
         h.make_node("Sub", ["x", "u"], ["d"])],
        [vi("x", [3, 4]), vi("u", [3, 4])], [vi("m", [3]), vi("d", [3, 4])], ["X", "U"], ["M", "D"],
        [vi("X", ["seq", 3, 4]), vi("U", ["seq", 3, 4])], [vi("M", ["seq", 3]), vi("D", [3, 4, "seq"])],
        num_scan_inputs=2, scan_input_directions=[0, 1], scan_output_directions=[1, 0], scan_output_axes=[0, -1])


def map_state_gemm():
    """A pass-through state q (like skl2onnx) and Gemm(x_t, W, transB) + c, then ArgMax and TopK."""
    w, c = weights(4, [5, 3], [5])
    return hand(
        [h.make_node("Identity", ["q"], ["q_out"]),
         h.make_node("Gemm", ["x", "W", "c"], ["g"], transB=1, alpha=0.5),
         h.make_node("Mul", ["g", "q"], ["gq"]),
         h.make_node("ArgMax", ["gq"], ["am"], axis=1, keepdims=0),
         h.make_node("TopK", ["gq", "k"], ["tv", "ti"], axis=-1)],
        [vi("q", [1, 5]), vi("x", ["rows", 3])],
        [vi("q_out", [1, 5]), vi("am", ["rows"], TP.INT64), vi("tv", ["rows", 2])],
        ["Q", "X"], ["Q_final", "AM", "TV"],
        [vi("Q", [1, 5]), vi("X", ["seq", "rows", 3])],
        [vi("Q_final", [1, 5]), vi("AM", ["seq", "rows"], TP.INT64), vi("TV", ["seq", "rows", 2])],
        inits=[const("W", w), const("c", c)], body_inits=[const("k", np.array([2], np.int64))], num_scan_inputs=1)


def cell_rnn_residual():
    """A recurrent cell fuse cannot map (a residual): h' = tanh(x_t W + b + h R) + 0.5 h.
    x_t W + b depends only on the step: hoist lifts it out as one MatMul over the sequence."""
    w, r, b = weights(5, [4, 8], [8, 8], [8])
    return hand(
        [h.make_node("MatMul", ["x", "W"], ["xw"]), h.make_node("Add", ["xw", "b"], ["xwb"]),
         h.make_node("MatMul", ["h", "R"], ["hr"]), h.make_node("Add", ["xwb", "hr"], ["pre"]),
         h.make_node("Tanh", ["pre"], ["act"]), h.make_node("Mul", ["h", "half"], ["hh"]),
         h.make_node("Add", ["act", "hh"], ["h_next"]), h.make_node("Identity", ["h_next"], ["y"])],
        [vi("h", ["batch", 8]), vi("x", ["batch", 4])], [vi("h_next", ["batch", 8]), vi("y", ["batch", 8])],
        ["H0", "X"], ["H", "Y"], [vi("H0", ["batch", 8]), vi("X", ["seq", "batch", 4])],
        [vi("H", ["batch", 8]), vi("Y", ["seq", "batch", 8])],
        inits=[const("W", w), const("R", r), const("b", b)], body_inits=[const("half", np.float32(0.5))],
        num_scan_inputs=1)


def cell_normalized_input():
    """Per-step input normalization then an accumulating state:
    n_t = (x_t - mean(x_t)) / sqrt(var(x_t) + eps); s' = s * 0.9 + n_t (W^T)."""
    (w,) = weights(6, [5, 6])
    nodes = [
        h.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]), h.make_node("Sub", ["x", "mu"], ["xc"]),
        h.make_node("Mul", ["xc", "xc"], ["sq"]), h.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        h.make_node("Add", ["var", "eps"], ["ve"]), h.make_node("Sqrt", ["ve"], ["sd"]),
        h.make_node("Div", ["xc", "sd"], ["xn"]),
        h.make_node("Gemm", ["xn", "W"], ["proj"], transB=1),
        h.make_node("Mul", ["s", "decay"], ["sd9"]), h.make_node("Add", ["sd9", "proj"], ["s_next"]),
        h.make_node("Identity", ["s_next"], ["y"]),
    ]
    return hand(
        nodes, [vi("s", [2, 5]), vi("x", [2, 6])], [vi("s_next", [2, 5]), vi("y", [2, 5])],
        ["S0", "X"], ["S", "Y"], [vi("S0", [2, 5]), vi("X", ["seq", 2, 6])], [vi("S", [2, 5]), vi("Y", ["seq", 2, 5])],
        inits=[const("W", w)],
        body_inits=[const("eps", np.float32(1e-5)), const("decay", np.float32(0.9))], num_scan_inputs=1,
        opset=13)


HAND = {
    "maps/map_elementwise": map_elementwise,
    "maps/map_matmul_outer": map_matmul_outer,
    "maps/map_softmax_rows": map_softmax_rows,
    "maps/map_axis1": map_axis1,
    "maps/map_reverse": map_reverse,
    "maps/map_state_gemm": map_state_gemm,
    "maps/cell_rnn_residual": cell_rnn_residual,
    "maps/cell_normalized_input": cell_normalized_input,
}


def write(name):
    if name in HAND:
        m = HAND[name]()
    else:
        m, expected = skl_model(name.split("/", 1)[1])
        assert any(n.op_type == "Scan" for n in m.graph.node), f"{name}: skl2onnx emitted no Scan"
        save_npz(os.path.join(HERE, f"{name}.expected.npz"), expected)
    path = os.path.join(HERE, f"{name}.onnx")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save_model(m, path)
    print(f"{name}.onnx  {os.path.getsize(path)} bytes", flush=True)


def main(argv=None):
    everything = list(HAND) + [f"skl/{n}" for n in SKL]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append", choices=everything)
    p.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in args.only or everything:
        if name in HAND or args.in_process:
            write(name)
        else:
            export_in_fresh_process(__file__, name)


if __name__ == "__main__":
    main()
