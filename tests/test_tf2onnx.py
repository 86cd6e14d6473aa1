"""tf2onnx's TF1 ``dynamic_rnn`` samples (models/tf2onnx, written by its generate.py with
TensorFlow and tf2onnx 1.17) and the forms it writes: every unknown dim has its own
``unk__N`` name, dead step counters ride along as states, the opset-8 form hides the batch
inside a size-1 Scan-8 batch. Each sample is optimized and compared with TensorFlow's own
outputs (stored beside it) and with the original on synthesized inputs; the batch fallback
(X and the initial states expanded to their common batch) is checked on batches that
broadcast, where the native op alone would be wrong."""

from __future__ import annotations

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
          "dynamic_rnn_concat_tanh_opset8": "RNN"}


def _optimize(model):
    return scanopt.optimize(model, options={"target": "portable"})


def _run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_every_sample_is_listed():
    assert SAMPLES == sorted(NATIVE)


@pytest.mark.parametrize("name", SAMPLES)
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
