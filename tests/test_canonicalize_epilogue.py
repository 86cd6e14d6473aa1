"""canonicalize moves a scan output that is an elementwise function of another scan output's
value (``relu(h) * 2`` next to ``h``, as the held-out PyTorch exports emit) after the loop, so
the cell fuses; forms where the stacked computation would differ stay in the loop."""

from __future__ import annotations

import numpy as np
import pytest

import cell_builders as cb
import scanopt
from equivalence import assert_equivalent, ops


def _rnn_with_extra(extra, *, out_dirs=None):
    """An RNN Scan with scan outputs h and ``extra(body, h)``."""
    body = cb.Body()
    h_new = cb.rnn(body, "x", "h")
    model = cb.scan_model(body, [("h", h_new, cb.H)], ys=[h_new, extra(body, h_new)], out_dirs=out_dirs)
    return model


def _canonicalized(model):
    return scanopt.optimize(model, passes=["canonicalize"])


def _relu_times(body, h, factor=np.float32(2.0)):
    return body.op("Mul", body.op("Relu", h), body.const(factor, "two"))


def test_elementwise_output_moves_after_the_loop_and_the_cell_fuses():
    model = _rnn_with_extra(_relu_times)
    out, report = _canonicalized(model)
    assert any("computed after the loop from scan output 0 (Relu, Mul)" in o.detail for o in report.outcomes)
    assert report.verification["passed"] is True
    assert_equivalent(model, out)
    fused, _ = scanopt.optimize(model, options={"target": "portable"})
    assert ops(fused)["Scan"] == 0 and ops(fused)["RNN"] == 1
    assert_equivalent(model, fused)


def test_rank_two_operand_stays_in_the_loop():
    """An operand above rank 1 can raise a step's rank (a [1, 1] on an unbatched step [H] makes
    [1, H], stacked [T, 1, H], while [1, 1] on the stack [T, H] stays [T, H]): such operands are
    left alone, here too, where the step is [B, H] and the result would have been right."""
    model = _rnn_with_extra(lambda body, h: _relu_times(body, h, np.ones((1, 1), np.float32)))
    _, report = _canonicalized(model)
    assert not any("computed after the loop" in o.detail for o in report.outcomes)


def test_opposite_direction_stays_in_the_loop():
    model = _rnn_with_extra(_relu_times, out_dirs=[0, 1])
    _, report = _canonicalized(model)
    assert not any("computed after the loop" in o.detail for o in report.outcomes)


def test_function_of_a_non_output_value_stays_in_the_loop():
    """``relu(x W)`` is elementwise, but of a value no other scan output stacks."""
    def of_projection(body, h):
        return body.op("Relu", body.nodes[0].output[0])
    model = _rnn_with_extra(of_projection)
    _, report = _canonicalized(model)
    assert not any("computed after the loop" in o.detail for o in report.outcomes)


@pytest.mark.parametrize("extra, out_dirs", [
    (lambda body, h: body.op("LeakyRelu", h, alpha=0.3), None),  # an attribute goes with the op
    (lambda body, h: body.op("Div", body.const(np.float32(2.0), "two"), body.op("Add", h, body.const(np.float32(3.0), "three"))),
     None),  # the scalar as the first operand keeps its side
    (lambda body, h: body.op("Tanh", h), [1, 1]),  # both outputs stacked in reverse
], ids=["leaky-relu", "scalar-over-h", "both-reversed"])
def test_other_epilogues_move_and_the_cell_still_fuses(extra, out_dirs):
    model = _rnn_with_extra(extra, out_dirs=out_dirs)
    out, report = _canonicalized(model)
    assert any("computed after the loop" in o.detail for o in report.outcomes)
    assert_equivalent(model, out)
    fused, _ = scanopt.optimize(model, options={"target": "portable"})
    assert ops(fused)["Scan"] == 0 and ops(fused)["RNN"] == 1
    assert_equivalent(model, fused)
