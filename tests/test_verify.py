"""The equivalence checker: tolerances, failure reports, engines, signatures."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import builders
import scanopt.verify as verify
from scanopt.errors import ScanoptError
from scanopt.feed_shapes import free_size
from scanopt.verify import TOLERANCES, SignatureMismatchError, compare_arrays, compare_models, tolerance


def perturbed(model: onnx.ModelProto, output: str, eps: float, elem=TP.FLOAT) -> onnx.ModelProto:
    """A copy of ``model`` whose ``output`` has ``eps`` added."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    for node in graph.node:
        node.output[:] = [f"{o}_raw" if o == output else o for o in node.output]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    graph.initializer.append(onnx.numpy_helper.from_array(np.array(eps, dtype), "eps"))
    graph.node.append(h.make_node("Add", [f"{output}_raw", "eps"], [output]))
    return copy


def mul_model(elem: int) -> onnx.ModelProto:
    """y = x * x over [N, 4]."""
    graph = h.make_graph(
        [h.make_node("Mul", ["x", "x"], ["y"])],
        "mul",
        [builders.vi("x", ["N", 4], elem)],
        [builders.vi("y", ["N", 4], elem)],
    )
    return builders.model(graph)


@pytest.fixture(scope="module")
def scan8():
    return builders.scan8_sum()


# -- pass and fail ------------------------------------------------------------------------


def seeded(result):
    """The comparisons on the seeds' feed sets (not the edge inputs verification adds)."""
    return [comp for comp in result.comparisons if not comp.inputs.startswith("edge: ")]


@pytest.mark.parametrize("engine", ["ort", "reference", "both", "auto"])
def test_identical_models_pass_with_zero_error(scan8, engine):
    result = compare_models(scan8, scan8, engine=engine, seeds=2)
    assert result.passed
    per_set = 4 if engine == "both" else 1
    assert len(seeded(result)) == 2 * per_set
    assert any(comp.inputs.startswith("edge: ") for comp in result.comparisons)  # issue 33's edge inputs too
    checks = [c for comp in result.comparisons for c in comp.checks]
    assert [c.name for c in checks[:2]] == ["s_final", "Y"]
    assert all(c.max_abs == 0 and c.max_rel == 0 for c in checks)
    assert "PASSED" in result.format()


@pytest.mark.parametrize("engine", ["ort", "reference"])
def test_perturbed_output_fails_naming_it_with_the_error_size(scan8, engine):
    # 0.05 is out of tolerance even for the largest synthesized sums (|Y| ~ 100: 1e-4 * 100)
    result = compare_models(scan8, perturbed(scan8, "Y", 0.05), engine=engine, seeds=3)
    assert not result.passed
    for comp in seeded(result):
        by_name = {c.name: c for c in comp.checks}
        assert by_name["s_final"].passed and by_name["s_final"].max_abs == 0
        y = by_name["Y"]
        assert not y.passed
        assert y.max_abs == pytest.approx(0.05, rel=1e-3)
        assert y.mismatches == int(np.prod(y.shape))  # every element moved
    failures = [f for f in result.failures() if "edge: " not in f]
    assert len(failures) == 3 and all(line.startswith("output 'Y' (seed ") for line in failures)
    assert "FAIL" in result.format() and "NOT equivalent: output 'Y'" in result.summary()


def test_user_tolerance_overrides_the_table_for_floats_only(scan8):
    candidate = perturbed(scan8, "Y", 1e-3)
    assert compare_models(scan8, candidate, seeds=1, atol=2e-3).passed
    assert not compare_models(scan8, candidate, seeds=1, atol=5e-4).passed
    check = compare_arrays("i", np.array([3, 4]), np.array([3, 5]), rtol=1.0, atol=10.0)
    assert not check.passed and (check.rtol, check.atol) == (0.0, 0.0)


# -- tolerances per dtype -----------------------------------------------------------------


def test_tolerance_table_orders_the_float_types():
    f16, f32, f64 = (tolerance(np.dtype(t)) for t in ("float16", "float32", "float64"))
    bf16 = tolerance(onnx.helper.tensor_dtype_to_np_dtype(TP.BFLOAT16))
    assert bf16 > f16 > f32 > f64 > (0.0, 0.0)
    for exact in ("int64", "int8", "uint32", "bool"):
        assert tolerance(np.dtype(exact)) == (0.0, 0.0)
        assert exact not in TOLERANCES


def test_same_perturbation_passes_in_float16_and_fails_in_float32():
    f16, f32 = mul_model(TP.FLOAT16), mul_model(TP.FLOAT)
    assert compare_models(f16, perturbed(f16, "y", 5e-4, TP.FLOAT16), seeds=2).passed
    assert not compare_models(f32, perturbed(f32, "y", 5e-4, TP.FLOAT), seeds=2).passed


def test_same_perturbation_passes_in_float32_and_fails_in_float64():
    f32, f64 = mul_model(TP.FLOAT), mul_model(TP.DOUBLE)
    assert compare_models(f32, perturbed(f32, "y", 1e-7, TP.FLOAT), seeds=2).passed
    result = compare_models(f64, perturbed(f64, "y", 1e-7, TP.DOUBLE), seeds=2)
    assert not result.passed
    check = result.comparisons[0].checks[0]
    assert check.dtype == "float64" and check.max_abs == pytest.approx(1e-7, rel=1e-6)
    assert (check.rtol, check.atol) == TOLERANCES["float64"]


def test_relative_tolerance_scales_with_the_value():
    big = np.array([1000.0], np.float32)
    assert compare_arrays("y", big, big + np.float32(0.05)).passed  # 5e-5 relative
    assert not compare_arrays("y", big, big + np.float32(0.5)).passed  # 5e-4 relative


# -- array comparison details -------------------------------------------------------------


def test_nan_in_the_same_place_is_equal_and_elsewhere_is_not():
    a = np.array([1.0, np.nan, np.inf], np.float32)
    assert compare_arrays("y", a, a.copy()).passed
    check = compare_arrays("y", a, np.array([np.nan, np.nan, np.inf], np.float32))
    assert not check.passed and check.mismatches == 1 and check.max_abs == np.inf
    assert check.worst_index == (0,)
    assert not compare_arrays("y", a, np.array([1.0, np.nan, -np.inf], np.float32)).passed


def test_shape_and_dtype_must_match_exactly():
    a = np.zeros((2, 3), np.float32)
    shape = compare_arrays("y", a, np.zeros((3, 2), np.float32))
    assert not shape.passed and "shape is (3, 2), expected (2, 3)" in shape.describe()
    dtype = compare_arrays("y", a, np.zeros((2, 3), np.float64))
    assert not dtype.passed and "dtype is float64" in dtype.describe()
    broadcastable = compare_arrays("y", np.zeros((1, 3), np.float32), np.zeros((3,), np.float32))
    assert not broadcastable.passed


def test_integers_and_bools_compare_exactly():
    big = np.array([2**62, 5], np.int64)
    assert compare_arrays("i", big, big.copy()).passed
    check = compare_arrays("i", big, big + np.array([1, 0]))  # lost in float64
    assert not check.passed and check.worst_index == (0,)
    assert not compare_arrays("b", np.array([True, False]), np.array([True, True])).passed


def test_worst_element_is_reported():
    expected = np.zeros((2, 3), np.float32)
    actual = expected.copy()
    actual[1, 2], actual[0, 0] = 0.5, 0.01
    check = compare_arrays("y", expected, actual)
    assert check.worst_index == (1, 2) and check.worst_values == (0.0, 0.5)
    assert "at (1, 2) (expected 0, got 0.5)" in check.describe()


# -- signatures ---------------------------------------------------------------------------


def test_signature_differences_are_clear_errors(scan8):
    renamed = onnx.ModelProto()
    renamed.CopyFrom(scan8)
    renamed.graph.output[1].name = "Y2"
    renamed.graph.node[0].output[1] = "Y2"
    message = "outputs only in the original: 'Y'; outputs only in the candidate: 'Y2'"
    with pytest.raises(SignatureMismatchError, match=message):
        compare_models(scan8, renamed)
    with pytest.raises(SignatureMismatchError, match="input 'x' is float in the original but double in the candidate"):
        compare_models(mul_model(TP.FLOAT), mul_model(TP.DOUBLE))
    ranked = mul_model(TP.FLOAT)
    ranked.graph.input[0].type.tensor_type.shape.dim.add().dim_value = 1
    with pytest.raises(SignatureMismatchError, match="input 'x' has rank 2 in the original but 3 in the candidate"):
        compare_models(mul_model(TP.FLOAT), ranked)


# -- engines ------------------------------------------------------------------------------


def test_both_reports_disagreement_between_engines(scan8, monkeypatch):
    """A reference engine that is off by 1 on Y shows up in the engine cross-checks."""
    real_prepare = verify.prepare

    def skewed_prepare(model, engine, **kwargs):
        runner = real_prepare(model, engine, **kwargs)
        if engine != "reference":
            return runner
        call = runner._call
        runner._call = lambda feeds: [v + 1 if n == "Y" else v for n, v in zip(runner.output_names, call(feeds))]
        return runner

    monkeypatch.setattr(verify, "prepare", skewed_prepare)
    result = compare_models(scan8, scan8, engine="both", seeds=1)
    assert not result.passed
    failed = sorted(comp.label for comp in seeded(result) if not comp.passed)
    assert failed == ["candidate: reference vs ort", "original: reference vs ort"]
    assert all("output 'Y'" in line for line in result.failures())


def test_each_model_is_loaded_once_whatever_the_seed_count(scan8, monkeypatch):
    calls = []
    real_prepare = verify.prepare
    monkeypatch.setattr(verify, "prepare", lambda *a, **k: calls.append(a[1]) or real_prepare(*a, **k))
    assert compare_models(scan8, scan8, engine="ort", seeds=5).passed
    assert calls == ["ort", "ort", "ort"]  # the original, the candidate, the original's float64 twin


def test_auto_falls_back_to_the_reference_when_onnxruntime_cannot_load(scan8):
    refused = builders.ort_unloadable(scan8)
    original = scan8 if refused.graph.input == scan8.graph.input else refused
    result = compare_models(original, refused, engine="auto", seeds=6)
    assert result.passed and result.engine == "reference"
    assert "onnxruntime cannot load" in result.notes[0]
    assert compare_models(scan8, scan8, engine="auto").engine == "ort"


def test_a_candidate_that_fails_to_run_is_a_failure_not_a_crash():
    model = mul_model(TP.FLOAT)
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    broken.graph.node.insert(0, h.make_node("Reshape", ["x", "shape"], ["x4"]))
    broken.graph.node[1].input[:] = ["x4", "x4"]
    broken.graph.initializer.append(builders.init("shape", np.array([free_size(0, 0), 4], np.int64)))
    result = compare_models(model, broken, engine="ort", seeds=3)  # N = 8, 1, then another size
    assert [comp.passed for comp in seeded(result)] == [True, False, False]
    assert "Reshape" in result.comparisons[1].error
    assert "ERROR" in result.format()


def reshaped_mul(target) -> onnx.ModelProto:
    """mul_model with x [N, 4] reshaped to ``target`` first."""
    model = mul_model(TP.FLOAT)
    model.graph.node.insert(0, h.make_node("Reshape", ["x", "shape"], ["x4"]))
    model.graph.node[1].input[:] = ["x4", "x4"]
    model.graph.initializer.append(builders.init("shape", np.array(target, np.int64)))
    return model


def test_a_reshape_target_binds_the_symbolic_dim():
    model = reshaped_mul([3, 4])  # only N = 3 runs
    result = compare_models(model, model, engine="ort", seeds=2)
    assert result.passed and result.sizes == {"seed 0": "N=3", "seed 1": "N=3"}


def test_an_original_that_runs_on_no_input_cannot_be_verified_and_asks_for_inputs():
    model = reshaped_mul([3, 5])  # 4N elements are never 15
    with pytest.raises(verify.CannotVerifyError, match="cannot verify: the original model fails on seed 0 at every size tried .*pass inputs it accepts with --inputs") as caught:
        compare_models(model, model, engine="ort")
    assert caught.value.exit_code == 1
    model = reshaped_mul([2, 6])
    feeds = {"x": np.ones((3, 4), np.float32)}
    result = compare_models(model, model, inputs=feeds)
    assert result.passed and [c.inputs for c in result.comparisons] == ["inputs"]


def test_given_input_sets_replace_seeds():
    model = mul_model(TP.FLOAT)
    sets = [{"x": np.full((1, 4), 2, np.float32)}, {"x": np.full((5, 4), 3, np.float32)}]
    result = compare_models(model, perturbed(model, "y", 1e-3), inputs=sets)
    assert [c.inputs for c in result.comparisons] == ["inputs #1", "inputs #2"]
    assert [c.checks[0].shape for c in result.comparisons] == [(1, 4), (5, 4)]
    with pytest.raises(ScanoptError, match="missing required input"):
        compare_models(model, model, inputs={})


def test_result_serializes_to_json_with_non_finite_errors_as_text():
    check = compare_arrays("y", np.array([1.0], np.float32), np.array([np.nan], np.float32))
    comparison = verify.Comparison("seed 0", ("original", "ort"), ("candidate", "ort"), [check])
    result = verify.VerifyResult("ort", [comparison])
    data = json.loads(json.dumps(result.to_dict()))
    assert data["passed"] is False
    output = data["comparisons"][0]["outputs"][0]
    assert output["max_abs"] == "inf" and output["name"] == "y" and output["worst_index"] == [0]
    assert data["comparisons"][0]["actual"] == {"model": "candidate", "engine": "ort"}


def test_bad_arguments_are_clear_errors(scan8):
    with pytest.raises(ScanoptError, match="unknown engine 'gpu'"):
        compare_models(scan8, scan8, engine="gpu")
    with pytest.raises(ScanoptError, match="at least 1"):
        compare_models(scan8, scan8, seeds=0)
    with pytest.raises(ScanoptError, match="negative"):
        compare_models(scan8, scan8, rtol=-1.0)


def test_auto_avoids_onnxruntime_where_it_miscomputes():
    """onnxruntime 1.31 returns zeros for a Scan body output that is a body input;
    "auto" must then verify with the reference executor."""
    import builders as b
    from scanopt.verify import compare_models as compare

    m = b.scan9_sum(steps=3)
    body = m.graph.node[0].attribute[0].g
    body.output[0].name = "s"  # the state passes straight through: s_final == s0
    assert compare(m, m, engine="auto", seeds=1).engine == "reference"
    assert compare(b.scan9_sum(steps=3), b.scan9_sum(steps=3), engine="auto", seeds=1).engine == "ort"


def test_an_output_declared_without_a_type_is_still_compared():
    """onnxscript writes graph outputs without a type; their values must still be checked."""
    model = mul_model(TP.FLOAT)
    typeless = onnx.ModelProto()
    typeless.CopyFrom(model)
    typeless.graph.output[0].ClearField("type")
    assert compare_models(typeless, model, seeds=2).passed
    result = compare_models(typeless, perturbed(typeless, "y", 0.5), seeds=2)
    assert not result.passed and result.comparisons[0].checks[0].name == "y"


def test_a_stopped_input_shape_derivation_is_reported_not_swallowed(monkeypatch):
    """The derivation walk catches anything so a model it misreads still gets its declared
    shapes; what it caught must reach the verification notes, not vanish."""
    from scanopt.feed_shapes import InputShapes

    def broken(self, graph, env, opset):
        raise RuntimeError("walk bug")

    monkeypatch.setattr(InputShapes, "_constrain", broken)
    model = mul_model(TP.FLOAT)
    result = compare_models(model, model, engine="ort", seeds=1)
    assert result.passed
    assert result.notes[0] == "input sizes: shape derivation stopped: RuntimeError: walk bug"
    assert [n for n in result.notes[1:] if not n.startswith("also checked on ")] == []


def test_contradictory_declared_sizes_are_a_verification_note():
    """A Scan state declared [4] outside and [5] in its body: the derivation records the
    contradiction (and compare_models passes it on as a note)."""
    from scanopt.feed_shapes import InputShapes

    body = h.make_graph(
        [h.make_node("Add", ["s", "e"], ["s2"]), h.make_node("Identity", ["s2"], ["o"])],
        "body",
        [builders.vi("s", [5]), builders.vi("e", [5])],
        [builders.vi("s2", [5]), builders.vi("o", [5])],
    )
    graph = h.make_graph(
        [h.make_node("Scan", ["s0", "xs"], ["sN", "ys"], body=body, num_scan_inputs=1)],
        "main",
        [builders.vi("s0", [4]), builders.vi("xs", ["T", 5])],
        [builders.vi("sN", [4]), builders.vi("ys", ["T", 5])],
    )
    shapes = InputShapes(builders.model(graph), ["s0", "xs"])
    assert len(shapes.conflicts) == 1 and "4" in shapes.conflicts[0] and "5" in shapes.conflicts[0]


def test_keep_ort_fails_a_candidate_only_onnxruntime_refuses():
    """The pipeline's policy: a rewrite that onnxruntime can no longer load is a failure, not a
    reason to verify both models with the reference executor instead."""
    original = builders.scan9_sum(opset=18)
    candidate = onnx.ModelProto()
    candidate.CopyFrom(original)  # a Split-18 with neither sizes nor num_outputs: onnxruntime refuses it
    candidate.graph.node.append(h.make_node("Split", ["X"], ["half_a", "half_b"], axis=0))
    assert builders.ort_refuses(candidate) and not builders.ort_refuses(original)
    lenient = compare_models(original, candidate, engine="auto", seeds=1)
    assert lenient.engine == "reference"
    strict = compare_models(original, candidate, engine="auto", seeds=1, keep_ort=True)
    assert strict.engine == "ort" and not strict.passed
    assert "onnxruntime loads the original" in strict.comparisons[0].error


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_big_outputs_are_compared_in_chunks_with_the_same_verdict(monkeypatch, dtype):
    """Chunked comparison (bounded temporaries for big outputs) counts every mismatch and
    finds the worst one across chunks, as one pass over the whole array does."""
    rng = np.random.default_rng(0)
    expected = (rng.standard_normal((7, 9)) * 10).astype(dtype)
    actual = expected.copy()
    actual[0, 1] += 3  # first chunk
    actual[4, 2] += 5  # a later chunk: the worst
    actual[6, 8] += 3  # the last, partial chunk
    whole = compare_arrays("y", expected, actual)
    monkeypatch.setattr(verify, "CHUNK_ELEMENTS", 4)
    chunked = compare_arrays("y", expected, actual)
    assert chunked.mismatches == whole.mismatches == 3
    assert chunked.worst_index == whole.worst_index == (4, 2)
    assert chunked.worst_values == whole.worst_values
    assert chunked.max_abs == whole.max_abs and chunked.max_rel == whole.max_rel
    assert compare_arrays("y", expected, expected.copy()).passed


def test_synthesized_seeds_are_compared_one_at_a_time(monkeypatch):
    """The original's outputs for a seed are dropped before the next seed runs, so a model
    with big outputs costs one seed's outputs, not all of them (issue 14's memory bound)."""
    import gc
    import weakref

    alive_before: list[tuple[int, int]] = []
    refs: list[weakref.ref] = []
    real = verify._first_that_runs

    def spy(synthesizer, seed, pairs):
        gc.collect()
        alive_before.append((seed, sum(ref() is not None for ref in refs)))
        run, failures = real(synthesizer, seed, pairs)
        refs.extend(weakref.ref(array) for outputs in run[2].values() for array in outputs.values())
        return run, failures

    monkeypatch.setattr(verify, "_first_that_runs", spy)
    model = mul_model(TP.FLOAT)
    result = compare_models(model, perturbed(model, "y", 0.0), seeds=3)
    assert result.passed and len(seeded(result)) == 3
    assert alive_before == [(0, 0), (1, 0), (2, 0)]


def test_reference_engine_is_silent_about_float_overflow():
    """exp(1000) is inf in both engines; numpy's RuntimeWarning would reach the user's terminal."""
    import warnings

    from onnx import TensorProto, helper

    from scanopt.engines import run

    graph = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outputs = run(model, {"x": np.array([-1000.0, 0.0, 1000.0], np.float32)}, "reference")
    np.testing.assert_allclose(outputs["y"], [0.0, 0.5, 1.0])
