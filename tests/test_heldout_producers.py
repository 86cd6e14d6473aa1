"""Issue 20's held-out producer models (models/heldout_producers, written by
generate_heldout_producers.py with PyTorch 2.13, tf2onnx 1.17 / Keras 3): forms the matchers were
not built against. Each is optimized for the portable target; the test pins what happens to each
recurrence or map (fused, loop-free, or left with the pass's reason) and checks the result
reproduces the source framework's stored outputs and passed verification. A row that changes
here changes the held-out counts in the README."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import scanopt
from equivalence import top_ops

MODELS = Path(__file__).resolve().parent.parent / "models" / "heldout_producers"

# name -> (loop-op counts after optimize, reason a left loop gives or "")
OUTCOMES = {
    "dyn_scan_gru_nobias": ({"GRU": 1}, ""),
    "dyn_scan_lstm_nobias": ({"LSTM": 1}, ""),
    "dyn_scan_gru_two_layer": ({"GRU": 2}, ""),
    "dyn_scan_gru_batch_first": ({"GRU": 1}, ""),
    "dyn_scan_rnn_multi_out": ({"RNN": 1}, ""),  # relu(h) * 2 computed after the loop
    "dyn_while_gru": ({"GRU": 1}, ""),
    "ts_rnn_range_reverse": ({"RNN": 1}, ""),  # x gathered at n-1 - arange(M): exact for any trip count
    "ts_gru_size1_stack": ({"GRU": 1}, ""),
    "ts_lstm_nobias_reverse": ({"LSTM": 1}, ""),
    "ts_map_size1": ({}, ""),
    "ts_rnn_two_lists": ({"RNN": 1}, ""),  # h * 0.5 computed after the loop
    "keras_simplernn_backwards": ({"RNN": 1}, ""),
    "keras_gru_last": ({"GRU": 1}, ""),
    "keras_lstm_seq": ({"LSTM": 1}, ""),  # tf2onnx already writes the native LSTM: nothing to do
    "keras_stacked": ({"RNN": 1, "GRU": 1}, ""),
    "tf_scan_cumsum": ({}, ""),  # linrec: CumSum
    "tf_map_fn_tanh": ({}, ""),
    "tf_scan_pair": ({"RNN": 1}, ""),  # split by canonicalize: the RNN, then a CumSum of its h
}
LOOP_OPS = ("Scan", "Loop", "RNN", "GRU", "LSTM")


def test_every_model_is_listed():
    assert sorted(p.stem for p in MODELS.glob("*.onnx")) == sorted(OUTCOMES)


@pytest.mark.parametrize("name", sorted(OUTCOMES))
def test_heldout_producer_outcome_and_equality(name):
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    out, report = scanopt.optimize(model, options={"target": "portable"})
    after, reason = OUTCOMES[name]
    counts = top_ops(out)
    assert {op: counts[op] for op in LOOP_OPS if counts[op]} == after, [o.detail for o in report.outcomes]
    if reason:
        assert any(reason in o.detail for o in report.outcomes if not o.applied), [o.detail for o in report.outcomes]
    if report.modified:
        assert report.verification["passed"] is True, report.verification
    stored = np.load(MODELS / f"{name}.expected.npz")
    feeds = {i.name: stored[i.name] for i in model.graph.input}
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    for result, output in zip(session.run(None, feeds), model.graph.output):
        np.testing.assert_allclose(result, stored[output.name], rtol=1e-4, atol=1e-5)


def _while_gru_with_body_bound(start):
    """dyn_while_gru, whose body re-reads its bound as Shape(x, start, start + 1)."""
    model = onnx.load(str(MODELS / "dyn_while_gru.onnx"))
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    body = next(a.g for a in loop.attribute if a.name == "body")
    shape = next(n for n in body.node if n.op_type == "Shape")
    for attr in shape.attribute:
        attr.i = {"start": start, "end": start + 1}[attr.name]
    return model


def test_loop_bound_recomputed_in_body_from_the_same_dim_converts():
    out, report = scanopt.optimize(_while_gru_with_body_bound(0), passes=["loop_to_scan"])
    assert top_ops(out)["Loop"] == 0, [o.detail for o in report.outcomes]
    assert report.verification["passed"] is True


def test_loop_bound_recomputed_in_body_from_another_dim_stays():
    """The initial test is i < x.shape[0], the body's i + 1 < x.shape[1]: not one trip count."""
    model = _while_gru_with_body_bound(1)
    out, report = scanopt.optimize(model, passes=["loop_to_scan"])
    assert top_ops(out)["Loop"] == 1
    assert any("bound is computed inside the body" in o.detail for o in report.outcomes if not o.applied)
