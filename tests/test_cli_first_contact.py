"""What a new user meets in the first hour: output on a console that cannot show every
character, hints that name what can be declared, contradictory shapes, library feeds of the
wrong dtype, and the summary of a model whose Loops became Scans."""

from __future__ import annotations

import os
import subprocess
import sys

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")
ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_a_console_without_the_reports_characters_gets_replacements_not_a_traceback(tmp_path):
    """PYTHONIOENCODING=cp1252 (a redirected Windows console): the nested sample's verdicts say
    '⊙', which cp1252 lacks; the run ended in a UnicodeEncodeError, exit 1, after writing."""
    env = dict(os.environ, PYTHONIOENCODING="cp1252", SCANOPT_TUNE="0")
    out = tmp_path / "o.onnx"
    with open(tmp_path / "log", "wb") as log:
        result = subprocess.run([sys.executable, "-m", "scanopt", "optimize", os.path.join(MODELS, "scan_nested.onnx"),
                                 str(out), "-v"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.PIPE, timeout=300)
    err = result.stderr.decode("cp1252", "replace")
    assert result.returncode == 0 and "Traceback" not in err, err
    text = (tmp_path / "log").read_bytes().decode("cp1252")
    assert "wrote" in text and "?" in text and out.exists()
