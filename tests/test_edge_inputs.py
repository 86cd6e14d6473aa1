"""The written model runs wherever the original runs (issue 33): an empty batch, a
zero-length sequence, a sequence_lens entry of 0, a trip count of 0, a NaN or inf in one
step. Models run in a child process (tests/child_run.py): onnxruntime's GRU and LSTM abort
the process on an empty batch."""

from __future__ import annotations

import os

import numpy as np
import pytest

import cell_builders as cb
import scanopt
from child_run import run_in_child
from equivalence import ops

MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")


def assert_runs_like(original, optimized, feeds):
    """Where the original runs, the optimized model gives the same shapes and values; it
    never aborts (an original's clean error may become a run: the spec's result)."""
    want, got = run_in_child(original, feeds), run_in_child(optimized, feeds)
    assert got[0] != "crash", (got, want)
    if want[0] == "ok":
        assert got[0] == "ok", (got, want)
        for name, value in want[1].items():
            assert got[1][name].shape == value.shape, name
            np.testing.assert_allclose(got[1][name], value, rtol=1e-5, atol=1e-5)
    return want[0], got[0]


@pytest.mark.parametrize("kind", ["gru", "lstm", "rnn"])
def test_readme_samples_fused_run_on_an_empty_batch_and_sequence(kind):
    """S6: the README's example, fused at --input-shape X:100,8,3 (--target portable)."""
    model = scanopt.load_model(os.path.join(MODELS, f"scan_{kind}.onnx"))
    out, _ = scanopt.optimize(model, input_shapes={"X": [100, 8, 3]}, options={"target": "portable"}, verify=False)
    assert ops(out)["Scan"] == 0 and ops(out)[kind.upper()] == 1
    states = [i.name for i in model.graph.input if i.name != "X"]
    for T, B in ((5, 0), (0, 2), (0, 0), (3, 2)):
        feeds = {"X": np.ones((T, B, 3), np.float32), **{s: np.full((B, 4), 0.5, np.float32) for s in states}}
        assert_runs_like(model, out, feeds)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("batch, in_axis, bidirectional", [(True, 0, False), (True, 1, True), (False, 0, True)])
def test_every_fused_form_runs_on_an_empty_batch_and_sequence(kind, batch, in_axis, bidirectional):
    body = cb.Body(batch=batch)
    states, h_new = cb.cell(kind, body)
    m = cb.scan_model(body, states, ys=[h_new], in_axis=in_axis)
    if bidirectional:
        body2 = cb.Body(batch=batch, prefix="b_")
        states2, h2 = cb.cell(kind, body2, seed=3)
        m = cb.two_scans(m, cb.scan_model(body2, states2, ys=[h2], in_axis=in_axis, in_dir=1))
    out, outcomes = cb.fuse(m)
    assert ops(out)["Scan"] == 0, [o.detail for o in outcomes]
    for T, B in ((4, 0), (0, 2)) if batch else ((0, None),):
        feeds = cb.feeds(m, T=T, B=B)[0] if batch else cb.feeds(m, T=T)[0]
        assert_runs_like(m, out, feeds)


def test_scan8_gru_fused_per_item_at_opset_11_keeps_a_clean_error_on_length_0():
    """S3: a Scan-8 GRU with sequence_lens migrated to opset 11 (one Scan per batch item,
    each fused): a length 0 gave a clean INVALID_ARGUMENT in the original, an abort after."""
    body = cb.Body(batch=False, opset=8)
    states, h_new = cb.cell("GRU", body)
    m = cb.scan8_model(body, states, ys=[h_new], reverse=True)  # not fused at opset 8: needs ReverseSequence
    out, _ = scanopt.optimize(m, options={"target_opset": 11, "upgrade_strategy": "c"}, verify=False)
    assert ops(out)["GRU"] == 1 and ops(out)["Scan"] == 1  # the Scan over items, each a GRU
    feeds = cb.feeds(m, T=5, B=3, lens=[0, 5, 2])[0]
    want, got = assert_runs_like(m, out, feeds)
    assert want == "error" and got in ("ok", "error")
    assert_runs_like(m, out, cb.feeds(m, T=5, B=3, lens=[1, 5, 2])[0])
