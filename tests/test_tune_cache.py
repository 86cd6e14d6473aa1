"""The tuning cache's key follows scanopt's own code: a choice measured for the forms an
older pass wrote is not reused once the pass changes (found: a stale "hoisted" kept a Scan
that the new loop fission splits and fuses)."""

import json
import os
import signal

import onnx
import pytest

import scanopt
import scanopt.passes
import scanopt.pipeline
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



# K1 (issue 33): a cache folder is anyone's to edit. Entries whose JSON is valid but not what
# a measurement writes, and files that are no entry at all: each is one note and a fresh
# measurement, never a traceback, a hang or a read without end.
def _choice(**changes) -> str:
    base = {"format": 1, "form": "native", "passes": ["fuse"], "times": {"loop": 1e-3, "native": 3e-4},
            "ratios": {}, "noise": 0.02, "rounds": 9, "clock": "thread CPU", "where": "T=100 B=8", "same": {},
            "threads": None}
    base.update(changes)
    return json.dumps({k: v for k, v in base.items() if v is not None or k == "threads"})


MALFORMED = {
    "only the format": '{"format": 1}',
    "no times": _choice(times=None),
    "times a list": _choice(times=[1e-3, 3e-4]),
    "a time a string": _choice(times={"loop": "1 ms", "native": 3e-4}),
    "no loop time": _choice(times={"native": 3e-4}),
    "the form not timed": _choice(form="vectorized"),
    "the form a number": _choice(form=3),
    "passes a number": _choice(passes=7),
    "passes of numbers": _choice(passes=[1, 2]),
    "same a list": _choice(same=["a"]),
    "noise a string": _choice(noise="2%"),
    "rounds true": _choice(rounds=True),
    "threads a string": _choice(threads="eight"),
    "a time NaN": _choice().replace('"loop": 0.001', '"loop": NaN'),
    "a time Infinity": _choice().replace('"loop": 0.001', '"loop": Infinity'),
    "a time 10**400": _choice().replace('"loop": 0.001', '"loop": 1' + "0" * 400),
    "a time of 5000 digits": _choice().replace('"loop": 0.001', '"loop": 1' + "0" * 5000),
    "a negative time": _choice(times={"loop": -1.0, "native": 3e-4}),
    "nested 100000 deep": '{"format": 1, "times": ' + "[" * 100000 + "]" * 100000 + "}",
    "a list, not an object": "[1, 2]",
    "not UTF-8": b'{"format": 1, "form": "\xff\xfe"}'.decode("unicode_escape").encode("latin-1"),
    "empty": "",
}


def _measured_twice(tmp_path, monkeypatch, spoil):
    """Optimize the RNN sample twice with injected timings; ``spoil(entry_path)`` runs between.
    Returns (measurements made, the second run's tuning notes)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SCANOPT_CACHE_DIR", str(cache))
    timer = FakeTimer({"native": 0.3})
    monkeypatch.setattr(scanopt.tune, "measure", timer)

    def optimize():
        return scanopt.optimize(onnx.load(RNN), options={"tune": True}, input_shapes={"X": [16, 2, 3]}, seeds=1)

    optimize()
    entry, = [p for p in cache.iterdir() if p.suffix == ".json"]
    spoil(entry)
    out, report = optimize()
    return len(timer.calls), report.tuning, entry, out


def _ops(model):
    from scanopt.protos import walk_proto_graphs

    return {n.op_type for g in walk_proto_graphs(model.graph) for n in g.node}


def _write(content):
    def spoil(entry):
        entry.unlink()
        entry.write_bytes(content if isinstance(content, bytes) else content.encode())
    return spoil


def test_a_well_formed_entry_is_read_back_without_a_note(tmp_path, monkeypatch):
    calls, notes, _, out = _measured_twice(tmp_path, monkeypatch, _write(_choice()))
    assert calls == 1 and not any("ignored" in n for n in notes)
    assert "RNN" in _ops(out)


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_malformed_entry_is_one_note_and_measured_again(tmp_path, monkeypatch, kind):
    calls, notes, entry, out = _measured_twice(tmp_path, monkeypatch, _write(MALFORMED[kind]))
    ignored = [n for n in notes if "ignored" in n]
    assert calls == 2, kind
    assert len(ignored) == 1 and str(entry) in ignored[0] and ignored[0].endswith("measured again"), notes
    assert "\n" not in ignored[0]
    assert "RNN" in _ops(out)  # the fresh measurement decides
    assert json.loads(entry.read_text())["times"]["native"] == pytest.approx(3e-4)  # and replaces the entry


@pytest.fixture
def deadline():
    """A hang fails the test instead of the suite (no pytest-timeout here)."""
    def hung(*_):
        raise TimeoutError("the cache read blocked")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "dev_urandom", "too_big", "folder"])
def test_an_entry_that_is_no_regular_file_of_entry_size_is_refused_before_reading(tmp_path, monkeypatch, deadline,
                                                                                  kind):
    def spoil(entry):
        entry.unlink()
        if kind == "fifo":
            os.mkfifo(entry)  # nobody writes: a plain open() blocks forever
        elif kind.startswith("dev_"):
            os.symlink("/dev/" + kind[4:], entry)  # a read until memory runs out
        elif kind == "too_big":
            entry.write_text(_choice(where="x" * (2 << 20)))
        else:
            entry.mkdir()

    calls, notes, entry, _ = _measured_twice(tmp_path, monkeypatch, spoil)
    ignored = [n for n in notes if "ignored" in n]
    assert calls == 2 and len(ignored) == 1, notes


def test_read_regular_reads_no_more_than_its_bound(tmp_path):
    small = tmp_path / "small.json"
    small.write_bytes(b"x" * tune_cache.MAX_BYTES)
    assert len(tune_cache.read_regular(str(small))) == tune_cache.MAX_BYTES
    small.write_bytes(b"x" * (tune_cache.MAX_BYTES + 1))
    with pytest.raises(OSError):
        tune_cache.read_regular(str(small))


def test_a_malformed_calibration_is_one_note_and_calibrated_again(tmp_path, monkeypatch):
    from scanopt import calibrate

    monkeypatch.setenv("SCANOPT_CACHE_DIR", str(tmp_path))
    timer = FakeTimer({"fuse": 0.5})
    chosen = scanopt.pipeline.select_passes()
    first = calibrate.scales({}, scanopt.pipeline._run_passes, chosen, timer)
    entry, = list(tmp_path.iterdir())
    for bad in ('{"format": 1, "scales": [1]}', '{"format": 1, "scales": {"fuse_rnn": "x"}}',
                '{"format": 1, "scales": {"fuse_rnn": 0}}', '{"format": 1}'):
        entry.write_text(bad)
        notes: list[str] = []
        calls = len(timer.calls)
        assert calibrate.scales({}, scanopt.pipeline._run_passes, chosen, timer, notes) == first
        assert len(timer.calls) > calls and len(notes) == 1 and notes[0].startswith("calibration: cache entry")
