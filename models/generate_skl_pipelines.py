"""Regenerate the skl2onnx pipeline and ZipMap samples in models/skl/pipelines/, deterministically.

    python models/generate_skl_pipelines.py                      # all of them
    python models/generate_skl_pipelines.py --only skl/pipelines/pipeline_scaler_pca_knn_regressor

Pipelines (StandardScaler -> PCA -> KNeighbors*) put the map Scan behind the transformers,
whose outputs skl2onnx declares without a shape (the ranks scanopt must recover), and
classifiers with skl2onnx's default ZipMap output, typed ``seq(map(int64, tensor(float)))``
(the non-tensor types scanopt must keep). Fitted on 20 rows of 3 features; each
``<name>.expected.npz`` holds the inputs and scikit-learn's outputs (a ZipMap's list of
dicts as a [rows, classes] array in class order). Needs `pip install skl2onnx scikit-learn`;
runs in a fresh process with PYTHONHASHSEED=0 (skl2onnx orders opset_import by string hash).
Written with skl2onnx 1.20 and scikit-learn 1.9.
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from generate import run_generator, save_npz  # noqa: E402 - one home for the npz writer and the isolated export

NAMES = [
    "pipeline_scaler_pca_knn_regressor", "pipeline_scaler_pca_knn_classifier", "pipeline_scaler_knn_regressor",
    "knn_classifier_zipmap", "pipeline_scaler_pca_knn_classifier_zipmap",
]


def _fitted(name):
    from sklearn import decomposition, neighbors, pipeline, preprocessing

    rng = np.random.RandomState(0)
    x = rng.randn(20, 3).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32)).astype(np.float32)
    labels = (y > 0).astype(np.int64) + (y > 1.5).astype(np.int64)  # three classes
    scale_pca = [("scale", preprocessing.StandardScaler()), ("pca", decomposition.PCA(2, random_state=0))]
    est = {
        "pipeline_scaler_pca_knn_regressor": lambda: pipeline.Pipeline(scale_pca + [("knn", neighbors.KNeighborsRegressor(3))]),
        "pipeline_scaler_pca_knn_classifier": lambda: pipeline.Pipeline(scale_pca + [("knn", neighbors.KNeighborsClassifier(3))]),
        "pipeline_scaler_knn_regressor": lambda: pipeline.Pipeline([("scale", preprocessing.StandardScaler()),
                                                                    ("knn", neighbors.KNeighborsRegressor(3))]),
        "knn_classifier_zipmap": lambda: neighbors.KNeighborsClassifier(3),
        "pipeline_scaler_pca_knn_classifier_zipmap": lambda: pipeline.Pipeline(
            scale_pca + [("knn", neighbors.KNeighborsClassifier(3))]),
    }[name]()
    est.fit(x, labels if "classifier" in name else y)
    return est, rng.randn(5, 3).astype(np.float32)


def skl_model(name):
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    warnings.filterwarnings("ignore")
    est, x = _fitted(name)
    options = {id(est): {"zipmap": False}} if "classifier" in name and not name.endswith("zipmap") else None
    m = to_onnx(est, initial_types=[("X", FloatTensorType([None, 3]))], target_opset=17, options=options)
    expected = {"X": x}
    names = [o.name for o in m.graph.output]
    values = [est.predict(x), est.predict_proba(x)] if "classifier" in name else [est.predict(x).reshape(-1, 1)]
    for out, value in zip(names, values):
        expected[out] = np.asarray(value)
    return m, expected


def write(name):
    m, expected = skl_model(name.rsplit("/", 1)[1])
    assert any(n.op_type == "Scan" for n in m.graph.node), f"{name}: skl2onnx emitted no Scan"
    save_npz(os.path.join(HERE, f"{name}.expected.npz"), expected)
    path = os.path.join(HERE, f"{name}.onnx")
    onnx.save_model(m, path)
    print(f"{name}.onnx  {os.path.getsize(path)} bytes", flush=True)


def main(argv=None):
    run_generator(__file__, __doc__, [f"skl/pipelines/{n}" for n in NAMES], write, argv=argv)


if __name__ == "__main__":
    main()
