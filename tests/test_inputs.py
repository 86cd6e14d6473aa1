"""Input synthesis (dims, sequence_lens, indices, dtypes) and loading the user's feeds."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import builders
from scanopt import engines
from scanopt.errors import ScanoptError
from scanopt.inputs import (
    InputSynthesizer,
    check_feeds,
    load_feeds,
    parse_input_assignment,
    read_feeds,
    synthesize_inputs,
)

SEEDS = range(8)


def add_model(shape_a, shape_b, elem=TP.FLOAT) -> onnx.ModelProto:
    graph = h.make_graph(
        [h.make_node("Add", ["a", "b"], ["c"])],
        "add",
        [builders.vi("a", shape_a, elem), builders.vi("b", shape_b, elem)],
        [builders.vi("c", None, elem)],
    )
    return builders.model(graph)


# -- dims ---------------------------------------------------------------------------------


def test_same_symbolic_dim_gets_one_size_and_the_model_runs():
    model = add_model(["N", 3], ["N", 3])
    for seed in SEEDS:
        feeds = synthesize_inputs(model, seed)
        assert feeds["a"].shape == feeds["b"].shape
        out = engines.run(model, feeds, "ort")["c"]
        np.testing.assert_array_equal(out, feeds["a"] + feeds["b"])


def test_symbolic_sizes_vary_across_seeds_and_include_one():
    model = add_model(["N", "K"], ["N", "K"])
    sizes = [synthesize_inputs(model, seed)["a"].shape for seed in range(3)]
    assert len({s[0] for s in sizes}) == 3
    assert 1 in {s[0] for s in sizes}
    # different names, different sizes in one seed -- but at seed 1, where every free dim is 1
    assert sizes[0][0] != sizes[0][1] and sizes[2][0] != sizes[2][1] and sizes[1] == (1, 1)


def test_unnamed_dims_get_a_size_shared_by_all_of_them():
    model = add_model([None, 2], [None, 2])
    for seed in range(3):
        feeds = synthesize_inputs(model, seed)
        assert feeds["a"].shape == feeds["b"].shape
        assert feeds["a"].shape[0] >= 1 and feeds["a"].shape[1] == 2
        engines.run(model, feeds, "ort")


def test_scalar_inputs_are_arrays_for_every_dtype():
    graph = h.make_graph(
        [h.make_node("Where", ["flag", "x", "y"], ["out"])],
        "where",
        [builders.vi("flag", [], TP.BOOL), builders.vi("x", []), builders.vi("y", [])],
        [builders.vi("out", [])],
    )
    model = builders.model(graph)
    feeds = synthesize_inputs(model)
    assert all(isinstance(v, np.ndarray) and v.shape == () for v in feeds.values())
    out = engines.run(model, feeds, "ort")["out"]
    assert out == (feeds["x"] if feeds["flag"] else feeds["y"])


def test_same_seed_same_feeds_other_seed_other_values():
    model = add_model([4, 3], [4, 3])
    first, again, other = synthesize_inputs(model, 5), synthesize_inputs(model, 5), synthesize_inputs(model, 6)
    np.testing.assert_array_equal(first["a"], again["a"])
    np.testing.assert_array_equal(first["b"], again["b"])
    assert not np.array_equal(first["a"], other["a"])


def test_input_without_shape_is_a_clear_error():
    model = add_model(None, [2])
    with pytest.raises(ScanoptError, match="input 'a' has no shape"):
        synthesize_inputs(model)


# -- sequence_lens ------------------------------------------------------------------------


@pytest.mark.parametrize("engine, low", [("ort", 1), ("reference", 0)])
def test_sequence_lens_drawn_within_the_sequence_length(engine, low):
    model = builders.scan8_sum(batch="B", steps="T")
    seen = set()
    for seed in range(12):
        feeds = synthesize_inputs(model, seed, engine=engine)
        batch, steps = feeds["X"].shape[:2]
        lens = feeds["lens"]
        assert lens.dtype == np.int64 and lens.shape == (batch,)
        assert lens.min() >= low and lens.max() <= steps
        seen.update(int(v) for v in lens)
        engines.run(model, feeds, engine)  # onnxruntime rejects a 0 length
    assert low in seen and max(seen) >= 3


def test_sequence_lens_with_fixed_dims_and_an_unnamed_batch():
    model = builders.scan8_sum(batch=3, steps=5)
    model.graph.input[0].type.tensor_type.shape.dim[0].Clear()  # lens: [?]
    values = np.concatenate([synthesize_inputs(model, seed)["lens"] for seed in range(10)])
    assert values.size == 30  # batch from X, not from the unnamed dim
    assert values.min() >= 1 and values.max() <= 5
    assert set(values.tolist()) == {1, 2, 3, 4, 5}


def test_sequence_lens_when_the_scan_input_is_computed():
    """The sequence length comes from shape inference when X is not a graph input."""
    model = builders.scan8_sum(batch=2, steps="T")
    model.graph.input[2].name = "X_in"
    model.graph.node.insert(0, h.make_node("Identity", ["X_in"], ["X"]))
    longest = 0
    for seed in range(6):
        feeds = synthesize_inputs(model, seed)
        assert feeds["lens"].max() <= feeds["X_in"].shape[1]
        longest = max(longest, feeds["lens"].max())
        engines.run(model, feeds, "ort")
    assert longest > 1  # the inferred T was used, not the fallback of 1


def test_scan9_has_no_sequence_lens_to_synthesize():
    model = builders.scan9_sum(steps="T")
    assert InputSynthesizer(model).lens_uses == {}


# -- indices ------------------------------------------------------------------------------


def gather_model(op: str, axis: int, data_shape, index_shape, data_init=None) -> onnx.ModelProto:
    inputs = [builders.vi("idx", index_shape, TP.INT64)]
    initializers = []
    if data_init is None:
        inputs.insert(0, builders.vi("data", data_shape))
    else:
        initializers.append(builders.init("data", data_init))
    graph = h.make_graph(
        [h.make_node(op, ["data", "idx"], ["out"], axis=axis)],
        "gather",
        inputs,
        [builders.vi("out", None)],
        initializer=initializers,
    )
    return builders.model(graph)


def test_gather_indices_stay_inside_an_initializer_axis():
    table = np.arange(21, dtype=np.float32).reshape(7, 3)
    model = gather_model("Gather", 0, None, ["N", 4], data_init=table)
    values = np.concatenate([synthesize_inputs(model, s)["idx"].ravel() for s in range(6)])
    assert values.min() >= 0 and values.max() <= 6
    assert values.max() > 4  # not just the default small integers


def test_gather_elements_indices_follow_the_bound_dim_of_a_graph_input():
    model = gather_model("GatherElements", -1, ["N", "K"], ["N", "K"])
    for seed in range(6):
        feeds = synthesize_inputs(model, seed)
        assert feeds["idx"].max() < feeds["data"].shape[1]
        out = engines.run(model, feeds, "ort")["out"]
        np.testing.assert_array_equal(out, np.take_along_axis(feeds["data"], feeds["idx"], axis=1))


# -- dtypes -------------------------------------------------------------------------------


def test_every_common_dtype_is_synthesized_with_its_own_type():
    types = {
        "f16": (TP.FLOAT16, "float16"),
        "bf16": (TP.BFLOAT16, "bfloat16"),
        "f64": (TP.DOUBLE, "float64"),
        "i8": (TP.INT8, "int8"),
        "i32": (TP.INT32, "int32"),
        "u16": (TP.UINT16, "uint16"),
        "flag": (TP.BOOL, "bool"),
    }
    graph = h.make_graph(
        [h.make_node("Identity", [name], [f"{name}_out"]) for name in types],
        "types",
        [builders.vi(name, [5, 4], elem) for name, (elem, _) in types.items()],
        [builders.vi(f"{name}_out", [5, 4], elem) for name, (elem, _) in types.items()],
    )
    model = builders.model(graph)
    feeds = synthesize_inputs(model, 0)
    assert {name: feeds[name].dtype.name for name in types} == {n: d for n, (_, d) in types.items()}
    assert set(np.unique(feeds["flag"]).tolist()) == {False, True}
    assert np.unique(feeds["f64"]).size == 20
    out = engines.run(model, feeds, "ort")  # bfloat16 included
    for name in types:
        np.testing.assert_array_equal(out[f"{name}_out"], feeds[name])


# -- user feeds ---------------------------------------------------------------------------


@pytest.fixture
def add2(tmp_path):
    model = add_model(["N", 2], ["N", 2])
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = np.full((3, 2), 0.5, np.float32)
    np.savez(tmp_path / "feeds.npz", a=a, b=b)
    np.save(tmp_path / "b.npy", b * 4)
    return model, a, b, tmp_path


def test_npz_feeds_are_used_exactly_and_input_overrides(add2):
    model, a, b, tmp = add2
    feeds = load_feeds(model, npz=str(tmp / "feeds.npz"))
    assert list(feeds) == ["a", "b"]
    np.testing.assert_array_equal(feeds["a"], a)
    np.testing.assert_array_equal(feeds["b"], b)
    feeds = load_feeds(model, npz=str(tmp / "feeds.npz"), arrays=[f"b={tmp / 'b.npy'}"])
    np.testing.assert_array_equal(feeds["b"], b * 4)


def test_no_feeds_given_means_none():
    assert read_feeds() is None


def f32(*shape):
    return np.zeros(shape, np.float32)


@pytest.mark.parametrize(
    "feeds, message",
    [
        ({"a": f32(3, 2), "b": f32(3, 2), "z": np.zeros(1)}, "unknown input name.*'z'"),
        ({"a": f32(3, 2)}, "missing required input.*'b'"),
        ({"a": np.zeros((3, 2)), "b": f32(3, 2)}, "'a' is float64; the model wants float32"),
        ({"a": f32(3, 2), "b": f32(4, 2)}, "dim 'N' is 3 in input 'a' but 4 in input 'b'"),
        ({"a": f32(3, 3), "b": f32(3, 2)}, "axis 1 must be 2"),
        ({"a": f32(3), "b": f32(3, 2)}, "'a' has rank 1"),
    ],
)
def test_bad_feeds_are_clear_errors(feeds, message):
    with pytest.raises(ScanoptError, match=message):
        check_feeds(add_model(["N", 2], ["N", 2]), feeds)


def test_input_with_an_initializer_default_is_optional():
    model = add_model([2], [2])
    model.graph.initializer.append(builders.init("b", np.ones(2, np.float32)))
    feeds = check_feeds(model, {"a": np.zeros(2, np.float32)})
    assert list(feeds) == ["a"]
    assert list(synthesize_inputs(model)) == ["a"]


def test_bad_files_are_clear_errors(add2):
    model, _, _, tmp = add2
    with pytest.raises(ScanoptError, match="not an .npz archive"):
        load_feeds(model, npz=str(tmp / "b.npy"))
    with pytest.raises(ScanoptError, match="cannot read"):
        load_feeds(model, npz=str(tmp / "missing.npz"))
    with pytest.raises(ScanoptError, match="expected NAME=FILE.npy"):
        parse_input_assignment("just_a_file.npy")
    assert parse_input_assignment("x:0=a=b.npy") == ("x:0=a", "b.npy")


def test_bfloat16_npy_records_are_read_back_as_bfloat16(tmp_path):
    model = add_model([2], [2], TP.BFLOAT16)
    value = np.array([1.5, -2.0], dtype=onnx.helper.tensor_dtype_to_np_dtype(TP.BFLOAT16))
    np.savez(tmp_path / "f.npz", a=value, b=value)  # stored as raw 2-byte records
    feeds = load_feeds(model, npz=str(tmp_path / "f.npz"))
    assert feeds["a"].dtype.name == "bfloat16"
    np.testing.assert_array_equal(feeds["a"].astype(np.float32), [1.5, -2.0])


def test_seed_0_runs_a_long_sequence_shortened_to_fit_the_memory_budget(monkeypatch):
    from scanopt import inputs
    from scanopt.feed_shapes import LONG_TRIP
    from scanopt.inputs import MIN_FITTED_TRIP, InputSynthesizer

    budget = 100 * 2**10  # 64 steps of 1 KiB floats need 256 KiB; 16 fit
    monkeypatch.setattr(inputs, "FEED_BUDGET_BYTES", budget)

    def model(width):
        body = builders.sum_body(width=width)
        node = h.make_node("Scan", ["s0", "X"], ["s_final", "Y"], body=body, num_scan_inputs=1)
        graph = h.make_graph([node], "main", [builders.vi("s0", [width]), builders.vi("X", ["T", width])],
                             [builders.vi("s_final", [width]), builders.vi("Y", ["T", width])])
        return builders.model(graph)

    assert InputSynthesizer(model(2)).shapes(0)["X"] == (LONG_TRIP, 2)
    assert InputSynthesizer(model(2)).shapes(1)["X"] == (1, 2)
    wide = 1024
    steps = InputSynthesizer(model(wide)).shapes(0)["X"][0]
    assert MIN_FITTED_TRIP <= steps < LONG_TRIP and (steps + 1) * wide * 4 <= budget


def test_only_one_trip_count_gets_the_long_length():
    from scanopt.feed_shapes import LONG_TRIP, OTHER_TRIP_MAX

    nodes = [h.make_node("Scan", [f"s{k}", f"X{k}"], [f"f{k}", f"Y{k}"], body=builders.sum_body(prefix=f"b{k}_"),
                         num_scan_inputs=1) for k in (1, 2)]
    graph = h.make_graph(
        nodes, "two",
        [builders.vi(n, shape) for k in (1, 2) for n, shape in ((f"s{k}", [2]), (f"X{k}", [f"T{k}", 2]))],
        [builders.vi(f"{o}{k}", None) for k in (1, 2) for o in ("f", "Y")],
    )
    shapes = InputSynthesizer(builders.model(graph)).shapes(0)
    assert sorted([shapes["X1"][0], shapes["X2"][0]]) == [OTHER_TRIP_MAX, LONG_TRIP]
