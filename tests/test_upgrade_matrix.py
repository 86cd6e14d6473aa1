"""The migration matrix: every op family of tests/migration_matrix.py at every nesting level,
migrated to each target opset and compared numerically with the original.

The original runs in onnxruntime (it loads every source opset used here); the migrated
model runs in onnxruntime too, or in scanopt's reference executor where the installed
onnxruntime has no kernel for an op at the target's version (probed per case). The default
run covers the targets {9, 11, 13, 17, 21, newest}; ``SCANOPT_FULL_MATRIX=1`` runs every
target from 9 to the newest one onnxruntime loads."""

from __future__ import annotations

import functools
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from migration_matrix import FAMILIES, LEVELS, build, feeds
from scanopt.emit import MIN_TARGET, NEWEST_TARGET
from scanopt.migrate import migrate
from scanopt.reference.evaluator import run_model


def _session(model: onnx.ModelProto):
    options = ort.SessionOptions()
    options.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=None)
def _expected(family, level):
    original = build(family, level)
    session = _session(original)
    sets = feeds(original)
    return original, sets, [session.run(None, f) for f in sets]


def _run(model: onnx.ModelProto, sets: list[dict]) -> list[list[np.ndarray]]:
    """onnxruntime, or the reference executor when onnxruntime lacks a kernel for the model."""
    try:
        session = _session(model)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors share no useful base class
        if "NOT_IMPLEMENTED" not in str(exc):
            raise
        names = [o.name for o in model.graph.output]
        return [[run_model(model, f)[n] for n in names] for f in sets]
    return [session.run(None, f) for f in sets]


def _targets() -> list[int]:
    if os.environ.get("SCANOPT_FULL_MATRIX"):
        return list(range(MIN_TARGET, NEWEST_TARGET + 1))
    return sorted({9, 11, 13, 17, 21, NEWEST_TARGET})


CASES = [
    pytest.param(family, level, target, id=f"{family.name}-{level}-{target}")
    for family in FAMILIES for level in LEVELS for target in _targets()
    if target >= max(family.source, family.min_target)
]


@pytest.mark.parametrize("family,level,target", CASES)
def test_migration_keeps_the_numbers(family, level, target):
    original, sets, expected = _expected(family, level)
    migrated = migrate(original, target).model
    assert [o.version for o in migrated.opset_import if o.domain in ("", "ai.onnx")] == [target]
    assert [v.SerializeToString() for v in migrated.graph.input] == [v.SerializeToString() for v in original.graph.input]
    for want, got in zip(expected, _run(migrated, sets)):
        assert len(got) == len(want)
        for w, g in zip(want, got):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_the_matrix_covers_every_level_and_family():
    """A guard against the matrix shrinking: every family reaches every level."""
    assert len(LEVELS) == 7 and len(FAMILIES) >= 25
    for family in FAMILIES:
        for level in LEVELS:
            assert any(c.values[:2] == (family, level) for c in CASES)
