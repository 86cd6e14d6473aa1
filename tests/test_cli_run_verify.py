"""`scanopt run` and `scanopt verify` end to end: output, files written, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper as h

import builders


def add_model(eps: float | None = None) -> onnx.ModelProto:
    """c = a + b over [N, 2]; with ``eps``, c = a + b + eps (a wrong "rewrite")."""
    nodes = [h.make_node("Add", ["a", "b"], ["c" if eps is None else "c_raw"])]
    initializers = []
    if eps is not None:
        nodes.append(h.make_node("Add", ["c_raw", "eps"], ["c"]))
        initializers.append(builders.init("eps", np.float32(eps)))
    graph = h.make_graph(
        nodes,
        "add",
        [builders.vi("a", ["N", 2]), builders.vi("b", ["N", 2])],
        [builders.vi("c", ["N", 2])],
        initializer=initializers,
    )
    return builders.model(graph)


@pytest.fixture
def files(tmp_path):
    paths = {}
    for name, model in {
        "add": add_model(),
        "add_off": add_model(1e-3),
        "scan8": builders.scan8_sum(),
        "scan9": builders.scan9_sum(),
    }.items():
        paths[name] = str(tmp_path / f"{name}.onnx")
        onnx.save(model, paths[name])
    a = np.arange(8, dtype=np.float32).reshape(4, 2)
    b = np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    paths["feeds"] = str(tmp_path / "feeds.npz")
    np.savez(paths["feeds"], a=a, b=b)
    paths["b2"] = str(tmp_path / "b2.npy")
    np.save(paths["b2"], b * 10)
    paths["a"], paths["b"], paths["dir"] = a, b, tmp_path
    return paths


# -- verify -------------------------------------------------------------------------------


def test_verify_equivalent_models_exit_0(cli, files):
    result = cli("verify", files["scan8"], files["scan8"], "--seeds", "2")
    assert result.code == 0
    assert "PASSED: equivalent on " in result.out and "with ort" in result.out
    rows = [line for line in result.out.splitlines() if "candidate vs original [ort]" in line]
    assert sum(line.startswith("seed ") for line in rows) == 4  # 2 outputs x 2 seeds
    assert any(line.startswith("edge: ") for line in rows)  # and the edge inputs
    assert any(line.startswith("'T' = 1024 steps") for line in rows)  # and the named length's long run


def test_verify_perturbed_model_exit_1_names_the_output(cli, files):
    result = cli("verify", files["add"], files["add_off"], "--seeds", "2")
    assert result.code == 1
    failed = [line for line in result.out.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 2 and all("output 'c'" in line and "max abs error 1.00e-03" in line for line in failed)


def test_verify_tolerance_flags_change_the_verdict(cli, files):
    assert cli("verify", files["add"], files["add_off"], "--atol", "2e-3").code == 0
    assert cli("verify", files["add"], files["add_off"], "--atol", "1e-4", "--rtol", "0").code == 1


def test_verify_json(cli, files):
    result = cli("verify", files["add"], files["add_off"], "--json", "--seeds", "1", "--engine", "both")
    assert result.code == 1
    data = json.loads(result.out)
    assert data["passed"] is False and data["engine"] == "both"
    verdicts = {
        (c["actual"]["model"], c["actual"]["engine"], c["expected"]["engine"]): c["passed"] for c in data["comparisons"]
        if not c["inputs"].startswith("edge: ")  # an empty edge input passes: nothing to be off by 1e-3
    }
    assert verdicts == {
        ("candidate", "ort", "ort"): False,
        ("candidate", "reference", "reference"): False,
        ("original", "reference", "ort"): True,
        ("candidate", "reference", "ort"): True,
    }
    assert data["comparisons"][0]["outputs"][0]["max_abs"] == pytest.approx(1e-3, rel=1e-3)


def test_verify_on_given_inputs(cli, files):
    result = cli("verify", files["add"], files["add_off"], "--inputs", files["feeds"], "--json")
    data = json.loads(result.out)
    assert result.code == 1 and [c["inputs"] for c in data["comparisons"]] == ["inputs"]
    assert data["comparisons"][0]["outputs"][0]["shape"] == [4, 2]  # the file's N, not a synthesized one


@pytest.mark.parametrize(
    "args, message",
    [
        (("verify", "{add}", "{missing}"), "no such file"),
        (("verify", "{add}", "{add}", "--inputs", "{b2}"), "not an .npz archive"),
        (("verify", "{add}", "{add}", "--input", "z={b2}"), "unknown input name(s) 'z'"),
        (("verify", "{add}", "{add}", "--seeds", "0"), "at least 1"),
        (("verify", "{add}", "{add}", "--engine", "gpu"), "invalid choice"),
        (("run", "{add}", "--input", "a={missing}"), "no such file"),
        (("run", "{add}", "--inputs", "{missing}"), "no such file"),
        (("run", "{missing}"), "no such file"),
    ],
)
def test_bad_input_exit_2_with_one_line(cli, files, args, message):
    paths = {**files, "missing": str(files["dir"] / "missing.onnx")}
    result = cli(*(a.format(**paths) for a in args))
    assert result.code == 2
    assert result.err.startswith("scanopt: ") and message in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert result.out == ""


def test_verify_via_python_m_scanopt(files):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(
        [sys.executable, "-m", "scanopt", "verify", files["add"], files["add_off"], "--seeds", "1"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 1, proc.stderr
    assert "FAILED: output 'c'" in proc.stdout


@pytest.mark.parametrize("command", ["run", "verify"])
def test_help_shows_examples(cli, command):
    result = cli(command, "--help")
    assert result.code == 0
    assert "examples:" in result.out and f"scanopt {command} model.onnx" in result.out


# -- run ----------------------------------------------------------------------------------


def test_run_prints_each_output(cli, files):
    result = cli("run", files["scan8"], "--seed", "2")
    assert result.code == 0
    lines = result.out.splitlines()
    assert lines[0] == "engine: ort"
    assert "inputs (synthesized, seed 2):" in lines
    outputs = lines[lines.index("outputs:") + 1 :]
    assert [line.split()[:3] for line in outputs] == [["s_final", "float32", "(3,"], ["Y", "float32", "(3,"]]
    s_final, y = outputs
    assert len(s_final.split("[")[1].split()) == 6  # few values: all of them
    assert " min " in y and " max " in y and " mean " in y  # many: a summary


def test_run_uses_the_npz_exactly_and_saves_outputs(cli, files):
    out = files["dir"] / "out.npz"
    result = cli("run", files["add"], "--inputs", files["feeds"], "--out", out)
    assert result.code == 0 and "wrote 1 output(s)" in result.out
    with np.load(out) as saved:
        assert saved.files == ["c"]
        np.testing.assert_array_equal(saved["c"], files["a"] + files["b"])
    result = cli("run", files["add"], "--inputs", files["feeds"], "--input", f"b={files['b2']}", "--out", out)
    with np.load(out) as saved:
        np.testing.assert_array_equal(saved["c"], files["a"] + files["b"] * 10)
    leftovers = [n for n in os.listdir(files["dir"]) if n.startswith(".scanopt-")]
    assert leftovers == []


def test_run_out_to_a_missing_directory_writes_nothing(cli, files):
    target = files["dir"] / "nope" / "out.npz"
    result = cli("run", files["add"], "--out", target)
    assert result.code == 2 and "output directory does not exist" in result.err
    assert not target.parent.exists()


def test_run_with_the_reference_engine(cli, files):
    result = cli("run", files["scan9"], "--inputs", files["feeds"], "--input", f"X={files['b2']}")
    assert result.code == 2 and "unknown input name(s) 'a', 'b'" in result.err
    x = np.ones((3, 2), np.float32)
    np.savez(files["dir"] / "s.npz", s0=np.zeros(2, np.float32), X=x)
    result = cli("run", files["scan9"], "--engine", "reference", "--inputs", files["dir"] / "s.npz")
    assert result.code == 0 and result.out.startswith("engine: reference")
    assert "s_final  float32  (2,)    [3 3]" in result.out


def test_run_engine_ort_on_a_model_it_cannot_load_exit_2(cli, files, tmp_path):
    model = builders.ort_unloadable(builders.scan9_sum())
    path = tmp_path / "refused.onnx"
    onnx.save(model, path)
    result = cli("run", path, "--engine", "ort")
    assert result.code == 2 and "onnxruntime cannot load the model" in result.err
    assert cli("run", path).out.startswith("engine: reference")  # auto falls back


def test_run_prints_a_zipmap_output_as_a_sequence_of_maps(cli, tmp_path):
    """skl2onnx classifiers return a ZipMap: a list of {class: probability} per row, which
    onnxruntime gives as Python lists and dicts, not arrays (``run`` raised AttributeError)."""
    model = Path(__file__).resolve().parent.parent / "models" / "heldout_producers_3" / "skl_knn_classifier_uniform_euclid_k3.onnx"
    result = cli("run", model)
    assert result.code == 0, result.err
    line = next(l for l in result.out.splitlines() if "output_probability" in l)
    assert "seq(map)" in line and "(8,)" in line and "{0: " in line
    result = cli("run", model, "--out", tmp_path / "o.npz")
    assert result.code == 0 and (tmp_path / "o.npz").exists()
