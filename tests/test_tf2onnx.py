"""tf2onnx's TF1 ``dynamic_rnn`` samples (models/tf2onnx, written by its generate.py with
TensorFlow and tf2onnx 1.17) and the forms it writes: every unknown dim has its own
``unk__N`` name, dead step counters ride along as states, the opset-8 form hides the batch
inside a size-1 Scan-8 batch. Each sample is optimized and compared with TensorFlow's own
outputs (stored beside it) and with the original on synthesized inputs; the batch fallback
(X and the initial states expanded to their common batch) is checked on batches that
broadcast, where the native op alone would be wrong."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP

import cell_builders as cb
import scanopt
from equivalence import assert_equivalent, ops
from scanopt.reference import run_model

MODELS = Path(__file__).resolve().parent.parent / "models" / "tf2onnx"
SAMPLES = sorted(p.stem for p in MODELS.glob("*.onnx"))
NATIVE = {"dynamic_rnn_concat_tanh": "RNN", "dynamic_rnn_concat_tanh_h0": "RNN", "dynamic_rnn_concat_relu": "RNN",
          "dynamic_rnn_concat_gru": "GRU", "dynamic_rnn_concat_lstm": "LSTM", "bidirectional_dynamic_rnn": "RNN",
          "dynamic_rnn_concat_tanh_opset8": "RNN", "bidirectional_dynamic_rnn_lstm": "LSTM",
          "dynamic_rnn_concat_tanh_lengths": "RNN", "dynamic_rnn_concat_gru_lengths": "GRU",
          "dynamic_rnn_concat_lstm_lengths": "LSTM"}
LENGTHS = [s for s in SAMPLES if s.endswith("_lengths")]


def _optimize(model):
    return scanopt.optimize(model, options={"target": "portable"})


def _run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_every_sample_is_listed():
    assert SAMPLES == sorted(NATIVE)


# The opset-8 form and sequence_length have tests of their own below.
FUSED_HERE = [s for s in SAMPLES if not s.endswith(("_opset8", "_lengths"))]


@pytest.mark.parametrize("name", FUSED_HERE)
def test_tf2onnx_sample_fuses_and_matches_tensorflow(name):
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    out, report = _optimize(model)
    counts = ops(out)
    assert counts["Scan"] == 0 and counts[NATIVE[name]] >= 1, [o.detail for o in report.outcomes]
    assert report.verification["passed"] is True, report.verification
    assert out.opset_import[0].version == model.opset_import[0].version
    stored = np.load(MODELS / f"{name}.expected.npz")
    feeds = {i.name: stored[i.name] for i in model.graph.input if i.name in stored}
    for result, output in zip(_run(out, feeds), model.graph.output):
        np.testing.assert_allclose(result, stored[output.name], rtol=1e-4, atol=1e-5)
    assert_equivalent(model, out, inputs=[feeds])


def _rnn_with_own_state_batch(kind="RNN"):
    """A MatMul-form cell whose initial states' batch is a dim of its own ("hb", as
    tf2onnx's unk__N): the Scan broadcasts a size-1 batch of either side."""
    body = cb.Body(batch=True)
    states, h_new = cb.cell(kind, body, seed=2)
    model = cb.scan_model(body, states, ys=(h_new,))
    for value in list(model.graph.input) + list(model.graph.output):
        if value.name != "X" and not value.name.startswith("Y"):
            value.type.tensor_type.shape.dim[0].dim_param = "hb"
        elif value.name.startswith("Y"):  # the step outputs' batch is whichever side is not 1
            for axis, dim in enumerate(value.type.tensor_type.shape.dim):
                if dim.dim_param == "batch":
                    dim.dim_param = f"{value.name}_{axis}"
    return _bodies_name_batches_apart(model)


def _bodies_name_batches_apart(model):
    """Each Scan body declares its states' batch apart from x's too, and its outputs' as
    whichever side's: else the body's own declarations (one "batch" symbol) would promise the
    batches equal, and dims would rightly prove it."""
    for node in model.graph.node:
        scan_body = next((a.g for a in node.attribute if a.name == "body"), None)
        if scan_body is None:
            continue
        n_states = len(scan_body.input) - 1
        for k, value in enumerate(list(scan_body.input[:n_states]) + list(scan_body.output)):
            dims = value.type.tensor_type.shape.dim
            if dims and dims[0].dim_param:
                dims[0].dim_param = f"{node.name}_hb_body" if k < n_states else f"{node.name}_{value.name}_b"
    return model


def _feeds(model, bx, bh, T, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in model.graph.input:
        dims = [T if d.dim_param == "seq" else bx if d.dim_param == "batch" else bh if d.dim_param == "hb" else d.dim_value
                for d in v.type.tensor_type.shape.dim]
        feeds[v.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_unproven_batches_fuse_into_a_form_right_for_every_batch(kind):
    model = _rnn_with_own_state_batch(kind)
    out, outcomes = cb.fuse(model)
    assert [o.applied for o in outcomes] == [True], [o.detail for o in outcomes]
    assert "both expanded to their common batch" in outcomes[0].detail
    assert ops(out)["Expand"] >= 2 and ops(out)[kind] == 1
    compared = 0
    for bx, bh, T in [(3, 3, 5), (3, 1, 1), (1, 3, 4), (1, 1, 3), (2, 2, 0), (3, 1, 0)]:
        feeds = _feeds(model, bx, bh, T)
        for run in (lambda m: _run(m, feeds), lambda m: list(run_model(m, feeds).values())):
            try:
                expected = run(model)
            except Exception:  # noqa: BLE001 - the original itself does not run at these sizes
                continue
            got = run(out)
            for a, b in zip(expected, got):
                assert a.shape == b.shape, (bx, bh, T)
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
            compared += 1
    assert compared >= 6  # equal batches, each broadcasting side and the zero-length scan ran


def test_proven_equal_batches_emit_no_expand():
    body = cb.Body(batch=True)
    states, h_new = cb.cell("RNN", body, seed=2)
    out, outcomes = cb.fuse(cb.scan_model(body, states, ys=(h_new,)))
    assert outcomes[0].applied and "common batch" not in outcomes[0].detail
    assert ops(out)["Expand"] == 0


def test_unproven_batches_with_a_zero_length_guard_below_opset_10_are_declined():
    model = _rnn_with_own_state_batch()
    model.opset_import[0].version = 9
    assert "needs opset 10 for the zero-length case" in cb.declined(model)


def _scan8_batch_of_one(kind="RNN", lens=False):
    """tf2onnx's opset-8 form by hand: a Scan-8 over X [1, seq, batch, I] with states
    [1, batch, H], the body computing on [batch, I] and [batch, H]."""
    from onnx import helper as h

    body = cb.Body(batch=True, opset=8)
    states, h_new = cb.cell(kind, body, seed=4)
    vi = h.make_tensor_value_info
    nodes = list(body.nodes) + [h.make_node("Identity", [h_new], ["y_t"])]
    graph = h.make_graph(nodes, "cell_body", [vi(n, TP.FLOAT, ["batch", s]) for n, _, s in states]
                         + [vi("x", TP.FLOAT, ["batch", body.I])],
                         [vi(o, TP.FLOAT, ["batch", s]) for _, o, s in states] + [vi("y_t", TP.FLOAT, ["batch", body.H])],
                         initializer=body.inits)
    scan = h.make_node("Scan", ["lens" if lens else ""] + [f"{n}0" for n, _, _ in states] + ["X"],
                       [f"{n}_n" for n, _, _ in states] + ["Y"], name="scan8_one", num_scan_inputs=1, body=graph)
    inputs = ([vi("lens", TP.INT64, [1])] if lens else []) + [vi("X", TP.FLOAT, [1, "seq", "batch", body.I])]
    inputs += [vi(f"{n}0", TP.FLOAT, [1, "batch", s]) for n, _, s in states]
    outputs = [vi(f"{n}_n", TP.FLOAT, [1, "batch", s]) for n, _, s in states] + [vi("Y", TP.FLOAT, [1, "seq", "batch", body.H])]
    g = h.make_graph(body.outer_nodes + [scan], "scan8_one", inputs, outputs, initializer=body.outer)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 8)], ir_version=8)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_a_scan8_over_a_batch_of_one_fuses_at_opset_8(kind):
    model = _scan8_batch_of_one(kind)
    out, outcomes = cb.fuse(model)
    assert [o.applied for o in outcomes] == [True], [o.detail for o in outcomes]
    assert ops(out)["Scan"] == 0 and ops(out)[kind] == 1 and out.opset_import[0].version == 8
    assert_equivalent(model, out)
    for T, B in ((5, 3), (1, 2), (0, 2)):
        rng = np.random.default_rng(T)
        feeds = {v.name: rng.standard_normal([1 if d.dim_value == 1 else T if d.dim_param == "seq" else B
                                              if d.dim_param == "batch" else d.dim_value
                                              for d in v.type.tensor_type.shape.dim]).astype(np.float32)
                 for v in model.graph.input}
        expected, got = run_model(model, feeds), run_model(out, feeds)
        for name in expected:
            assert expected[name].shape == got[name].shape, name
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-5)


def test_a_scan8_batch_of_one_with_sequence_lens_is_not_read_as_scan9():
    reason = cb.declined(_scan8_batch_of_one(lens=True))
    assert "x has rank 2" in reason


def test_the_opset8_sample_loses_its_dead_states_and_stays_equal():
    """tf2onnx's opset-8 dynamic_rnn: a Scan-8 over a batch of one with two dead int32
    counters. Canonicalize removes them; fuse then fuses it where h0's batch is proven
    to be X's and otherwise names that as the reason (never a wrong model)."""
    name = "dynamic_rnn_concat_tanh_opset8"
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    out, report = _optimize(model)
    canon = [o for o in report.outcomes if o.pass_name == "canonicalize" and o.applied]
    assert canon and "removed dead state 1" in canon[0].detail and "removed dead state 2" in canon[0].detail
    fused = [o for o in report.outcomes if o.pass_name == "fuse"]
    assert ops(out)["RNN"] == 1 and "common batch" not in fused[-1].detail, [o.detail for o in fused]
    assert [i.name for i in out.graph.input] == [i.name for i in model.graph.input]
    stored = np.load(MODELS / f"{name}.expected.npz")
    (result_y, result_h) = _run(out, {"x:0": stored["x:0"]})
    np.testing.assert_allclose(result_y, stored["y:0"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(result_h, stored["h_n:0"], rtol=1e-4, atol=1e-5)


def _lengths_model(name="dynamic_rnn_concat_tanh_lengths"):
    return onnx.load(str(MODELS / f"{name}.onnx"))


@functools.lru_cache(maxsize=None)
def _fused_lengths(name):
    out, report = _optimize(_lengths_model(name))
    details = tuple(o.detail for o in report.outcomes if o.pass_name == "fuse")
    return out.SerializeToString(), details, report.verification["passed"]


def _work_nodes(graph):
    """The graph's nodes, each guard If's else branch (the work) in place of the If."""
    for node in graph.node:
        if node.op_type == "If":
            yield from _work_nodes(next(a.g for a in node.attribute if a.name == "else_branch"))
        else:
            yield node


@pytest.mark.parametrize("name", LENGTHS)
def test_dynamic_rnn_with_sequence_length_fuses_with_sequence_lens_and_matches_tensorflow(name):
    out_bytes, details, verified = _fused_lengths(name)
    out = onnx.load_from_string(out_bytes)
    assert ops(out)["Scan"] == 0 and ops(out)[NATIVE[name]] == 1, details
    assert verified is True
    assert "per-item lengths from the body's step mask" in details[0]
    native = next(n for n in _work_nodes(out.graph) if n.op_type == NATIVE[name])  # behind its empty-input guard
    assert len(native.input) >= 5 and native.input[4], "the native op takes sequence_lens"
    stored = np.load(MODELS / f"{name}.expected.npz")
    feeds = {k: stored[k] for k in ("x:0", "lens:0")}
    assert len(set(stored["lens:0"].tolist())) > 1  # items of different lengths
    for result, key in zip(_run(out, feeds), ("y:0", "h_n:0")):
        np.testing.assert_allclose(result, stored[key], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name, lens", [(LENGTHS[k % len(LENGTHS)], lens) for k, lens in enumerate(
    [[0, 5, 2], [7, -1, 3], [3], [0], [5, 5, 5], [2, 0, 9]])])
def test_sequence_length_fusion_matches_the_scan_for_every_length_with_both_engines(name, lens):
    """Lengths past T, negative, zero and a single length broadcast over the batch: the
    Scan's step mask and the native op's clipped sequence_lens agree, initial state kept
    where no step is valid."""
    model = _lengths_model(name)
    out = onnx.load_from_string(_fused_lengths(name)[0])
    assert ops(out)[NATIVE[name]] == 1
    rng = np.random.default_rng(len(lens))
    compared = 0
    for T in (5, 1, 0):
        feeds = {"x:0": rng.standard_normal((3, T, 4)).astype(np.float32), "lens:0": np.array(lens, np.int32)}
        for run in (_run, lambda m, f: list(run_model(m, f).values())):
            try:
                expected = run(model, feeds)
            except Exception:  # noqa: BLE001 - onnxruntime crashes on a zero-length Scan-9+ (DESIGN.md)
                assert T == 0 and run is _run
                continue
            got = run(out, feeds)
            for a, b in zip(expected, got):
                assert a.shape == b.shape, (lens, T)
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
            compared += 1
    assert compared >= 5


def _edited_lengths_model(edit):
    model = _lengths_model()
    edit(model)
    return model


def _set_init(name, value):
    def edit(model):
        for k, init in enumerate(model.graph.initializer):
            if init.name == name:
                model.graph.initializer[k].CopyFrom(onnx.numpy_helper.from_array(np.array(value, np.int32), name))
    return edit


def _body(model):
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    return next(a.g for a in scan.attribute if a.name == "body")


def _keep_old_output(model):
    """The scan output keeps the state (not zeros) past the length: not the native Y."""
    edited = 0
    for node in _body(model).node:
        if node.output[0] == "rnn/while/Select__486:0":
            node.input[1] = "Identity__431:0"
            edited += 1
    assert edited == 1


@pytest.mark.parametrize("edit, reason", [
    (_set_init("rnn/while/iteration_counter:0", 1), "does not provably start at 0"),
    (_set_init("rnn/while/add_2/y:0", 2), "does not provably count by 1 per step"),
    (_keep_old_output, "past the length, not zeros"),
])
def test_step_masks_that_are_not_sequence_lens_are_declined_with_the_reason(edit, reason):
    model = _edited_lengths_model(edit)
    out, report = _optimize(model)
    assert ops(out)["Scan"] == 1 and ops(out)["RNN"] == 0
    fused = [o for o in report.outcomes if o.pass_name == "fuse"]
    assert fused and reason in fused[0].detail, [o.detail for o in fused]
    rng = np.random.default_rng(0)
    feeds = {"x:0": rng.standard_normal((3, 4, 4)).astype(np.float32), "lens:0": np.array([1, 4, 2], np.int32)}
    for a, b in zip(_run(model, feeds), _run(out, feeds)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_a_bidirectional_pair_with_initial_states_of_their_own_batches():
    """Each direction's h0 has its own batch dim ("hb" and "hb_b"): each is expanded to X's
    batch before the two meet in the native op's [2, B, H] state."""
    first_body = cb.Body(batch=True)
    states, h_new = cb.cell("LSTM", first_body, seed=1)
    first = cb.scan_model(first_body, states, ys=(h_new,))
    second_body = cb.Body(batch=True, prefix="b_")
    states, h_new = cb.cell("LSTM", second_body, seed=5)
    second = cb.scan_model(second_body, states, ys=(h_new,), in_dir=1)
    model = cb.two_scans(first, second)
    for value in list(model.graph.input) + list(model.graph.output):
        if value.name != "X" and not value.name.startswith("Y"):
            value.type.tensor_type.shape.dim[0].dim_param = "hb_b" if value.name.endswith("_b") else "hb"
        elif value.name.startswith("Y"):
            for axis, dim in enumerate(value.type.tensor_type.shape.dim):
                if dim.dim_param == "batch":
                    dim.dim_param = f"{value.name}_{axis}"
    _bodies_name_batches_apart(model)
    out, outcomes = cb.fuse(model)
    assert all(o.applied for o in outcomes) and ops(out)["LSTM"] == 1, [o.detail for o in outcomes]
    assert cb.native(out)[1]["direction"] == b"bidirectional"
    compared = 0
    for bx, bh, bh2, T in [(3, 3, 3, 4), (1, 3, 3, 2), (1, 3, 3, 1), (2, 2, 2, 0), (3, 1, 3, 2)]:
        rng = np.random.default_rng(T + bh)
        feeds = {}
        for v in model.graph.input:
            dims = [{"seq": T, "batch": bx, "hb": bh, "hb_b": bh2}.get(d.dim_param, d.dim_value)
                    for d in v.type.tensor_type.shape.dim]
            feeds[v.name] = rng.standard_normal(dims).astype(np.float32)
        try:
            expected = run_model(model, feeds)
        except Exception:  # noqa: BLE001 - the original does not run at these sizes (a state changing shape)
            continue
        got = run_model(out, feeds)
        for name, value in expected.items():
            assert got[name].shape == value.shape, (name, bx, bh, bh2, T)
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)
        compared += 1
    assert compared >= 4


def _where_masked_rnn(reverse=False, output_old="zeros", lens_batch="batch", lift=True, counter=TP.INT64,
                      counter_in_cell=False, select="where", compare="Less", column=False):
    """The step mask as people write it by hand: ``valid = Unsqueeze(c < lens, 1)``, states
    ``Where(valid, new, h)``, outputs ``Where(valid, new, 0)``, an int64 counter from 0.
    ``select="mul"``: a float mask ``m = Cast(valid)``, states ``m·new + (1-m)·h``, outputs
    ``new·m``; ``compare="Greater"``: ``lens > c``; ``column``: lens [B, column], compared unlifted."""
    from onnx import helper as h
    from onnx import numpy_helper as nh

    H_, I_ = 4, 3
    rng = np.random.default_rng(3)
    W, R = (rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in ((I_, H_), (H_, H_)))
    vi = h.make_tensor_value_info
    np_counter = onnx.helper.tensor_dtype_to_np_dtype(counter)
    nodes = [h.make_node("MatMul", ["x", "W"], ["xw"]), h.make_node("MatMul", ["h", "R"], ["hr"]),
             h.make_node("Add", ["xw", "hr"], ["pre0"])]
    nodes += [h.make_node("Cast", ["c"], ["cf"], to=TP.FLOAT), h.make_node("Add", ["pre0", "cf"], ["pre"])] \
        if counter_in_cell else [h.make_node("Identity", ["pre0"], ["pre"])]
    nodes += [h.make_node("Tanh", ["pre"], ["new"]),
              h.make_node(compare, ["c", "lens"] if compare == "Less" else ["lens", "c"],
                          ["valid_b" if lift and not column else "valid"])]
    nodes += [h.make_node("Unsqueeze", ["valid_b", "one_axis"], ["valid"])] if lift and not column else []
    if select == "where":
        nodes += [h.make_node("Where", ["valid", "new", "h"], ["h_out"]),
                  h.make_node("Where", ["valid", "new", "zero" if output_old == "zeros" else "h"], ["y"])]
    else:
        nodes += [h.make_node("Cast", ["valid"], ["m"], to=TP.FLOAT), h.make_node("Sub", ["one_f", "m"], ["not_m"]),
                  h.make_node("Mul", ["m", "new"], ["kept"]), h.make_node("Mul", ["not_m", "h"], ["held"]),
                  h.make_node("Add", ["kept", "held"], ["h_out"]),
                  h.make_node("Mul", ["new", "m" if output_old == "zeros" else "not_m"], ["y"])]
    nodes.append(h.make_node("Add", ["c", "one"], ["c_out"]))
    inits = [nh.from_array(np.array([1], np.int64), "one_axis"), nh.from_array(np.array(1, np_counter), "one"),
             nh.from_array(np.zeros([1, H_], np.float32), "zero")]
    inits += [nh.from_array(np.array(1, np.float32), "one_f")] if select == "mul" else []
    body = h.make_graph(nodes, "masked", [vi("c", counter, []), vi("h", TP.FLOAT, ["batch", H_]),
                                          vi("x", TP.FLOAT, ["batch", I_])],
                        [vi("c_out", counter, []), vi("h_out", TP.FLOAT, ["batch", H_]),
                         vi("y", TP.FLOAT, ["batch", H_])], initializer=inits)
    scan = h.make_node("Scan", ["c0", "h0", "X"], ["c_n", "h_n", "Y"], name="masked_scan", num_scan_inputs=1,
                       body=body, scan_input_directions=[int(reverse)])
    graph = h.make_graph([scan], "g", [vi("X", TP.FLOAT, ["seq", "batch", I_]), vi("lens", counter, [lens_batch] + ([int(column)] if column else [])),
                                       vi("h0", TP.FLOAT, ["batch", H_])],
                         [vi("h_n", TP.FLOAT, ["batch", H_]), vi("Y", TP.FLOAT, ["seq", "batch", H_])],
                         initializer=[nh.from_array(W, "W"), nh.from_array(R, "R"), nh.from_array(np.array(0, np_counter), "c0")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("lens_batch, counter, select, compare, column", [
    ("batch", TP.INT64, "where", "Less", False), ("lb", TP.INT64, "where", "Less", False),
    ("batch", TP.INT32, "mul", "Greater", False), ("lb", TP.INT64, "mul", "Less", False),
    ("batch", TP.INT64, "where", "Less", True), ("lb", TP.INT32, "mul", "Greater", True)])
def test_a_where_step_mask_by_hand_fuses_with_sequence_lens(lens_batch, counter, select, compare, column):
    """Where or a float mask ``m·new + (1-m)·h``; ``c < lens`` or ``lens > c``; int64 or int32;
    lengths [B], or a column [B, 1] (``t < lens[:, None]``) compared without a lift."""
    model = _where_masked_rnn(lens_batch=lens_batch, counter=counter, select=select, compare=compare, column=column)
    out, outcomes = cb.fuse(model)
    assert [o.applied for o in outcomes] == [True], [o.detail for o in outcomes]
    assert ops(out)["RNN"] == 1 and ops(out)["Scan"] == 0
    assert ("common batch" in outcomes[0].detail) == (lens_batch == "lb")  # proven by the shared name
    rng = np.random.default_rng(0)
    compared = 0
    for T, B, lens in ((6, 3, [6, 0, 2]), (4, 2, [9, -3]), (1, 1, [0]), (3, 4, [2]), (0, 2, [1, 0])):
        if lens_batch == "batch" and len(lens) != B:
            continue  # the model declares them one size
        feeds = {"X": rng.standard_normal((T, B, 3)).astype(np.float32), "lens": np.array(lens, onnx.helper.tensor_dtype_to_np_dtype(counter)).reshape((-1, 1) if column else -1),
                 "h0": rng.standard_normal((B, 4)).astype(np.float32)}
        for run in (_run, lambda m, f: list(run_model(m, f).values())):
            try:
                expected = run(model, feeds)
            except Exception:  # noqa: BLE001 - onnxruntime crashes on a zero-length Scan-9+
                assert T == 0 and run is _run
                continue
            for a, b in zip(expected, run(out, feeds)):
                assert a.shape == b.shape, (T, B, lens)
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
            compared += 1
    assert compared >= (9 if lens_batch == "lb" else 7)


@pytest.mark.parametrize("kwargs, reason", [
    ({"reverse": True}, "a reverse scan masked by per-item lengths"),
    ({"output_old": "state"}, "past the length, not zeros"),
    ({"lift": False}, "reads the step counter other than as a select by the mask"),  # [B] mask: broadcasts along H
    ({"counter": TP.FLOAT}, "not integers"),
    ({"counter_in_cell": True}, "reads the step counter besides the mask"),
    ({"select": "mul", "output_old": "state"}, "past the length, not zeros"),  # y = new·(1-m): zeros inside
    ({"select": "mul", "lift": False}, "reads the step counter other than as a select by the mask"),
    ({"column": 2}, "not a vector [B] or a column [B, 1]"),  # lens [B, 2]
])
def test_where_step_masks_the_native_op_cannot_take_are_declined(kwargs, reason):
    assert reason in cb.declined(_where_masked_rnn(**kwargs))
