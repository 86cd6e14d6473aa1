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
    from test_cli_first_contact import _rnn_over_a_computed_prefix as build

    return build(["B", 4])


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
    from scanopt.report import count_ops

    assert count_ops(out)["RNN"] == 1  # behind the converted Loop's zero-step guard


# E1 (issue 33): the run is the user's code, which may never end. A Loop with trip count
# 2^62 whose condition stays true, stacking a [B, W] state every step.
def _endless_loop_then_scan(width):
    body = oh.make_graph([oh.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT), oh.make_node("Add", ["a", "fi"], ["a_new"]),
                          oh.make_node("Identity", ["c"], ["c_out"]), oh.make_node("Identity", ["a_new"], ["st"])],
                         "body", [vi("i", [], TP.INT64), vi("c", [], TP.BOOL), vi("a", ["B", width])],
                         [vi("c_out", [], TP.BOOL), vi("a_new", ["B", width]), vi("st", ["B", width])])
    scan_body = oh.make_graph([oh.make_node("Add", ["h", "x_t"], ["pre"]), oh.make_node("Tanh", ["pre"], ["h_new"])],
                              "scan_body", [vi("h", ["B", width]), vi("x_t", ["B", width])], [vi("h_new", ["B", width])])
    nodes = [const("n", np.array(2**62, np.int64)), const("true", np.array(True)),
             oh.make_node("Loop", ["n", "true", "x"], ["a_n", "stack"], body=body),
             oh.make_node("Scan", ["h0", "stack"], ["h_n"], body=scan_body, num_scan_inputs=1)]
    return make_model(17, nodes, [vi("x", ["B", width]), vi("h0", ["B", width])], [vi("h_n", ["B", width])])


def _shaped(model, width):
    from scanopt.deploy import shaped_model

    return shaped_model(model, {"x": [2, width], "h0": [2, width]})


def test_an_endless_loop_is_stopped_at_the_time_limit():
    import time

    began = time.perf_counter()
    found = observe(_shaped(_endless_loop_then_scan(4), 4), {"stack": TP.FLOAT}, seconds=2.0)
    assert found == "onnxruntime: stopped after the time limit of 2 s"
    assert time.perf_counter() - began < 4.0


def test_an_endless_loop_that_grows_is_stopped_at_the_memory_limit(monkeypatch):
    """4 MB stacked per step: the child's address space runs out long before the time limit,
    and this process's memory does not grow."""
    import resource
    import time

    import scanopt.isolated

    monkeypatch.setattr(scanopt.isolated, "BOUNDED_MEMORY_BYTES", 512 << 20)
    monkeypatch.setattr(scanopt.isolated.run_bounded, "__defaults__", (512 << 20,))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    began = time.perf_counter()
    found = observe(_shaped(_endless_loop_then_scan(1 << 20), 1 << 20), {"stack": TP.FLOAT}, seconds=60.0)
    assert time.perf_counter() - began < 30.0
    assert found.startswith("onnxruntime: ") and "memory limit of" in found and "MB" in found, found
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 << 10  # KB: under 256 MB more


def test_the_optimizer_says_in_one_line_that_the_shapes_were_not_observed(timer, monkeypatch):
    import scanopt.observe

    monkeypatch.setattr(scanopt.observe, "RUN_SECONDS", 1.5)
    _, report = scanopt.optimize(_endless_loop_then_scan(4), input_shapes={"x": [2, 4], "h0": [2, 4]}, verify=False,
                                 options={"tune": True}, seeds=1)
    lines = [line for line in report.tuning if "not observed" in line]
    assert lines == ["shapes of 'stack' not observed (onnxruntime: stopped after the time limit of 1.5 s); "
                     "the Scans reading them are modelled"]


OBSERVING = """
import sys, time
sys.path.insert(0, "tests")
import onnx
from onnx import TensorProto as TP
from scanopt.cli.interrupts import Interrupted, handled_signals
from scanopt.observe import observe
model = onnx.load(sys.argv[1])
with handled_signals():
    try:
        print("observing", flush=True)
        observe(model, {"stack": TP.FLOAT}, seconds=60.0)
        print("returned", flush=True)
    except Interrupted:
        print("interrupted", flush=True)
"""


def test_sigterm_during_the_run_ends_it_within_a_second(tmp_path):
    import signal
    import subprocess
    import time

    path = tmp_path / "loop.onnx"
    onnx.save(_shaped(_endless_loop_then_scan(4), 4), str(path))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", OBSERVING, str(path)], cwd=root, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "observing"
    time.sleep(2.0)  # onnxruntime imported, the Loop running
    children = _children(proc.pid)
    assert children
    sent = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert time.perf_counter() - sent < 1.0
    assert out.strip() == "interrupted"
    time.sleep(0.2)
    assert not [c for c in children if os.path.exists(f"/proc/{c}")]  # the child was killed, not orphaned


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    if int(handle.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return found
