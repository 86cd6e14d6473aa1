"""onnxruntime dying on the user's model (a signal, not an error) is one line, not a dead process.

A malformed model onnxruntime accepts can kill its process: a Loop whose trip count is an
empty tensor dies of SIGSEGV when run (structure mutants of the sample models found it: a
Constant feeding the count emptied), a Split with more outputs than ``num_outputs`` aborts
onnx's shape inference and onnxruntime's session alike. The first run of the original in
onnxruntime therefore happens in the persistent child (scanopt.isolated.screen_original):
``scanopt run``/``verify``/``optimize`` end with exit 2 and one line, writing nothing; a
candidate that kills the child fails verification (rolled back) instead of killing the run.

The command-line tests run scanopt in a subprocess: before the fix the process died of SIGSEGV
(exit -11) in each of them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import builders as b

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRASHED = "onnxruntime crashed running the original model: its process died of SIGSEGV"


def empty_count_loop(state: str, out: str) -> list[onnx.NodeProto]:
    """Nodes of a Loop carrying ``state`` whose trip count is an int64 tensor of shape [0]:
    onnxruntime 1.31/1.32 read its first element anyway and die of SIGSEGV."""
    body = h.make_graph(
        [h.make_node("Identity", ["c"], ["c_out"]), h.make_node("Identity", ["v"], ["v_out"])],
        "loop_body",
        [b.vi("i", [], TP.INT64), b.vi("c", [], TP.BOOL), b.vi("v", [2])],
        [b.vi("c_out", [], TP.BOOL), b.vi("v_out", [2])],
    )
    return [
        h.make_node("Constant", [], [f"{out}_M"], value=numpy_helper.from_array(np.zeros([0], np.int64))),
        h.make_node("Constant", [], [f"{out}_go"], value=numpy_helper.from_array(np.array(True))),
        h.make_node("Loop", [f"{out}_M", f"{out}_go", state], [out], name=f"{out}_loop", body=body),
    ]


def crashing_model() -> onnx.ModelProto:
    """A Scan running sum optimize rewrites (so verification runs it), beside a Loop that kills
    onnxruntime: the original as a user would bring it."""
    m = b.scan9_sum(opset=17, steps="T")
    m.graph.node.extend(empty_count_loop("s0", "s_loop"))
    m.graph.output.append(b.vi("s_loop", [2]))
    onnx.checker.check_model(m)
    return m


def scanopt(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), SCANOPT_TUNE="0")
    return subprocess.run([sys.executable, "-m", "scanopt", *argv], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


def one_line(done: subprocess.CompletedProcess, code: int = 2) -> str:
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scanopt: "), done.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["optimize", "run", "verify"])
def test_onnxruntime_dying_on_the_original_is_one_line_and_nothing_written(tmp_path, command):
    model = tmp_path / "m.onnx"
    onnx.save(crashing_model(), model)
    before = model.read_bytes()
    argv = {"optimize": ["optimize", str(model), str(tmp_path / "out.onnx")],
            "run": ["run", str(model), "--out", str(tmp_path / "out.npz")],
            "verify": ["verify", str(model), str(model)]}[command]
    done = scanopt(*argv)
    line = one_line(done)
    assert CRASHED in line and "seed 0's synthesized inputs" in line, line
    assert done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # nothing written, no staging left
    assert model.read_bytes() == before


def test_onnxruntime_dying_on_given_inputs_is_one_line(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(crashing_model(), model)
    np.savez(tmp_path / "in.npz", s0=np.zeros(2, np.float32), X=np.ones([3, 2], np.float32))
    line = one_line(scanopt("run", str(model), "--inputs", str(tmp_path / "in.npz")))
    assert CRASHED in line and "on the given inputs" in line, line


def test_the_reference_engine_says_what_onnxruntime_died_of(tmp_path):
    """The line's advice holds: ``--engine reference`` runs the model without onnxruntime, and
    names what is wrong with it."""
    model = tmp_path / "m.onnx"
    onnx.save(crashing_model(), model)
    line = one_line(scanopt("run", str(model), "--engine", "reference"))
    assert "Loop's M must be an integer scalar, got int64[0]" in line, line


def test_a_candidate_that_kills_onnxruntime_fails_verification_in_process():
    """compare_models (what the pipeline's rollback asks) on a candidate onnxruntime dies on:
    a failed comparison naming the death, and this process lives on."""
    from scanopt.verify import compare_models

    original = b.model(h.make_graph([h.make_node("Identity", ["s0"], ["y"])], "g", [b.vi("s0", [2])], [b.vi("y", [2])]))
    candidate = b.model(h.make_graph(empty_count_loop("s0", "y"), "g", [b.vi("s0", [2])], [b.vi("y", [2])]))
    for keep_ort in (True, False):
        result = compare_models(original, candidate, seeds=1, keep_ort=keep_ort)
        assert not result.passed
        assert "onnxruntime's process dies on the candidate (SIGSEGV" in result.summary(), result.summary()
        assert result.engine == "ort"


def test_the_original_dying_in_compare_models_is_an_error_and_a_watched_crash():
    from scanopt.isolated import OnnxruntimeCrashError, crash_watch
    from scanopt.verify import compare_models

    m = crashing_model()
    with crash_watch() as crashes:
        with pytest.raises(OnnxruntimeCrashError, match="crashed running the original model"):
            compare_models(m, m, seeds=1)
    assert len(crashes) == 1 and CRASHED in crashes[0]
    with pytest.raises(OnnxruntimeCrashError):  # outside a watch: raised all the same
        compare_models(m, m, seeds=1)


def test_a_timed_form_that_kills_onnxruntime_is_not_timed():
    from scanopt import timing

    fine = b.model(h.make_graph([h.make_node("Identity", ["s0"], ["y"])], "g", [b.vi("s0", [2])], [b.vi("y", [2])]))
    dies = b.model(h.make_graph(empty_count_loop("s0", "y"), "g", [b.vi("s0", [2])], [b.vi("y", [2])]))
    said = timing.measure({"loop": fine, "form": dies}, {"s0": np.zeros(2, np.float32)}, threads=1, seconds=0.05)
    assert isinstance(said, str) and "dies running the form 'form' (SIGSEGV)" in said, said


def test_first_run_survivors_are_not_run_again_and_errors_survive():
    from scanopt import isolated

    fine = b.scan9_sum(opset=17, steps=3)
    feeds = {"s0": np.zeros(2, np.float32), "X": np.ones([3, 2], np.float32)}
    assert isolated.screen_original(fine, feeds, "on test inputs") == []
    assert isolated.survived(fine)
    child = isolated._child
    assert isolated.screen_original(fine, feeds, "on test inputs") == []  # no request: the same child, idle
    assert isolated._child is child
    wrong = {"s0": np.zeros(3, np.float32), "X": np.ones([3, 2], np.float32)}  # a clean error is survival
    assert isolated.first_run([b.scan9_sum(opset=17, steps=3)], wrong) == [None]
    assert isolated.first_run([fine], None) == [None]  # creating the session alone


def test_screen_says_how_the_child_died():
    from scanopt import isolated

    dies = b.model(h.make_graph(empty_count_loop("s0", "y"), "g", [b.vi("s0", [2])], [b.vi("y", [2])]))
    why: dict = {}
    feeds = {"s0": np.zeros(2, np.float32)}
    assert isolated.screen([dies], [None, feeds, feeds], why) == [["ok", "crash", "crash"]]
    assert why == {(0, 1): "SIGSEGV", (0, 2): "SIGSEGV"}


def split_with_an_extra_output(opset: int = 18) -> onnx.ModelProto:
    node = h.make_node("Split", ["x"], ["a", "b", "c", "d"], axis=1, num_outputs=3)
    graph = h.make_graph([node], "g", [b.vi("x", [2, 12])], [b.vi(o, [2, None]) for o in "abcd"])
    return b.model(graph, opset)


def test_a_split_with_more_outputs_than_num_outputs_is_refused(cli, tmp_path):
    """onnx's shape inference and onnxruntime's session abort on it (a libstdc++ assertion):
    refused on loading, one line, before either runs (it aborted inspect too)."""
    path = tmp_path / "split.onnx"
    onnx.save(split_with_an_extra_output(), path)
    for argv in (["inspect", str(path)], ["run", str(path)], ["optimize", str(path), str(tmp_path / "o.onnx")]):
        result = cli(*argv)
        assert result.code == 2, (argv, result)
        assert result.err.strip() == f"scanopt: {path}: Split node 'Split' has 4 outputs but num_outputs = 3", result.err
    assert not (tmp_path / "o.onnx").exists()


def test_a_split_with_as_many_outputs_as_num_outputs_is_accepted():
    from scanopt.validate import validate_model

    m = split_with_an_extra_output()
    next(a for a in m.graph.node[0].attribute if a.name == "num_outputs").i = 4
    assert validate_model(m) == []


def test_run_takes_its_outputs_from_the_child(cli, tmp_path, monkeypatch):
    """`scanopt run` on the CPU runs the model once, in the child: no session of it in this
    process, the same numbers as one here."""
    from scanopt import engines
    from scanopt.cli import run_cmd

    m = b.scan9_sum(opset=17, steps="T")
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    np.savez(tmp_path / "in.npz", s0=np.ones(2, np.float32), X=np.arange(10, dtype=np.float32).reshape(5, 2))
    expected = engines.run(m, dict(np.load(tmp_path / "in.npz")), "ort")

    def no_session(*args, **kwargs):
        raise AssertionError("a session of the model in this process")

    monkeypatch.setattr(run_cmd, "prepare", no_session)
    result = cli("run", str(path), "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "out.npz"))
    assert result.code == 0 and "(engine ort)" in result.out, result
    with np.load(tmp_path / "out.npz") as got:
        assert sorted(got.files) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_array_equal(got[name], value)
