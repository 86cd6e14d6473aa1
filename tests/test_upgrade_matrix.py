"""The migration matrix: every op family of tests/migration_matrix.py at every nesting level,
migrated to each target opset and compared numerically with the original.

The original runs in onnxruntime (it loads every source opset used here); the migrated
model runs in onnxruntime too, or in scanopt's reference executor where the installed
onnxruntime has no kernel for an op at the target's version (probed per case). The default
run covers the targets {9, 11, 13, 17, 21, 26, newest} (see :func:`_cases`);
``SCANOPT_FULL_MATRIX=1`` runs every target from 9 to the newest one onnxruntime loads."""

from __future__ import annotations

import functools
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from migration_matrix import FAMILIES, LEVELS, build, feeds
from scanopt.emit import MIN_TARGET
from scanopt.migrate import migrate, newest_target
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


NEWEST = newest_target()
DEFAULT_TARGETS = sorted({t for t in (9, 11, 13, 17, 21, 26) if t <= NEWEST} | {NEWEST})


def _cases():
    """Every family x level x target under ``SCANOPT_FULL_MATRIX=1`` (every target from 9 to
    the newest). By default: the main graph at every default target, each nested level at
    one default target, rotating, so every level meets every default target across the
    families (the full run is several minutes on a shared machine)."""
    full = bool(os.environ.get("SCANOPT_FULL_MATRIX"))
    for i, family in enumerate(FAMILIES):
        allowed = [t for t in (range(MIN_TARGET, NEWEST + 1) if full else DEFAULT_TARGETS)
                   if t >= max(family.source, family.min_target)]
        for j, level in enumerate(LEVELS):
            targets = allowed if full or level == "main" else [allowed[(i + j) % len(allowed)]]
            for target in targets:
                yield pytest.param(family, level, target, id=f"{family.name}-{level}-{target}")


CASES = list(_cases())


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


def test_the_matrix_covers_every_level_family_and_target():
    """A guard against the matrix shrinking: every family reaches every level, and every
    level meets every default target."""
    assert len(LEVELS) == 9 and len(FAMILIES) >= 25
    for family in FAMILIES:
        for level in LEVELS:
            assert any(c.values[:2] == (family, level) for c in CASES)
    wanted = set(range(MIN_TARGET, NEWEST + 1)) if os.environ.get("SCANOPT_FULL_MATRIX") else set(DEFAULT_TARGETS)
    for level in LEVELS:
        assert {c.values[2] for c in CASES if c.values[1] == level} == wanted


def test_the_newest_target_is_probed_from_onnxruntime():
    probe = build(FAMILIES[0], "main")
    for target, loads in ((NEWEST, True), (NEWEST + 1, False)):
        if target > onnx.defs.onnx_opset_version():
            continue
        model = migrate(probe, min(target, NEWEST)).model
        model.opset_import[0].version = target
        try:
            _session(model)
            loaded = True
        except Exception:  # noqa: BLE001
            loaded = False
        assert loaded == loads, target
