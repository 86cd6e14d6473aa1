"""Every model of models/real/ (Scans other projects wrote; see models/generate_real.py)
goes through `optimize` and is verified: issue 10's "Done when".

A model no pass changes is not verified by `optimize` (there is nothing to check), so for
those the test verifies the model against itself: that proves inputs it runs on were
synthesized, which is what verification of any later rewrite needs. Opset-8 models are
also moved to opset 11 (`optimize --target-opset 11`), verified.
"""

from __future__ import annotations

import os

import pytest

import scanopt
from scanopt.validate import default_opset
from scanopt.verify import compare_models

REAL = os.path.join(os.path.dirname(__file__), "..", "models", "real")
MODELS = sorted(f[:-5] for f in os.listdir(REAL) if f.endswith(".onnx"))

# Models only the reference executor can run, and why (asserted from the verification notes).
REFERENCE_ONLY = {"scan9_zero_length_o11": "onnxruntime runs the original on no synthesized input"}


def load(name: str):
    return scanopt.load_model(os.path.join(REAL, f"{name}.onnx"))


def test_the_corpus_has_every_form_the_issue_names():
    prefixes = {f"ort_short_sequence_o{opset}_{main}_" for opset in (8, 9, 11, 16) for main in ("main", "nomain")}
    assert all(any(m.startswith(p) for m in MODELS) for p in prefixes)
    assert {"backend_test_scan_sum", "backend_test_scan9_sum"} <= set(MODELS)
    assert any(m.startswith("os_") for m in MODELS)  # typeless graph outputs, as onnxscript writes them
    assert {"nested_scan8_in_loop_o8", "nested_scan8_in_if_o8"} <= set(MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_optimize_verifies_every_real_model(name):
    model = load(name)
    optimized, report = scanopt.optimize(model)
    if report.modified:
        verification = report.verification
        assert verification["passed"] is True, verification["summary"]
        details = verification["details"]
    else:
        result = compare_models(model, model, seeds=2)
        assert result.passed, result.summary()
        details = result.to_dict()
    if name in REFERENCE_ONLY:
        assert details["engine"] == "reference"
        assert any(REFERENCE_ONLY[name] in note for note in details["notes"])
    else:
        assert details["engine"] == "ort"


OPSET_8 = [m for m in MODELS if m.endswith("_o8") or "_o8_" in m or m == "backend_test_scan_sum"]


@pytest.mark.parametrize("name", OPSET_8)
def test_opset_8_models_move_to_opset_11_verified(name):
    model = load(name)
    assert default_opset(model) == 8
    moved, report = scanopt.optimize(model, options={"target_opset": 11})
    assert default_opset(moved) == 11
    assert report.verification["passed"] is not False, report.verification["summary"]
    assert "cannot verify" not in report.verification["summary"]
