"""scanopt.optimize keeps its contract (issue 22): a path or a proto, typed options, every
invalid argument a ScanoptError naming the fix, and the caller's proto never modified."""

from __future__ import annotations

import os
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import builders as b
import scanopt
from equivalence import assert_equivalent, top_ops
from scanopt.errors import InvalidArgumentError, ScanoptError
from scanopt.options import known_options

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")


def _sample(name: str) -> onnx.ModelProto:
    return onnx.load(os.path.join(MODELS, name))


def _big_weight_rnn() -> onnx.ModelProto:
    """A tanh RNN Scan whose W and R (16 KiB each) go to an external data file."""
    rng = np.random.default_rng(0)
    body = h.make_graph(
        [h.make_node("MatMul", ["x_t", "W"], ["xw"]), h.make_node("MatMul", ["h_in", "R"], ["hr"]),
         h.make_node("Add", ["xw", "hr"], ["pre"]), h.make_node("Tanh", ["pre"], ["h_out"]),
         h.make_node("Identity", ["h_out"], ["y_t"])],
        "body", [h.make_tensor_value_info("h_in", TP.FLOAT, [1, 64]), h.make_tensor_value_info("x_t", TP.FLOAT, [1, 64])],
        [h.make_tensor_value_info("h_out", TP.FLOAT, [1, 64]), h.make_tensor_value_info("y_t", TP.FLOAT, [1, 64])])
    graph = h.make_graph(
        [h.make_node("Scan", ["h0", "X"], ["h_n", "Y"], name="rnn", num_scan_inputs=1, body=body)], "main",
        [h.make_tensor_value_info("h0", TP.FLOAT, [1, 64]), h.make_tensor_value_info("X", TP.FLOAT, ["T", 1, 64])],
        [h.make_tensor_value_info("h_n", TP.FLOAT, [1, 64]), h.make_tensor_value_info("Y", TP.FLOAT, ["T", 1, 64])],
        initializer=[numpy_helper.from_array((rng.standard_normal((64, 64)) * 0.1).astype(np.float32), name)
                     for name in ("W", "R")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


# --- model_or_path -------------------------------------------------------------------


def test_a_path_str_or_pathlike_gives_what_the_loaded_proto_gives(tmp_path):
    path = os.path.join(MODELS, "scan_rnn.onnx")
    portable = {"target": "portable"}
    from_proto, _ = scanopt.optimize(scanopt.load_model(path), verify=False, options=portable)
    for given in (path, tmp_path.__class__(path)):
        from_path, report = scanopt.optimize(given, verify=False, options=portable)
        assert from_path.SerializeToString() == from_proto.SerializeToString()
        assert report.modified and "RNN" in top_ops(from_path)


def test_a_path_with_external_data_is_optimized_and_returned_with_its_weights_inline(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save_model(_big_weight_rnn(), src, save_as_external_data=True, location="m.bin", size_threshold=1024)
    assert any(t.data_location == TP.EXTERNAL for t in onnx.load(str(src), load_external_data=False).graph.initializer)
    out, report = scanopt.optimize(src, options={"target": "portable"})
    assert report.modified and report.verification["passed"] is True
    assert not any(t.data_location == TP.EXTERNAL for t in out.graph.initializer)  # an ordinary proto
    assert "RNN" in top_ops(out)
    assert_equivalent(onnx.load(str(src)), out)


def test_a_missing_file_and_a_wrong_type_are_scanopt_errors(tmp_path):
    with pytest.raises(ScanoptError, match="no-such.onnx"):
        scanopt.optimize(tmp_path / "no-such.onnx")
    with pytest.raises(InvalidArgumentError, match="ModelProto or a file path, not bytes"):
        scanopt.optimize(b"\x08\x07")


# --- invalid arguments ----------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    ({"options": {"unrol_max": 0}}, "unknown option 'unrol_max' (did you mean 'unroll_max'?)"),
    ({"options": {"target": "onnxruntim"}}, "unknown target 'onnxruntim' (did you mean 'onnxruntime'?)"),
    ({"options": {"unroll_max": "4"}}, "'unroll_max' must be int, not str"),
    ({"options": {"unroll_max": True}}, "'unroll_max' must be int, not bool"),
    ({"options": {"unroll_max": -1}}, "'unroll_max' must be at least 0"),
    ({"options": {"tune": "yes"}}, "'tune' must be bool"),
    ({"options": {"threads": 0}}, "'threads' must be at least 1"),
    ({"options": {"vectorize_max_bytes": 1.5}}, "'vectorize_max_bytes' must be int"),
    ({"options": [("unroll_max", 2)]}, "options must be a dict"),
    ({"engine": "onnxruntime"}, "unknown engine 'onnxruntime' (did you mean 'ort'?)"),
    ({"engine": "refrence"}, "unknown engine 'refrence' (did you mean 'reference'?)"),
    ({"seeds": 0}, "seeds must be a whole number of at least 1, not 0"),
    ({"seeds": True}, "seeds must be a whole number"),
    ({"seeds": 1.5}, "seeds must be a whole number"),
    ({"passes": ["fusee"]}, "passes: unknown pass 'fusee' (did you mean 'fuse'?)"),
    ({"skip": "unrol"}, "skip: unknown pass 'unrol' (did you mean 'unroll'?)"),
    ({"passes": 3}, "passes must be a list of pass names"),
    ({"verify": "no"}, "verify must be True or False"),
    ({"inputs": [1, 2]}, "inputs must be a dict"),
    ({"inputs": []}, "inputs must be a dict"),
    ({"input_shapes": {"X": [2, "T"]}}, "input_shapes['X'] must be a list of whole numbers"),
    ({"input_shapes": {"X0": [1, 2]}}, "'X0': the model has no such input (did you mean 'X'?)"),
    ({"input_shapes": [2, 3]}, "input_shapes must be a dict"),
    ({"progress": "stderr"}, "progress must be callable"),
    ({"inputs": {"nope": np.zeros(2), "s0": np.zeros(2), "X": np.zeros((3, 2))}},
     "inputs: the model has no input 'nope'"),
    ({"inputs": {"X": np.zeros((3, 2), np.float32)}}, "inputs: no value for 's0'"),
    ({"inputs": {"s0": "abc", "X": np.zeros((3, 2), np.float32)}}, "inputs['s0'] must be a numeric or bool array"),
])
def test_every_invalid_argument_raises_before_any_work_naming_the_fix(kwargs, message):
    model = b.scan9_sum()
    before = model.SerializeToString()
    with pytest.raises(InvalidArgumentError, match=re.escape(message)) as caught:
        scanopt.optimize(model, **kwargs)
    assert isinstance(caught.value, ScanoptError) and isinstance(caught.value, ValueError)
    assert model.SerializeToString() == before


def test_valid_arguments_reach_the_pipeline(monkeypatch):
    import scanopt.pipeline

    seen = {}
    monkeypatch.setattr(scanopt.pipeline, "optimize", lambda model, **kw: seen.update(kw) or (model, None))
    scanopt.optimize(b.scan9_sum(), passes="fuse, cleanup", skip=("unroll",), input_shapes={"X": (3, 2)},
                     inputs={"X": np.zeros((3, 2), np.float32), "s0": np.zeros(2, np.float32)}, engine="both", seeds=3,
                     options={"unroll_max": 0, "tune": None, "threads": 2, "tune_seconds": 1.5})
    assert seen["passes"] == ["fuse", "cleanup"] and seen["skip"] == ["unroll"]
    assert seen["options"] == {"unroll_max": 0, "tune": None, "threads": 2, "tune_seconds": 1.5,
                               "input_shapes": {"X": [3, 2]}}
    assert seen["engine"] == "both" and seen["seeds"] == 3 and len(seen["inputs"]) == 1


def test_the_docstring_lists_every_option_key():
    for key in known_options():
        assert f"{key} (" in scanopt.optimize.__doc__ or f" {key}" in scanopt.optimize.__doc__, key


def test_every_option_has_a_type_and_a_help_line():
    for spec in known_options().values():
        assert spec.types and len(spec.doc) > 10, spec.key


# --- the caller's proto is never modified ----------------------------------------------


CASES = [
    ("scan8_sum.onnx", {"target_opset": 17}),  # gained an ai.scanopt.hold opset import (issue 22)
    ("scan8_sum.onnx", {"target_opset": 17, "target": "portable"}),
    ("scan8_sum_seqlens.onnx", {"target_opset": 13, "upgrade_strategy": "c"}),
    ("scan8_sum.onnx", {}),
    ("scan_rnn.onnx", {}),
    ("scan_rnn.onnx", {"target": "portable"}),
    ("scan_lstm.onnx", {"fuse_layout": 1}),
    ("scan_short_static.onnx", {"unroll_max": 8}),
    ("scan_short_static.onnx", {"unroll_max": 0}),
    ("scan_nested.onnx", {"target": "portable", "unroll_max": 8}),
    ("scan_axes_directions.onnx", {"vectorize_max_bytes": 1 << 10}),
    ("scan9_sum.onnx", {"unroll_max_nodes": 1, "unroll_max_bytes": 1}),
    ("scan_gru.onnx", {"measured": {("fuse", "gru"): 0.5}}),
]


@pytest.mark.parametrize("verify", [True, False], ids=["verified", "unverified"])
@pytest.mark.parametrize("name, options", CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_the_callers_proto_is_never_modified(name, options, verify):
    model = _sample(name)
    before = model.SerializeToString()
    out, report = scanopt.optimize(model, options=options, verify=verify, seeds=1)
    assert model.SerializeToString() == before
    if report.modified:
        assert out is not model
        out.graph.node[0].name += "_touched"  # the result shares nothing with the input
        assert model.SerializeToString() == before


def test_a_failed_rewrite_rolled_back_leaves_the_callers_proto_as_it_was(monkeypatch):
    """Blame runs both models with extra outputs listed on the caller's proto, then removes them."""
    from scanopt import verify as verify_module

    model = _sample("scan_rnn.onnx")
    before = model.SerializeToString()
    real = verify_module.compare_models
    calls = []

    def first_fails(original, candidate, **kwargs):
        outcome = real(original, candidate, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            outcome.comparisons[0].checks[0].passed = False
        return outcome

    monkeypatch.setattr(verify_module, "compare_models", first_fails)
    scanopt.optimize(model, options={"target": "portable"}, seeds=1)
    assert len(calls) > 1 and model.SerializeToString() == before


def test_an_unchanged_model_is_returned_as_the_very_same_object():
    model = b.no_scan_model()
    out, report = scanopt.optimize(model)
    assert out is model and not report.modified


def test_old_pass_result_name_warns_and_is_the_scan_pass_result():
    with pytest.warns(DeprecationWarning, match="ScanPassResult"):
        old = scanopt.PassResult
    assert old is scanopt.ScanPassResult
    with pytest.warns(DeprecationWarning):
        from scanopt.pass_api import PassResult  # noqa: F401
