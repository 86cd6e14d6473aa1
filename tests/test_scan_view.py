"""ScanView: defaults applied, axes resolved, the opset-8 layout explicit."""

from __future__ import annotations

import pytest

import builders as b
from scanopt.errors import InvalidModelError
from scanopt.ir import import_model
from scanopt.scan_view import ScanView, scan_version


@pytest.mark.parametrize(
    "opset, version",
    [(8, 8), (9, 9), (10, 9), (11, 11), (15, 11), (16, 16), (18, 16), (19, 19), (21, 21), (23, 23), (24, 24), (25, 25)],
)
def test_scan_version_per_opset(opset, version):
    assert scan_version(opset) == version


def test_scan_before_opset_8_is_invalid():
    with pytest.raises(InvalidModelError, match="before opset 8"):
        scan_version(7)


def _view(m, opset):
    return ScanView.from_gs(import_model(m).nodes[0], opset)


def test_defaults_for_v9_plus():
    v = _view(b.scan9_sum(opset=16, steps=5), 16)
    assert (v.version, v.num_states, v.num_scan_inputs, v.num_scan_outputs) == (16, 1, 1, 1)
    assert v.input_axes == (0,) and v.output_axes == (0,)
    assert v.input_directions == (0,) and v.output_directions == (0,)
    assert v.trip_count == 5 and v.is_canonical_layout and not v.batched
    assert v.initial_states == ("s0",) and v.scan_inputs == ("X",)
    assert v.final_states == ("s_final",) and v.scan_outputs == ("Y",)


def test_negative_axes_resolved_with_known_rank():
    m = b.scan9_sum(opset=16, steps=4, scan_input_axes=[-2], scan_output_axes=[-1], scan_output_directions=[1])
    v = _view(m, 16)
    assert v.input_axes == (0,) and v.output_axes == (1,)
    assert v.output_directions == (1,) and not v.is_canonical_layout


def test_symbolic_trip_count_is_unknown():
    assert _view(b.scan9_sum(opset=16, steps="T"), 16).trip_count is None


def test_opset8_layout():
    v = _view(b.scan8_sum(batch=3, steps=6, directions=[1]), 8)
    assert v.batched and v.version == 8
    assert v.sequence_lens == "lens" and v.input_directions == (1,)
    assert v.input_axes == (1,) and v.output_axes == (1,) and v.trip_count == 6


def test_opset8_without_sequence_lens():
    v = _view(b.scan8_sum(seq_lens=False), 8)
    assert v.sequence_lens is None and v.initial_states == ("s0",)


def test_top_scan_inputs_read_axes_as_the_scan_view_does():
    """Verification's weak spots and edge inputs find what a top-level Scan scans through one
    helper: Scan-8's sequence axis 1, a negative axis resolved on the declared rank."""
    from onnx import TensorProto as TP
    from onnx import helper as oh

    from scanopt.scan_view import top_scan_inputs

    vi = oh.make_tensor_value_info
    body = oh.make_graph([oh.make_node("Add", ["s", "x"], ["s2"]), oh.make_node("Identity", ["s2"], ["y"])], "b",
                         [vi("s", TP.FLOAT, [2]), vi("x", TP.FLOAT, [2])], [vi("s2", TP.FLOAT, [2]), vi("y", TP.FLOAT, [2])])
    def model(opset, **attrs):
        inputs = ["", "s0", "X"] if opset == 8 else ["s0", "X"]
        scan = oh.make_node("Scan", inputs, ["sT", "Y"], body=body, num_scan_inputs=1, **attrs)
        graph = oh.make_graph([scan], "g", [vi("s0", TP.FLOAT, ["B", 2]), vi("X", TP.FLOAT, ["B", "T", 2])],
                              [vi("sT", TP.FLOAT, None), vi("Y", TP.FLOAT, None)])
        return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])

    assert list(top_scan_inputs(model(8))) == [("X", 1)]
    assert list(top_scan_inputs(model(17, scan_input_axes=[-2]))) == [("X", 1)]
    assert list(top_scan_inputs(model(17))) == [("X", 0)]
    broken = model(17)
    broken.graph.node[0].attribute[1].i = 5  # num_scan_inputs beyond the inputs: skipped, not raised
    assert list(top_scan_inputs(broken)) == []
