"""`scanopt upgrade` end to end, and `scanopt optimize --target-opset`."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from onnx import helper as h

from builders import vi
from equivalence import assert_equivalent
from scanopt.validate import default_opset
from test_upgrade import bidaf_like, const, gemm_model, sum_model


@pytest.fixture
def bidaf(tmp_path):
    path = tmp_path / "bidaf.onnx"
    onnx.save(bidaf_like(batch="batch", steps="seq", lens=True), path)
    return path


def test_upgrade_writes_a_verified_model_at_the_target(cli, bidaf, tmp_path):
    out = tmp_path / "out.onnx"
    result = cli("upgrade", "--target-opset", "17", bidaf, out, "--engine", "both")
    assert result.code == 0, result.err
    assert "opset 8 -> 17" in result.out
    assert "scan8: strategy (b): one Scan-9 over time" in result.out
    assert re.search(r"verification: equivalent on \d+ input set\(s\) with both", result.out), result.out
    upgraded = onnx.load(out)
    assert default_opset(upgraded) == 17
    assert [v.SerializeToString() for v in upgraded.graph.input] == [
        v.SerializeToString() for v in onnx.load(bidaf).graph.input
    ]
    assert_equivalent(onnx.load(bidaf), upgraded)


def test_upgrade_report_json_lists_the_strategy_per_node(cli, tmp_path):
    src, out, report = tmp_path / "g.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(gemm_model(lens=True), src)
    result = cli("upgrade", "--target-opset", "13", src, out, "--report", report, "-q")
    assert result.code == 0 and result.out == ""
    data = json.loads(report.read_text())
    assert data["source_opset"] == 8 and data["target_opset"] == 13
    (scan,) = data["scans"]
    assert scan["node"] == "scan8" and scan["applied"]
    assert scan["detail"].startswith("strategy (c)") and "not (b): Gemm" in scan["detail"]
    assert data["verification"]["passed"] is True
    assert data["op_changes"]["Scan"] == {"before": 1, "after": 2}


def test_upgrade_strategy_flag(cli, bidaf, tmp_path):
    out = tmp_path / "c.onnx"
    result = cli("upgrade", "--target-opset", "11", bidaf, out, "--strategy", "c")
    assert result.code == 0, result.err
    assert "strategy (c)" in result.out
    assert_equivalent(onnx.load(bidaf), onnx.load(out))


@pytest.mark.parametrize("argv,message", [
    (["--target-opset", "8"], "out of range"),
    (["--target-opset", "99"], "out of range"),
    (["--target-opset", "13", "--strategy", "a"], "strategy (a) needs batch 1"),
])
def test_upgrade_refusals_exit_2_and_write_nothing(cli, bidaf, tmp_path, argv, message):
    out = tmp_path / "never.onnx"
    result = cli("upgrade", *argv, bidaf, out)
    assert result.code == 2
    assert message in result.err and len(result.err.strip().splitlines()) == 1
    assert not out.exists()


def test_upgrade_needs_a_target(cli, bidaf, tmp_path):
    result = cli("upgrade", bidaf, tmp_path / "x.onnx")
    assert result.code == 2 and "--target-opset" in result.err


def test_converter_failure_exits_2_and_writes_nothing(cli, tmp_path):
    model = sum_model(batch=2, steps=3)
    model.graph.node.append(h.make_node("BatchNormalization", ["y", "g", "g", "g", "g"], ["bn"], spatial=0))
    model.graph.initializer.append(const("g", np.ones((3, 2), np.float32)))
    model.graph.output.append(vi("bn", [2, 3, 2]))
    src, out = tmp_path / "bn.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    result = cli("upgrade", "--target-opset", "12", src, out)
    assert result.code == 2
    assert "onnx.version_converter cannot convert the model from opset 8 to 12" in result.err
    assert "spatial" in result.err
    assert not out.exists()


def test_failed_verification_exits_1_and_writes_nothing(cli, bidaf, tmp_path, monkeypatch):
    import scanopt.verify as verify

    real = verify.compare_models

    def wrong(original, candidate, **kwargs):
        broken = onnx.ModelProto()
        broken.CopyFrom(candidate)
        tanh = next(n for g in [broken.graph] for n in g.node if n.op_type == "Scan")
        body = next(a.g for a in tanh.attribute if a.name == "body")
        next(n for n in body.node if n.op_type == "Tanh").op_type = "Sigmoid"
        return real(original, broken, **kwargs)

    monkeypatch.setattr(verify, "compare_models", wrong)
    out = tmp_path / "never.onnx"
    result = cli("upgrade", "--target-opset", "13", bidaf, out)
    assert result.code == 1
    assert "is not equivalent to the original" in result.err and "nothing written" in result.err
    assert not out.exists()


def test_same_file_needs_in_place(cli, bidaf):
    result = cli("upgrade", "--target-opset", "13", bidaf, bidaf)
    assert result.code == 2 and "--in-place" in result.err
    result = cli("upgrade", "--target-opset", "13", bidaf, bidaf, "--in-place", "-q")
    assert result.code == 0 and default_opset(onnx.load(bidaf)) == 13


def test_optimize_keeps_scan8_without_a_target_and_says_why(cli, bidaf, tmp_path):
    out = tmp_path / "o.onnx"
    result = cli("optimize", bidaf, out, "-v")
    assert result.code == 0
    assert "upgrade       skipped: kept as Scan-8" in result.out and "--target-opset N" in result.out
    assert default_opset(onnx.load(out)) == 8


def test_optimize_with_target_opset_migrates(cli, bidaf, tmp_path):
    out = tmp_path / "o.onnx"
    result = cli("optimize", bidaf, out, "--target-opset", "14", "--skip", "fuse")  # else it fuses into RNN first
    assert result.code == 0, result.err
    assert "upgrade       applied: strategy (b)" in result.out
    assert "verification: opset 8 -> 14: equivalent" in result.out
    assert default_opset(onnx.load(out)) == 14
    assert_equivalent(onnx.load(bidaf), onnx.load(out))


def test_help_describes_the_strategies(cli):
    result = cli("upgrade", "--help")
    assert result.code == 0
    assert "(a) batch 1 without sequence_lens" in result.out and "--target-opset N" in result.out


def test_a_target_no_engine_can_run_exits_1_cannot_verify(cli, tmp_path):
    """GlobalLpPool has no kernel at opset 22+ in onnxruntime (up to at least 1.32) nor in onnx's
    reference: the migrated model cannot be checked, which is not bad input."""
    from builders import ort_refuses

    graph = h.make_graph([h.make_node("GlobalLpPool", ["x"], ["y"])], "g", [vi("x", [1, 2, 3, 3])], [vi("y", [1, 2, 1, 1])])
    newer = h.make_model(graph, opset_imports=[h.make_opsetid("", 22)], ir_version=8)
    if not ort_refuses(newer):
        pytest.skip("the installed onnxruntime runs GlobalLpPool-22")
    src, out = tmp_path / "glp.onnx", tmp_path / "glp22.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 8)], ir_version=4), src)
    result = cli("upgrade", "--target-opset", "22", src, out)
    assert result.code == 1, result.err
    assert "cannot verify" in result.err and "reference executor cannot load" in result.err
    assert not out.exists()
