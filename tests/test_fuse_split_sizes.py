"""fuse on a Split whose constant sizes do not match its outputs (an invalid model, as a byte
flip of a sample made one): declined with the reason, never an exception."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from scanopt.pipeline import optimize

MODELS = Path(__file__).resolve().parent.parent / "models"


def test_split_sizes_not_one_per_output_are_declined_with_the_reason():
    m = onnx.load(MODELS / "scan_gru_lbr1.onnx")
    body = next(a.g for a in m.graph.node[0].attribute if a.name == "body")
    at = next(k for k, t in enumerate(body.initializer) if t.name == "split3")
    body.initializer[at].CopyFrom(numpy_helper.from_array(np.array([4, 8], np.int64), "split3"))  # 3 outputs
    _, report = optimize(m, passes=["fuse"], verify=False)
    fused = [o for o in report.outcomes if o.pass_name == "fuse"]
    assert fused and not any(o.applied for o in fused), report.format()
    assert any("2 sizes for 3 outputs" in o.detail for o in fused), report.format()
