"""fuse and float16 cells (issue 12): declined, because the rewrite is not provably equivalent.

A float16 Scan rounds every op's result and the carried state to float16 at each step; a native
float16 RNN/GRU/LSTM computes at the runtime's internal precision (onnxruntime's CPU runs it in
float32 behind Casts and rounds only Y/Y_h, probed below), and a Cast-to-float32 wrapper does the
same. The test builds both from one set of weights and shows their outputs differ."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import cell_builders as cb
from scanopt.engines import run as run_engine

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "models", "heldout", "rnn_f16.onnx")


def test_float16_cell_is_declined_with_the_rounding_reason():
    model = onnx.load(SAMPLE)
    out, outcomes = cb.fuse(model)
    assert [o.applied for o in outcomes] == [False]
    detail = outcomes[0].detail
    assert "float16" in detail and "rounds every op's result and the state to float16 at each step" in detail
    assert "not provably equivalent" in detail and "not implemented" not in detail


def _native_f16(model):
    """The float16 RNN written by hand from the sample's weights (x·Wt + h·Rt + bias, tanh)."""
    w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    W, R, b = w["Wt"].T[None], w["Rt"].T[None], np.concatenate([w["bias"], np.zeros_like(w["bias"])])[None]
    Hn = W.shape[1]
    nodes = [h.make_node("Unsqueeze", ["h0", "ax0"], ["h03"]),
             h.make_node("RNN", ["X", "W", "R", "B", "", "h03"], ["Y4", "Yh"], hidden_size=Hn, activations=["Tanh"]),
             h.make_node("Squeeze", ["Y4", "ax1"], ["Y"]), h.make_node("Squeeze", ["Yh", "ax0"], ["hT"])]
    inits = [numpy_helper.from_array(v.astype(np.float16), k) for k, v in (("W", W), ("R", R), ("B", b))]
    inits += [numpy_helper.from_array(np.array([0], np.int64), "ax0"), numpy_helper.from_array(np.array([1], np.int64), "ax1")]
    vi = h.make_tensor_value_info
    g = h.make_graph(nodes, "native16", [vi("h0", TP.FLOAT16, ["B", Hn]), vi("X", TP.FLOAT16, ["T", "B", W.shape[2]])],
                     [vi("hT", TP.FLOAT16, ["B", Hn]), vi("Y", TP.FLOAT16, ["T", "B", Hn])], initializer=inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_native_float16_op_does_not_reproduce_the_scans_per_step_rounding():
    model = onnx.load(SAMPLE)
    native = _native_f16(model)
    rng = np.random.default_rng(0)
    feeds = {"h0": rng.standard_normal((3, 4)).astype(np.float16),
             "X": rng.standard_normal((40, 3, 3)).astype(np.float16)}
    try:
        want = run_engine(native, feeds, "ort")
    except Exception as exc:  # a runtime without a float16 RNN: nothing to compare
        pytest.skip(f"onnxruntime cannot run a float16 RNN: {exc}")
    got = run_engine(model, feeds, "ort")
    diff = np.abs(got["Y"].astype(np.float32) - want["Y"].astype(np.float32)).max()
    assert diff > 0, "the native float16 op reproduced the Scan's float16 rounding bit for bit"
    assert diff < 0.05  # ...yet both are the same cell: the difference is rounding, not a wrong match
