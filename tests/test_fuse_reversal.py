"""fuse and ReverseSequence with run-time lengths before the Scan (issue 12).

Lengths built from ``Shape(X)`` at the time axis and broadcast (``fill([batch], T)``, as TF
converters write it) reverse X whole: the Scan becomes the reverse direction (and merges with a
forward partner into a bidirectional op). Any other run-time lengths may be shorter than T; a
Scan-9+ then also runs over the unreversed tail, which a reverse op with sequence_lens would not
read, so it is fused forward over the ReverseSequence output and the report says why."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import cell_builders as cb
from equivalence import assert_equivalent, ops

H, I = cb.H, cb.I


def _cell_model(kind="GRU", prefix="", seed=0):
    body = cb.Body(prefix=prefix)
    states, h_new = cb.cell(kind, body, seed=seed)
    return cb.scan_model(body, states, ys=[h_new])


def _reverse_input(model, lens="input", scan_index=-1, realign=True):
    """Scan ``scan_index`` reads ReverseSequence(X, lens) (time axis 0, batch axis 1); with
    ``realign`` its scan output goes through ReverseSequence(Y, lens) too. ``lens``: "input" (a
    graph input), "gather"/"slice"/"shape15" (T from Shape(X), expanded to [batch]), "int32" (as
    tf2onnx writes TF's int32 lengths: Shape cast to int32, lengths cast back), "ones_mul" /
    "zeros_add" (ConstantOfShape([batch], 1) * T, ConstantOfShape([batch], 0) + T), or the
    not-T forms "batch_dim" (Shape(X)[1], the wrong axis) and "zeros_mul" (ConstantOfShape 0 * T: all zeros)."""
    g = model.graph
    scan = [n for n in g.node if n.op_type == "Scan"][scan_index]
    scan.input[-1] = "X_rev"
    nodes = []
    c = lambda name, v: g.initializer.append(numpy_helper.from_array(np.asarray(v, np.int64), name))  # noqa: E731
    if lens == "input":
        g.input.append(h.make_tensor_value_info("lens", TP.INT64, ["batch"]))
    else:
        c("i0", 0), c("b1", [1]), c("s0", [0]), c("e1", [1]), c("e2", [2])
        if lens == "shape15":
            nodes.append(h.make_node("Shape", ["X"], ["T1"], start=0, end=1))
        elif lens == "int32":
            nodes += [h.make_node("Shape", ["X"], ["shp64"]), h.make_node("Cast", ["shp64"], ["shp"], to=TP.INT32),
                      h.make_node("Gather", ["shp", "i0"], ["T0"], axis=0), h.make_node("Reshape", ["T0", "b1"], ["T1"])]
        elif lens == "slice":
            nodes += [h.make_node("Shape", ["X"], ["shp"]), h.make_node("Slice", ["shp", "s0", "e1"], ["T1"])]
        else:
            nodes += [h.make_node("Shape", ["X"], ["shp"]),
                      h.make_node("Gather", ["shp", "b1" if lens == "batch_dim" else "i0"], ["T0"], axis=0),
                      h.make_node("Reshape", ["T0", "b1"], ["T1"])]
        nodes += [h.make_node("Shape", ["X"], ["shp_b"]), h.make_node("Slice", ["shp_b", "e1", "e2"], ["B1"])]
        if lens in ("ones_mul", "zeros_add", "zeros_mul"):
            fill = {"ones_mul": 1, "zeros_add": 0, "zeros_mul": 0}[lens]
            nodes += [h.make_node("ConstantOfShape", ["B1"], ["filled"], value=h.make_tensor("v", TP.INT64, [1], [fill])),
                      h.make_node("Add" if lens == "zeros_add" else "Mul", ["filled", "T1"], ["lens"])]
        elif lens == "int32":
            nodes += [h.make_node("Expand", ["T1", "B1"], ["lens32"]), h.make_node("Cast", ["lens32"], ["lens"], to=TP.INT64)]
        else:
            nodes.append(h.make_node("Expand", ["T1", "B1"], ["lens"]))
    nodes.append(h.make_node("ReverseSequence", ["X", "lens"], ["X_rev"], time_axis=0, batch_axis=1))
    if realign:
        y = scan.output[-1]
        scan.output[-1] = y + "_scan"
        g.node.append(h.make_node("ReverseSequence", [y + "_scan", "lens"], [y], time_axis=0, batch_axis=1))
    for k, n in enumerate(nodes):
        g.node.insert(k, n)
    return model


def _fused(model, kind):
    out, outcomes = cb.fuse(model)
    assert [o.applied for o in outcomes] == [True] * len(outcomes), [o.detail for o in outcomes]
    assert ops(out)["Scan"] == 0 and ops(out)[kind] == 1, ops(out)
    assert_equivalent(model, out)
    return out, outcomes


@pytest.mark.parametrize("lens", ["gather", "slice", "shape15", "int32", "ones_mul", "zeros_add"])
def test_lengths_from_shape_of_x_reverse_it_whole(lens):
    model = _reverse_input(_cell_model(), lens=lens)
    out, _ = _fused(model, "GRU")
    assert cb.native(out)[1]["direction"] == b"reverse"
    assert_equivalent(model, out, inputs=cb.feeds(model, T=7, B=3))


def test_forward_scan_and_scan_over_x_reversed_by_shape_lengths_merge_into_bidirectional():
    model = _reverse_input(cb.two_scans(_cell_model("LSTM"), _cell_model("LSTM", prefix="b_", seed=7)), lens="gather")
    out, _ = _fused(model, "LSTM")
    assert cb.native(out)[1]["direction"] == b"bidirectional"


@pytest.mark.parametrize("lens", ["input", "batch_dim", "zeros_mul"])
def test_run_time_lengths_fuse_forward_and_say_why_not_reverse(lens):
    """Lengths that may be shorter than T: the Scan runs past them over the unreversed tail."""
    model = _reverse_input(_cell_model("RNN"), lens=lens)
    out, outcomes = _fused(model, "RNN")
    assert cb.native(out)[1].get("direction", b"forward") == b"forward"
    assert ops(out)["ReverseSequence"] == 2  # the user's, before and after: the native op reads X_rev
    detail = outcomes[0].detail
    assert "fused forward over ReverseSequence" in detail and "unreversed tail past each length" in detail, detail
    if lens == "input":
        feeds = cb.feeds(model, T=6, B=3, lens=[6, 2, 1])
        assert_equivalent(model, out, inputs=feeds)


def test_a_reverse_op_with_those_lengths_would_differ_past_the_length():
    """Why the short-length form is not the reverse direction: the Scan over ReverseSequence(X, [2])
    keeps stepping over x[2:], so its final state is not the reverse op's (x[1], x[0] only)."""
    from scanopt.engines import run as run_engine

    model = _reverse_input(_cell_model("RNN"), lens="input", realign=False)
    (feeds,) = cb.feeds(model, T=5, B=1, lens=[2])
    scan_final = run_engine(model, feeds, "ort")["h_n"]
    head = dict(feeds, X=feeds["X"][:2], lens=np.array([2], np.int64))  # what a reverse op with lens=2 reads
    reverse_final = run_engine(model, head, "ort")["h_n"]
    assert np.abs(scan_final - reverse_final).max() > 1e-3
