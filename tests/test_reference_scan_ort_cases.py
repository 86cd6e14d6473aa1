"""The cases of onnxruntime's own Scan unit tests, run through onnxruntime and scanopt.

Each test re-creates one case of onnxruntime/test/providers/cpu/controlflow/scan_test.cc
(named in a comment) as an ONNX model with our own input data, runs it with onnxruntime
and with the reference executor, and requires the same outputs. Where onnxruntime cannot
run an input the spec allows (a sequence_lens entry of 0), the reference is also run on it
and checked against onnxruntime's result for the other batch items.

Not re-created: MixedExecutionProviders* (CUDA only; same model as other cases).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper as oh

try:  # onnx 1.23+; older releases cannot check shape annotations
    from onnx.reference.shape_annotation_checker import ShapeAnnotationError
except ImportError:
    ShapeAnnotationError = None

from builders import vi
from ort_scan_cases import (
    OUTER_VALUE,
    SCAN_OUTPUTS,
    counting_concat_split_body,
    counting_concat_split_model,
    crossing_model,
    scan8_model,
    scan9_model,
)
from reference_helpers import FLOAT, INT64, assert_outputs_close, make_model, run_ort, scan_node
from scanopt.errors import InvalidModelError
from scanopt.reference import make_evaluator, run_model

V9_OPSETS = (9, 11, 25)  # the first, the first with negative axes, the latest
ALL_OPSETS = (8, *V9_OPSETS)

rng = np.random.default_rng(1)


def rand(*shape) -> np.ndarray:
    return rng.uniform(-5, 5, shape).round(2).astype(np.float32)


def differential(model: onnx.ModelProto, feeds: dict) -> dict:
    """Run both; require identical names, shapes and dtypes and close values."""
    ours = run_model(model, feeds)
    assert_outputs_close(ours, run_ort(model, feeds))
    return ours


# -- the model shared by most cases (built in ort_scan_cases) -------------------------


def counting_feeds(opset, batch=1, length=2, scalar_state=False):
    lead = (batch,) if opset == 8 else ()
    state = np.arange(batch, dtype=np.float32) * 10 if opset == 8 else np.zeros((), np.float32)
    state = state.reshape(lead if scalar_state else lead + (1,))
    return {"scan_loop_state_in_0": state,
            "scan_input_0": rand(*lead, length, 2), "scan_input_1": rand(*lead, length, 2)}


def run_short_sequence(opset, **options):
    """ShortSequenceOneInBatchOneLoopStateVar with the given RunOptions."""
    scalar_state = options.get("scalar_state", False)
    body = counting_concat_split_body(opset, **options)
    model = counting_concat_split_model(opset, body, dims_in_main=options.get("dims_in_main", False),
                                        scalar_state=scalar_state)
    ours = differential(model, counting_feeds(opset, scalar_state=scalar_state))
    np.testing.assert_array_equal(ours["scan_loop_state_out_0"].ravel(), [2.0])  # one per step
    return ours


# -- ShortSequenceOneInBatchOneLoopStateVar and its RunOptions variants ----------------


@pytest.mark.parametrize("opset", ALL_OPSETS)
def test_short_sequence_no_shape_in_main_graph_type_and_shape_in_subgraph(opset):
    # ShortSequenceOneInBatchOneLoopStateVar_NoShapeInMainGraph_TypeAndShapeInSubgraph
    run_short_sequence(opset, dims_in_main=False, types_in_sub=True, dims_in_sub=True)


@pytest.mark.parametrize("opset", ALL_OPSETS)
def test_short_sequence_shape_in_main_graph_no_type_and_shape_in_subgraph(opset):
    # ShortSequenceOneInBatchOneLoopStateVar_ShapeInMainGraph_NoTypeAndShapeInSubgraph
    run_short_sequence(opset, dims_in_main=True, types_in_sub=False, dims_in_sub=False)


@pytest.mark.parametrize("opset", ALL_OPSETS)
def test_short_sequence_no_shape_in_main_graph_no_type_and_shape_in_subgraph(opset):
    # ShortSequenceOneInBatchOneLoopStateVar_NoShapeInMainGraph_NoTypeAndShapeInSubgraph
    run_short_sequence(opset, dims_in_main=False, types_in_sub=False, dims_in_sub=False)


@pytest.mark.parametrize("opset", ALL_OPSETS)
def test_scalar_loop_state(opset):
    # OnnxScalarLoopState
    ours = run_short_sequence(opset, dims_in_main=True, types_in_sub=False, dims_in_sub=False, scalar_state=True)
    assert ours["scan_loop_state_out_0"].shape == ((1,) if opset == 8 else ())


@pytest.mark.parametrize("opset", ALL_OPSETS)
@pytest.mark.parametrize(
    "dims_in_main, sub",
    [(False, True), (True, False), (False, False)],
    ids=[
        "OuterScopeAccess_NoShapeInMainGraph_TypeAndShapeInSubgraph",
        "OuterScopeAccess_ShapeInMainGraph_NoTypeAndShapeInSubgraph",
        "OuterScopeAccess_NoShapeInMainGraph_NoTypeAndShapeInSubgraph",
    ],
)
def test_outer_scope_access(opset, dims_in_main, sub):
    # OuterScopeAccess_* (three RunOptions variants, named in the ids)
    ours = run_short_sequence(opset, dims_in_main=dims_in_main, types_in_sub=sub, dims_in_sub=sub,
                              outer_scope_add=True)
    assert ours["scan_output_0"].min() > OUTER_VALUE - 6  # the outer value was added


@pytest.mark.parametrize("opset", ALL_OPSETS)
def test_bad_shape_is_rejected(opset):
    # BadShape: a body input declared [2, 99] receives [2]. onnxruntime 1.31 fails the run (its
    # test expected a load-time ShapeInferenceError); the reference fails it when asked to
    # check shape annotations, which it does inside bodies too.
    body = counting_concat_split_body(opset, bad_shape=True)
    model = counting_concat_split_model(opset, body)
    feeds = counting_feeds(opset)
    with pytest.raises(Exception, match="must have the shape set for all outputs|ShapeInferenceError"):
        run_ort(model, feeds)
    if ShapeAnnotationError is None:
        pytest.skip("this onnx's reference evaluator cannot check shape annotations (onnx 1.23+ can)")
    with pytest.raises(ShapeAnnotationError, match="concat_in_0"):
        make_evaluator(model).run(None, feeds, check_shape_annotations=True)


# -- Scan-8 batching ------------------------------------------------------------------


def test_scan8_two_in_batch():
    # Scan8.ShortSequenceTwoInBatchOneLoopStateVar
    ours = differential(scan8_model(2, 2), counting_feeds(8, batch=2))
    np.testing.assert_array_equal(ours["scan_loop_state_out_0"].ravel(), [2.0, 12.0])


def check_scan8_lens(feeds, lens, **attrs):
    """Differential on the items onnxruntime can run (len >= 1); len-0 items: initial state, zeros."""
    batch, length = feeds["scan_input_0"].shape[:2]
    feeds = {**feeds, "sequence_lens": np.array(lens, np.int64)}
    ours = run_model(scan8_model(batch, length, with_lens=True, **attrs), feeds)
    ran = [b for b, n in enumerate(lens) if n > 0]
    theirs = run_ort(scan8_model(len(ran), length, with_lens=True, **attrs), {k: v[ran] for k, v in feeds.items()})
    assert_outputs_close({k: v[ran] for k, v in ours.items()}, theirs)
    for b, n in enumerate(lens):
        for name in SCAN_OUTPUTS:
            assert not ours[name][b, n:].any(), f"{name}[{b}] not zero past its length {n}"
        if n == 0:
            np.testing.assert_array_equal(ours["scan_loop_state_out_0"][b], feeds["scan_loop_state_in_0"][b])
    return ours


@pytest.mark.parametrize("lens", [[1, 2, 2], [0, 2, 1]], ids=["ort-lengths", "with-zero"])
def test_scan8_mixed_sequence_lens(lens):
    # Scan8.MixedSequenceLens (the with-zero variant goes beyond what onnxruntime accepts)
    ours = check_scan8_lens(counting_feeds(8, batch=3), lens)
    np.testing.assert_array_equal(ours["scan_loop_state_out_0"].ravel(), [lens[b] + 10 * b for b in range(3)])


@pytest.mark.parametrize("lens", [[1, 2], [0, 2], [2, 1]])
def test_scan8_mixed_sequence_lens_reverse(lens):
    # Scan8.MixedSequenceLensReverse: a reverse item with len 1 reads only position 0
    feeds = counting_feeds(8, batch=2)
    ours = check_scan8_lens(feeds, lens, directions=[1, 1])
    short = lens.index(min(lens))
    if lens[short] == 1:
        np.testing.assert_array_equal(ours["scan_output_0"][short, 0, 0], feeds["scan_input_0"][short, 0, 0])


def test_scan8_two_in_batch_reverse_first_input():
    # Scan8.ShortSequenceTwoInBatchOneLoopStateVarReverseFirstInput
    feeds = counting_feeds(8, batch=2)
    ours = differential(scan8_model(2, 2, directions=[1, 0]), feeds)
    np.testing.assert_array_equal(ours["scan_output_0"][:, :, 0], feeds["scan_input_0"][:, ::-1, 0])
    np.testing.assert_array_equal(ours["scan_output_2"][:, :, 0], feeds["scan_input_1"][:, :, 0])


# -- Scan-9+: directions and axes -----------------------------------------------------


@pytest.mark.parametrize("opset", V9_OPSETS)
def test_reversed_input(opset):
    # Scan9.ReversedInput
    feeds = counting_feeds(opset)
    ours = differential(scan9_model(opset, scan_input_directions=[0, 1]), feeds)
    np.testing.assert_array_equal(ours["scan_output_2"][:, 0], feeds["scan_input_1"][::-1, 0])


@pytest.mark.parametrize("opset", V9_OPSETS)
def test_reversed_output(opset):
    # Scan9.ReversedOutput
    feeds = counting_feeds(opset)
    ours = differential(scan9_model(opset, scan_output_directions=[0, 1, 1, 0]), feeds)
    np.testing.assert_array_equal(ours["scan_output_1"][:, 0], feeds["scan_input_0"][::-1, 1])


@pytest.mark.parametrize("opset", [11, 25])
def test_transpose_input(opset):
    # Scan9.TransposeInput (axes [1, -1]; onnxruntime's own test runs it at opset 11)
    model = scan9_model(opset, scan_input_axes=[1, -1])
    feeds = {k: (v.T.copy() if k.startswith("scan_input") else v) for k, v in counting_feeds(opset).items()}
    ours = differential(model, feeds)
    np.testing.assert_array_equal(ours["scan_output_0"][:, 0], feeds["scan_input_0"][0])


def test_transpose_input_negative_axis_at_opset_9_is_rejected_by_the_spec_only():
    # Scan9.TransposeInput as originally written at opset 9: the Scan-9 spec has no negative
    # axes (they arrive in Scan-11), onnxruntime accepts them anyway.
    model = scan9_model(9, scan_input_axes=[1, -1])
    feeds = {k: (v.T.copy() if k.startswith("scan_input") else v) for k, v in counting_feeds(9).items()}
    assert run_ort(model, feeds)["scan_output_0"].shape == (2, 1)
    with pytest.raises(InvalidModelError, match="negative axes"):
        run_model(model, feeds)


@pytest.mark.parametrize("opset", [11, 25])
def test_transpose_output(opset):
    # Scan9.TransposeOutput (axes [1, -1, 0, 0])
    ours = differential(scan9_model(opset, scan_output_axes=[1, -1, 0, 0]), counting_feeds(opset))
    assert [ours[n].shape for n in SCAN_OUTPUTS] == [(1, 2), (1, 2), (2, 1), (2, 1)]


@pytest.mark.parametrize("opset", V9_OPSETS)
def test_transpose_output_dim2(opset):
    # Scan9.TransposeOutputDim2: elements [1, 1] accumulated on axis 2
    body = oh.make_graph([oh.make_node("Identity", ["scan_in_1"], ["scan_out_1"])], "body",
                         [vi("scan_in_1", [1, 1])], [vi("scan_out_1", [1, 1])])
    node = scan_node(["scan_input_1"], ["scan_output_1"], body, 1, scan_output_axes=[2])
    model = make_model(opset, [node], [vi("scan_input_1", [2, 1, 1])], [vi("scan_output_1", [1, 1, 2])])
    x = rand(2, 1, 1)
    ours = differential(model, {"scan_input_1": x})
    np.testing.assert_array_equal(ours["scan_output_1"], x.reshape(1, 1, 2))


# -- InvalidInput ---------------------------------------------------------------------

INVALID = [
    # (opset, attributes, name of onnxruntime's sub-case)
    (8, {"directions": [2, 1]}, "InvalidDirectionsValue"),
    (8, {"directions": [1, 0, 1]}, "InvalidNumEntriesInDirections"),
    (11, {"scan_input_directions": [2, 1]}, "InvalidInputDirectionsValue"),
    (11, {"scan_output_directions": [0, 2, 1, 0]}, "InvalidOutputDirectionsValue"),
    (11, {"scan_input_directions": [1, 0, 1]}, "InvalidNumEntriesInInputDirections"),
    (11, {"scan_output_directions": [1, 0, 1]}, "InvalidNumEntriesInOutputDirections"),
    (11, {"scan_input_axes": [2, -1]}, "InvalidEntryInInputAxes"),
    (11, {"scan_input_axes": [0, 1, 2]}, "InvalidNumEntriesInInputAxes"),
    (11, {"scan_output_axes": [3, -1, 0, 0]}, "InvalidEntryInOutputAxes"),
    (11, {"scan_output_axes": [0, 1, 2]}, "InvalidNumEntriesInOutputAxes"),
]


@pytest.mark.parametrize("opset, attrs", [c[:2] for c in INVALID], ids=[c[2] for c in INVALID])
def test_invalid_input(opset, attrs):
    # InvalidInput (Scan8 and Scan9): both executors refuse the model
    model = scan9_model(opset, **attrs)
    feeds = counting_feeds(opset)
    with pytest.raises(Exception):
        run_ort(model, feeds)
    with pytest.raises(InvalidModelError, match="entries|only 0 and 1|out of range"):
        run_model(model, feeds)


# -- bodies of their own --------------------------------------------------------------


@pytest.mark.parametrize("opset", ALL_OPSETS)
def test_mixed_type_inputs(opset):
    # MixedTypeInputs: float and int64 states and scan inputs side by side
    model = crossing_model(opset, [FLOAT, INT64], [1])
    lead = (1,) if opset == 8 else ()
    feeds = {
        "initial_state_0": rand(*lead, 1), "initial_state_1": np.array([7], np.int64).reshape(lead + (1,)),
        "scan_input_0": rand(*lead, 3, 1), "scan_input_1": np.arange(3, dtype=np.int64).reshape(lead + (3, 1)) + 5,
    }
    ours = differential(model, feeds)
    assert ours["scan_output_1"].dtype == np.int64
    np.testing.assert_array_equal(ours["final_state_1"].ravel(), [7])


@pytest.mark.parametrize("opset", ALL_OPSETS)
def test_unknown_dim_in_subgraph_output(opset):
    # UnknownDimInSubgraphOutput: symbolic dims in the body and in the main graph
    model = crossing_model(opset, [FLOAT], ["input_size"], dim_param="param")
    lead = (1,) if opset == 8 else ()
    ours = differential(model, {"initial_state_0": rand(*lead, 1), "scan_input_0": rand(*lead, 3, 1)})
    assert ours["scan_output_0"].shape == lead + (3, 1)
