"""Model runs in a child process: onnxruntime kills the process on some empty inputs (SIGFPE
in a Scan over a non-zero axis with an empty batch, SIGABRT in GRU/LSTM), which no exception
handler catches, and a user's model may run without bound.

:func:`screen`: whether models survive feed sets. Verification screens its empty-dimension
feed sets here before running them in-process (scanopt.verify). One child serves every
screening of this process (importing onnxruntime costs ~0.4 s: paid once, not per
verification; :func:`warm_up` starts it without waiting, so that import overlaps the caller's
own work); a run that kills it is recorded as a crash (``why`` says of which signal) and a new
child takes the rest. A child that does not answer within TIMEOUT_S is killed: what it had
not answered counts as a crash (unsafe to run in-process). A feed set of None screens the
session's creation alone (onnxruntime's graph optimizers may die on a model too).

:func:`first_run`: the first run of a user's model in onnxruntime, which happens here, where
onnxruntime dying on a malformed model it accepts (SIGSEGV on a Loop whose trip count is an
empty tensor, SIGABRT on a Split with more outputs than ``num_outputs``) is survivable: the
command ends with :class:`OnnxruntimeCrashError`'s one line instead of a dead process.

:func:`run_bounded`: one run of a user's model whose length nothing bounds (a Loop with trip
count 2^62 that stacks an output every step), under a time limit and an address-space limit
(RLIMIT_AS), killed at the limit or when the parent is interrupted (subprocess.run kills its
child on any exception, the signal handlers' Interrupted included)."""

from __future__ import annotations

import atexit
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Sequence

from scanopt.errors import ScanoptError

# numpy and onnx are imported where used: warm_up runs before the command line's heavy imports

SCREEN_BYTES = 64 << 20  # a bigger model is not copied into a child: its empty sets are skipped
TIMEOUT_S = 60  # per screening

_CHILD = r"""
import os, sys
import numpy as np
import onnxruntime as ort
options = ort.SessionOptions()
options.intra_op_num_threads = 1
options.log_severity_level = 4
print("ready", flush=True)
for request in sys.stdin:
    folder, models, sets, start = request.split("\t")
    models, sets, start = int(models), int(sets), int(start)
    sessions = {}  # one per model and request: its feed sets run in the same session
    for job in range(start, models * sets):
        i, j = divmod(job, sets)
        print(job, flush=True)  # the run under way: if the process dies now, this one killed it
        try:
            if i not in sessions:  # jobs go model by model: one session alive at a time
                sessions.clear()
                sessions[i] = None  # stays None where onnxruntime refuses the model: an error on every set
                sessions[i] = ort.InferenceSession(f"{folder}/m{i}.onnx", options, providers=["CPUExecutionProvider"])
            session = sessions[i]
            if session is None:
                raise RuntimeError("no session")
            try:
                feeds = np.load(f"{folder}/f{j}.npz")
            except FileNotFoundError:  # a None feed set: the session's creation alone
                feeds = None
            if feeds is not None:
                values = session.run(None, dict(feeds))
                if os.path.exists(f"{folder}/keep") and all(isinstance(v, np.ndarray) and v.dtype.kind in "biufc"
                                                            for v in values):
                    np.savez(f"{folder}/o{i}_{j}.npz", *values)  # handed back: the caller need not run it again
            print("ok", flush=True)
        except Exception:
            print("error", flush=True)
    print("done", flush=True)
"""

_child: subprocess.Popen | None = None
_ready = False  # whether _child has said "ready" (warm_up does not wait for it)


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
    import numpy as np

    from scanopt.external_data import serialized_size_bound

    if not screenable(model):
        return f"the model is over {SCREEN_BYTES >> 20} MB or has external data: not copied into a bounded child"
    with tempfile.TemporaryDirectory(prefix="scanopt-run-") as folder:
        with open(os.path.join(folder, "model.onnx"), "wb") as f:
            f.write(model.SerializeToString())
        np.savez(os.path.join(folder, "feeds.npz"), **{k: np.asarray(v) for k, v in feeds.items()})
        with open(os.path.join(folder, "names.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(names))
        size = serialized_size_bound(model) + sum(np.asarray(v).nbytes for v in feeds.values())
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
    import onnx

    from scanopt.external_data import has_marks, serialized_size_bound

    return not has_marks(model) and serialized_size_bound(model) <= SCREEN_BYTES and not any(
        t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def screen(models: Sequence[onnx.ModelProto], feed_sets: Sequence[dict | None],
           why: dict | None = None, outputs: dict | None = None) -> list[list[str]]:
    """status[i][j]: "ok", "error" or "crash" for model i on feed set j (onnxruntime, CPU; a
    set of None: creating the session alone). ``why``, when given, gets {(i, j): how the
    process died} for each crash: "SIGSEGV", "no answer within 60 s", "no child process".
    ``outputs``, when given, gets {(i, j): the outputs in graph order} of each "ok" run whose
    outputs are all numeric or bool tensors."""
    import numpy as np

    status = [["crash"] * len(feed_sets) for _ in models]
    why = {} if why is None else why
    if not models or not feed_sets:
        return status
    with tempfile.TemporaryDirectory(prefix="scanopt-screen-") as folder:
        for i, model in enumerate(models):
            with open(os.path.join(folder, f"m{i}.onnx"), "wb") as f:
                f.write(model.SerializeToString())
        for j, feeds in enumerate(feed_sets):
            if feeds is not None:
                np.savez(os.path.join(folder, f"f{j}.npz"), **{k: np.asarray(v) for k, v in feeds.items()})
        if outputs is not None:
            open(os.path.join(folder, "keep"), "w").close()
        total, start = len(models) * len(feed_sets), 0
        deadline = time.monotonic() + TIMEOUT_S
        while start < total:
            start = _ask(folder, len(models), len(feed_sets), start, status, deadline, why)
        for i, row in enumerate(status if outputs is not None else ()):
            for j, word in enumerate(row):
                kept = os.path.join(folder, f"o{i}_{j}.npz")
                if word == "ok" and os.path.exists(kept):
                    try:
                        with np.load(kept, allow_pickle=False) as values:
                            outputs[(i, j)] = [values[f"arr_{k}"] for k in range(len(values.files))]
                    except (OSError, ValueError, KeyError):
                        pass
    for i, row in enumerate(status):
        for j, word in enumerate(row):
            if word == "crash":
                why.setdefault((i, j), "no child process")
    return status


def _ask(folder, n_models, n_sets, start, status, deadline, why) -> int:
    """Run jobs from ``start`` in the child until it answers "done" or dies; return the next
    job to run (past the one that killed it), or the total when no child can answer."""
    total = n_models * n_sets
    child = _started(deadline) if time.monotonic() < deadline else None
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
    if timed_out:
        for late in range(job, total):
            why[divmod(late, n_sets)] = f"no answer within {TIMEOUT_S} s"
    else:
        try:
            code = child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        if job < total:
            why[divmod(job, n_sets)] = _signal_name(-code) if code is not None and code < 0 else (
                f"exit code {code}" if code is not None else "it stopped answering")
    _stop()
    return total if timed_out else job + 1


def first_run(models: Sequence[onnx.ModelProto], feeds: dict | None, outputs: dict | None = None) -> list[str | None]:
    """Per model, how onnxruntime's process died creating its session and running it once on
    ``feeds`` (None, or feeds numpy cannot store plainly: creating the session alone) in the
    child ("SIGSEGV"), or None where it survived. A clean error is survival (the run in this
    process reports it), and so is what says nothing of the model: a model too big for a
    child (:func:`screenable`), no child process, no answer within TIMEOUT_S (a slow model).
    ``outputs``, when given, gets {index in ``models``: its outputs in graph order} where the
    child could hand them back."""
    fits = [screenable(m) for m in models]
    runnable = [m for m, ok in zip(models, fits) if ok]
    if runnable and outputs is None:  # the caller runs onnxruntime next: its import here overlaps the child's
        warm_up()
        import onnxruntime  # noqa: F401
    why: dict = {}
    kept: dict | None = {} if outputs is not None else None
    status = screen(runnable, [feeds if _plain(feeds) else None], why, kept) if runnable else []
    died = iter(why.get((i, 0)) if row[0] == "crash" and not why.get((i, 0), "").startswith("no ") else None
                for i, row in enumerate(status))
    positions = [k for k, ok in enumerate(fits) if ok]  # index in ``runnable`` -> index in ``models``
    for (i, _), values in (kept or {}).items():
        outputs[positions[i]] = values
    return [next(died) if ok else None for ok in fits]


def _plain(feeds) -> bool:
    """Feeds an .npz holds as they are: numeric and bool arrays (no sequences, maps, strings
    or ml_dtypes types)."""
    import numpy as np

    return feeds is not None and all(isinstance(v, np.ndarray) and v.dtype.kind in "biufc"
                                     and type(v.dtype).__module__.startswith("numpy") for v in feeds.values())


class OnnxruntimeCrashError(ScanoptError):
    """onnxruntime's process died (a signal, not an error) running the user's model: reported
    in one line, exit code 2 (the model is the problem), nothing written."""


# Originals whose first run a child survived, the protos kept so that their ids stay theirs (no
# weak references to protos): the last few only, a library process optimizing many big models
# must not hold them all (a verification asks about the same original again and again).
_SURVIVORS: dict[int, onnx.ModelProto] = {}
SURVIVORS_KEPT = 2
_CRASHES: ContextVar[list[str] | None] = ContextVar("scanopt_ort_crashes", default=None)


def screen_original(original: onnx.ModelProto, feeds: dict | None, where: str,
                    others: Sequence[onnx.ModelProto] = (), outputs: list | None = None) -> list[str | None]:
    """The first run of ``original`` in onnxruntime (and of ``others`` beside it: a candidate),
    in the child (:func:`first_run`) before any run in this process: raises
    OnnxruntimeCrashError when the original's process dies; returns how each of ``others``
    died (None: it survived). ``where``: the inputs, in words ("on seed 0's inputs"). An
    original that survived once is not run again (its proto is kept, so its id stays
    its own); a crash is also added to the list of an enclosing :func:`crash_watch`.
    ``outputs``: a list that gets the original's outputs (graph order) where the child ran it
    and could hand them back (then nothing needs to run it again: ``scanopt run``)."""
    again = survived(original) and outputs is None
    models = ([] if again else [original]) + [m for m in others if m is not original]
    if not models:
        return [None for _ in others]
    kept: dict | None = {} if outputs is not None else None
    verdicts = dict(zip(map(id, models), first_run(models, feeds, kept)))
    died = verdicts.get(id(original))
    if died:
        message = (f"onnxruntime crashed running the original model: its process died of {died} {where} "
                   "(run in a child process; --engine reference runs it without onnxruntime)")
        watching = _CRASHES.get()
        if watching is not None:
            watching.append(message)
        raise OnnxruntimeCrashError(message)
    if outputs is not None and 0 in kept:
        outputs.extend(kept[0])
    if id(original) in verdicts:
        if len(_SURVIVORS) >= SURVIVORS_KEPT:
            _SURVIVORS.pop(next(iter(_SURVIVORS)))
        _SURVIVORS[id(original)] = original
    return [None if m is original else verdicts.get(id(m)) for m in others]


def survived(model: onnx.ModelProto) -> bool:
    """Whether :func:`screen_original` ran ``model`` (this very proto) in a child and it survived."""
    return _SURVIVORS.get(id(model)) is model


@contextmanager
def crash_watch():
    """Within the block, every OnnxruntimeCrashError :func:`screen_original` raises is also
    appended to the list this yields: a caller that turns verification errors into "cannot
    verify" (the pipeline) cannot hide from the command that onnxruntime dies on the model."""
    found: list[str] = []
    token = _CRASHES.set(found)
    try:
        yield found
    finally:
        _CRASHES.reset(token)


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


def warm_up() -> None:
    """Start the child now, without waiting for it: its import of onnxruntime (~0.4 s)
    overlaps what the caller does before its first screening."""
    global _child, _ready
    if _child is not None and _child.poll() is None:
        return
    _stop()
    try:
        _child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL)
    except OSError:
        _child = None
    _ready = False


def _started(deadline: float | None = None) -> subprocess.Popen | None:
    """The running child, started if there is none, once it has said it is ready."""
    global _ready
    warm_up()
    if _child is None:
        return None
    if not _ready:
        if next(_words(_child, deadline or time.monotonic() + TIMEOUT_S), None) != "ready":
            _stop()
            return None
        _ready = True
    return _child


def _stop() -> None:
    global _child, _ready
    if _child is not None:
        if _child.poll() is None:
            _child.kill()
        _child.wait()
        for stream in (_child.stdin, _child.stdout):
            try:
                stream.close()
            except OSError:
                pass
    _child, _ready = None, False


atexit.register(_stop)
