"""tf2onnx-style Scans (models/tf2onnx_style, from models/generate_tf2onnx_style.py): every
dim its own ``unk__N``. Verification must bind T >= 2 and B >= 2 at some seed with
consistent sizes, and fusion must see that X's batch and the initial state's are one
dim (issue 20)."""

from __future__ import annotations

import os

import onnx
import pytest

import scanopt
from scanopt.inputs import InputSynthesizer
from scanopt.verify import compare_models

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")
DIR = os.path.join(MODELS, "tf2onnx_style")
SAMPLES = sorted(f[:-5] for f in os.listdir(DIR) if f.endswith(".onnx"))
# tf2onnx's own output, where the exporter samples are present (models/tf2onnx/)
REAL = os.path.join(MODELS, "tf2onnx")
REAL_SAMPLES = sorted(f for f in os.listdir(REAL) if f.endswith(".onnx")) if os.path.isdir(REAL) else []


def _load(name):
    return onnx.load(os.path.join(DIR, f"{name}.onnx"))


def _long_batched_feed(model) -> bool:
    """Seed 0 gives some input a batch >= 2 and a sequence >= 64 (issue 20: not all ones)."""
    shapes = InputSynthesizer(model).shapes(0)
    return any(len(s) >= 2 and min(s[:2]) >= 2 and max(s[:2]) >= 64 for s in shapes.values())


def test_there_are_samples():
    assert len(SAMPLES) >= 3


@pytest.mark.parametrize("name", SAMPLES)
def test_feeds_are_consistent_and_reach_long_sequences_and_batches(name):
    model = _load(name)
    result = compare_models(model, model, seeds=2)
    assert result.passed, result.summary()
    assert not any("the original fails at" in note for note in result.notes), result.notes  # no all-ones fallback
    batch, steps = InputSynthesizer(model).shapes(0)["X:0"][:2]
    assert batch >= 2 and steps >= 64


@pytest.mark.parametrize("name", SAMPLES)
def test_fuses_because_the_graph_proves_the_batches_equal(name):
    model = _load(name)
    optimized, report = scanopt.optimize(model, options={"target": "portable"})
    fused = [o for o in report.outcomes if o.pass_name == "fuse"]
    assert fused and all(o.applied for o in fused), [o.detail for o in fused]
    assert report.verification["passed"], report.verification["summary"]
    assert "Scan" not in {n.op_type for n in optimized.graph.node}
    assert compare_models(model, optimized, engine="both", seeds=2).passed


@pytest.mark.parametrize("name", REAL_SAMPLES)
def test_real_tf2onnx_models_get_consistent_long_batched_feeds(name):
    model = onnx.load(os.path.join(REAL, name))
    result = compare_models(model, model, seeds=2)
    assert result.passed, result.summary()
    assert not any("the original fails at" in note for note in result.notes), result.notes
    assert _long_batched_feed(model)
