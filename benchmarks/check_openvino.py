"""Does `scanopt optimize --target portable` write models OpenVINO's CPU runtime loads and runs, equal?

    python benchmarks/check_openvino.py [--filter rnn ...] [--no-samples] [--no-table] [--table-small]
                                        [--perf ../shared/perf] [--work DIR] [--max-kb 2048]

Needs `pip install openvino` beside scanopt (issue 30: "a form OpenVINO cannot run is not portable").
For every committed sample (models/**/*.onnx up to --max-kb) and the 15 models of
../shared/perf/GPU-AND-QUIET-CPU.md (rebuilt with that folder's gen_set.py pieces; --table-small
shrinks the cells to T <= 64, B <= 4, I, H <= 32 for a quick run), this runs the CLI
(`scanopt optimize -q --target portable M OUT`), then compiles the original and the output with
`openvino.Core().compile_model(..., "CPU")` at f32 inference precision, runs each on two
synthesized input sets in turn on one request, the smaller first (the sizes verification draws
for seeds 0 and 1: static dims from the model, symbolic ones bound to small sizes; float values
from N(0, 0.5^2), or N(0, 0.05^2) where onnxruntime's run of the original overflows on those: a
form OpenVINO runs right at sizes it ran before and wrong as they grow fails here) and compares
each run with onnxruntime's run of the original
(rtol 1e-4, atol 1e-5 times the output's largest magnitude, at least 1; integer and bool outputs
exactly). An output also counts as equal where its error is within twice OpenVINO's own error on
the original (the runtime's rounding, not the rewrite's), or where it equals OpenVINO's run of the
original ("yes (as OV's original)": both off onnxruntime's, e.g. both overflowing).

Columns: model, forms scanopt wrote, whether OpenVINO loads (and runs) the original and the
output, whether the output equals, and the first line of the error. A summary follows: among
the models whose original OpenVINO loads and runs, how many outputs it loads and how many are
equal (all of them, and those scanopt rewrote). Exit status 1 when one of those is not equal.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
RTOL, ATOL = 1e-4, 1e-5


def table_models(perf_dir: str, small: bool) -> list[tuple[str, onnx.ModelProto]]:
    """The shared table's 15 Scan models, built the way ../shared/perf/gen_set.py builds them."""
    os.environ.setdefault("SCANOPT_CHECKOUT", ROOT)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    sys.path.insert(0, os.path.abspath(perf_dir))
    import gen_set  # noqa: PLC0415 - the shared folder's builder, found at run time
    import linrec_builders as lb  # noqa: PLC0415

    out = []
    for kind, T, B, I, H in gen_set.CELLS:
        tag = f"{kind}_{T}x{B}x{I}x{H}"
        if small:
            T, B, I, H = min(T, 64), min(B, 4), min(I, 32), min(H, 32)
        scan, _ = gen_set.cell_models(kind, I, H)
        out.append((tag, gen_set.staticize(scan, {"seq": T, "batch": B})))
    # gen_set.main's linear recurrences (the lambdas there, at the table's sizes)
    for tag, build in [("cumsum_T4096", lambda: lb.running_sum(T=4096, H=128, B=1)),
                       ("ema_T2048", lambda: lb.ema(T=2048, H=128)),
                       ("mingru_T1024", lambda: lb.mingru(T=1024, I=64, H=64, B=1)),
                       ("mamba_T1024", lambda: lb.mamba(T=1024, B=1, D=64, N=16)),
                       ("linattn_T1024", lambda: lb.linear_attention(T=1024, DK=64, DV=64))]:
        m = build()
        out.append((tag, m if isinstance(m, onnx.ModelProto) else m[0]))
    return out


def sample_paths(max_kb: int, needles: list[str]) -> list[str]:
    paths = sorted(glob.glob(os.path.join(ROOT, "models", "**", "*.onnx"), recursive=True))
    return [p for p in paths if _wanted(os.path.relpath(p, ROOT), needles) and os.path.getsize(p) <= max_kb * 1024]


def _wanted(name: str, needles: list[str]) -> bool:
    return not needles or any(n in name for n in needles)


def optimize(src: str, dst: str, report: str) -> tuple[str | None, str]:
    """(forms written, or None where the CLI wrote nothing; its error line)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-m", "scanopt", "optimize", "-q", "--target", "portable",
                        "--report", report, src, dst], capture_output=True, text=True, env=env)
    if r.returncode != 0 or not os.path.exists(dst):
        err = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return None, err
    try:
        rep = json.load(open(report))
        forms = sorted(k.split(":")[0] for k in rep["summary"].get("replaced", {}))
    except (OSError, ValueError, KeyError):
        forms = []
    return ", ".join(forms) or "unchanged", ""


def feeds_for(path: str, scale: float = 0.5) -> list[dict]:
    """The sizes, lengths and indices of verification's input sets of seeds 0 and 1, smaller
    first, with every float input redrawn from N(0, scale^2): verification's saturated outliers
    overflow some models to inf, where two runtimes then disagree about nothing this check is
    about. One OpenVINO request runs them in that order: its CPU runtime has run a form right at
    sizes it had run before and wrong at larger ones (docs/execution-providers.md)."""
    from scanopt.verify import runnable_feeds  # noqa: PLC0415

    sets = runnable_feeds(path, seeds=2, engine="ort")
    plain = [s for s in sets if str(getattr(s, "label", "")).startswith("seed")] or sets[:1]
    rng = np.random.default_rng(0)
    out = []
    for one in plain[:2]:
        feeds = {}
        for name, value in one.items():
            value = np.asarray(value)
            if value.dtype.kind == "f":
                value = np.asarray(scale * rng.standard_normal(value.shape), value.dtype)  # a scalar stays an array
            feeds[name] = value
        out.append(feeds)
    return sorted(out, key=lambda f: sum(np.asarray(v).nbytes for v in f.values()))


def ort_run(path: str, feeds: dict) -> dict:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    wanted = {i.name for i in sess.get_inputs()}
    return dict(zip(names, sess.run(None, {k: v for k, v in feeds.items() if k in wanted})))


def ov_run(core, path: str, feed_sets: list[dict]) -> list[dict]:
    """OpenVINO's outputs by name for each input set, run in order on one request; raises with
    OpenVINO's message where it cannot."""
    compiled = core.compile_model(core.read_model(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    results = []
    for feeds in feed_sets:
        inputs = {}
        for port in compiled.inputs:
            name = next((n for n in port.get_names() if n in feeds), None)
            if name is None:
                raise RuntimeError(f"OpenVINO input {port.get_names()} has no feed")
            inputs[port] = feeds[name]
        result = request.infer(inputs)
        out = {}
        for port in compiled.outputs:
            value = np.array(result[port])
            for name in port.get_names():
                out[name] = value
        results.append(out)
    return results


def max_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest error in units of the tolerance (<= 1: equal); inf on a shape or dtype mismatch."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    if want.size == 0:
        return 0.0
    if want.dtype.kind not in "fc":
        return 0.0 if np.array_equal(got, want) else float("inf")
    got, want = got.astype(np.float64), want.astype(np.float64)
    same_nonfinite = (~np.isfinite(want)) & ((got == want) | (np.isnan(got) & np.isnan(want)))
    finite = np.isfinite(want)
    if np.any(~finite & ~same_nonfinite):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = max(1.0, float(np.max(np.abs(want[finite]))))
    err = np.abs(got[finite] - want[finite]) / (ATOL * scale + RTOL * np.abs(want[finite]))
    return float(np.nan_to_num(err.max(), nan=np.inf))


def compare(got: list[dict], want: list[dict]) -> float:
    """The largest error over every input set and output, in units of the tolerance."""
    errors = [max_error(g[name], value) if name in g else float("inf")
              for g, w in zip(got, want) for name, value in w.items()]
    return max(errors, default=0.0)


def first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("Exception from", "Check '"))] or lines or [type(exc).__name__]
    return " / ".join(keep[-2:])[:160]


def check(core, name: str, src: str, work: str) -> dict:
    row = {"model": name, "forms": "", "orig": "-", "out": "-", "equal": "-", "error": "", "seconds": 0.0}
    start = time.perf_counter()
    dst, rep = os.path.join(work, "out.onnx"), os.path.join(work, "report.json")
    for p in (dst, rep):
        if os.path.exists(p):
            os.remove(p)
    forms, err = optimize(src, dst, rep)
    row["seconds"] = time.perf_counter() - start
    if forms is None:
        row.update(forms="optimize failed", error=err[:160])
        return row
    row["forms"] = forms
    try:
        feeds = feeds_for(src)
        want = [ort_run(src, f) for f in feeds]
        if not all(np.isfinite(v).all() for w in want for v in w.values()
                   if isinstance(v, np.ndarray) and v.dtype.kind == "f"):
            feeds = feeds_for(src, 0.05)  # onnxruntime's original overflows there: milder values
            want = [ort_run(src, f) for f in feeds]
    except Exception as exc:  # noqa: BLE001 - a model onnxruntime cannot run is a row
        row["error"] = "onnxruntime: " + first_line(exc)
        return row
    try:
        theirs = ov_run(core, src, feeds)
        own = compare(theirs, want)
        row["orig"] = "yes" if own <= 1 else f"runs, differs ({own:.3g}x tol)"
    except Exception as exc:  # noqa: BLE001
        row["orig"], own, theirs = "no", None, None
        row["error"] = "original: " + first_line(exc)
    try:
        got = ov_run(core, dst, feeds)
        row["out"] = "yes"
        error = compare(got, want)
        equal = error <= 1 or (own is not None and np.isfinite(own) and error <= 2 * own)
        if not equal and theirs is not None and compare(got, theirs) <= 1:
            row["equal"] = "yes (as OV's original)"
        else:
            row["equal"] = "yes" if equal else f"no ({error:.3g}x tol)"
    except Exception as exc:  # noqa: BLE001
        row["out"] = "no"
        row["error"] = (row["error"] + "; " if row["error"] else "") + "output: " + first_line(exc)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", action="append", default=[],
                        help="only models whose name contains this (repeatable: any of them)")
    parser.add_argument("--no-samples", action="store_true", help="skip models/**.onnx")
    parser.add_argument("--no-table", action="store_true", help="skip the shared table's 15 models")
    parser.add_argument("--table-small", action="store_true", help="shrink the table's cells (T<=64, B<=4, I,H<=32)")
    parser.add_argument("--perf", default=os.path.join(ROOT, "..", "shared", "perf"),
                        help="folder with gen_set.py (default ../shared/perf)")
    parser.add_argument("--max-kb", type=int, default=2048, help="skip samples larger than this")
    parser.add_argument("--work", default=None, help="folder for the models written (default: a temp folder)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    try:
        import openvino as ov  # noqa: PLC0415
    except ImportError:
        print("openvino is not installed here (pip install openvino)", file=sys.stderr)
        return 2
    core = ov.Core()
    work = args.work or tempfile.mkdtemp(prefix="scanopt-ov-")
    os.makedirs(work, exist_ok=True)
    cases: list[tuple[str, str]] = []
    if not args.no_table:
        if not os.path.exists(os.path.join(args.perf, "gen_set.py")):
            print(f"no gen_set.py in {args.perf}: the table's models are skipped", file=sys.stderr)
        else:
            for tag, model in table_models(args.perf, args.table_small):
                if _wanted(f"table/{tag}", args.filter):
                    path = os.path.join(work, f"table_{tag}.onnx")
                    onnx.save(model, path)
                    cases.append((f"table/{tag}", path))
    if not args.no_samples:
        cases += [(os.path.relpath(p, ROOT), p) for p in sample_paths(args.max_kb, args.filter)]
    print(f"openvino {ov.__version__}, onnxruntime {ort.__version__}; scanopt optimize --target portable\n")
    print("| model | forms written | OV loads original | OV loads output | equal | error |\n|---|---|---|---|---|---|")
    rows = []
    for name, path in cases:
        row = check(core, name, path, work)
        rows.append(row)
        print(f"| {row['model']} | {row['forms']} | {row['orig']} | {row['out']} | {row['equal']} | {row['error']} |",
              flush=True)
    print("\n| | models | OV runs the original | of those: output loads | output equal | rewritten | "
          "rewritten: output loads | rewritten: output equal |\n|---|---|---|---|---|---|---|---|")
    for label, group in [("table", [r for r in rows if r["model"].startswith("table/")]),
                         ("samples", [r for r in rows if not r["model"].startswith("table/")]), ("all", rows)]:
        runs = [r for r in group if _runs_original(r)]
        changed = [r for r in runs if r["forms"] != "unchanged"]
        print(f"| {label} | {len(group)} | {len(runs)} | {sum(r['out'] == 'yes' for r in runs)} | "
              f"{sum(r['equal'].startswith('yes') for r in runs)} | {len(changed)} | "
              f"{sum(r['out'] == 'yes' for r in changed)} | {sum(r['equal'].startswith('yes') for r in changed)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any(_runs_original(r) and not r["equal"].startswith("yes") for r in rows) else 0


def _runs_original(row: dict) -> bool:
    """OpenVINO loads and runs the original (equal to onnxruntime or not: the rows it cannot
    run are no question of scanopt's output)."""
    return row["orig"] == "yes" or row["orig"].startswith("runs")


if __name__ == "__main__":
    sys.exit(main())
