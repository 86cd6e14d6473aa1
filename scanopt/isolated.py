"""Whether models survive feed sets, asked of a child process: onnxruntime kills the process
on some empty inputs (SIGFPE in a Scan over a non-zero axis with an empty batch, SIGABRT in
GRU/LSTM), which no exception handler catches. Verification screens its empty-dimension
feed sets here before running them in-process (scanopt.verify); one child per screening
(~0.4 s: importing onnxruntime), restarted after a run that killed it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Sequence

import numpy as np
import onnx

SCREEN_BYTES = 64 << 20  # a bigger model is not copied into a child: its empty sets are skipped
TIMEOUT_S = 60

_CHILD = r"""
import sys
import numpy as np
import onnxruntime as ort
folder, models, sets, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
options = ort.SessionOptions()
options.intra_op_num_threads = 1
for job in range(start, models * sets):
    i, j = divmod(job, sets)
    print(job, flush=True)  # the run under way: if the process dies now, this one killed it
    try:
        session = ort.InferenceSession(f"{folder}/m{i}.onnx", options, providers=["CPUExecutionProvider"])
        session.run(None, dict(np.load(f"{folder}/f{j}.npz")))
        print("ok", flush=True)
    except Exception:
        print("error", flush=True)
"""


def screenable(model: onnx.ModelProto) -> bool:
    """Small enough to copy into a child, weights inline."""
    from scanopt.external_data import has_marks

    return not has_marks(model) and model.ByteSize() <= SCREEN_BYTES and not any(
        t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def screen(models: Sequence[onnx.ModelProto], feed_sets: Sequence[dict]) -> list[list[str]]:
    """status[i][j]: "ok", "error" or "crash" for model i on feed set j (onnxruntime, CPU)."""
    status = [["crash"] * len(feed_sets) for _ in models]
    if not models or not feed_sets:
        return status
    with tempfile.TemporaryDirectory(prefix="scanopt-screen-") as folder:
        for i, model in enumerate(models):
            with open(os.path.join(folder, f"m{i}.onnx"), "wb") as f:
                f.write(model.SerializeToString())
        for j, feeds in enumerate(feed_sets):
            np.savez(os.path.join(folder, f"f{j}.npz"), **{k: np.asarray(v) for k, v in feeds.items()})
        total, start = len(models) * len(feed_sets), 0
        while start < total:
            start = _one_child(folder, len(models), len(feed_sets), start, status)
    return status


def _one_child(folder, n_models, n_sets, start, status) -> int:
    """Run jobs from ``start`` until the child ends; return the next job to run."""
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, folder, str(n_models), str(n_sets), str(start)],
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        lines = done.stdout.split()
    except (OSError, subprocess.SubprocessError):
        return n_models * n_sets  # no child: every remaining run counts as unsafe
    job = start
    for word in lines:
        if word.isdigit():
            job = int(word)
        else:
            i, j = divmod(job, n_sets)
            status[i][j] = word
            job += 1
    if not lines:  # the child did not start: every remaining run counts as unsafe
        return n_models * n_sets
    return int(lines[-1]) + 1 if lines[-1].isdigit() else job  # a digit last: that run killed the child
