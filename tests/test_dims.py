"""scanopt.dims: dims unified by what ops require, not by their names (issue 20)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper as h

import builders
from scanopt.dims import DimClasses
from test_reference_scan_random import SETTINGS, build8, build9, cases8, cases9

TF2ONNX_STYLE = os.path.join(os.path.dirname(__file__), "..", "models", "tf2onnx_style")


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return builders.model(graph, opset)


def _i64(name, values):
    return builders.init(name, np.array(values, np.int64))


def test_concat_unifies_every_dim_but_the_axis():
    m = _model([h.make_node("Concat", ["a", "b"], ["c"], axis=1)],
               [builders.vi("a", ["u1", "u2"]), builders.vi("b", ["u3", "u4"])], [builders.vi("c", None)])
    d = DimClasses(m)
    assert d.same(("a", 0), ("b", 0)) and d.same(("a", 0), ("c", 0))
    assert not d.same(("a", 1), ("b", 1))  # the concat axis: any sizes


def test_matmul_and_gemm_unify_contraction_dims_only():
    m = _model(
        [h.make_node("MatMul", ["a", "b"], ["ab"]), h.make_node("Gemm", ["ab", "c"], ["y"], transB=1)],
        [builders.vi("a", ["u1", "u2"]), builders.vi("b", ["u3", "u4"]), builders.vi("c", ["u5", "u6"])],
        [builders.vi("y", None)],
    )
    d = DimClasses(m)
    assert d.same(("a", 1), ("b", 0))
    assert d.same(("b", 1), ("c", 1))  # ab's columns meet c's columns (transB)
    assert d.same(("y", 0), ("a", 0)) and d.same(("y", 1), ("c", 0))
    assert not d.same(("a", 0), ("b", 1))


def test_broadcasting_is_only_likely_and_a_declared_one_never_unifies():
    m = _model(
        [h.make_node("Add", ["a", "b"], ["s"]), h.make_node("Mul", ["s", "one"], ["y"])],
        [builders.vi("a", ["u1", 3]), builders.vi("b", ["u2", 3]), builders.vi("one", [1, "u3"])],
        [builders.vi("y", None)],
    )
    d = DimClasses(m)
    assert d.same(("a", 0), ("b", 0), likely=True)
    assert not d.same(("a", 0), ("b", 0))  # one of them may be 1 at run time
    assert not d.same(("one", 0), ("a", 0), likely=True)


def test_shape_provenance_to_constant_of_shape_expand_and_reshape():
    nodes = [
        h.make_node("Shape", ["x"], ["sx"]),
        h.make_node("Gather", ["sx", "i1"], ["n"], axis=0),
        h.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        h.make_node("Concat", ["n1", "four"], ["shape"], axis=0),
        h.make_node("ConstantOfShape", ["shape"], ["zeros"]),
        h.make_node("Expand", ["row", "shape"], ["expanded"]),
        h.make_node("Slice", ["sx", "s0", "s1"], ["lead"]),
        h.make_node("Concat", ["lead", "minus1"], ["flat_shape"], axis=0),
        h.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
    ]
    m = _model(
        nodes,
        [builders.vi("x", ["u1", "u2", 5]), builders.vi("row", [1, 4])],
        [builders.vi(n, None) for n in ("zeros", "expanded", "flat")],
        [_i64("i1", 1), _i64("ax0", [0]), _i64("four", [4]), _i64("s0", [0]), _i64("s1", [1]), _i64("minus1", [-1])],
    )
    d = DimClasses(m)
    assert d.same(("zeros", 0), ("x", 1)) and d.size("zeros", 1) == 4
    assert d.same(("expanded", 0), ("x", 1))
    assert d.same(("flat", 0), ("x", 0))
    assert not d.same(("zeros", 0), ("x", 0))


def test_scan8_contract_shares_batch_and_length_and_reaches_sequence_lens():
    m = builders.scan8_sum(batch="unk__1", steps="unk__2")
    d = DimClasses(m)
    names = [v.name for v in m.graph.input]
    lens, state, scan_input = names[0], names[1], names[-1]
    assert d.same((lens, 0), (scan_input, 0)) and d.same((state, 0), (scan_input, 0))
    out = m.graph.output[-1].name
    assert d.same((out, 1), (scan_input, 1)) and not d.same((scan_input, 0), (scan_input, 1))
    assert d.is_trip_count(scan_input, 1) and not d.is_trip_count(scan_input, 0) and not d.is_trip_count(state, 0)


@pytest.mark.parametrize("state_input", [False, True])
def test_tf2onnx_batch_of_x_and_initial_state_is_one_class(state_input):
    m = onnx.load(os.path.join(TF2ONNX_STYLE, f"dynamic_rnn_tanh_{'state_input' if state_input else 'zero_state'}.onnx"))
    state = "h0:0" if state_input else "rnn/zeros:0"
    d = DimClasses(m)
    assert d.same(("rnn/transpose:0", 1), (state, 0))  # what fusion needs
    assert d.same(("X:0", 0), ("Y:0", 0)) and d.same(("X:0", 1), ("Y:0", 1))
    assert not d.same(("X:0", 0), ("X:0", 1))


def test_unknown_names_and_axes_are_never_the_same():
    m = _model([h.make_node("Identity", ["a"], ["b"])], [builders.vi("a", ["u", 2])], [builders.vi("b", None)])
    d = DimClasses(m)
    assert d.same(("a", 0), ("b", 0)) and d.same(("a", -1), ("b", 1))
    assert not d.same(("a", 0), ("nowhere", 0)) and not d.same(("a", 5), ("b", 5))


def test_loop_carried_values_may_change_shape_so_they_are_only_likely():
    body = h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"]), h.make_node("Concat", ["acc", "acc"], ["acc_next"], axis=0)],
        "grow",
        [builders.vi("i", [], TP.INT64), builders.vi("cond_in", [], TP.BOOL), builders.vi("acc", ["u_in"])],
        [builders.vi("cond_out", [], TP.BOOL), builders.vi("acc_next", ["u_out"])],
    )
    m = _model([h.make_node("Loop", ["n", "", "a0"], ["a_final"], body=body)],
               [builders.vi("n", [], TP.INT64), builders.vi("a0", ["u0"])], [builders.vi("a_final", None)])
    d = DimClasses(m)
    assert d.same(("a0", 0), ("a_final", 0), likely=True)
    assert not d.same(("a0", 0), ("a_final", 0))  # it doubles every iteration


def test_an_operand_alone_at_an_axis_gives_the_output_that_axis_exactly():
    # tf2onnx's sequence mask: GreaterOrEqual(step, lens [L]) -> Reshape [-1, 1] -> Mul with h [B, H]
    m = _model(
        [
            h.make_node("GreaterOrEqual", ["step", "lens"], ["done"]),
            h.make_node("Reshape", ["done", "col"], ["done_col"]),
            h.make_node("Cast", ["done_col"], ["mask"], to=TP.FLOAT),
            h.make_node("Mul", ["hidden", "mask"], ["masked"]),
        ],
        [builders.vi("step", [], TP.INT32), builders.vi("lens", ["u_len"], TP.INT32), builders.vi("hidden", ["u_b", 6])],
        [builders.vi("masked", None)],
        [_i64("col", [-1, 1])],
    )
    d = DimClasses(m)
    assert d.same(("done", 0), ("lens", 0))  # the scalar step does not reach axis 0
    assert d.same(("done_col", 0), ("lens", 0))  # the Reshape's -1 is the one unsized dim
    assert d.same(("mask", 0), ("hidden", 0), likely=True) and not d.same(("mask", 0), ("hidden", 0))
    assert d.same(("masked", 1), ("hidden", 1))  # mask is declared 1 there: hidden alone


def test_a_model_the_walk_misreads_keeps_the_facts_found_so_far(monkeypatch):
    m = _model([h.make_node("Identity", ["a"], ["b"]), h.make_node("Transpose", ["b"], ["c"])],
               [builders.vi("a", ["u", 2])], [builders.vi("c", None)])

    real_node = DimClasses._node

    def node(self, n, graph):
        if n.op_type == "Transpose":
            raise TypeError("unexpected")
        return real_node(self, n, graph)

    monkeypatch.setattr(DimClasses, "_node", node)
    d = DimClasses(m)
    assert d.incomplete and "TypeError" in d.incomplete
    assert d.same(("a", 0), ("b", 0))  # found before the walk stopped


def _run_sizes(model, feeds) -> dict:
    from scanopt.engines import prepare

    outputs = prepare(model, "ort")(feeds)
    return {**{k: np.shape(v) for k, v in feeds.items()}, **{k: np.shape(v) for k, v in outputs.items()}}


def _unsound_pairs(model, sizes) -> list:
    """Axes DimClasses proves equal that a run gives different sizes; a top-level Loop's scan
    output after zero iterations is left out past its first axis: onnxruntime writes it
    [0, 0, ...] whatever the body's per-iteration shape (a Loop(M=T) over X [T, B, 3] at T=0
    gives Y [0, 0, 4], not [0, B, 4]; heldout_4's loop_cond_const_node)."""
    import itertools

    d = DimClasses(model)
    empty_scans = {out for n in model.graph.node if n.op_type == "Loop" for out in n.output[len(n.input) - 2:]
                   if out in sizes and sizes[out] and sizes[out][0] == 0}
    axes = [(name, a) for name, shape in sizes.items() for a in range(len(shape))
            if not (name in empty_scans and a > 0)]
    return [(x, y) for x, y in itertools.combinations(axes, 2)
            if d.same(x, y) and sizes[x[0]][x[1]] != sizes[y[0]][y[1]]]


MODELS = os.path.join(os.path.dirname(__file__), "..", "models")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_exact_classes_hold_on_every_sample_model_as_it_runs():
    """Soundness: dims the ops are said to prove equal are equal in real runs, on the
    exporters' own inputs (.expected.npz, sized by the source framework, not by scanopt)
    and on synthesized ones (their outputs are sized by the model)."""
    import glob

    from scanopt.verify import runnable_feeds

    checked = 0
    for path in sorted(glob.glob(os.path.join(MODELS, "**", "*.onnx"), recursive=True)):
        model = onnx.load(path)
        expected = path[:-5] + ".expected.npz"
        feed_sets = []
        if os.path.exists(expected):
            with np.load(expected) as npz:
                names = {v.name for v in model.graph.input}
                feed_sets.append({k: npz[k] for k in npz.files if k in names})
        try:
            feed_sets += runnable_feeds(model, seeds=1, engine="ort")
        except Exception:  # noqa: BLE001 - models onnxruntime cannot run say nothing here
            pass
        for feeds in feed_sets:
            try:
                sizes = _run_sizes(model, feeds)
            except Exception:  # noqa: BLE001
                continue
            assert _unsound_pairs(model, sizes) == [], path
            checked += 1
    assert checked >= 130


def _sound_on_synthesized_runs(model):
    from scanopt.verify import runnable_feeds

    for feeds in runnable_feeds(model, seeds=2, engine="ort"):
        assert _unsound_pairs(model, _run_sizes(model, feeds)) == []


@settings(max_examples=15, **SETTINGS)
@given(cases9(min_length=1))
def test_exact_classes_hold_on_random_scan9_runs(case):
    _sound_on_synthesized_runs(build9(case)[0])


@settings(max_examples=15, **SETTINGS)
@given(cases8(min_len=1))
def test_exact_classes_hold_on_random_scan8_runs(case):
    _sound_on_synthesized_runs(build8(case)[0])


def test_gather_result_is_data_with_the_axis_replaced_by_the_indices_shape():
    m = _model([h.make_node("Gather", ["x", "idx"], ["y"], axis=1)],
               [builders.vi("x", [None, None, None]), builders.vi("idx", [None, None], TP.INT64)],
               [builders.vi("y", None)])
    d = DimClasses(m)
    assert d.rank("y") == 4
    assert d.same(("y", 0), ("x", 0)) and d.same(("y", 3), ("x", 2))
    assert d.same(("y", 1), ("idx", 0)) and d.same(("y", 2), ("idx", 1))
    assert not d.same(("y", 1), ("x", 1))  # the gathered axis: any size


def _loop_reading(tensors, index_from_body=True):
    """A Loop over Shape(x)[0] whose body gathers row ``i`` of each outer tensor (tf2onnx's
    map_fn over two inputs reads x and u like this)."""
    body_nodes = [h.make_node("Gather", [t, "i" if index_from_body else "zero"], [f"{t}_t"]) for t in tensors]
    body_nodes += [h.make_node("Identity", ["cond_in"], ["cond_out"])]
    body_nodes += [h.make_node("Add", [f"{tensors[0]}_t", f"{tensors[-1]}_t"], ["y_t"])]
    body = h.make_graph(body_nodes, "body",
                        [builders.vi("i", [], TP.INT64), builders.vi("cond_in", [], TP.BOOL)],
                        [builders.vi("cond_out", [], TP.BOOL), builders.vi("y_t", None)],
                        initializer=[builders.init("zero", np.array(0, np.int64))])
    nodes = [h.make_node("Shape", ["x"], ["shape"]), h.make_node("Gather", ["shape", "axis0"], ["n"]),
             h.make_node("Loop", ["n", ""], ["y"], body=body)]
    inputs = [builders.vi(t, [f"{t}_rows", f"{t}_cols"]) for t in tensors]
    return _model(nodes, inputs, [builders.vi("y", None)], inits=[_i64("axis0", 0)])


def test_a_loop_gathering_rows_of_outer_tensors_at_its_index_likely_runs_one_trip_per_row():
    d = DimClasses(_loop_reading(["x", "u"]))
    assert d.same(("x", 0), ("u", 0), likely=True)  # feeds give both as many rows as trips
    assert not d.same(("x", 0), ("u", 0))  # not proven: the body could stop reading early


def test_a_loop_gathering_a_fixed_row_says_nothing_about_the_rows():
    d = DimClasses(_loop_reading(["x", "u"], index_from_body=False))
    assert not d.same(("x", 0), ("u", 0), likely=True)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_gather_dims_agree_with_what_onnxruntime_computes(data):
    """Every dim the Gather rule calls equal is equal in the result onnxruntime computes."""
    import onnxruntime as ort

    x_shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3), "x shape")
    idx_shape = data.draw(st.lists(st.integers(1, 3), min_size=0, max_size=2), "indices shape")
    axis = data.draw(st.integers(-len(x_shape), len(x_shape) - 1), "axis")
    m = _model([h.make_node("Gather", ["x", "idx"], ["y"], axis=axis)],
               [builders.vi("x", [None] * len(x_shape)), builders.vi("idx", [None] * len(idx_shape), TP.INT64)],
               [builders.vi("y", None)])
    d = DimClasses(m)
    x = np.zeros(x_shape, np.float32)
    idx = np.zeros(idx_shape, np.int64)
    (y,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x, "idx": idx})
    assert d.rank("y") == y.ndim
    sized = [("x", k, n) for k, n in enumerate(x_shape)] + [("idx", k, n) for k, n in enumerate(idx_shape)]
    for j, size in enumerate(y.shape):
        matched = [(name, k) for name, k, n in sized if d.same(("y", j), (name, k))]
        assert matched, (j, y.shape)  # every result axis is traced to an operand's
        assert all(n == size for name, k, n in sized if (name, k) in matched)


def test_a_length_reached_through_projections_einsums_and_unsqueezes_is_the_trip_count():
    """mamba-minimal's export: x [1, 40, 64] -> MatMul -> Split -> Einsum('bld,...->bldn') -> Exp ->
    Transpose -> the Scan; and Hugging Face's layout, Unsqueeze -> Mul -> the Scan on axis 2."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    import linrec_builders as lb
    from scanopt.dims import DimClasses

    model = onnx.load(Path(__file__).resolve().parent.parent / "models" / "linrec" / "torch_mamba_minimal_wide.onnx")
    for value in list(model.graph.input) + list(model.graph.output):  # re-declared at T=256 (no size coincides)
        dims = value.type.tensor_type.shape.dim
        if len(dims) > 1 and dims[1].dim_value == 40:
            dims[1].dim_value = 256
    del model.graph.value_info[:]
    classes = DimClasses(model)
    assert classes.is_trip_count("x", 1) and not classes.is_trip_count("x", 2)
    hf = DimClasses(lb.mamba_hf(T="T", B=2))
    assert hf.is_trip_count("dl", 2) and hf.is_trip_count("x", 2) and not hf.is_trip_count("dl", 1)
