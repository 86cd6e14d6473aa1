"""canonicalize on Scan-8: dead states and unread outputs go (tf2onnx's opset-8 dynamic_rnn
carries a step counter and a copy of the state beside the cell state), sequence_lens and the
batch semantics stay, and the cell then fuses at opset 8. Checked for structure and numbers
(onnxruntime and the reference executor, with sequence_lens drawn per item)."""

from __future__ import annotations

import numpy as np
from onnx import helper as h

import cell_builders as cb
import scanopt
from equivalence import assert_equivalent, ops


def _scan8_with_dead_states(lens=True, counter_read=False):
    """A tanh RNN cell as Scan-8 plus two dead states: a step counter (float, +1 per step)
    and a copy of the previous hidden state; with ``counter_read`` the counter's final
    value is a graph output (then it is not dead)."""
    body = cb.Body(batch=False, opset=8)
    h_new = cb.rnn(body, "x", "h", seed=3)
    one = body.const(np.ones(1, np.float32), "one")
    body.nodes.append(h.make_node("Add", ["k", one], ["k_next"]))
    body.nodes.append(h.make_node("Identity", ["h"], ["prev_next"]))
    model = cb.scan8_model(body, [("h", h_new, body.H), ("k", "k_next", 1), ("prev", "prev_next", body.H)], ys=(h_new,), lens=lens)
    g = model.graph
    if not counter_read:
        keep = {"h_n", "Y0"}
        kept = [o for o in g.output if o.name in keep]
        del g.output[:]
        g.output.extend(kept)
    return model


def _canon(model, passes=("canonicalize",)):
    return scanopt.optimize(model, passes=list(passes), verify=False, options={"target": "portable"})


def _scan8(model):
    (node,) = [n for n in model.graph.node if n.op_type == "Scan"]
    return node


def test_dead_states_of_a_scan8_are_removed_and_sequence_lens_kept():
    model = _scan8_with_dead_states()
    out, report = _canon(model)
    outcome = [o for o in report.outcomes if o.pass_name == "canonicalize"][0]
    assert outcome.applied, outcome.detail
    assert "removed dead state 1" in outcome.detail and "removed dead state 2" in outcome.detail
    node = _scan8(out)
    assert list(node.input) == ["lens", "h0", "X"] and list(node.output) == ["h_n", "Y0"]
    (body,) = [a.g for a in node.attribute if a.name == "body"]
    assert [v.name for v in body.input] == ["h", "x"]
    assert out.opset_import[0].version == 8
    lens = np.array([1, 5, 3], np.int64)
    assert_equivalent(model, out, inputs=cb.feeds(model, T=5, B=3, lens=lens))
    assert_equivalent(model, out)


def test_a_read_counter_state_stays():
    model = _scan8_with_dead_states(counter_read=True)
    out, report = _canon(model)
    node = _scan8(out)
    # the counter's final value is read, the copy of h is read too (a graph output): all stay
    assert len(node.input) == 5
    (outcome,) = [o for o in report.outcomes if o.pass_name == "canonicalize"]
    assert not outcome.applied and "already canonical" in outcome.detail


def test_unread_scan_output_and_duplicate_input_of_a_scan8_go():
    body = cb.Body(batch=False, opset=8)
    h_new = cb.rnn(body, "x", "h", seed=5)
    model = cb.scan8_model(body, [("h", h_new, body.H)], ys=(h_new, h_new))
    g = model.graph
    kept = [o for o in g.output if o.name != "Y0"]
    del g.output[:]
    g.output.extend(kept)
    out, report = _canon(model)
    node = _scan8(out)
    assert list(node.output) == ["h_n", "Y1"]
    assert_equivalent(model, out, inputs=cb.feeds(model, T=4, B=2))


def test_a_scan8_cell_with_dead_states_fuses_at_opset_8():
    model = _scan8_with_dead_states()
    out, report = _canon(model, passes=("canonicalize", "fuse", "cleanup"))
    counts = ops(out)
    assert counts["Scan"] == 0 and counts["RNN"] == 1, [o.detail for o in report.outcomes]
    assert out.opset_import[0].version == 8
    for lens in ([1, 5, 3], [5, 5, 2]):
        assert_equivalent(model, out, inputs=cb.feeds(model, T=5, B=3, lens=np.array(lens, np.int64)))
