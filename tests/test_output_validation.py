"""scanopt never writes a model it would refuse to read: omitted (empty-named) Scan/Loop
outputs survive every pass that rebinds them, and an invalid optimized model is rolled
back to the original with the reason reported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

import builders as b
from scanopt import load_model
from scanopt.pass_api import Match, ScanPass, Skip
from scanopt.pipeline import optimize
from test_pipeline import _use_passes

MODELS = Path(__file__).resolve().parent.parent / "models"


def blank_output(model: onnx.ModelProto, which: str) -> onnx.ModelProto:
    """A copy whose first top-level Scan/Loop has one ``which`` ("state" or "scan_out")
    output omitted (empty name): one that nothing reads, or a graph output dropped."""
    model = onnx.load_from_string(model.SerializeToString())
    graph_outputs = [o.name for o in model.graph.output]
    read = {name for node in model.graph.node for name in node.input}
    node = next(n for n in model.graph.node if n.op_type in ("Scan", "Loop"))
    body = next(a.g for a in node.attribute if a.name == "body")
    if node.op_type == "Scan":
        states = len(body.input) - next(a.i for a in node.attribute if a.name == "num_scan_inputs")
    else:
        states = len(body.input) - 2
    slots = range(states) if which == "state" else range(states, len(node.output))
    for i in slots:
        name = node.output[i]
        dropped = name in graph_outputs and len(graph_outputs) > 1
        if name and name not in read and (dropped or name not in graph_outputs):
            node.output[i] = ""
            kept = [o for o in model.graph.output if o.name != name]
            del model.graph.output[:]
            model.graph.output.extend(kept)
            return model
    raise AssertionError(f"no {which} output to omit")


CASES = [  # (pass, model, which output is omitted, options)
    ("unroll", "heldout/unused_scan_output_empty_name.onnx", None, {"unroll_max": 8}),
    ("unroll", "heldout/unused_scan_output_empty_name.onnx", "state", {"unroll_max": 8}),
    ("canonicalize", "heldout/unused_scan_output_empty_name.onnx", "state", {}),
    ("fuse", "cells/coupled_lstm.onnx", "state", {}),
    ("fuse", "cells/coupled_lstm.onnx", "scan_out", {}),
    ("hoist", "cells/lstm_fp16_weights.onnx", "state", {}),
    ("hoist", "cells/lstm_fp16_weights.onnx", "scan_out", {}),
    ("linrec", "heldout/digit_and_empty_dim_names.onnx", "state", {}),
    ("linrec", "heldout/digit_and_empty_dim_names.onnx", "scan_out", {}),
    ("vectorize", "heldout/int64_map_argmax.onnx", "scan_out", {}),
    ("vectorize", "heldout/passthrough_outputs.onnx", "state", {}),
    ("distances", "skl_knn_regressor.onnx", "state", {}),
    # onnxruntime 1.32 crashes running a Loop with an output omitted: engine auto takes the reference
    ("loop_to_scan", "loops/dyn_while_rnn_sum.onnx", "state", {}),
    ("upgrade", "scan8_sum.onnx", "state", {"target_opset": 17}),
    ("upgrade", "scan8_sum.onnx", "scan_out", {"target_opset": 17}),
]


@pytest.mark.parametrize("pass_name,path,which,options", CASES, ids=lambda v: v if isinstance(v, str) else "")
def test_an_omitted_output_stays_omitted(pass_name, path, which, options, tmp_path):
    model = onnx.load(str(MODELS / path))
    if which is not None:
        model = blank_output(model, which)
    onnx.checker.check_model(model)  # the input is valid
    out, report = optimize(model, passes=[pass_name], seeds=1, options=options)
    assert report.modified, report.format(verbose=True)  # the pass applied and nothing was rolled back
    assert report.verification["passed"] is True
    for node in out.graph.node:  # only an omitted optional output may be nameless, never a new node's only one
        assert any(node.output) or not node.output, node
    onnx.checker.check_model(out, full_check=True)
    onnx.save(out, str(tmp_path / "out.onnx"))
    load_model(str(tmp_path / "out.onnx"))  # scanopt re-reads what it wrote


def test_unroll_of_an_unused_empty_named_output_adds_no_stack_for_it():
    model = onnx.load(str(MODELS / "heldout/unused_scan_output_empty_name.onnx"))
    out, report = optimize(model, passes=["unroll"], seeds=1, options={"unroll_max": 8})
    assert report.modified
    assert [n.op_type for n in out.graph.node].count("Concat") == 1  # Y's only: none for the omitted output
    assert all(name for n in out.graph.node for name in n.output)


class _DanglingInput(ScanPass):
    """A broken rewrite: the Scan reads a value nothing defines (onnx.checker rejects it)."""

    name = "fuse"
    summary = "test (invalid on purpose)"

    def match(self, node, view, level, ctx):
        return Skip("done") if node.inputs[-1].name == "nowhere" else Match()

    def rewrite(self, node, match, level, ctx):
        x = node.inputs[-1]
        node.inputs[-1] = gs.Variable("nowhere", dtype=x.dtype, shape=x.shape)
        return "read a dangling value"


class _NamelessExtraOutput(ScanPass):
    """A broken rewrite that still computes the right outputs: an extra Identity writes a
    value with an empty name (the reference evaluator runs it, onnx.checker rejects it)."""

    name = "fuse"
    summary = "test (invalid on purpose)"

    def match(self, node, view, level, ctx):
        return Skip("done") if any(n.op == "Identity" for n in level.graph.nodes) else Match()

    def rewrite(self, node, match, level, ctx):
        level.graph.nodes.append(gs.Node("Identity", inputs=[node.inputs[-1]], outputs=[gs.Variable("")]))
        return "added a nameless value"


@pytest.mark.parametrize("broken,verify,reason", [
    (_DanglingInput, False, "reads 'nowhere', which nothing defines"),  # scanopt's own check
    (_NamelessExtraOutput, True, "onnx.checker rejects it"),  # the reference evaluator verifies it
    (_NamelessExtraOutput, False, "onnx.checker rejects it"),
])
def test_an_invalid_optimized_model_is_rolled_back_and_reported(monkeypatch, broken, verify, reason):
    _use_passes(monkeypatch, fuse=broken)
    model = b.scan9_sum()
    out, report = optimize(model, passes=["fuse"], seeds=1, verify=verify, engine="reference")
    assert out is model and not report.modified
    assert report.verification["passed"] is False
    assert report.verification["rolled_back"] == ["fuse on scan_sum"]
    text = " ".join(report.format().split())
    assert "rolled back every rewrite: optimized model: " in text and reason in text, text


SCRIPT = """
import sys
import onnx_graphsurgeon as gs
from scanopt import pass_api
from scanopt.cli import main
sys.path.insert(0, {tests!r})
from test_output_validation import _NamelessExtraOutput
pass_api._REGISTRY = dict(pass_api.registered_passes(), fuse=_NamelessExtraOutput)
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("strict", [False, True])
def test_cli_writes_the_original_or_nothing_when_the_result_is_invalid(tmp_path, strict):
    source, target = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(b.scan9_sum(), str(source))
    script = SCRIPT.format(tests=str(Path(__file__).resolve().parent))
    args = [sys.executable, "-c", script, "optimize", str(source), str(target), "--passes", "fuse", "--seeds", "1",
            "--engine", "reference"]
    done = subprocess.run(args + (["--strict"] if strict else []), capture_output=True, text=True)
    assert "onnx.checker rejects it" in done.stdout + done.stderr
    if strict:
        assert done.returncode == 1 and not target.exists()
    else:
        assert done.returncode == 0, done.stderr
        assert target.read_bytes() == source.read_bytes()  # the original, unchanged


def test_a_valid_result_is_written_as_optimized():
    """The check lets a valid rewrite through (the safety net is not a blanket rollback)."""
    model = b.scan9_sum()
    out, report = optimize(model, passes=["unroll"], seeds=1)
    assert out is not model and report.modified and report.verification["passed"] is True
    np.testing.assert_equal(len([n for n in out.graph.node if n.op_type == "Scan"]), 0)


def test_upgrade_of_an_invalid_result_exits_1_and_writes_nothing(cli, tmp_path, monkeypatch):
    """`upgrade` has no original to fall back to (the opset is what was asked): exit 1."""
    import scanopt.cli.upgrade_cmd as upgrade_cmd

    real = upgrade_cmd.migrate_verified

    def nameless(*args, **kwargs):
        migration = real(*args, **kwargs)
        migration.model.graph.node.add(op_type="Identity", input=[migration.model.graph.input[0].name], output=[""])
        return migration

    monkeypatch.setattr(upgrade_cmd, "migrate_verified", nameless)
    source, out = tmp_path / "in.onnx", tmp_path / "never.onnx"
    onnx.save(b.scan8_sum(), str(source))
    result = cli("upgrade", "--target-opset", "13", source, out)
    assert result.code == 1
    assert "upgraded model: onnx.checker rejects it" in result.err and "nothing written" in result.err
    assert not out.exists()


def test_a_loop_with_an_omitted_output_is_never_run_on_onnxruntime():
    """onnxruntime 1.32 dies (SIGSEGV) running such a Loop: engine auto takes the reference."""
    from scanopt.engines import ort_miscomputes

    model = blank_output(onnx.load(str(MODELS / "loops/dyn_while_rnn_sum.onnx")), "state")
    assert "Loop" in ort_miscomputes(model)
    assert ort_miscomputes(onnx.load(str(MODELS / "loops/dyn_while_rnn_sum.onnx"))) is None
