"""Shapes learnt by one run (scanopt.observe): a Scan whose scan input static inference
cannot size (a Slice by a length computed at run time) is measured at the shapes the model
runs at under declared input shapes, not modelled at guessed ones; a run that fails or is
too slow leaves the Scan modelled, with the reason. Timings are injected (FakeTimer): no
timed asserts."""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

import scanopt
import scanopt.tune
from builders import vi
from reference_helpers import const, make_model
from scanopt.observe import observe
from test_tune import FakeTimer

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")


@pytest.fixture
def timer(monkeypatch, tmp_path):
    monkeypatch.setenv("SCANOPT_CACHE_DIR", str(tmp_path / "cache"))
    fake = FakeTimer({"native": 0.4, "hoisted": 0.9})
    monkeypatch.setattr(scanopt.tune, "measure", fake)
    return fake


def _rnn_over_a_computed_prefix():
    """A tanh RNN Scan over x[:k], k = ceil(T / 2) computed in float32 (no inference carries it)."""
    rng = np.random.default_rng(0)
    body = oh.make_graph(
        [oh.make_node("MatMul", ["x_t", "W"], ["xw"]), oh.make_node("MatMul", ["h", "R"], ["hr"]),
         oh.make_node("Add", ["xw", "hr"], ["pre"]), oh.make_node("Tanh", ["pre"], ["h_new"]),
         oh.make_node("Identity", ["h_new"], ["y_t"])],
        "body", [vi("h", ["B", 4]), vi("x_t", ["B", 3])], [vi("h_new", ["B", 4]), vi("y_t", ["B", 4])])
    nodes = [
        const("W", rng.uniform(-0.5, 0.5, (3, 4)).astype(np.float32)),
        const("R", rng.uniform(-0.5, 0.5, (4, 4)).astype(np.float32)),
        oh.make_node("Shape", ["x"], ["shape"], start=0, end=1), oh.make_node("Cast", ["shape"], ["tf"], to=TP.FLOAT),
        const("two", np.array([2.0], np.float32)), oh.make_node("Div", ["tf", "two"], ["half"]),
        oh.make_node("Ceil", ["half"], ["up"]), oh.make_node("Cast", ["up"], ["k"], to=TP.INT64),
        const("zero", np.array([0], np.int64)), oh.make_node("Slice", ["x", "zero", "k", "zero"], ["prefix"]),
        oh.make_node("Scan", ["h0", "prefix"], ["h_n", "y"], body=body, num_scan_inputs=1),
    ]
    return make_model(17, nodes, [vi("x", ["T", "B", 3]), vi("h0", ["B", 4])], [vi("h_n", ["B", 4]), vi("y", [None, "B", 4])])


def _run(model, **options):
    options.setdefault("tune", True)
    return scanopt.optimize(model, options=options, seeds=1)


def test_a_scan_over_a_computed_prefix_is_measured_at_the_shape_a_run_gives(timer):
    out, report = _run(_rnn_over_a_computed_prefix(), input_shapes={"x": [15, 4, 3], "h0": [4, 4]})
    (forms, feeds, _), = timer.calls
    assert feeds == {"h0": (4, 4), "prefix": (8, 4, 3)}  # ceil(15 / 2) steps; W, R Constant nodes: copied, not fed
    assert report.tuning[0].startswith("shapes observed in one onnxruntime run at the declared shapes")
    assert report.tuning[0].endswith("prefix [8,4,3]")
    fuse = next(o for o in report.outcomes if o.pass_name == "fuse")
    assert fuse.measured and fuse.applied and "T=8 B=4 (declared; observed in a run)" in fuse.expected
    assert report.verification["passed"] is True


def test_without_the_run_the_scan_would_be_modelled(timer):
    """What the run adds: with the shapes unknown (no declaration), nothing is measured."""
    _, report = _run(_rnn_over_a_computed_prefix())
    assert not any("prefix" in feeds for _, feeds, _ in timer.calls)  # (calibration times its own probes)
    assert any("not measured (deployment shape of" in line and "modelled instead" in line for line in report.tuning)


def test_a_run_that_fails_leaves_the_scan_modelled_with_the_reason(timer):
    model = _rnn_over_a_computed_prefix()
    # a Reshape the declared x cannot take: the run fails, as the model would there
    model.graph.node.insert(0, oh.make_node("Reshape", ["x", "five"], ["x5"]))
    model.graph.node.insert(0, const("five", np.array([-1, 7], np.int64)))
    model.graph.output.append(vi("x5", None))
    _, report = _run(model, input_shapes={"x": [15, 4, 3], "h0": [4, 4]})
    assert not any("prefix" in feeds for _, feeds, _ in timer.calls)
    assert report.tuning[0].startswith("shapes of 'prefix' not observed (onnxruntime: ")
    assert "modelled" in report.tuning[0]


def test_a_run_over_the_time_limit_is_stopped():
    """A Loop of 10**9 steps: onnxruntime is told to stop after the limit."""
    body = oh.make_graph([oh.make_node("Add", ["a", "one"], ["a_new"]), oh.make_node("Identity", ["c"], ["c_out"])],
                         "body", [vi("i", [], TP.INT64), vi("c", [], TP.BOOL), vi("a", [1])],
                         [vi("c_out", [], TP.BOOL), vi("a_new", [1])])
    nodes = [const("one", np.ones(1, np.float32)), const("n", np.array(10**9, np.int64)), const("true", np.array(True)),
             oh.make_node("Loop", ["n", "true", "x"], ["a_n"], body=body), oh.make_node("Identity", ["a_n"], ["y"])]
    model = make_model(17, nodes, [vi("x", [1])], [vi("y", [1])])
    found = observe(model, {"a_n": TP.FLOAT}, seconds=0.2)
    assert found == "onnxruntime: stopped after the time limit of 0.2 s"


def test_the_keras_backwards_simplernn_is_measured_under_declared_shapes(timer):
    """models/heldout_producers/keras_simplernn_backwards: the converted Loop's scan input is
    a run-time Slice (cut to the trip count); at T=16 B=4 the run gives its shape, and the
    native RNN is chosen on a measurement, not on a prediction at T=1024 B=32."""
    sys.path.insert(0, MODELS)
    from evaluate_heldout_producers import HeldOutSet

    path = os.path.join(MODELS, "heldout_producers", "keras_simplernn_backwards")
    model, stored = onnx.load(path + ".onnx"), np.load(path + ".expected.npz")
    out, report = scanopt.optimize(model, input_shapes=HeldOutSet().declared(model, stored, "keras_simplernn_backwards"),
                                   options={"tune": True}, seeds=1)
    (forms, feeds, _), = timer.calls
    assert "native" in forms and (16, 4, 3) in feeds.values()
    fuse = next(o for o in report.outcomes if o.pass_name == "fuse")
    assert fuse.measured and fuse.applied and "T=16 B=4 (declared; observed in a run)" in fuse.expected
    assert report.verification["passed"] is True
    assert [n.op_type for n in out.graph.node].count("RNN") == 1
