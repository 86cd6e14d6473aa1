"""fuse, LSTM Scans that also emit the cell state per step (PyTorch scans returning (h, c) per
step, hand authors): the native LSTM gives every h_t, the c_t sequence is recomputed from it as
a linear recurrence (passes/fuse/cell_states.py). Numbers match the Scan in onnxruntime and
the reference executor, in every direction and axis; peepholes on i/f and Scan-8 are declined."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import cell_builders as cb
from equivalence import assert_equivalent, loop_scans, ops, work_ops

CELLS = os.path.join(os.path.dirname(__file__), "..", "models", "cells")  # models/generate_cells.py


def lstm_body(batch=True, peep=None, coupled=False, clip=None, acts=("Sigmoid", "Tanh", "Tanh"), opset=17, prefix=""):
    """(body, h_new, c_new, h_act(c_new)) of an ONNX-order LSTM written by hand; ``peep``:
    the gates that peek at the cell state ("i", "f", "o")."""
    b = cb.Body(batch=batch, opset=opset, prefix=prefix)
    H = cb.H
    xw = b.linear("x", cb.rand(1, 4 * H, cb.I), cb.rand(2, 4 * H))
    gates = b.op("Add", xw, b.linear("h", cb.rand(3, 4 * H, H), cb.rand(4, 4 * H)))
    i, o, f, g = b.split(gates, 4)
    if clip is not None:
        if opset < 11:
            i, o, f, g = (b.op("Clip", t, min=-clip, max=clip) for t in (i, o, f, g))
        else:
            lo, hi = b.const(np.float32(-clip), "lo"), b.const(np.float32(clip), "hi")
            i, o, f, g = (b.op("Clip", t, lo, hi) for t in (i, o, f, g))
    for gate in peep or ():
        if gate == "i":
            i = b.op("Add", i, b.op("Mul", b.const(cb.rand(5, H)), "c"))
        if gate == "f":
            f = b.op("Add", f, b.op("Mul", "c", b.const(cb.rand(6, H))))
    f_act, g_act, h_act = acts
    i, g = b.op(f_act, i), b.op(g_act, g)
    if coupled:  # (1 - i)⊙c + i⊙g
        keep = b.op("Sub", b.const(np.float32(1.0), "one"), i)
        c_new = b.op("Add", b.op("Mul", keep, "c"), b.op("Mul", i, g))
    else:
        c_new = b.op("Add", b.op("Mul", b.op(f_act, f), "c"), b.op("Mul", i, g))
    if "o" in (peep or ()):
        o = b.op("Add", o, b.op("Mul", c_new, b.const(cb.rand(7, H))))
    squashed = b.op(h_act, c_new)
    return b, b.op("Mul", b.op(f_act, o), squashed), c_new, squashed


def model(outputs=("h", "c"), c_first=False, body_kw=None, **scan):
    b, h_new, c_new, squashed = lstm_body(**(body_kw or {}))
    states = [("h", h_new, cb.H), ("c", c_new, cb.H)]
    if c_first:
        states.reverse()
    ys = [{"h": h_new, "c": c_new, "tanh_c": squashed}[k] for k in outputs]
    return cb.scan_model(b, states, ys=ys, **scan)


def fused(m, passes=("fuse", "cleanup")):
    """Fuse ``m``: one LSTM, the cell states from one two-node Scan; equal on both engines."""
    out, outcomes = cb.fuse(m, passes)
    assert outcomes[0].applied, outcomes[0].detail  # (the c recurrence's own Scan is not a cell: skipped)
    assert "the per-step cell state recomputed from Y" in outcomes[0].detail
    counts = ops(out)
    assert counts["LSTM"] == 1, counts
    assert_equivalent(m, out)
    assert_equivalent(m, out, inputs=cb.feeds(m, T=9, B=3))
    return out, counts


@pytest.mark.parametrize("scan", [
    {},
    {"in_dir": 1},  # reverse LSTM: c_t follows c_{t+1}, h0 after the last step
    {"in_dir": 1, "out_dirs": [1, 1]},  # reverse scan, prepending outputs (aligned with X)
    {"out_dirs": [0, 1]},  # the c sequence written backwards
    {"in_axis": 1, "out_axes": [1, 1]},  # batch-major X and outputs
])
def test_cell_state_per_step_fuses_in_every_direction_and_axis(scan):
    out, counts = fused(model(**scan))
    assert counts["Scan"] == 1 and counts["Loop"] == 0  # the c recurrence: Mul + Add per step
    (scan_node,) = [n for n in out.graph.node if n.op_type == "Scan"]
    assert sorted(n.op_type for n in scan_node.attribute[0].g.node) == ["Add", "Identity", "Mul"]


def test_only_the_cell_state_read_and_it_is_the_first_state():
    fused(model(outputs=("c",), c_first=True))


def test_output_activation_of_the_cell_state_and_the_cell_state_itself():
    fused(model(outputs=("tanh_c", "h", "c")))


@pytest.mark.parametrize("body_kw", [
    {"batch": False},  # x [I], h [H]
    {"coupled": True},  # input_forget=1: f = 1 - i
    {"clip": 0.7},  # the clip attribute also bounds the recomputed gates
    {"peep": "o"},  # the output gate reads c_new: c's recurrence does not see it
    {"acts": ("HardSigmoid", "Softsign", "Tanh")},
    {"opset": 9, "batch": False},  # Squeeze/Slice attributes (forward: reversing Y needs opset 10)
    {"opset": 10, "clip": 0.5},  # Clip's bounds as attributes
])
def test_cell_state_per_step_fuses_for_cell_variants(body_kw):
    fused(model(body_kw=body_kw, in_dir=int(body_kw.get("opset", 17) >= 10)))


def test_forward_and_reverse_scans_over_one_x_fuse_one_native_op_each():
    """A pair that would merge into one bidirectional op stays two ops when one emits c."""
    first = model(outputs=("h", "c"))
    b, h_new, c_new, _ = lstm_body(prefix="r_")
    second = cb.scan_model(b, [("h", h_new, cb.H), ("c", c_new, cb.H)], ys=[h_new], in_dir=1)
    m = cb.two_scans(first, second)
    out, outcomes = cb.fuse(m)
    assert [o.applied for o in outcomes][:2] == [True, True], [o.detail for o in outcomes]
    assert ops(out)["LSTM"] == 2 and "bidirectional" not in " ".join(o.detail for o in outcomes)
    assert_equivalent(m, out, inputs=cb.feeds(m, T=9, B=2))


def test_projection_computed_outside_the_loop_is_folded_for_the_recomputed_gates_too():
    """scanopt's hoist writes X·W + b outside; fusing its output reads X with W folded in."""
    import scanopt

    m = model(in_dir=1)
    hoisted, report = scanopt.optimize(m, passes=["canonicalize", "hoist", "cleanup"], verify=False,
                                       options={"target": "portable"})
    assert any(o.applied for o in report.outcomes if o.pass_name == "hoist")
    out, outcomes = cb.fuse(hoisted)
    assert outcomes[0].applied and "input projection" in outcomes[0].detail, outcomes[0].detail
    assert_equivalent(m, out, inputs=cb.feeds(m, T=9, B=3))


def test_linrec_makes_the_cell_state_recurrence_loop_free():
    m = model()
    out, outcomes = cb.fuse(m, passes=("fuse", "linrec", "cleanup"))
    counts = work_ops(out)  # but the Scan behind the If where the state is not finite
    assert counts["LSTM"] == 1 and loop_scans(out) == 0, counts  # and linrec's own chunk Scans
    assert_equivalent(m, out, inputs=cb.feeds(m, T=40, B=2))


@pytest.mark.parametrize("peep", ["i", "f"])
def test_peepholes_on_the_input_or_forget_gate_are_declined(peep):
    m = model(body_kw={"peep": peep})
    out, outcomes = cb.fuse(m)
    assert [o.applied for o in outcomes] == [False], [o.detail for o in outcomes]
    assert "scan output 1 is the cell state of every step" in outcomes[0].detail
    assert "peeks at c_{t-1} (peepholes)" in outcomes[0].detail
    assert ops(out)["Scan"] == 1 and ops(out)["LSTM"] == 0


def test_scan8_cell_state_outputs_are_declined():
    b, h_new, c_new, _ = lstm_body(batch=False, opset=8)
    m = cb.scan8_model(b, [("h", h_new, cb.H), ("c", c_new, cb.H)], ys=[h_new, c_new], lens=True)
    out, outcomes = cb.fuse(m)
    assert [o.applied for o in outcomes] == [False], [o.detail for o in outcomes]
    assert "opset-8 batched Scan" in outcomes[0].detail


@pytest.mark.parametrize("name", ["torch_scan_lstm_hc", "torch_scan_lstm_hc_flip", "torch_script_lstm_hc_stack"])
def test_pytorch_exports_returning_h_and_c_per_step(name):
    m = onnx.load(os.path.join(CELLS, f"{name}.onnx"))
    import scanopt

    out, report = scanopt.optimize(m, options={"target": "portable"})
    applied = [o for o in report.outcomes if o.pass_name == "fuse" and o.applied]
    assert len(applied) == 1 and "the per-step cell state recomputed from Y" in applied[0].detail
    assert report.verification["passed"] is True, report.verification
    assert ops(out)["LSTM"] == 1
    cb.matches_torch(out, name, CELLS)
    assert_equivalent(m, out, engine="both")


def _sized(H):
    body = cb.Body(hidden=H, inputs=H)
    h_new, c_new = cb.lstm(body, "x", "h", "c")
    return cb.scan_model(body, [("h", h_new, H), ("c", c_new, H)], ys=[h_new, c_new])


@pytest.mark.parametrize("B, applied", [(1, True), (8, False)])
def test_the_cost_model_prices_the_recomputed_gates_and_the_c_loop(B, applied):
    """H = I = 64, T = 128: measured (benchmarks/bench_lstm_cell_states.py) 1.8-1.95x faster at
    B = 1 and 0.73-0.87x at B = 8 (the gates' products done twice); unmeasured, the model decides."""
    import scanopt

    shapes = {"X": [128, B, 64], "h0": [B, 64], "c0": [B, 64]}
    out, report = scanopt.optimize(_sized(64), input_shapes=shapes, options={"tune": False}, verify=False)
    (first, *_) = [o for o in report.outcomes if o.pass_name == "fuse"]
    assert first.applied is applied, first.detail
    assert ops(out)["LSTM"] == int(applied)
    if not applied:
        assert "predicted slower than the loop" in first.detail


@pytest.mark.parametrize("fastest, linrec_applied", [("native", False), ("native+linrec", True)])
def test_tuning_measures_native_with_and_without_linrec_and_the_choice_binds_the_c_loop(monkeypatch, tmp_path,
                                                                                        fastest, linrec_applied):
    """The c loop fuse emits is a new Scan: linrec applies to it only if the measured form of the
    Scan it came from includes linrec (at T=16 the loop-free form measured 0.63x of the loop,
    native alone 1.67x; at T=1024 B=1 8.3x against 3.7x)."""
    import scanopt
    import scanopt.tune
    from test_tune import FakeTimer

    monkeypatch.setenv("SCANOPT_CACHE_DIR", str(tmp_path / "cache"))
    timer = FakeTimer({"native": 0.6, "native+linrec": 0.7, "hoisted": 0.9})
    timer.factors[fastest] = 0.3
    monkeypatch.setattr(scanopt.tune, "measure", timer)
    m = model()
    out, report = scanopt.optimize(m, input_shapes={"X": [16, 4, cb.I], "h0": [4, cb.H], "c0": [4, cb.H]},
                                   options={"tune": True}, seeds=1)
    (forms, _, _), = timer.calls
    assert forms[:3] == ["loop", "native", "hoisted"] and "native+linrec" in forms, forms
    linrec = [o for o in report.outcomes if o.pass_name == "linrec" and o.measured]
    assert [o.applied for o in linrec] == [linrec_applied], [o.detail for o in report.outcomes]
    assert ops(out)["LSTM"] == 1
    assert report.verification["passed"] is True


@pytest.mark.parametrize("scan", [{}, {"in_dir": 1}])
def test_zero_steps_give_an_empty_cell_state_sequence_and_the_initial_final_states(scan):
    """The reference executor runs a zero-length Scan-9 (onnxruntime 1.31 crashes on one)."""
    m = model(**scan)
    out, _ = cb.fuse(m)
    assert_equivalent(m, out, inputs=cb.feeds(m, T=0, B=2), engine="reference")
