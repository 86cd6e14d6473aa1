"""canonicalize splits a Scan whose states split one way (an RNN's h, and a running sum or
EMA of h) into two Scans, so fuse makes the first native and linrec the second loop-free;
a mutual dependency stays one Scan with its reason. Every result is compared numerically
with the original in onnxruntime and the reference executor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import cell_builders as cb
import scanopt
from equivalence import assert_equivalent, ops, work_ops

MODELS = Path(__file__).resolve().parent.parent / "models"
PORTABLE = {"target": "portable"}


def _pair(accumulate, *, ys=lambda body, h, s: [h], chain=False, in_dir=0, out_dirs=None, mutual=False):
    """A Scan with states h (a tanh RNN cell) and s (``accumulate(body, s, h_new)``); with
    ``chain`` a third state u accumulates s; ``mutual`` makes h read s too."""
    body = cb.Body()
    h_new = cb.rnn(body, "x", "h")
    if mutual:
        h_new = body.op("Add", h_new, body.op("Mul", "s", body.const(np.float32(0.5), "half")))
    s_new = accumulate(body, "s", h_new)
    states = [("h", h_new, cb.H), ("s", s_new, cb.H)]
    if chain:
        states.append(("u", body.op("Add", "u", s_new), cb.H))
    outputs = ys(body, h_new, s_new)
    return cb.scan_model(body, states, ys=outputs, in_dir=in_dir, out_dirs=out_dirs or [0] * len(outputs))


def _sum(body, s, h):
    return body.op("Add", s, h)


def _ema(body, s, h):
    return body.op("Add", body.op("Mul", s, body.const(np.float32(0.9), "decay")),
                   body.op("Mul", h, body.const(np.float32(0.1), "rate")))


def _splits(report) -> list[str]:
    return [o.detail for o in report.outcomes if o.pass_name == "canonicalize" and o.applied and "split into" in o.detail]


@pytest.mark.parametrize("accumulate", [_sum, _ema], ids=["sum", "ema"])
def test_running_sum_and_ema_of_h_split_fuse_and_lose_their_loop(accumulate):
    model = _pair(accumulate)
    out, report = scanopt.optimize(model, options=PORTABLE)
    assert len(_splits(report)) == 1, [o.detail for o in report.outcomes]
    assert ops(out)["RNN"] == 1 and "the pieces get fuse and linrec" in _splits(report)[0]
    assert_equivalent(model, out)


def test_split_alone_keeps_every_output_and_the_finals():
    """canonicalize with the split forced and nothing after it: two Scans, same numbers."""
    model = _pair(_sum, ys=lambda body, h, s: [h, s])
    out, report = scanopt.optimize(model, passes=["canonicalize"], options={"fission": "always"})
    assert ops(out)["Scan"] == 2
    assert _splits(report) and "reading" in _splits(report)[0]
    assert_equivalent(model, out)


def test_an_output_read_from_both_groups_goes_with_the_second():
    model = _pair(_sum, ys=lambda body, h, s: [h, body.op("Add", h, s)])
    out, report = scanopt.optimize(model, options=PORTABLE)
    assert "states [1] with scan outputs [1]" in _splits(report)[0]
    assert ops(out)["RNN"] == 1
    assert_equivalent(model, out)


@pytest.mark.parametrize("out_dirs", [[0], [1]], ids=["appending", "prepending"])
def test_reversed_scan_input(out_dirs):
    model = _pair(_sum, in_dir=1, out_dirs=out_dirs)
    out, report = scanopt.optimize(model, options=PORTABLE)
    assert _splits(report) and ops(out)["RNN"] == 1
    assert_equivalent(model, out)


def test_three_group_chain_comes_apart_in_order():
    model = _pair(_sum, chain=True)
    out, report = scanopt.optimize(model, options=PORTABLE)
    splits = _splits(report)
    assert len(splits) == 2 and "states [0]" in splits[0] and "states [1] with" in splits[1], splits
    assert ops(out)["Scan"] == 0 and ops(out)["RNN"] == 1
    assert_equivalent(model, out)


def test_mutual_dependency_is_not_split_and_says_why():
    model = _pair(_sum, mutual=True)
    out, report = scanopt.optimize(model, options=PORTABLE)
    reasons = [o.detail for o in report.outcomes if o.pass_name == "canonicalize" and not o.applied]
    assert any("state 0 reads state 1 and state 1 reads state 0" in r for r in reasons), reasons
    assert not _splits(report) and ops(out)["Scan"] == 1


def test_no_split_when_no_piece_gets_a_form():
    """Two tanh recurrences that fuse cannot read (h and tanh(s + h)): splitting would only
    add a loop, so the Scan stays whole (auto) and splits when asked (always)."""
    model = _pair(lambda body, s, h: body.op("Tanh", body.op("Add", s, h)))
    out, report = scanopt.optimize(model, options=PORTABLE, passes=["canonicalize", "linrec"])
    assert ops(out)["Scan"] == 1 and not _splits(report)
    assert any("no piece would then be native or loop-free" in o.detail for o in report.outcomes)
    forced, _ = scanopt.optimize(model, passes=["canonicalize"], options={"fission": "always"})
    assert ops(forced)["Scan"] == 2
    assert_equivalent(model, forced)


def test_fission_never_keeps_the_scan():
    out, report = scanopt.optimize(_pair(_sum), options=dict(PORTABLE, fission="never"))
    assert ops(out)["Scan"] == 1 and not _splits(report)


def _scan8_pair(reverse):
    body = cb.Body(batch=False)
    h_new = cb.rnn(body, "x", "h")
    s_new = body.op("Add", "s", h_new)
    return cb.scan8_model(body, [("h", h_new, cb.H), ("s", s_new, cb.H)], ys=[h_new], reverse=reverse)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_scan8_with_sequence_lens_splits_exactly(reverse):
    """Batch-major stacks, zeros past each length, reverse from len - 1: the rest reads
    step t of what the first piece computed at step t."""
    model = _scan8_pair(reverse)
    out, report = scanopt.optimize(model, passes=["canonicalize"], options={"fission": "always"})
    assert ops(out)["Scan"] == 2 and _splits(report)
    assert_equivalent(model, out)


def test_scan8_cell_fuses_at_opset_8_after_the_split():
    model = _scan8_pair(False)
    fused, report = scanopt.optimize(model, options=PORTABLE)
    assert _splits(report) and ops(fused)["RNN"] == 1 and ops(fused)["Scan"] == 1
    assert_equivalent(model, fused)


@pytest.mark.parametrize("path, native", [
    ("heldout_producers/tf_scan_pair.onnx", "RNN"),  # tf2onnx: tf.scan over (h, sum of h), a Loop
    ("loops/dyn_while_rnn_sum.onnx", "RNN"),  # torch.while_loop RNN with a running sum
    ("fission/dyn_scan_rnn_sum.onnx", "RNN"),  # dynamo scan HOP, carry (h, s)
    ("fission/dyn_scan_lstm_ema.onnx", "LSTM"),  # dynamo scan HOP, carry (h, c, EMA of h)
    ("fission/ts_rnn_sum_stack.onnx", "RNN"),  # TorchScript loop, torch.stack(outs)
])
def test_real_exports_fuse_after_the_split(path, native):
    model = onnx.load(str(MODELS / path))
    out, report = scanopt.optimize(model, options=PORTABLE)
    assert _splits(report), [o.detail for o in report.outcomes]
    counts = ops(out)
    assert counts[native] == 1 and counts["Loop"] == 0
    if "ema" not in path:  # a running sum is one CumSum; an EMA takes linrec's chunked form
        assert counts["Scan"] == 0
    assert_equivalent(model, out)
    stored = np.load(str(MODELS / path).replace(".onnx", ".expected.npz"))
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {i.name: stored[i.name] for i in model.graph.input})
    for value, output in zip(got, model.graph.output):
        np.testing.assert_allclose(value, stored[output.name], rtol=1e-4, atol=1e-5)


def test_a_nested_body_reading_h_moves_its_read_to_the_frontier():
    """s' = s + If(c, h', 2·h'): the If's branches read h' by outer-scope capture; in the
    second Scan they read the stacked h' instead."""
    from onnx import TensorProto as TP
    from onnx import helper as oh

    body = cb.Body()
    h_new = cb.rnn(body, "x", "h")
    then = oh.make_graph([oh.make_node("Identity", [h_new], ["then_out"])], "then", [],
                         [oh.make_tensor_value_info("then_out", TP.FLOAT, None)])
    other = oh.make_graph([oh.make_node("Add", [h_new, h_new], ["else_out"])], "else", [],
                          [oh.make_tensor_value_info("else_out", TP.FLOAT, None)])
    flag = body.const(np.array(False), "flag")
    picked = body.op("If", flag, then_branch=then, else_branch=other)
    s_new = body.op("Add", "s", picked)
    model = cb.scan_model(body, [("h", h_new, cb.H), ("s", s_new, cb.H)], ys=[h_new])
    out, report = scanopt.optimize(model, passes=["canonicalize"], options={"fission": "always"})
    assert ops(out)["Scan"] == 2 and _splits(report), [o.detail for o in report.outcomes]
    assert_equivalent(model, out)


def _choice(form, passes):
    """A measured choice as scanopt.tune hands it to the cost policy (times in seconds)."""
    times = {"loop": 1e-3, form: 5e-4} if form != "loop" else {"loop": 1e-3}
    return {"form": form, "passes": passes, "times": times, "noise": 0.02, "rounds": 9, "clock": "thread CPU",
            "where": "T=16 B=1 (declared)", "same": {}}


def test_measured_loop_keeps_the_scan_whole():
    """Canonicalize runs inside every form the tuner times, so a measured "loop" means the
    split forms lost: no split."""
    out, report = scanopt.optimize(_pair(_sum), options={"measured": {"cell_scan": _choice("loop", [])}, "tune": False})
    assert ops(out)["Scan"] == 1 and not _splits(report)
    assert any("the measured fastest form is loop" in o.detail for o in report.outcomes)


def test_measured_split_form_splits_and_both_pieces_follow_it():
    """Measured "native" (fuse alone): the first piece fuses, the second stays a loop even
    though linrec would rewrite it (its modelled verdict would apply it)."""
    model = _pair(_sum)
    measured = {"cell_scan": _choice("native", ["fuse"])}
    out, report = scanopt.optimize(model, options={"measured": measured, "tune": False})
    assert _splits(report) and ops(out)["RNN"] == 1 and ops(out)["Scan"] == 1, [o.detail for o in report.outcomes]
    assert any(o.pass_name == "linrec" and o.declined_for_speed for o in report.outcomes)
    assert_equivalent(model, out)


def test_modelled_default_splits_where_the_pieces_are_modelled_no_slower_anywhere():
    """Shapes unknown, target onnxruntime: the native RNN at I=3, H=4 is modelled faster in
    geometric mean and at most 25% slower than its loop at every point of the assumed range
    (measured 1.3-8x faster there), and the running sum's CumSum never slower: the pair is
    split, the pieces become an RNN and a CumSum, verified; no loop is left."""
    out, report = scanopt.optimize(_pair(_sum), options={"tune": False})
    assert _splits(report) and work_ops(out)["RNN"] == 1 and work_ops(out)["Scan"] == 0
    assert report.verification["passed"] is True


def test_a_scan_a_pass_rewrites_whole_is_not_split():
    """Two independent running sums: linrec takes the whole Scan, so it stays one."""
    body = cb.Body()
    a = body.op("Add", "s", body.op("Mul", "x", body.const(np.float32(2.0), "two")))
    c = body.op("Add", "u", body.op("Mul", "x", body.const(np.float32(3.0), "three")))
    model = cb.scan_model(body, [("s", a, cb.I), ("u", c, cb.I)], ys=[])
    _, report = scanopt.optimize(model, passes=["canonicalize", "linrec"], options=PORTABLE)
    reasons = [o.detail for o in report.outcomes if o.pass_name == "canonicalize" and not o.applied]
    assert any("the Scan as it is gets linrec" in r for r in reasons), reasons
    assert not _splits(report)


def test_an_unknown_fission_mode_is_named_and_nothing_splits():
    out, report = scanopt.optimize(_pair(_sum), options=dict(PORTABLE, fission="sometimes"))
    assert not _splits(report) and ops(out)["RNN"] == 0
    assert any("option fission='sometimes' is not one of auto, always, never" in o.detail for o in report.outcomes)


def _squared_cell_pair(accumulate):
    """h' = tanh(x W + h R + b)², which no native op computes, beside ``accumulate`` of h'."""
    body = cb.Body()
    t = cb.rnn(body, "x", "h")
    h_new = body.op("Mul", t, t)
    s_new = accumulate(body, "s", h_new)
    return cb.scan_model(body, [("h", h_new, cb.H), ("s", s_new, cb.H)], ys=[h_new])


def test_portable_does_not_split_when_no_piece_loses_its_loop():
    """The EMA's only form at a symbolic length is linrec's chunked Loops, and the cell stays a
    loop: the split would turn one loop into three (target portable counts, not guesses)."""
    model = _squared_cell_pair(_ema)
    out, report = scanopt.optimize(model, options=PORTABLE)
    assert not _splits(report)
    reason = next(o.detail for o in report.outcomes if "not split" in o.detail)
    assert "no piece would then be native or loop-free" in reason and "linrec (" in reason and "loops)" in reason
    assert ops(out)["Scan"] + ops(out)["Loop"] == 1
    assert_equivalent(model, out)


def test_portable_splits_when_a_piece_becomes_loop_free():
    """A running sum's form has no loop left (a ReduceSum: only its final value is read): the
    split pays even though the cell stays a loop."""
    model = _squared_cell_pair(_sum)
    out, report = scanopt.optimize(model, options=PORTABLE)
    assert len(_splits(report)) == 1, [o.detail for o in report.outcomes]
    assert "the pieces get a loop and linrec" in _splits(report)[0]
    assert ops(out)["Scan"] == 1 and ops(out)["Loop"] == 0
    assert_equivalent(model, out)


def test_keras_masking_gru_stays_one_loop_under_portable():
    """Keras' Masking -> GRU: before, the split gave three Scans (one loop before)."""
    model = onnx.load(str(MODELS / "heldout_producers_2" / "keras_masking_gru.onnx"))
    out, report = scanopt.optimize(model, options=PORTABLE)
    assert not _splits(report)
    assert ops(out)["Scan"] + ops(out)["Loop"] == 1
    assert any("no piece would then be native or loop-free" in o.detail for o in report.outcomes)
    assert report.verification["passed"] is True
