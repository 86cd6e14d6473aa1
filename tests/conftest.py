"""Shared fixtures: running the CLI in-process and capturing its output."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/builders.py and friends

from hypothesis import settings  # noqa: E402

from scanopt.cli import main  # noqa: E402

# CI replays the same examples every run (a red CI must mean a change broke something);
# locally hypothesis explores new examples each run.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


# Output must not depend on the machine running the suite: measuring candidate forms
# (on by default where shapes are known) is off unless a test turns it on, and a test that
# does measures into its own cache (tests/test_tune.py injects the timings).
os.environ["SCANOPT_TUNE"] = "0"
os.environ.setdefault("SCANOPT_CACHE_DIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), f"scanopt-test-cache-{os.getpid()}"))


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """cli('optimize', 'a.onnx', 'b.onnx') -> CliResult(code, stdout, stderr)."""

    def run(*argv: str) -> CliResult:
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse --help / usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run
