"""Whether models survive feed sets, asked of a child process: onnxruntime kills the process
on some empty inputs (SIGFPE in a Scan over a non-zero axis with an empty batch, SIGABRT in
GRU/LSTM), which no exception handler catches. Verification screens its empty-dimension
feed sets here before running them in-process (scanopt.verify).

One child serves every screening of this process (importing onnxruntime costs ~0.4 s: paid
once, not per verification); a run that kills it is recorded as a crash and a new child
takes the rest. A child that does not answer within TIMEOUT_S is killed: what it had not
answered counts as a crash (unsafe to run in-process)."""

from __future__ import annotations

import atexit
import os
import select
import subprocess
import sys
import tempfile
import time
from typing import Sequence

import numpy as np
import onnx

SCREEN_BYTES = 64 << 20  # a bigger model is not copied into a child: its empty sets are skipped
TIMEOUT_S = 60  # per screening

_CHILD = r"""
import sys
import numpy as np
import onnxruntime as ort
options = ort.SessionOptions()
options.intra_op_num_threads = 1
options.log_severity_level = 4
print("ready", flush=True)
for request in sys.stdin:
    folder, models, sets, start = request.split("\t")
    models, sets, start = int(models), int(sets), int(start)
    for job in range(start, models * sets):
        i, j = divmod(job, sets)
        print(job, flush=True)  # the run under way: if the process dies now, this one killed it
        try:
            session = ort.InferenceSession(f"{folder}/m{i}.onnx", options, providers=["CPUExecutionProvider"])
            session.run(None, dict(np.load(f"{folder}/f{j}.npz")))
            print("ok", flush=True)
        except Exception:
            print("error", flush=True)
    print("done", flush=True)
"""

_child: subprocess.Popen | None = None


def screenable(model: onnx.ModelProto) -> bool:
    """Small enough to copy into a child, weights inline."""
    from scanopt.external_data import has_marks, serialized_size_bound

    return not has_marks(model) and serialized_size_bound(model) <= SCREEN_BYTES and not any(
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
        deadline = time.monotonic() + TIMEOUT_S
        while start < total:
            start = _ask(folder, len(models), len(feed_sets), start, status, deadline)
    return status


def _ask(folder, n_models, n_sets, start, status, deadline) -> int:
    """Run jobs from ``start`` in the child until it answers "done" or dies; return the next
    job to run (past the one that killed it), or the total when no child can answer."""
    total = n_models * n_sets
    child = _started() if time.monotonic() < deadline else None
    if child is None:
        return total
    try:
        child.stdin.write(f"{folder}\t{n_models}\t{n_sets}\t{start}\n".encode())
        child.stdin.flush()
    except OSError:
        _stop()
        return start  # it had died since the last screening: a new one takes the request
    job = start
    for word in _words(child, deadline):
        if word == "done":
            return total
        if word.isdigit():
            job = int(word)
        else:
            i, j = divmod(job, n_sets)
            status[i][j] = word
            job += 1
    # no "done": the child died on ``job`` (that run stays "crash"), or ran out of time
    timed_out = time.monotonic() >= deadline
    _stop()
    return total if timed_out else job + 1


def _words(child: subprocess.Popen, deadline: float):
    """The child's answers, one per line, until EOF or the deadline (read from the pipe's
    descriptor: a buffered reader would hold lines the wait cannot see)."""
    fd, buffer = child.stdout.fileno(), b""
    while True:
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line.decode("ascii", "replace").strip()
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        buffer += chunk


def _started() -> subprocess.Popen | None:
    """The running child, started (and waited for) if there is none."""
    global _child
    if _child is not None and _child.poll() is None:
        return _child
    try:
        _child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL)
    except OSError:
        _child = None
        return None
    if next(_words(_child, time.monotonic() + TIMEOUT_S), None) != "ready":
        _stop()
        return None
    return _child


def _stop() -> None:
    global _child
    if _child is not None:
        if _child.poll() is None:
            _child.kill()
        _child.wait()
        for stream in (_child.stdin, _child.stdout):
            try:
                stream.close()
            except OSError:
                pass
    _child = None


atexit.register(_stop)
