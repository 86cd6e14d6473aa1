"""`upgrade --target-opset N` on real models: every opset-8 model committed under models/
(models/real/ included when present) and onnx's own backend Scan tests (generated from the
installed onnx package: its wheel ships the test-case code, not always the .onnx files),
for N in {9, 11, 13, 17, 21, 26}: the interface is kept exactly and the outputs are equal,
checked by scanopt's verifier and, for the backend tests, against onnx's expected outputs."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from scanopt.migrate import migrate_verified, newest_target
from scanopt.validate import default_opset

MODELS = Path(__file__).resolve().parent.parent / "models"
TARGETS = [t for t in (9, 11, 13, 17, 21, 26) if t <= newest_target()]


def _opset8_models() -> list[Path]:
    found = []
    for path in sorted(MODELS.rglob("*.onnx")):
        model = onnx.load(str(path), load_external_data=False)
        if default_opset(model) == 8:
            found.append(path)
    return found


@functools.lru_cache(maxsize=None)
def _backend_scan_cases() -> dict:
    """onnx's backend test cases for Scan (test_scan_sum is the Scan-8 one), built by the
    installed onnx's own case code."""
    import onnx.backend.test.case.node as registry
    from onnx.backend.test.case.node import scan

    saved_names, before = dict(registry._existing_names), len(registry._NodeTestCases)
    registry._existing_names.clear()
    try:
        for name in dir(scan.Scan):
            if name.startswith("export"):
                getattr(scan.Scan, name)()
        cases = registry._NodeTestCases[before:]
    finally:
        del registry._NodeTestCases[before:]
        registry._existing_names.clear()
        registry._existing_names.update(saved_names)
    return {case.name: case for case in cases}


def _signature(model):
    return [v.SerializeToString() for v in list(model.graph.input) + list(model.graph.output)]


def test_the_models_include_the_scan8_samples():
    names = {p.name for p in _opset8_models()}
    assert {"scan8_sum.onnx", "scan8_sum_seqlens.onnx", "scan8_reverse_seqlens.onnx"} <= names
    assert "test_scan_sum" in _backend_scan_cases()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("path", _opset8_models(), ids=lambda p: str(p.relative_to(MODELS)))
def test_every_opset8_model_upgrades_with_its_interface_and_numbers(path, target):
    original = onnx.load(str(path))
    if path.name == "ort_unknown_dim_o8.onnx" and target < 10:
        # its scan output's step dims are not stated: the empty-input guard reads them off the
        # state at run time with a computed Slice, which needs opset 10; unguarded, onnxruntime
        # dies on the zero-length sequence the Scan-8 runs, so the migration is refused
        from scanopt.errors import VerificationError

        with pytest.raises(VerificationError, match="dimension 'seq' = 0|process dies"):
            migrate_verified(original, target, engine="ort")
        return
    migration = migrate_verified(original, target, engine="ort")  # raises unless equivalent
    assert migration.verification["passed"] is True
    assert default_opset(migration.model) == target
    assert _signature(migration.model) == _signature(original)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["test_scan_sum", "test_scan9_sum", "test_scan9_multi_state", "test_scan9_scalar"])
def test_onnx_backend_scan_tests_upgrade_to_their_expected_outputs(name, target):
    case = _backend_scan_cases()[name]
    original = case.model
    if default_opset(original) > target:
        pytest.skip("already newer than the target")
    migration = migrate_verified(original, target, engine="ort")
    assert _signature(migration.model) == _signature(original)
    session = ort.InferenceSession(migration.model.SerializeToString(), providers=["CPUExecutionProvider"])
    for inputs, expected in case.data_sets:
        feeds = {v.name: np.asarray(x) for v, x in zip(original.graph.input, inputs)}
        for got, want in zip(session.run(None, feeds), expected):
            np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("target", [12, 13, 17])
def test_cli_upgrades_the_ir3_backend_scan_sum(cli, tmp_path, target):
    """The issue's command: test_scan_sum (IR 3, Scan-8) went to 12 but failed from 13 on
    with "Input axes is undefined!" (the converter ignored initializers that IR 3 does not
    list as graph inputs)."""
    original = _backend_scan_cases()["test_scan_sum"].model
    assert original.ir_version == 3
    src, dst = tmp_path / "scan_sum.onnx", tmp_path / "out.onnx"
    onnx.save(original, str(src))
    result = cli("upgrade", "--target-opset", target, src, dst)
    assert result.code == 0, result.err
    migrated = onnx.load(str(dst))
    assert default_opset(migrated) == target
    assert _signature(migrated) == _signature(original)
