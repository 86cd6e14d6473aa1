"""Signals at random moments into ``python -m scanopt optimize`` (issue 33, D1/D2): every run
must end with exit 0 and OUT written, or 128+N, one line, nothing written; never a traceback,
another code or a staging leftover.

A signal that lands before Python has run scanopt's entry point (the interpreter's own
start-up and ``import scanopt.cli``, measured here as ``startup``) meets Python's defaults,
which no program can change: SIGTERM/SIGHUP kill the process (the shell's 143/129, no line),
SIGINT prints Python's KeyboardInterrupt. Those are counted apart; nothing is written there
either. Run as a script for the long version: ``python tests/signal_storm.py 200 3.0``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _defaults():
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


def startup_seconds(repeat: int = 5) -> float:
    """The longest of ``repeat`` starts of the interpreter up to scanopt's entry point."""
    worst = 0.0
    for _ in range(repeat):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import scanopt.cli"], cwd=ROOT, check=True, preexec_fn=_defaults)
        worst = max(worst, time.perf_counter() - began)
    return worst


def trial(src: str, folder: str, signum: int, offset: float) -> dict:
    """One run of ``optimize src folder/out.onnx`` with ``signum`` sent ``offset`` s after start."""
    out = os.path.join(folder, "out.onnx")
    proc = subprocess.Popen([sys.executable, "-m", "scanopt", "optimize", src, out, "-q"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_defaults)
    began = time.perf_counter()
    try:
        proc.wait(timeout=offset)  # ended before its signal: none is sent
    except subprocess.TimeoutExpired:
        proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    seconds = time.perf_counter() - began
    written = os.path.exists(out)
    leftovers = [n for n in os.listdir(folder) if n != "out.onnx"]
    if written:
        os.unlink(out)
    return {"signal": signum, "offset": offset, "code": proc.returncode, "err": err, "written": written,
            "leftovers": leftovers, "seconds": seconds}


def _python_default(code: int, err: str, signum: int) -> bool:
    """What Python itself does with ``signum`` before scanopt's handlers are in place: SIGTERM
    and SIGHUP kill the process; SIGINT raises KeyboardInterrupt wherever the interpreter is
    (exit 1 with its traceback when that is inside ``-m``'s own module lookup, or the
    re-raised SIGINT)."""
    if code == -signum:
        return True
    return signum == signal.SIGINT and code == 1 and err.rstrip().endswith("KeyboardInterrupt")


def verdict(result: dict, startup: float) -> str | None:
    """None when the run ended as documented; else what was wrong."""
    code, err, signum = result["code"], result["err"], result["signal"]
    if result["leftovers"]:
        return f"left {result['leftovers']}"
    if code == 0:
        return None if result["written"] and not err.strip() else f"exit 0, written={result['written']}, err={err!r}"
    if result["written"]:
        return f"exit {code} but OUT written"
    if code == 128 + signum:
        expected = "scanopt: interrupted" + ("" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}")
        return None if err.strip() == expected else f"exit {code}, stderr {err.strip()!r}"
    if result["offset"] <= startup and _python_default(code, err, signum):
        return None  # before the entry point: Python's own default (counted apart)
    return f"exit {code}, stderr {err.strip()[-300:]!r}"


def storm(src: str, folder: str, count: int, longest: float, seed: int = 0) -> tuple[list[dict], list[str], float]:
    """``count`` trials at offsets uniform in [0, longest]: (results, failures, startup)."""
    rng = random.Random(seed)
    startup = startup_seconds()
    results, failures = [], []
    for _ in range(count):
        result = trial(src, folder, rng.choice(SIGNALS), rng.uniform(0.0, longest))
        results.append(result)
        wrong = verdict(result, startup)
        if wrong:
            failures.append(f"{signal.Signals(result['signal']).name} at {result['offset']:.3f} s: {wrong}")
    return results, failures, startup


def main() -> int:
    import tempfile

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import builders as b

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    longest = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    with tempfile.TemporaryDirectory() as folder:
        src = os.path.join(folder, "in.onnx")
        with open(src, "wb") as handle:
            handle.write(b.scan9_sum(steps="T").SerializeToString())
        work = os.path.join(folder, "work")
        os.mkdir(work)
        began = time.perf_counter()
        results, failures, startup = storm(src, work, count, longest)
    codes: dict[int, int] = {}
    for r in results:
        codes[r["code"]] = codes.get(r["code"], 0) + 1
    print(f"{count} signals at 0-{longest:g} s in {time.perf_counter() - began:.0f} s; start-up {startup * 1e3:.0f} ms; "
          f"exit codes {dict(sorted(codes.items()))}; written {sum(r['written'] for r in results)}; "
          f"failures {len(failures)}")
    for line in failures:
        print("  " + line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
