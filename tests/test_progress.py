"""Progress on long runs (issue 22): phases with counters and elapsed time on stderr, live
on a terminal, one line per phase with --progress elsewhere, nothing under -q or by default
when stderr is not a terminal."""

from __future__ import annotations

import io
import subprocess
import sys

import onnx

from scanopt.progress import Progress
from test_scale import shared_x_model


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_each_phase_is_one_line_with_its_counter_and_times_when_not_live():
    stream, clock = io.StringIO(), _Clock()
    progress = Progress(stream, live=False, clock=clock)
    progress("loading m.onnx")
    clock.now = 0.5
    progress("round 1: fuse")
    for done in range(1, 4):
        progress.count(done, 3)
    clock.now = 2.0
    progress.close()
    assert stream.getvalue().splitlines() == [
        "scanopt: loading m.onnx  0.5 s (total 0.5 s)",
        "scanopt: round 1: fuse  3/3 Scans  1.5 s (total 2.0 s)",
    ]


def test_live_redraws_one_line_in_place_and_ends_each_phase_with_a_newline():
    stream, clock = io.StringIO(), _Clock()
    progress = Progress(stream, live=True, clock=clock)
    progress("round 1: fuse")
    for done in range(1, 1001):  # the same instant: redrawn only at the end, not 1000 times
        progress.count(done, 1000)
    progress.close()
    text = stream.getvalue()
    assert text.count("\r") <= 5 and "1000/1000 Scans" in text
    assert "\n" not in text and text.endswith("\r")  # a short phase is wiped: the report starts on a clean line
    stream.seek(0)
    stream.truncate(0)
    progress("verifying")
    clock.now = 5.0
    progress.close()
    assert stream.getvalue().endswith("scanopt: verifying  5.0 s (total 5.0 s)\n")  # a slow phase keeps its line


def _cli(*args, tty=False):
    code = "import sys; from scanopt.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True)


def test_progress_flag_prints_every_phase_with_scan_counts(tmp_path):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(shared_x_model([0] * 12), src)
    result = _cli("optimize", src, out, "--progress", "--target", "portable", "--seeds", "1")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("scanopt: ")]
    phases = [line.split("  ")[0] for line in lines]
    assert phases[0] == f"scanopt: loading {src}"
    assert "scanopt: round 1: forms" in phases and "scanopt: verifying" in phases  # the chooser walks all forms at once
    assert phases[-1] == f"scanopt: writing {out}"
    assert "12/12 Scans" in next(line for line in lines if line.startswith("scanopt: round 1: forms"))
    assert all(" s (total " in line for line in lines)


def test_quiet_and_a_non_terminal_stderr_print_no_progress(tmp_path):
    src = tmp_path / "in.onnx"
    onnx.save(shared_x_model([0] * 3), src)
    for args in ((), ("--progress", "-q")):
        result = _cli("optimize", src, tmp_path / "out.onnx", "--seeds", "1", *args)
        assert result.returncode == 0 and "round 1" not in result.stderr, result.stderr


def test_upgrade_shows_its_phases_too(tmp_path):
    import os

    src = os.path.join(os.path.dirname(__file__), "..", "models", "scan8_sum.onnx")
    out = tmp_path / "out.onnx"
    result = _cli("upgrade", "--target-opset", "13", src, out, "--progress", "--seeds", "1")
    assert result.returncode == 0, result.stderr
    phases = [line.split("  ")[0] for line in result.stderr.splitlines()]
    assert phases == [f"scanopt: loading {src}", f"scanopt: moving {src} to opset 13, verified",
                      f"scanopt: writing {out}"]


def test_a_long_counting_phase_prints_its_counter_every_few_seconds_when_not_live():
    """Issue 28: timing 300 Scans into a log said nothing until the phase ended; now a counter
    line every LOG_SECONDS (5 s), none for a phase that counts faster."""
    stream, clock = io.StringIO(), _Clock()
    progress = Progress(stream, live=False, clock=clock)
    progress("timing")
    for done in range(300):
        clock.now = done * 0.1  # 0.1 s per Scan: 30 s in all
        progress.count(done, 300)
    clock.now = 30.0
    progress.count(300, 300)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "scanopt: timing  50/300 Scans  5.0 s (total 5.0 s)", lines
    assert 5 <= len(lines) <= 7 and lines[-1] == "scanopt: timing  300/300 Scans  30.0 s (total 30.0 s)"
