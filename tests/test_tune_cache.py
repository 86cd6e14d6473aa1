"""The tuning cache's key follows scanopt's own code: a choice measured for the forms an
older pass wrote is not reused once the pass changes (found: a stale "hoisted" kept a Scan
that the new loop fission splits and fuses)."""

import onnx
import pytest

import scanopt
import scanopt.passes
from scanopt import tune_cache
from test_tune import RNN, FakeTimer


@pytest.fixture
def fresh_fingerprint():
    tune_cache.code_fingerprint.cache_clear()
    yield
    tune_cache.code_fingerprint.cache_clear()


def test_the_fingerprint_changes_with_any_source_file_of_scanopt_or_its_passes(tmp_path, monkeypatch,
                                                                               fresh_fingerprint):
    core, passes = tmp_path / "scanopt", tmp_path / "passes"
    (core / "cli").mkdir(parents=True)
    passes.mkdir()
    (core / "cli" / "main.py").write_text("A = 1\n")
    (passes / "fuse.py").write_text("B = 1\n")
    (passes / "notes.txt").write_text("not code\n")
    monkeypatch.setattr(scanopt, "__path__", [str(core)])
    monkeypatch.setattr(scanopt.passes, "__path__", [str(passes)])
    first = tune_cache.code_fingerprint()
    tune_cache.code_fingerprint.cache_clear()
    (passes / "notes.txt").write_text("edited\n")
    assert tune_cache.code_fingerprint() == first  # only Python sources count
    for edited in (passes / "fuse.py", core / "cli" / "main.py"):
        tune_cache.code_fingerprint.cache_clear()
        edited.write_text(edited.read_text() + "C = 2\n")
        changed = tune_cache.code_fingerprint()
        assert changed != first
        first = changed


def test_a_changed_pass_measures_again_instead_of_reading_the_old_choice(monkeypatch, tmp_path):
    monkeypatch.setenv("SCANOPT_CACHE_DIR", str(tmp_path / "cache"))
    timer = FakeTimer({"native": 0.3})
    monkeypatch.setattr(scanopt.tune, "measure", timer)

    def optimize():
        scanopt.optimize(onnx.load(RNN), options={"tune": True}, input_shapes={"X": [16, 2, 3]}, seeds=1)

    optimize()
    optimize()
    assert len(timer.calls) == 1  # the same code: cached
    monkeypatch.setattr(tune_cache, "code_fingerprint", lambda: "another scanopt")
    optimize()
    assert len(timer.calls) == 2
