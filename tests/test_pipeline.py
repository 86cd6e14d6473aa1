"""The pipeline: pass order, fixed point, outcomes, untouched models returned as is,
verification with per-node rollback."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

import builders as b
import scanopt
from scanopt import pass_api
from scanopt.errors import ScanoptError
from scanopt.pass_api import Match, ScanPass, Skip
from scanopt.pipeline import PIPELINE_ORDER, applied_keys, optimize, select_passes


class _RenameB(ScanPass):
    """Test pass: appends _b to a Scan's name once."""

    name = "canonicalize"  # occupies a pipeline slot after "upgrade"
    summary = "test"

    def match(self, node, view, level, ctx):
        return Skip("already renamed") if "_b" in node.name else Match()

    def rewrite(self, node, match, level, ctx):
        node.name += "_b"
        return "renamed to " + node.name


class _RenameA(ScanPass):
    """Test pass that runs before _RenameB and applies only after it: needs a second round."""

    name = "upgrade"
    summary = "test"

    def match(self, node, view, level, ctx):
        return Match() if node.name.endswith("_b") else Skip("waits for _b")

    def rewrite(self, node, match, level, ctx):
        node.name += "_a"
        return "renamed to " + node.name


class _NegateScanInput(ScanPass):
    """A deliberately wrong rewrite: feeds -X to the Scan named in ``targets``."""

    name = "fuse"
    summary = "test (wrong on purpose)"
    targets = ("scan_sum", "scan_sum_b")

    def match(self, node, view, level, ctx):
        if node.name not in self.targets or any(n.op == "Neg" for n in level.graph.nodes):
            return Skip("not a target")
        return Match()

    def rewrite(self, node, match, level, ctx):
        x = node.inputs[-1]
        neg = gs.Variable(ctx.names.fresh("neg_x"), dtype=x.dtype, shape=x.shape)
        level.graph.nodes.append(gs.Node("Neg", inputs=[x], outputs=[neg]))
        node.inputs[-1] = neg
        return "negated the scan input"


def _use_passes(monkeypatch, **replacements):
    """The registry with some passes replaced by test passes (for this test only)."""
    original = pass_api.registered_passes()
    # a stand-in takes the place (order, kind) of the pass it stands in for
    replacements = {name: type(cls.__name__, (cls,), {"order": original[name].order, "kind": original[name].kind})
                    if name in original else cls for name, cls in replacements.items()}
    registry = {**original, **replacements}
    monkeypatch.setattr(pass_api, "_REGISTRY", registry)
    return registry


def _independent_scans(names: list[str], outputs) -> onnx.ModelProto:
    """scan9_sum's running-sum Scan once per name, each with its own (state, Y) output names."""
    model = b.scan9_sum()
    template = model.graph.node.pop()
    del model.graph.output[:]
    for name, (state, y) in zip(names, outputs):
        node = model.graph.node.add()
        node.CopyFrom(template)
        node.name = name
        del node.output[:]
        node.output.extend([state, y])
        model.graph.output.extend([b.vi(state, [2]), b.vi(y, [3, 2])])
    return model


@pytest.fixture
def test_passes(monkeypatch):
    return _use_passes(monkeypatch, upgrade=_RenameA, canonicalize=_RenameB, fuse=_NegateScanInput)


def test_select_passes_orders_by_pipeline_not_by_request(test_passes):
    names = [p.name for p in select_passes(["cleanup", "canonicalize", "upgrade"])]
    assert names == ["upgrade", "canonicalize", "cleanup"]
    assert names == [n for n in PIPELINE_ORDER if n in names]


def test_select_passes_skip_and_unknown(test_passes):
    assert "cleanup" not in [p.name for p in select_passes(skip=["cleanup"])]
    with pytest.raises(ScanoptError, match="unknown pass nope"):
        select_passes(["nope"])


def test_fixed_point_reruns_passes_until_nothing_changes(test_passes):
    model = b.scan9_sum()
    out, report = optimize(model, passes=["upgrade", "canonicalize"], verify=False)
    assert report.rounds == 3  # round 1: B; round 2: A; round 3: nothing
    assert [n.name for n in out.graph.node] == ["scan_sum_b_a"]
    applied = [(o.pass_name, o.detail) for o in report.outcomes if o.applied]
    assert applied == [("canonicalize", "renamed to scan_sum_b"), ("upgrade", "renamed to scan_sum_b_a")]
    assert model.graph.node[0].name == "scan_sum"  # the input proto is untouched


def test_untouched_model_is_returned_as_the_same_object():
    model = b.scan9_sum()
    out, report = optimize(model, passes=["cleanup"])
    assert out is model and not report.modified
    assert report.scans[0]["node"] == "scan_sum"


def test_model_without_scan_reports_so():
    model = b.no_scan_model()
    out, report = optimize(model)
    assert out is model and report.scans == []
    assert "no Scan nodes" in report.format()


def test_cleanup_removes_a_dead_scan_and_says_so():
    model = b.scan9_sum()
    model.graph.output.pop()  # nobody reads Y ...
    model.graph.output.pop()  # ... nor s_final
    model.graph.output.append(b.vi("X", [3, 2]))
    out, report = optimize(model, passes=["cleanup"], verify=False)
    assert [n.op_type for n in out.graph.node] == []
    assert any(o.pass_name == "cleanup" and o.applied and "removed" in o.detail for o in report.outcomes)
    assert report.op_changes() == {"Add": (1, 0), "Identity": (1, 0), "Scan": (1, 0)}


def test_wrong_rewrite_is_rolled_back(test_passes):
    model = b.scan9_sum()
    out, report = optimize(model, passes=["fuse"], seeds=1)
    assert out is model and not report.modified
    assert report.verification["passed"] is False
    assert report.verification["rolled_back"] == ["fuse on scan_sum"]


def test_rollback_is_per_node(test_passes):
    """Two Scans renamed correctly, one of them also broken: only the break is undone."""
    model = b.scan9_sum()
    second = b.scan9_sum().graph.node[0]
    second.name = "other_scan"
    del second.output[:]
    second.output.extend(["s_final2", "Y2"])
    model.graph.node.append(second)
    model.graph.output.extend([b.vi("s_final2", [2]), b.vi("Y2", [3, 2])])
    out, report = optimize(model, passes=["canonicalize", "fuse"], seeds=1)
    assert report.modified
    assert report.verification["rolled_back"] == ["fuse on scan_sum_b"]
    assert sorted(n.name for n in out.graph.node) == ["other_scan_b", "scan_sum_b"]
    assert "Neg" not in [n.op_type for n in out.graph.node]
    assert ("canonicalize", "scan_sum") in applied_keys(report)


def test_correct_rewrite_is_verified(test_passes):
    out, report = optimize(b.scan9_sum(), passes=["canonicalize"], seeds=2)
    assert report.verification["passed"] is True
    assert out.graph.node[0].name == "scan_sum_b"


def test_library_api_is_exported():
    from scanopt.api import optimize as checked_optimize

    assert scanopt.optimize is checked_optimize
    model = b.scan9_sum(weight=np.ones(2))
    out, report = scanopt.optimize(model)
    assert isinstance(report, scanopt.Report)


class _DropOutputType(ScanPass):
    """A deliberately wrong rewrite that changes the model's interface (Y's dtype)."""

    name = "fuse"
    summary = "test (changes the signature)"

    def match(self, node, view, level, ctx):
        return Match() if node.outputs[1].dtype != np.float64 else Skip("done")

    def rewrite(self, node, match, level, ctx):
        y = node.outputs[1]
        raw = gs.Variable(ctx.names.fresh("y_raw"), dtype=y.dtype, shape=y.shape)
        node.outputs[1] = raw
        level.graph.nodes.append(gs.Node("Cast", inputs=[raw], outputs=[y], attrs={"to": 11}))
        y.dtype = np.float64
        return "cast Y to double"


def test_signature_change_is_rolled_back(monkeypatch):
    _use_passes(monkeypatch, fuse=_DropOutputType)
    model = b.scan9_sum()
    out, report = optimize(model, passes=["fuse"], seeds=1)
    assert out is model
    assert report.verification["rolled_back"] == ["fuse on scan_sum"]


def test_unverifiable_model_is_not_rewritten(test_passes):
    """A model no synthesized input runs cannot be verified: nothing unverified is written."""
    model = b.scan9_sum()
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_value = 5  # the body adds [2] to it
    # the body leaves x's shape open (declaring [2] would contradict X, refused as bad input)
    model.graph.node[0].attribute[0].g.input[1].type.tensor_type.ClearField("shape")
    out, report = optimize(model, passes=["canonicalize"])
    assert out is model and not report.modified
    assert report.verification["summary"].startswith("cannot verify")
    out, report = optimize(model, passes=["canonicalize"], verify=False)
    assert out.graph.node[0].name == "scan_sum_b"


def test_an_input_without_shape_gets_one_from_the_scan_body(test_passes):
    model = b.scan9_sum()
    model.graph.input[1].type.tensor_type.ClearField("shape")
    out, report = optimize(model, passes=["canonicalize"])
    assert report.modified and report.verification["passed"] is True


def test_blame_names_the_node_whose_outputs_differ_from_right_inputs(test_passes):
    from scanopt.pipeline import _blame, _run_passes

    model = _independent_scans(["scan_sum", "other_scan"], [("s_final", "Y"), ("s_final2", "Y2")])
    candidate, report = _run_passes(model, select_passes(["fuse"]), {}, frozenset(), None)
    assert applied_keys(report) == [("fuse", "scan_sum")]
    assert _blame(model, candidate, report, None, "auto", 1) == [("fuse", "scan_sum")]
    assert [o.name for o in model.graph.output] == ["s_final", "Y", "s_final2", "Y2"]  # probes removed


class _CopyScanInput(ScanPass):
    """Feeds each Scan a copy of its X (Identity), and scan_3 a negated one (wrong)."""

    name = "fuse"
    summary = "test"

    def match(self, node, view, level, ctx):
        return Skip("done") if node.inputs[-1].inputs and node.inputs[-1].inputs[0].op in ("Identity", "Neg") else Match()

    def rewrite(self, node, match, level, ctx):
        x = node.inputs[-1]
        copy = gs.Variable(ctx.names.fresh("x_copy"), dtype=x.dtype, shape=x.shape)
        op = "Neg" if node.name == "scan_3" else "Identity"
        level.graph.nodes.append(gs.Node(op, inputs=[x], outputs=[copy]))
        node.inputs[-1] = copy
        return "copied the scan input"


def test_one_failing_rewrite_among_many_costs_a_constant_number_of_runs(monkeypatch):
    """Per-node blame: the pipeline runs a fixed number of times, not once per rewrite."""
    from scanopt import pipeline

    _use_passes(monkeypatch, fuse=_CopyScanInput)
    model = _independent_scans([f"scan_{k}" for k in range(8)], [(f"s_{k}", f"Y_{k}") for k in range(8)])
    runs = []
    real = pipeline._run_passes
    monkeypatch.setattr(pipeline, "_run_passes", lambda *a, **k: runs.append(1) or real(*a, **k))
    out, report = optimize(model, passes=["fuse"], seeds=1)
    assert report.verification["rolled_back"] == ["fuse on scan_3"]
    assert report.verification["seconds"] > 0
    assert [n.op_type for n in out.graph.node].count("Identity") == 7
    assert "Neg" not in [n.op_type for n in out.graph.node]
    assert len(runs) == 3  # the candidate, the suspect against the rest, the final model
