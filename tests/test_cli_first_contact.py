"""What a new user meets in the first hour: output on a console that cannot show every
character, hints that name what can be declared, contradictory shapes, library feeds of the
wrong dtype, and the summary of a model whose Loops became Scans."""

from __future__ import annotations

import os
import subprocess
import sys

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")
ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_a_console_without_the_reports_characters_gets_replacements_not_a_traceback(tmp_path):
    """PYTHONIOENCODING=cp1252 (a redirected Windows console): a report naming a Scan '⊙ outer'
    (a character cp1252 lacks; verdicts said '⊙' too) ended in a UnicodeEncodeError, exit 1,
    after writing."""
    import onnx

    env = dict(os.environ, PYTHONIOENCODING="cp1252", SCANOPT_TUNE="0")
    model = onnx.load(os.path.join(MODELS, "scan_nested.onnx"))
    model.graph.node[0].name = "\u2299 outer"
    src, out = tmp_path / "nested.onnx", tmp_path / "o.onnx"
    onnx.save(model, src)
    with open(tmp_path / "log", "wb") as log:
        result = subprocess.run([sys.executable, "-m", "scanopt", "optimize", str(src), str(out), "-v"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.PIPE, timeout=300)
    err = result.stderr.decode("cp1252", "replace")
    assert result.returncode == 0 and "Traceback" not in err, err
    text = (tmp_path / "log").read_bytes().decode("cp1252")
    assert "wrote" in text and "?" in text and out.exists()


def _rnn_over_a_computed_prefix(h0_dims):
    """A tanh RNN Scan over x[:k], k = ceil(T / 2): the Scan reads 'prefix', a value computed
    in the model whose shape no inference gives; x is the graph input it comes from."""
    import numpy as np
    from onnx import TensorProto as TP
    from onnx import helper as oh

    from builders import vi
    from reference_helpers import const, make_model

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
    return make_model(17, nodes, [vi("x", ["T", h0_dims[0], 3]), vi("h0", h0_dims)],
                      [vi("h_n", h0_dims), vi("y", [None, h0_dims[0], 4])])


def test_the_declare_hint_names_graph_inputs_only(monkeypatch, tmp_path):
    """The Scan reads 'prefix' (computed); the hint said "declare it with --input-shape" of
    'prefix', which --input-shape refuses (no such input). It names x, the input to declare."""
    import scanopt

    monkeypatch.setenv("SCANOPT_CACHE_DIR", str(tmp_path / "cache"))
    _, report = scanopt.optimize(_rnn_over_a_computed_prefix([4, 4]), options={"tune": True}, seeds=1)
    line, = [n for n in report.tuning if "not measured (deployment shape of" in n]
    assert "'prefix' unknown" in line and "computed from x: declare it with --input-shape" in line, line
    _, report = scanopt.optimize(_rnn_over_a_computed_prefix(["B", 4]), options={"tune": True}, seeds=1)
    line, = [n for n in report.tuning if "not measured (deployment shape of" in n]
    assert "'h0' unknown: [?,4]; declare it with --input-shape" in line, line  # a graph input: itself


def test_contradictory_input_shapes_are_refused_in_one_line(cli, tmp_path):
    """batch 8 in X, 4 in h_0: accepted before, onnxruntime's error log on stderr, a report
    line cut mid-word and fuse applied anyway. Now exit 2, one line, nothing written."""
    out = tmp_path / "o.onnx"
    result = cli("optimize", os.path.join(MODELS, "scan_rnn.onnx"), out, "--input-shape", "X:100,8,3", "h_0:4,4")
    assert result.code == 2 and not out.exists(), result
    assert result.err.strip() == "scanopt: input shapes contradict: dim 'batch' is 8 in 'X' (axis 1) and 4 in 'h_0' (axis 0)"
    agreed = cli("optimize", os.path.join(MODELS, "scan_rnn.onnx"), out, "--input-shape", "X:100,8,3", "h_0:8,4", "-q")
    assert agreed.code == 0, agreed.err


def test_the_library_refuses_contradictory_shapes_too():
    import pytest

    import scanopt

    with pytest.raises(scanopt.InvalidArgumentError, match="dim 'batch' is 8"):
        scanopt.optimize(os.path.join(MODELS, "scan_rnn.onnx"), input_shapes={"X": [100, 8, 3], "h_0": [4, 4]})


def test_a_form_onnxruntime_fails_to_run_while_timed_logs_nothing_to_stderr(capfd):
    """onnxruntime's own error lines (red, timestamped) leaked to stderr when a timed form
    failed; the failure comes back as an exception, which the report words."""
    import numpy as np
    import pytest
    from onnx import TensorProto as TP
    from onnx import helper as oh

    from scanopt import timing

    graph = oh.make_graph([oh.make_node("Add", ["a", "b"], ["c"])], "g",
                          [oh.make_tensor_value_info("a", TP.FLOAT, None), oh.make_tensor_value_info("b", TP.FLOAT, None)],
                          [oh.make_tensor_value_info("c", TP.FLOAT, None)])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(Exception):
        timing.measure({"loop": model}, {"a": np.zeros(2, np.float32), "b": np.zeros(3, np.float32)},
                       threads=1, seconds=0.1)
    assert "onnxruntime" not in capfd.readouterr().err


def test_library_feeds_of_the_wrong_dtype_are_refused_as_the_cli_refuses_them(tmp_path):
    """float64 for an int64 input: the CLI said exit 2; the library went on and its report
    said both "1 replaced" and "nothing was rewritten"."""
    import numpy as np
    import pytest
    from onnx import TensorProto as TP
    from onnx import helper as oh

    import scanopt

    graph = oh.make_graph([oh.make_node("Cast", ["n"], ["f"], to=TP.FLOAT), oh.make_node("Add", ["f", "x"], ["y"])], "g",
                          [oh.make_tensor_value_info("n", TP.INT64, [2]), oh.make_tensor_value_info("x", TP.FLOAT, [2])],
                          [oh.make_tensor_value_info("y", TP.FLOAT, [2])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    feeds = {"n": np.array([1.0, 2.0]), "x": np.zeros(2, np.float32)}
    with pytest.raises(scanopt.InvalidArgumentError, match="input 'n' is float64; the model wants int64"):
        scanopt.optimize(model, inputs=feeds)
    np.savez(tmp_path / "feeds.npz", **feeds)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    from scanopt.cli import main

    assert main(["optimize", str(path), str(tmp_path / "o.onnx"), "--inputs", str(tmp_path / "feeds.npz")]) == 2
    scanopt.optimize(model, inputs={"n": np.array([1, 2]), "x": np.zeros(2, np.float32)})  # the right dtype runs


def test_a_model_whose_loops_became_scans_gets_the_summary(cli, tmp_path):
    """Keras SimpleRNN exported by tf2onnx: a Loop that loop_to_scan converts (and fuse, without
    shapes, replaces: I=3 H=4, the native RNN is modelled faster over the whole assumed range).
    The report had no "Scans found" and the JSON said "scans": 0."""
    import json

    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    result = cli("optimize", os.path.join(MODELS, "loops", "keras_simplernn.onnx"), out, "--report", report)
    assert result.code == 0, result.err
    assert "1 Scan found (1 from a Loop): 1 replaced, 0 still a Scan" in result.out
    summary = json.loads(report.read_text())["summary"]
    assert (summary["scans"], summary["from_loops"], summary["left"]) == (1, 1, 0)
    assert summary["replaced"] == {"fuse: fused into RNN": 1}
