"""Run a model in onnxruntime in a child process, so a test survives an abort (SIGABRT)
of the runtime: onnxruntime's GRU/LSTM kill the process on an empty batch."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx

_CHILD = r"""
import sys, numpy as np, onnxruntime as ort
folder = sys.argv[1]
feeds = dict(np.load(folder + "/feeds.npz"))
try:
    session = ort.InferenceSession(folder + "/model.onnx", providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    np.savez(folder + "/out.npz", **dict(zip(names, session.run(None, feeds))))
except Exception as exc:
    print(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    sys.exit(3)
"""


def run_in_child(model: onnx.ModelProto, feeds: dict, timeout: float = 120):
    """("ok", {output: array}) | ("error", first line) | ("crash", "signal N")."""
    with tempfile.TemporaryDirectory() as folder:
        onnx.save(model, os.path.join(folder, "model.onnx"))
        np.savez(os.path.join(folder, "feeds.npz"), **feeds)
        done = subprocess.run([sys.executable, "-c", _CHILD, folder], capture_output=True, text=True, timeout=timeout)
        if done.returncode < 0:
            return "crash", f"signal {-done.returncode}"
        if done.returncode == 3:
            return "error", done.stdout.strip()
        if done.returncode:
            return "crash", f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
        with np.load(os.path.join(folder, "out.npz")) as out:
            return "ok", dict(out)
