"""``scanopt optimize`` and ``scanopt inspect`` end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

import builders as b


def _save(tmp_path, m, name="in.onnx"):
    path = tmp_path / name
    path.write_bytes(m.SerializeToString())
    return path


def test_help_shows_examples_and_exit_codes(cli):
    result = cli("optimize", "--help")
    assert result.code == 0
    assert "examples:" in result.out and "scanopt optimize model.onnx" in result.out
    assert "exit codes" in result.out


def test_top_level_help_lists_subcommands(cli):
    result = cli("--help")
    assert result.code == 0
    for sub in ("optimize", "inspect"):
        assert sub in result.out


def test_model_without_scan_is_written_back_byte_identical(cli, tmp_path):
    src = _save(tmp_path, b.no_scan_model())
    out = tmp_path / "out.onnx"
    result = cli("optimize", src, out)
    assert result.code == 0, result.err
    assert out.read_bytes() == src.read_bytes()
    assert "no Scan nodes" in result.out and "unchanged" in result.out


def test_report_names_every_scan_and_json_report_is_written(cli, tmp_path):
    src = _save(tmp_path, b.scan_in_loop())
    report_path = tmp_path / "report.json"
    result = cli("optimize", src, tmp_path / "out.onnx", "--report", report_path, "--passes", "cleanup")
    assert result.code == 0, result.err
    for name in ("outer_scan", "inner_scan"):
        assert name in result.out
    report = json.loads(report_path.read_text())
    assert [s["node"] for s in report["scans"]] == ["outer_scan", "inner_scan"]
    assert report["scans"][1]["graph_path"] == "loop/body > outer_scan/body"
    assert report["modified"] is False


def test_quiet_prints_nothing(cli, tmp_path):
    src = _save(tmp_path, b.scan9_sum())
    result = cli("optimize", src, tmp_path / "out.onnx", "--quiet")
    assert result.code == 0 and result.out == "" and result.err == ""


def test_same_input_same_output_bytes(cli, tmp_path):
    m = b.scan9_sum(weight=np.array([1.0, 2.0]))
    m.graph.node.append(b.h.make_node("Neg", ["X"], ["dead"], name="dead"))  # cleanup rewrites
    src = _save(tmp_path, m)
    assert cli("optimize", src, tmp_path / "a.onnx", "--no-verify").code == 0
    assert cli("optimize", src, tmp_path / "b.onnx", "--no-verify").code == 0
    a, c = (tmp_path / "a.onnx").read_bytes(), (tmp_path / "b.onnx").read_bytes()
    assert a == c and a != src.read_bytes()


def test_in_place_replaces_the_input(cli, tmp_path):
    m = b.scan9_sum()
    m.graph.node.append(b.h.make_node("Neg", ["X"], ["dead"], name="dead"))
    src = _save(tmp_path, m)
    result = cli("optimize", src, src, "--in-place", "--no-verify")
    assert result.code == 0, result.err
    assert b"dead" not in src.read_bytes()


def test_python_dash_m_runs_the_same_cli(tmp_path):
    src = _save(tmp_path, b.scan9_sum(steps="T"))
    out = tmp_path / "out.onnx"
    proc = subprocess.run(
        [sys.executable, "-m", "scanopt", "optimize", str(src), str(out), "--skip", "linrec"], capture_output=True, text=True,
        timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "scan_sum" in proc.stdout and out.read_bytes() == src.read_bytes()


def test_inspect_lists_nested_scans_with_paths(cli, tmp_path):
    src = _save(tmp_path, b.scan_in_loop())
    result = cli("inspect", src)
    assert result.code == 0, result.err
    assert "2 Scan nodes" in result.out
    assert "inner_scan  (in loop/body > outer_scan/body, depth 2)" in result.out
    assert "captures: W" in result.out


def test_inspect_json_describes_scan8(cli, tmp_path):
    src = _save(tmp_path, b.scan8_sum(batch=4, steps=7, directions=[1]))
    result = cli("inspect", src, "--json")
    assert result.code == 0, result.err
    (scan,) = json.loads(result.out)["scans"]
    assert scan["version"] == 8 and scan["batch"] == 4 and scan["sequence_lens"] == "lens"
    assert scan["trip_count"] == 7 and scan["scan_input_directions"] == [1]
    assert (scan["num_states"], scan["num_scan_inputs"], scan["num_scan_outputs"]) == (1, 1, 1)
    assert scan["body_ops"] == ["Add", "Identity"]


def test_target_opset_report_heads_a_migrated_scan_with_the_version_the_model_had(cli, tmp_path):
    """The report describes the Scans after the move; its heading must not pass a Scan-8
    off as a Scan-16 (the upgrade is what happened to it)."""
    src = _save(tmp_path, b.scan8_sum(batch=4, steps=7))
    report = tmp_path / "r.json"
    result = cli("optimize", src, tmp_path / "o.onnx", "--target-opset", "17", "--report", report)
    assert result.code == 0, result.err
    assert "Scan-8 -> Scan-16" in result.out
    (scan,) = json.loads(report.read_text())["scans"]
    assert (scan["migrated_from"], scan["version"]) == (8, 16)
    plain = cli("optimize", src, tmp_path / "p.onnx")  # no migration: nothing to annotate
    assert plain.code == 0 and "->" not in plain.out.splitlines()[0]


def test_pass_option_sets_a_pass_tunable_and_unknown_keys_are_usage_errors(cli, tmp_path):
    src = _save(tmp_path, b.scan9_sum(steps=3))
    default = cli("optimize", src, tmp_path / "d.onnx")
    assert default.code == 0 and "unroll        applied" in default.out, default.out
    bounded = cli("optimize", src, tmp_path / "b.onnx", "--pass-option", "unroll_max_nodes=2")
    assert bounded.code == 0, bounded.err
    assert "over unroll_max_nodes 2" in " ".join(bounded.out.split())  # however the report wraps it
    for bad, why in (("nope=1", "KEY one of"), ("unroll_max_nodes=abc", "not an integer"),
                     ("unroll_max_nodes", "KEY one of"), ("vectorize_max_bytes=-1", "0 or more")):
        result = cli("optimize", src, tmp_path / "x.onnx", "--pass-option", bad)
        assert result.code == 2 and why in result.err and not (tmp_path / "x.onnx").exists()


def test_inspect_verdicts_follow_the_cost_policy(cli, tmp_path):
    """inspect says "would apply" only where optimize's policy would; a match the policy
    declines says so with the prediction (a tanh RNN at I=H=8, dynamic T and B: the native RNN
    is modelled faster at small batches only, so it would be dispatched on the batch; the
    hoisted loop is predicted slower; with shapes
    declared, the measured verdicts are tests/test_tune.py's)."""
    import onnx
    from test_cost import rnn_scan

    model = tmp_path / "rnn8.onnx"
    onnx.save(rnn_scan(batch="B", steps="T", hidden=8, inputs=8), model)
    default = cli("inspect", model, "--json")
    assert default.code == 0, default.err
    (scan,) = json.loads(default.out)["scans"]
    # modelled faster at small batches only: optimize writes it behind a run-time If on the batch
    assert scan["passes"]["fuse"].startswith("would apply: the batch is unknown: native expected")
    assert "T, B unknown" in scan["passes"]["fuse"] and "run-time If on the batch" in scan["passes"]["fuse"]
    assert scan["passes"]["hoist"].startswith("matches, not applied: predicted")
    portable = cli("inspect", model, "--json", "--target", "portable")
    (scan,) = json.loads(portable.out)["scans"]
    assert scan["passes"]["fuse"] == "would apply: target portable: applied whatever onnxruntime's speed"
