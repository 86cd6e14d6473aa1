"""Adversarial review of big weights left in their file (scanopt.external_data): the
committed corpus saved with every tensor external, odd external data, and paths."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import scanopt.external_data as external_data
from scanopt.cli import main
from scanopt.engines import run
from scanopt.external_data import FOLDER_KEY
from scanopt.inputs import synthesize_inputs

MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")


def _digests(folder) -> dict:
    return {f: hashlib.sha256(open(os.path.join(folder, f), "rb").read()).hexdigest() for f in sorted(os.listdir(folder))}


def _save_external(source: str, folder, name="m.onnx", data="m.data", threshold=0):
    path = os.path.join(folder, name)
    onnx.save_model(onnx.load(source), path, save_as_external_data=True, location=data,
                    size_threshold=threshold, convert_attribute=True)
    return path


def _no_marks(folder) -> None:
    for root, _, names in os.walk(folder):
        for name in names:
            assert FOLDER_KEY.encode() not in open(os.path.join(root, name), "rb").read(), name


def test_same_named_weights_in_two_bodies_both_read_from_their_file(tmp_path, monkeypatch, capsys):
    """A bidirectional TF export keeps a weight 'R' in each direction's body: both must be
    read from the file (one used to get gs's own reader, which looks in the working
    directory: a ValidationError traceback)."""
    monkeypatch.setattr(external_data, "INLINE_BELOW", 32)  # the weights stay in their file
    source = os.path.join(MODELS, "heldout_cells", "tf_birnn_reverse_sequence_fill_lengths.onnx")
    (tmp_path / "in").mkdir()
    path = _save_external(source, tmp_path / "in")
    before = _digests(tmp_path / "in")
    out = str(tmp_path / "out.onnx")
    assert main(["optimize", path, out, "-q"]) == 0, capsys.readouterr().err
    assert _digests(tmp_path / "in") == before
    _no_marks(tmp_path)
    original = onnx.load(source)
    feeds = synthesize_inputs(original, seed=0)
    expected = run(original, feeds)
    got = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, feeds)
    for name, value in zip([o.name for o in original.graph.output], got):
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)
