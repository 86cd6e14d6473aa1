"""fuse on PyTorch cells exported by the dynamo exporter with and without its optimization
(models/cells/, written by models/generate_cells.py): fused into the expected native op, equal
to what torch computed, to the original Scan at T = 16 ... 200 and B = 1, 4, and to a native
op written by hand from the model's own initializers (torch gate order → ONNX, here)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import cell_builders as cb
from equivalence import assert_equivalent

CELLS = os.path.join(os.path.dirname(__file__), "..", "models", "cells")
H = 4

SAMPLES = {  # name -> (native op, attributes it must have)
    "torch_gru_cell_noopt": ("GRU", {"linear_before_reset": 1}),
    "torch_lstm_cell_noopt": ("LSTM", {}),
    "torch_rnn_half": ("RNN", {}),
    "torch_rnn_half_noopt": ("RNN", {}),
    "torch_lstm_concat_noopt": ("LSTM", {}),
    "torch_lstm_coupled_noopt": ("LSTM", {"input_forget": 1}),
    "torch_bigru": ("GRU", {"direction": b"bidirectional", "linear_before_reset": 1}),
    "torch_bigru_noopt": ("GRU", {"direction": b"bidirectional", "linear_before_reset": 1}),
}


def load(name):
    return onnx.load(os.path.join(CELLS, f"{name}.onnx"))


def fused(name):
    model = load(name)
    kind, attrs = SAMPLES[name]
    out = cb.check_fused(model, kind, inputs=False)
    _, got = cb.native(out)
    for key, value in attrs.items():
        assert got.get(key) == value, (key, got.get(key))
    return model, out


def run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_torch_cell_fuses_and_matches_torch_and_the_original(name):
    """Through fuse alone: the bidirectional pair's reverse Scan reads Slice(x, step -1)."""
    model, out = fused(name)
    cb.matches_torch(out, name, CELLS)
    for T, B in ((16, 1), (200, 4)):
        assert_equivalent(model, out, inputs=cb.feeds(model, T=T, B=B, seed=T), engine="ort")


def _inits(model):
    return {i.name: numpy_helper.to_array(i).astype(np.float32) for i in model.graph.initializer}


def _blocks(a, order, want):
    parts = dict(zip(order, np.split(a, len(order))))
    return np.concatenate([parts[g] for g in want])


def _native_weights(name, w):
    """(kind, W, R, B, attrs) in ONNX layout, from the sample's initializers."""
    if name == "torch_gru_cell_noopt":
        W, R = (_blocks(w[f"cell.weight_{k}"], "rzn", "zrn") for k in ("ih", "hh"))
        B = np.concatenate([_blocks(w[f"cell.bias_{k}"], "rzn", "zrn") for k in ("ih", "hh")])
        return "GRU", W, R, B, {"linear_before_reset": 1}
    if name == "torch_lstm_cell_noopt":
        W, R = (_blocks(w[f"cell.weight_{k}"], "ifgo", "iofg") for k in ("ih", "hh"))
        B = np.concatenate([_blocks(w[f"cell.bias_{k}"], "ifgo", "iofg") for k in ("ih", "hh")])
        return "LSTM", W, R, B, {}
    if name.startswith("torch_rnn_half"):
        return "RNN", w["W"], w["R"], np.concatenate([w["b"], np.zeros(H)]), {}
    K, b = w["K"], w["b"]
    I = K.shape[0] - H
    Wx, Wh = K[:I].T, K[I:].T  # [gates*H, I], [gates*H, H]
    if name == "torch_lstm_concat_noopt":
        return ("LSTM", _blocks(Wx, "ifgo", "iofg"), _blocks(Wh, "ifgo", "iofg"),
                np.concatenate([_blocks(b, "ifgo", "iofg"), np.zeros(4 * H)]), {})
    # coupled: gates f, g, o with i = 1 - f = σ(-a_f): the input gate is the negated forget gate
    (wf, wg, wo), (rf, rg, ro), (bf, bg, bo) = np.split(Wx, 3), np.split(Wh, 3), np.split(b, 3)
    W = np.concatenate([-wf, wo, np.zeros_like(wf), wg])
    R = np.concatenate([-rf, ro, np.zeros_like(rf), rg])
    return "LSTM", W, R, np.concatenate([-bf, bo, np.zeros(H), bg, np.zeros(4 * H)]), {"input_forget": 1}


@pytest.mark.parametrize("name", ["torch_gru_cell_noopt", "torch_lstm_cell_noopt", "torch_rnn_half_noopt",
                                  "torch_lstm_concat_noopt", "torch_lstm_coupled_noopt"])
def test_torch_cell_equals_a_hand_written_native_op(name):
    model, out = fused(name)
    kind, W, R, B, attrs = _native_weights(name, _inits(model))
    native = cb.native_model(kind, W, R, B, **attrs)
    for T, Bn in ((16, 1), (64, 4)):
        rng = np.random.default_rng(T)
        feeds = {"X": rng.standard_normal((T, Bn, W.shape[1])).astype(np.float32),
                 "h0": rng.standard_normal((Bn, H)).astype(np.float32)}
        if kind == "LSTM":
            feeds["c0"] = rng.standard_normal((Bn, H)).astype(np.float32)
        want = run(native, feeds)
        got = run(out, {"x": feeds["X"], "h0": feeds["h0"], **({"c0": feeds["c0"]} if kind == "LSTM" else {})})
        np.testing.assert_allclose(got["y"], want["Y0"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["h_n"], want["h_n"], rtol=1e-5, atol=1e-5)
        if kind == "LSTM":
            np.testing.assert_allclose(got["c_n"], want["c_n"], rtol=1e-5, atol=1e-5)
