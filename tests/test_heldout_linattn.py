"""Issue 32's real exports (models/heldout_linattn, written by generate_heldout_linattn.py with
PyTorch 2.13): linear, RetNet, gated, DeltaNet and Gated DeltaNet recurrences as their reference
code writes them, each by TorchScript (a Loop, opset 17) and by dynamo with torch's scan. At
``--target-opset 27 --target portable --portable-runtime onnxruntime`` each becomes one LinearAttention (through loop_to_scan
for the Loops), passes verification and reproduces PyTorch's stored outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import scanopt
from scanopt.report import count_ops

MODELS = Path(__file__).resolve().parent.parent / "models" / "heldout_linattn"
# name -> the rule the LinearAttention takes
RULES = {f"{rule}_{src}": {"retnet": "gated"}.get(rule, rule)
         for rule in ("linear", "retnet", "gated", "delta", "gated_delta") for src in ("ts", "dyn")}
LOOP_OPS = ("Scan", "Loop", "LinearAttention")


def test_every_model_is_listed():
    assert sorted(p.stem for p in MODELS.glob("*.onnx")) == sorted(RULES)


def _equal_to_torch(name, out):
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    stored = np.load(MODELS / f"{name}.expected.npz")
    feeds = {i.name: stored[i.name] for i in model.graph.input}
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    for result, output in zip(session.run(None, feeds), model.graph.output):
        np.testing.assert_allclose(result, stored[output.name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(RULES))
def test_portable_writes_one_linear_attention_equal_to_torch(name):
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    out, report = scanopt.optimize(model, options={"target": "portable", "target_opset": 27, "portable_runtimes": ["onnxruntime"]})
    counts = count_ops(out)
    assert {op: counts[op] for op in LOOP_OPS if counts.get(op)} == {"LinearAttention": 1}, \
        [o.detail for o in report.outcomes]
    applied = [o.detail for o in report.outcomes if o.pass_name == "linattn" and o.applied]
    assert len(applied) == 1 and applied[0].startswith(RULES[name] + " "), applied
    assert report.verification["passed"] is True, report.verification
    _equal_to_torch(name, out)


@pytest.mark.parametrize("name", ["gated_delta_ts", "delta_dyn"])
def test_default_keeps_what_measures_fastest_and_equal_to_torch(name):
    """The default measures LinearAttention against the loop (onnxruntime CPU runs the op through
    its function body); whatever it writes is verified and equal to PyTorch."""
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    out, report = scanopt.optimize(model, options={"target_opset": 27})
    linattn = [o for o in report.outcomes if o.pass_name == "linattn"]
    assert linattn and any("LinearAttention" in o.detail for o in linattn), [o.detail for o in linattn]
    if report.modified:
        assert report.verification["passed"] is True, report.verification
    _equal_to_torch(name, out)


def test_a_migration_does_not_make_its_drawn_feeds_the_deployment_shapes():
    """--target-opset 27 verifies the migration on feeds drawn from the original; those are not
    the user's (only --inputs imply shapes): with B and T symbolic nothing is measured, and the
    report says why, instead of timing the forms at the first drawn set (T=3, B=16) as declared."""
    model = onnx.load(str(MODELS / "linear_ts.onnx"))
    _, report = scanopt.optimize(model, options={"target_opset": 27, "tune": True})
    assert not any("(declared" in line for line in report.tuning), report.tuning
    assert any("not measured" in line and "--input-shape" in line for line in report.tuning), report.tuning


@pytest.mark.parametrize("name", ["gated_ts", "delta_dyn"])
def test_the_hoisted_loop_is_read_as_linear_attention(name):
    """What the default keeps when LinearAttention measures slower: the loop after hoist, whose
    body reads k vᵀ (TorchScript: through the whole Slices of x[..., None, :]) or k as a row and
    a column from scan inputs computed over all steps. linattn still reads it (so the report's
    reason is the measurement, not 'not linear attention')."""
    passes = ["loop_to_scan", "upgrade", "canonicalize", "hoist", "cleanup"]
    hoisted, _ = scanopt.optimize(onnx.load(str(MODELS / f"{name}.onnx")), passes=passes,
                                  options={"target": "portable", "target_opset": 27, "portable_runtimes": ["onnxruntime"]})
    assert count_ops(hoisted).get("Scan") == 1
    out, report = scanopt.optimize(hoisted, passes=["upgrade", "canonicalize", "linattn"],
                                   options={"target": "portable", "portable_runtimes": ["onnxruntime"]})
    applied = [o.detail for o in report.outcomes if o.pass_name == "linattn" and o.applied]
    assert len(applied) == 1 and applied[0].startswith(RULES[name] + " "), [o.detail for o in report.outcomes]
    assert report.verification["passed"] is True, report.verification
    _equal_to_torch(name, out)
