"""canonicalize moves a scan output computed from another scan output's stacked value (``relu(h)
* 2``, a projection ``h·V``, ``softmax(h·V)``, ``h·V + x·U``) after the loop, lifted over the step
axis, so the loop keeps the cell and it fuses; forms whose stacked computation would differ stay
in the loop with the reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cell_builders as cb
import scanopt
from equivalence import assert_equivalent, ops

MODELS = Path(__file__).resolve().parent.parent / "models"
PORTABLE = {"target": "portable"}


def _rnn_with_extra(extra, *, out_dirs=None, in_dir=0, finals=True):
    """An RNN Scan with scan outputs h and ``extra(body, h)``."""
    body = cb.Body()
    h_new = cb.rnn(body, "x", "h")
    return cb.scan_model(body, [("h", h_new, cb.H)], ys=[h_new, extra(body, h_new)], out_dirs=out_dirs,
                         in_dir=in_dir, finals=finals)


def _canonicalized(model):
    return scanopt.optimize(model, passes=["canonicalize"])


def _moved(report) -> list[str]:
    return [part for o in report.outcomes for part in o.detail.split("; ") if "computed after the loop" in part]


def _details(report) -> str:
    return " | ".join(o.detail for o in report.outcomes)


def _body_ops(model) -> list[str]:
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    return [n.op_type for n in next(a.g for a in scan.attribute if a.name == "body").node]


def _relu_times(body, h, factor=np.float32(2.0)):
    return body.op("Mul", body.op("Relu", h), body.const(factor, "two"))


def _projection(body, h, seed=7):
    return body.op("MatMul", h, body.const(cb.rand(seed, cb.H, cb.H), "v"))


def _softmax_of_projection(body, h):
    return body.op("Softmax", _projection(body, h), axis=-1)


def _layer_norm(body, h):
    return body.op("LayerNormalization", h, body.const(cb.rand(3, cb.H) + 1, "g"), body.const(cb.rand(4, cb.H), "b"),
                   axis=-1)


def _projection_plus_input(body, h):
    """h·V + x·U: reads the stacked h and the scan input."""
    return body.op("Add", _projection(body, h), body.op("MatMul", "x", body.const(cb.rand(8, cb.I, cb.H), "u")))


def _fuses(model):
    fused, report = scanopt.optimize(model, options=PORTABLE)
    assert ops(fused)["Scan"] == 0 and ops(fused)["RNN"] == 1, [o.detail for o in report.outcomes]
    assert_equivalent(model, fused)


def test_elementwise_output_moves_after_the_loop_and_the_cell_fuses():
    model = _rnn_with_extra(_relu_times)
    out, report = _canonicalized(model)
    assert any("computed after the loop from scan output 0 (Relu, Mul)" in d for d in _moved(report))
    assert report.verification["passed"] is True
    assert_equivalent(model, out)
    _fuses(model)


@pytest.mark.parametrize("extra, lifted", [
    (_projection, ["MatMul"]),
    (_softmax_of_projection, ["MatMul", "Softmax"]),
    (_layer_norm, ["LayerNormalization"]),
    (_projection_plus_input, ["MatMul", "MatMul", "Add"]),
    (lambda body, h: body.op("MatMul", body.op("Concat", h, "x", axis=-1), body.const(cb.rand(5, cb.H + cb.I, cb.H), "w")),
     ["Concat", "MatMul"]),
    (lambda body, h: body.op("Reshape", body.op("Transpose", body.op("Reshape", h, body.const(np.array([0, 2, 2], np.int64), "s")),
                                                perm=[0, 2, 1]), body.const(np.array([0, -1], np.int64), "s2")),
     ["Reshape", "Transpose", "Reshape"]),
    (lambda body, h: body.op("MatMul", h, body.op("Transpose", body.const(cb.rand(5, cb.H, cb.H), "w"), perm=[1, 0])),
     ["Transpose", "MatMul"]),  # an invariant node of the body is copied once
], ids=["projection", "softmax-over-features", "layernorm", "projection-plus-input", "concat-h-x", "reshape-transpose",
        "weight-transposed-in-body"])
def test_per_step_functions_of_h_move_after_the_loop_and_the_cell_fuses(extra, lifted):
    model = _rnn_with_extra(extra)
    out, report = _canonicalized(model)
    [line] = _moved(report)
    assert f"({', '.join(lifted)})" in line, line
    assert_equivalent(model, out)
    _fuses(model)


def test_the_projection_leaves_the_body():
    model = _rnn_with_extra(_softmax_of_projection)
    out, _ = _canonicalized(model)
    assert "Softmax" not in _body_ops(out)
    assert _body_ops(out).count("MatMul") == _body_ops(model).count("MatMul") - 1
    assert ops(out)["Softmax"] == 1  # once, after the loop


@pytest.mark.parametrize("in_dir, out_dirs", [(1, [1, 1]), (1, [0, 0]), (0, [1, 1])],
                         ids=["reverse-in-prepend-out", "reverse-in", "prepend-out"])
def test_directions_are_kept(in_dir, out_dirs):
    """The lifted nodes read the stacks in the output's order (they act on each step alone);
    a scan input is read only when neither it nor the output runs in reverse (else a reversal
    after the loop would cost what the loop does for free): that output stays, with the reason."""
    model = _rnn_with_extra(_softmax_of_projection, in_dir=in_dir, out_dirs=out_dirs)
    out, report = _canonicalized(model)
    assert _moved(report)
    assert_equivalent(model, out)
    _fuses(model)
    with_input = _rnn_with_extra(_projection_plus_input, in_dir=in_dir, out_dirs=out_dirs)
    _, report = _canonicalized(with_input)
    assert not _moved(report) and "runs in reverse (a reversal after the loop" in _details(report)


def test_a_reversed_scan_input_is_not_read_after_the_loop():
    """A Slice reversing X feeding the Scan is folded into the direction; an output reading
    x_t then stays in the loop rather than keep the reversal alive."""
    model = _rnn_with_extra(_projection_plus_input)
    graph = model.graph
    rev = [onnx.numpy_helper.from_array(np.array([v], np.int64), name) for v, name in
           ((-1, "rev_start"), (np.iinfo(np.int64).min, "rev_end"), (0, "rev_axis"), (-1, "rev_step"))]
    graph.initializer.extend(rev)
    graph.node.insert(0, onnx.helper.make_node("Slice", ["X", "rev_start", "rev_end", "rev_axis", "rev_step"], ["X_rev"]))
    scan = graph.node[-1]
    scan.input[-1] = "X_rev"
    out, report = _canonicalized(model)
    assert not _moved(report) and "a reversal (which canonicalize folds into the direction" in _details(report)
    assert ops(out)["Slice"] == 0
    assert_equivalent(model, out)


def test_two_outputs_from_the_same_state():
    """h, h·V and softmax(h·V): both functions move; the cell's h stays the one scan output."""
    body = cb.Body()
    h_new = cb.rnn(body, "x", "h")
    model = cb.scan_model(body, [("h", h_new, cb.H)], ys=[h_new, _projection(body, h_new), _softmax_of_projection(body, h_new)])
    out, report = _canonicalized(model)
    assert len(_moved(report)) == 2
    assert_equivalent(model, out)
    _fuses(model)


def test_a_duplicate_of_a_moved_output_reads_its_stack():
    """h, h·V and h·V again (merged into the first, which then moves after the loop)."""
    body = cb.Body()
    h_new = cb.rnn(body, "x", "h")
    projection = _projection(body, h_new)
    model = cb.scan_model(body, [("h", h_new, cb.H)], ys=[h_new, projection, projection])
    out, report = _canonicalized(model)
    assert len(_moved(report)) == 1 and "merged scan output 2" in _details(report)
    assert_equivalent(model, out)


def test_axis_moved_output_keeps_its_layout():
    """An epilogue output stacked on axis 1 ([batch, seq, H]) is transposed after it is computed."""
    model = _rnn_with_extra(_projection)
    scan = model.graph.node[-1]
    scan.attribute.append(onnx.helper.make_attribute("scan_output_axes", [0, 1]))
    model.graph.output[-1].CopyFrom(onnx.helper.make_tensor_value_info("Y1", onnx.TensorProto.FLOAT, ["batch", "seq", cb.H]))
    out, report = _canonicalized(model)
    assert _moved(report)
    assert_equivalent(model, out)


def test_rank_two_operand_is_lifted_with_the_right_broadcast():
    """A [1, 1] operand on a step [B, H]: lift pads the per-step side, so the stack is [T, B, H]."""
    model = _rnn_with_extra(lambda body, h: _relu_times(body, h, np.ones((1, 1), np.float32)))
    out, report = _canonicalized(model)
    assert _moved(report)
    assert_equivalent(model, out)


def test_opposite_direction_stays_in_the_loop():
    model = _rnn_with_extra(_relu_times, out_dirs=[0, 1])
    _, report = _canonicalized(model)
    assert not _moved(report)


def test_function_of_the_scan_input_alone_stays_in_the_loop():
    """``relu(x W)`` reads no stacked output: a map of the scan input (hoist's and vectorize's)."""
    def of_projection(body, h):
        return body.op("Relu", body.nodes[0].output[0])
    model = _rnn_with_extra(of_projection)
    _, report = _canonicalized(model)
    assert not _moved(report)


def test_old_state_is_lifted_only_where_an_output_stacks_it():
    """``h_{t-1}·V`` stays in the loop (its stack would be a shift of h's); when a scan output
    stacks ``h_{t-1}`` itself, the projection reads that stack."""
    declined = _rnn_with_extra(lambda body, h: body.op("Add", _projection(body, h), _projection(body, "h", seed=8)))
    _, report = _canonicalized(declined)
    assert not _moved(report)
    assert "scan output 1 is computed from another one's value but stays in the loop: it reads the state input 'h'" \
        in _details(report)
    body = cb.Body()
    h_new = cb.rnn(body, "x", "h")
    old = body.op("Identity", "h")
    model = cb.scan_model(body, [("h", h_new, cb.H)], ys=[h_new, old, _projection(body, old)])
    out, report = _canonicalized(model)
    assert any("from scan output 1 (MatMul)" in d for d in _moved(report)), _moved(report)
    assert_equivalent(model, out)


def test_random_ops_stay_in_the_loop():
    model = _rnn_with_extra(lambda body, h: body.op("Dropout", h, outputs=1))
    _, report = _canonicalized(model)
    assert not _moved(report)
    assert "stays in the loop: Dropout" in _details(report) and "draws random numbers" in _details(report)


def test_memory_bound_keeps_the_output_in_the_loop():
    model = _rnn_with_extra(_projection)
    _, report = scanopt.optimize(model, passes=["canonicalize"], options={"vectorize_max_bytes": 1})
    assert not _moved(report)
    assert "above vectorize_max_bytes (1)" in _details(report)


def test_real_tf_scan_projection_moves_and_the_cell_fuses():
    """tf.scan with an (h, s) state emitting (h·v, s, h): h·v moves after the loop, fission
    then splits the EMA off, and the cell fuses ("scan output 0 is 'scan/while/matmul_2:0'
    (MatMul output), not the hidden state" before)."""
    model = onnx.load(str(MODELS / "heldout_producers_2" / "tf_scan_tuple_two_out.onnx"))
    out, report = scanopt.optimize(model, options=PORTABLE)
    assert any("computed after the loop" in o.detail and "MatMul" in o.detail for o in report.outcomes)
    assert ops(out)["RNN"] == 1
    stored = np.load(MODELS / "heldout_producers_2" / "tf_scan_tuple_two_out.expected.npz")
    got = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": stored["x"]})
    for name, value in zip([o.name for o in out.graph.output], got):
        np.testing.assert_allclose(value, stored[name], rtol=1e-4, atol=1e-5)
    assert_equivalent(model, out)


@pytest.mark.parametrize("name, native, lifted", [
    ("dyn_scan_rnn_logits", "RNN", "Gemm"),  # dynamo scan: h and nn.Linear(H, V)(h)
    ("dyn_scan_gru_softmax", "GRU", "Gemm, Softmax"),  # dynamo scan: GRUCell, softmax(W h) beside h
    ("ts_rnn_logits", "RNN", "Gemm"),  # TorchScript loop appending h and its logits
])
def test_real_exports_emitting_logits_fuse(name, native, lifted):
    path = MODELS / "epilogue" / name
    model, stored = onnx.load(str(path) + ".onnx"), np.load(str(path) + ".expected.npz")
    out, report = scanopt.optimize(model, options=PORTABLE)
    assert any("computed after the loop from scan output" in d and f"({lifted})" in d for d in _moved(report))
    assert ops(out)[native] == 1 and ops(out)["Scan"] + ops(out)["Loop"] == 0
    feeds = {i.name: stored[i.name] for i in out.graph.input}
    got = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for value, output in zip(got, out.graph.output):
        np.testing.assert_allclose(value, stored[output.name], rtol=1e-4, atol=1e-5)
    assert_equivalent(model, out)


_STEPS = {
    "matmul": lambda body, v, k: body.op("MatMul", v, body.const(cb.rand(k, cb.H, cb.H), "v")),
    "gemm": lambda body, v, k: body.op("Gemm", v, body.const(cb.rand(k, cb.H, cb.H), "v"), body.const(cb.rand(k + 1, cb.H), "c"),
                                       transB=1),
    "softmax": lambda body, v, k: body.op("Softmax", v, axis=-1),
    "tanh": lambda body, v, k: body.op("Tanh", v),
    "bias": lambda body, v, k: body.op("Add", v, body.const(cb.rand(k, cb.H), "b")),
    "x": lambda body, v, k: body.op("Add", v, body.op("MatMul", "x", body.const(cb.rand(k, cb.I, cb.H), "u"))),
    "mean": lambda body, v, k: body.op("Sub", v, body.op("ReduceMean", v, axes=[-1], keepdims=1)),
}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain=st.lists(st.sampled_from(sorted(_STEPS)), min_size=1, max_size=4),
       in_dir=st.integers(0, 1), out_dir=st.integers(0, 1))
def test_property_any_liftable_chain_moves_and_stays_equivalent(chain, in_dir, out_dir):
    def extra(body, h):
        value = h
        for k, step in enumerate(chain):
            value = _STEPS[step](body, value, 20 + k)
        return value
    model = _rnn_with_extra(extra, in_dir=in_dir, out_dirs=[out_dir, out_dir])
    out, report = _canonicalized(model)
    if "x" in chain and (in_dir or out_dir):  # x_t read outside the loop would need a reversal
        assert not _moved(report) and "runs in reverse" in _details(report)
    else:
        assert _moved(report), [o.detail for o in report.outcomes]
    assert_equivalent(model, out, engine="ort")


def _scan8_with(extra, lens, reverse=False):
    body = cb.Body(batch=False)
    h_new = cb.rnn(body, "x", "h")
    return cb.scan8_model(body, [("h", h_new, cb.H)], ys=[h_new, extra(body, h_new)], lens=lens, reverse=reverse)


@pytest.mark.parametrize("extra", [_projection, _softmax_of_projection, _projection_plus_input],
                         ids=["projection", "softmax", "projection-plus-input"])
def test_scan8_without_lengths_moves_and_fuses_at_opset_8(extra):
    """Scan-8 stacks [B, T, ...] are one row per (item, step) for the lifted nodes, and back."""
    model = _scan8_with(extra, lens=False)
    out, report = scanopt.optimize(model, passes=["canonicalize"], verify=False)
    assert _moved(report) and ops(out)["Reshape"] >= 2
    assert_equivalent(model, out, engine="reference")  # the spec's outputs, the 'seq' = 0 edge too
    _assert_scan8_kept_judged_by_the_spec_at_zero_steps(model)
    fused, _ = scanopt.optimize(model, options=PORTABLE)
    assert ops(fused)["RNN"] == 1 and ops(fused)["Scan"] == 0
    assert_equivalent(model, fused)


def test_scan8_reverse_reading_its_input_stays_with_the_reason():
    model = _scan8_with(_projection_plus_input, lens=False, reverse=True)
    _, report = _canonicalized(model)
    assert not _moved(report)
    assert "it reads scan input 0 and the input runs in reverse" in _details(report)
    model = _scan8_with(_projection, lens=False, reverse=True)
    moved, report = scanopt.optimize(model, passes=["canonicalize"], verify=False)  # h's stack alone: moves
    assert _moved(report)
    assert_equivalent(model, moved, engine="reference")
    _assert_scan8_kept_judged_by_the_spec_at_zero_steps(model)


def _assert_scan8_kept_judged_by_the_spec_at_zero_steps(model):
    """onnxruntime runs a Scan-8 over zero steps with uninitialized final states (the original
    too), so verification judges that edge by the spec (docs/verification.md): a candidate that
    keeps the Scan-8 departs from it on onnxruntime as the original does, is run on the
    reference executor there, matches the spec, and canonicalize alone is kept, with a note."""
    _, report = _canonicalized(model)
    assert _moved(report) and report.verification["passed"] is True, report.verification
    notes = report.verification["details"]["notes"]
    assert any("departs from the spec as the original's does" in n for n in notes), notes


def test_scan8_with_lengths_keeps_it_until_upgraded():
    """With sequence_lens the stacks are zeros past each length, which f(0) need not keep, and
    opset 8 has no Where/Range to restore them: kept; moved to opset 17 (``target_opset``), the
    upgrade masks and the output moves."""
    model = _scan8_with(_projection, lens=True)
    kept, report = _canonicalized(model)
    assert not _moved(report) and ops(kept)["Scan"] == 1
    out, report = scanopt.optimize(model, options=dict(PORTABLE, target_opset=17))
    assert _moved(report), [o.detail for o in report.outcomes]
    assert report.verification["passed"] is True


def _rnn_emitting_only(extra, *, out_dirs=None, finals=True):
    """An RNN Scan whose only scan output is ``extra(body, h)``: h itself is not stacked."""
    body = cb.Body()
    h_new = cb.rnn(body, "x", "h")
    return cb.scan_model(body, [("h", h_new, cb.H)], ys=[extra(body, h_new)], out_dirs=out_dirs, finals=finals)


@pytest.mark.parametrize("extra", [_projection, _softmax_of_projection, _layer_norm])
@pytest.mark.parametrize("finals", [True, False])
def test_an_output_of_the_new_state_alone_gets_a_stack_of_the_state_and_the_cell_fuses(extra, finals):
    """An RNN language model that emits only logits h_t·W (the dynamo export of a torch scan
    returning (h, head(h)) with h not kept): h's new value is stacked as a new scan output, the
    logits are computed after the loop from that stack, and the cell fuses."""
    model = _rnn_emitting_only(extra, finals=finals)
    out, report = _canonicalized(model)
    moved = _moved(report)
    assert len(moved) == 1 and "from the steps of state 0 (a new scan output)" in moved[0], moved
    scan = next(n for n in out.graph.node if n.op_type == "Scan")
    assert len(scan.output) == 2  # the final state and the new stack
    assert_equivalent(model, out)
    _fuses(model)


def test_no_new_stack_for_a_reversed_output_or_one_reading_the_old_state():
    """A prepending output would need the stack reversed after the loop; one reading h_{t-1}
    needs a shifted stack: both stay in the loop, and no stack is added for them."""
    for model in (_rnn_emitting_only(_projection, out_dirs=[1]),
                  _rnn_emitting_only(lambda body, h: body.op("Add", _projection(body, h), _projection(body, "h", 8)))):
        out, report = _canonicalized(model)
        assert not _moved(report)
        scan = next(n for n in out.graph.node if n.op_type == "Scan")
        assert len(scan.output) == 2
