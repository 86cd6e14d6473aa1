"""Loops that exporters wrote (models/loops/, see models/generate_loops.py and
generate_loops_tf.py) become Scans,
and the whole pipeline then fuses or vectorizes them; each result is verified by the
pipeline and checked against the outputs PyTorch computed for the sample."""

from __future__ import annotations

import os

import numpy as np
import pytest

import scanopt
from equivalence import ops
from reference_helpers import run_ort

LOOPS = os.path.join(os.path.dirname(__file__), "..", "models", "loops")
MODELS = sorted(f[:-5] for f in os.listdir(LOOPS) if f.endswith(".onnx"))

# name -> what the pipeline turns the converted Scan into (None: it stays a Scan)
EXPECTED = {
    "ts_rnn_stack": "RNN",
    "ts_rnn_cat": "RNN",
    "ts_rnn_reverse": "RNN",
    "ts_rnn_batch_first": "RNN",
    "ts_rnn_iter": "RNN",
    "ts_rnn_enumerate": "RNN",
    "ts_rnn_final": "RNN",
    "ts_rnn_stack_last": "RNN",
    "ts_rnn_cat_list": "RNN",
    "dyn_while_rnn": "RNN",
    "ts_map_stack": "vectorized",
    "ts_nested_map": "vectorized",
    "ts_gru_stack": "GRU",  # chunk(3): Slices whose bounds fold once Shape(gates)[1] is constant
    "ts_lstm_stack": "LSTM",
    "dyn_while_rnn_sum": "RNN",  # canonicalize splits off the running sum (a CumSum): fission
    "tf_scan_rnn": "RNN",
    "tf_map_fn": "vectorized",
    "keras_simplernn": "RNN",
    "keras_gru": "GRU",  # recurrent gates cut by Slice over axes [0, 1], the batch end INT32_MAX
}
DECLINED = {"ts_counter_arith": "the iteration counter is used in arithmetic",
            "ts_rnn_unbind": "the spec keeps their axis, onnxruntime drops it"}


def load(name: str):
    return scanopt.load_model(os.path.join(LOOPS, f"{name}.onnx"))


def expected(name: str) -> dict:
    with np.load(os.path.join(LOOPS, f"{name}.expected.npz")) as data:
        return dict(data)


def test_every_sample_is_listed():
    assert set(MODELS) == set(EXPECTED) | set(DECLINED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_loop_becomes_a_scan_and_the_pipeline_finishes_it(name):
    model = load(name)
    optimized, report = scanopt.optimize(model, options={"target": "portable"})
    converted = [o for o in report.outcomes if o.pass_name == "loop_to_scan"]
    assert converted and all(o.applied for o in converted), [o.detail for o in converted]
    assert report.verification["passed"] is True, report.verification["summary"]
    after = ops(optimized)
    assert after["Loop"] == 0 and after["SequenceInsert"] == 0
    goal = EXPECTED[name]
    if goal == "vectorized":
        assert any(o.pass_name == "vectorize" and o.applied for o in report.outcomes)
    elif goal is not None:
        assert after[goal] == 1 and after["Scan"] == 0
    else:
        assert after["Scan"] == 1
    data = expected(name)
    feeds = {i.name: data[i.name] for i in model.graph.input}
    got = run_ort(optimized, feeds)
    for out in model.graph.output:
        np.testing.assert_allclose(got[out.name], data[out.name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_loop_that_is_no_scan_stays_with_its_reason(name):
    model = load(name)
    optimized, report = scanopt.optimize(model)
    assert optimized is model and not report.modified
    reasons = [o.detail for o in report.outcomes if o.pass_name == "loop_to_scan"]
    assert reasons and DECLINED[name] in reasons[0]
    assert DECLINED[name] in report.format()


def test_default_target_keeps_verified_results():
    """Without --target portable the cost policy decides on the fused form; the converted
    Scan is still verified and runs as the Loop did."""
    model = load("ts_rnn_stack")
    optimized, report = scanopt.optimize(model)
    assert report.verification["passed"] is True
    assert ops(optimized)["Loop"] == 0
