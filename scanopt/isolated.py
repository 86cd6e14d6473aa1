"""Model runs in a child process. Whether models survive feed sets: onnxruntime kills the
process on some empty inputs (SIGFPE in a Scan over a non-zero axis with an empty batch,
SIGABRT in GRU/LSTM), which no exception handler catches. Verification screens its
empty-dimension feed sets here before running them in-process (scanopt.verify); one child
per screening (~0.4 s: importing onnxruntime), restarted after a run that killed it.

:func:`run_bounded`: one run of a user's model whose length nothing bounds (a Loop with trip
count 2^62 that stacks an output every step), under a time limit and an address-space limit
(RLIMIT_AS), killed at the limit or when the parent is interrupted (subprocess.run kills its
child on any exception, the signal handlers' Interrupted included)."""

from __future__ import annotations

import os
import signal
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


_BOUNDED_CHILD = r"""
import os, resource, sys
folder, limit = sys.argv[1], int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import numpy as np
import onnxruntime as ort
names = open(os.path.join(folder, "names.txt"), encoding="utf-8").read().split("\n")
options = ort.SessionOptions()
options.intra_op_num_threads = options.inter_op_num_threads = 1
options.log_severity_level = 4
try:
    session = ort.InferenceSession(os.path.join(folder, "model.onnx"), options, providers=["CPUExecutionProvider"])
    values = session.run(names, dict(np.load(os.path.join(folder, "feeds.npz"))))
    np.savez(os.path.join(folder, "out.npz"), *values)
except MemoryError:
    print("out of memory", flush=True)
except Exception as exc:
    text = " ".join(str(exc).split())
    if "Failed to allocate memory" in text or "bad_alloc" in text:
        text = "out of memory"
    print(text.splitlines()[0][:160] if text else type(exc).__name__, flush=True)
"""
BOUNDED_MEMORY_BYTES = 2 << 30  # address space of a bounded run's child, beyond its model and feeds


def run_bounded(model: onnx.ModelProto, feeds: dict, names: list[str], seconds: float,
                memory_bytes: int = BOUNDED_MEMORY_BYTES) -> list[np.ndarray] | str:
    """``names`` computed by onnxruntime (CPU, one thread) in a child process limited to
    ``seconds`` (onnxruntime's import included) and ``memory_bytes`` of address space plus four
    times the model's and the feeds' size; or why not, in words."""
    if not screenable(model):
        return f"the model is over {SCREEN_BYTES >> 20} MB or has external data: not copied into a bounded child"
    with tempfile.TemporaryDirectory(prefix="scanopt-run-") as folder:
        with open(os.path.join(folder, "model.onnx"), "wb") as f:
            f.write(model.SerializeToString())
        np.savez(os.path.join(folder, "feeds.npz"), **{k: np.asarray(v) for k, v in feeds.items()})
        with open(os.path.join(folder, "names.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(names))
        size = model.ByteSize() + sum(np.asarray(v).nbytes for v in feeds.values())
        limit = memory_bytes + 4 * size
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        try:
            done = subprocess.run([sys.executable, "-c", _BOUNDED_CHILD, folder, str(limit)],
                                  capture_output=True, text=True, timeout=seconds, env=env)
        except subprocess.TimeoutExpired:
            return f"stopped after the time limit of {seconds:g} s"
        except OSError as exc:
            return f"no child process: {exc.strerror or exc}"
        said = done.stdout.strip()
        if said == "out of memory":
            return f"out of memory at the memory limit of {limit >> 20} MB"
        if done.returncode < 0:
            return f"the run died ({_signal_name(-done.returncode)}; at the memory limit of {limit >> 20} MB?)"
        if said or done.returncode:
            return said or f"the run ended with exit code {done.returncode}"
        try:
            with np.load(os.path.join(folder, "out.npz")) as out:
                return [out[f"arr_{i}"] for i in range(len(names))]
        except (OSError, ValueError, KeyError) as exc:
            return f"no outputs came back ({exc})"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


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
