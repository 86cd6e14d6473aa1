"""Byte-flip mutants of the committed sample models, run through the command line in process.

A mutant may be refused (exit 2, one line), verified or not (exit 0/1); anything else —
an exception escaping ``main``, another exit code, a refusal of more than one line or with
a raw control character in it — is a finding. Deterministic: mutant i of seed s is always
the same bytes. ``python tests/fuzz_models.py N [--commands optimize,inspect,run,verify]``
runs N mutants per command and prints a table and the findings.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import random
import re
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = 64 * 1024  # models this small keep a mutant run short
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
HEADROOM = 4 * 2**30  # address space a mutant run may map beyond what the process maps already


def sample_models() -> list[str]:
    paths = sorted(glob.glob(os.path.join(ROOT, "models", "**", "*.onnx"), recursive=True))
    return [p for p in paths if os.path.getsize(p) <= SMALL and not os.path.exists(p + ".data")]


def mutant(data: bytes, rng: random.Random) -> bytes:
    """1 to 4 bytes changed: a flipped bit, a random byte, or a byte set to 0x80/0xff
    (invalid UTF-8, large varints)."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(out))
        how = rng.randrange(3)
        out[at] = out[at] ^ (1 << rng.randrange(8)) if how == 0 else rng.randrange(256) if how == 1 else rng.choice((0x80, 0xFF))
    return bytes(out)


def mutants(n: int, seed: int = 0):
    """(label, bytes) of n mutants, spread over the sample models."""
    rng = random.Random(seed)
    models = sample_models()
    cache = {}
    for i in range(n):
        path = models[rng.randrange(len(models))]
        if path not in cache:
            with open(path, "rb") as handle:
                cache[path] = handle.read()
        yield f"{os.path.relpath(path, ROOT)}#{seed}.{i}", mutant(cache[path], rng)


def command_line(command: str, model: str, out_dir: str) -> list[str]:
    return {
        "optimize": ["optimize", model, os.path.join(out_dir, "out.onnx"), "-q", "--seeds", "1"],
        "inspect": ["inspect", model],
        "run": ["run", model],
        "verify": ["verify", model, model, "--seeds", "1"],
    }[command]


@contextlib.contextmanager
def memory_limit(headroom: int = HEADROOM):
    """The address space capped at what the process maps now plus ``headroom``, as fuzzers
    run their targets (AFL's -m). A flipped byte can declare a tensor that really needs
    15 GB (tf2onnx_style/dynamic_rnn_relu_zero_state.onnx, seed 0 mutant 4: a hidden size
    of 3791650820, whose zero state onnxruntime then fills): without a cap onnxruntime
    allocates it and the machine runs out of memory; with one it fails to allocate and
    the command ends with its one line. No cap where the platform has none (not Linux)."""
    try:
        import resource

        with open("/proc/self/statm") as handle:
            mapped = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped + headroom if hard == resource.RLIM_INFINITY else min(hard, mapped + headroom)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run_one(command: str, data: bytes, work: str, codes: dict | None = None) -> str | None:
    """None if the command ended as it may; else what went wrong (with the traceback).
    ``codes`` counts the exit codes seen. Run under :func:`memory_limit`."""
    from scanopt.cli import main

    model = os.path.join(work, "mutant.onnx")
    with open(model, "wb") as handle:
        handle.write(data)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), memory_limit():
            code = main(command_line(command, model, work))
    except SystemExit as exc:
        code = exc.code
    except Exception:  # noqa: BLE001 - that is the finding
        return traceback.format_exc()
    finally:
        for name in os.listdir(work):
            os.remove(os.path.join(work, name))
    text = err.getvalue()
    if codes is not None:
        codes[code] = codes.get(code, 0) + 1
    if code not in (0, 1, 2):
        return f"exit {code}: {text}"
    if code == 2:
        lines = text.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith("scanopt: "):
            return f"exit 2 with {len(lines)} line(s): {text}"
        if CONTROL.search(lines[0]):
            return f"raw control character in: {lines[0]!r}"
    return None


def fuzz(n: int, commands=("optimize",), seed: int = 0, work: str | None = None):
    """{command: ({exit code: count}, [(label, finding)])} over n mutants per command."""
    import tempfile

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = work or tmp
        for command in commands:
            findings, codes = [], {}
            for label, data in mutants(n, seed):
                problem = run_one(command, data, work, codes)
                if problem:
                    findings.append((label, problem))
            results[command] = (codes, findings)
    return results


if __name__ == "__main__":
    import argparse
    import time

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("n", type=int)
    parser.add_argument("--commands", default="optimize")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    for command in args.commands.split(","):
        start = time.perf_counter()
        codes, findings = fuzz(args.n, (command,), args.seed)[command]
        tally = ", ".join(f"exit {c}: {k}" for c, k in sorted(codes.items(), key=str))
        print(f"{command}: {args.n} mutants, {len(findings)} findings ({tally}), {time.perf_counter() - start:.0f} s", flush=True)
        for label, problem in findings:
            print(f"--- {label}\n{problem.strip().splitlines()[-1]}")
            print(problem, file=sys.stderr)
