"""Byte-flip and structure-level mutants of the committed sample models, run through the
command line in process.

Byte flips mostly break the protobuf or a name; :func:`structure_mutant` keeps the bytes
valid and breaks the model's meaning instead (an empty Transpose.perm, an initializer's
data type changed, an initializer shadowing an input with another shape, an attribute of
the wrong type, a Scan with more scan inputs than inputs, a body's output count changed,
...): what the passes and the IR helpers see.

A mutant may be refused (exit 2, one line), verified or not (exit 0/1); anything else —
an exception escaping ``main``, another exit code, a refusal of more than one line or with
a raw control character in it — is a finding. Deterministic: mutant i of seed s is always
the same bytes. ``python tests/fuzz_models.py N [--commands optimize,inspect,run,verify]``
runs N mutants per command and prints a table and the findings; ``--kind structure`` the
structure-level ones. The mutants run in a worker process that a mutant may kill (onnxruntime
or onnx dying of SIGSEGV/SIGABRT): the death is counted as an abort, naming the mutant, and a
new worker goes on after it.
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


def _spread(n: int, seed: int, load, mutate):
    """(label, bytes) of n mutants, spread over the sample models: ``load(path)`` once per
    model, ``mutate(loaded, rng)`` -> (bytes, what was done or "")."""
    rng = random.Random(seed)
    models = sample_models()
    cache = {}
    for i in range(n):
        path = models[rng.randrange(len(models))]
        if path not in cache:
            cache[path] = load(path)
        data, how = mutate(cache[path], rng)
        yield f"{os.path.relpath(path, ROOT)}#{seed}.{i}" + (f":{how}" if how else ""), data


def _read(path):
    with open(path, "rb") as handle:
        return handle.read()


def mutants(n: int, seed: int = 0):
    """(label, bytes) of n byte-level mutants, spread over the sample models."""
    return _spread(n, seed, _read, lambda data, rng: (mutant(data, rng), ""))


def structure_mutants(n: int, seed: int = 0):
    """(label, bytes) of n structure-level mutants, spread over the sample models."""
    import onnx

    return _spread(n, seed, lambda path: onnx.load(path, load_external_data=False), structure_mutant)


def structure_mutant(model, rng: random.Random) -> tuple[bytes, str]:
    """(serialized mutant, what was done): a copy of ``model`` with 1 or 2 structure mutations."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    done = []
    for _ in range(rng.randint(1, 2)):
        for _attempt in range(20):  # a mutation that finds nothing to change in this model: another
            name = rng.choice(sorted(MUTATIONS))
            if MUTATIONS[name](copy, rng):
                done.append(name)
                break
    return copy.SerializeToString(), "+".join(done) or "none"


def _graphs(model) -> list:
    from onnx import AttributeProto

    found, todo = [], [model.graph]
    while todo:
        g = todo.pop()
        found.append(g)
        for node in g.node:
            for a in node.attribute:
                if a.type == AttributeProto.GRAPH:
                    todo.append(a.g)
                todo.extend(a.graphs)
    return found


def _nodes(model, op: str | None = None) -> list:
    return [n for g in _graphs(model) for n in g.node if op is None or n.op_type == op]


def _pick(rng, items):
    return rng.choice(items) if items else None


def _m_empty_perm(model, rng):
    node = _pick(rng, _nodes(model, "Transpose"))
    if node is None:
        return False
    for a in node.attribute:
        if a.name == "perm":
            del a.ints[:]
            return True
    node.attribute.append(__import__("onnx").helper.make_attribute("perm", [0]))
    return True


def _m_perm_out_of_range(model, rng):
    node = _pick(rng, _nodes(model, "Transpose"))
    if node is None:
        return False
    del node.attribute[:]
    node.attribute.append(__import__("onnx").helper.make_attribute("perm", rng.choice([[0, 0], [5, 0, 1], [-1, 0], [2, 1]])))
    return True


def _m_initializer_dtype(model, rng):
    inits = [t for g in _graphs(model) for t in g.initializer]
    t = _pick(rng, inits)
    if t is None:
        return False
    t.data_type = rng.choice([1, 2, 3, 5, 6, 7, 9, 10, 11, 16])
    return True


def _m_initializer_dims(model, rng):
    t = _pick(rng, [t for g in _graphs(model) for t in g.initializer])
    if t is None:
        return False
    dims = list(t.dims)
    choice = rng.randrange(3)
    dims = dims[::-1] + [1] if choice == 0 else dims[:-1] if choice == 1 else [d + 1 for d in dims]
    del t.dims[:]
    t.dims.extend(dims)
    return True


def _m_shadowing_initializer(model, rng):
    import numpy as np
    from onnx import numpy_helper

    g = _pick(rng, _graphs(model))
    value = _pick(rng, list(g.input))
    if value is None:
        return False
    shape = rng.choice([(), (1,), (2, 3), (7, 1, 5)])
    dtype = rng.choice([np.float32, np.int64, np.float64])
    g.initializer.append(numpy_helper.from_array(np.ones(shape, dtype), value.name))
    return True


def _m_attribute_type(model, rng):
    from onnx import AttributeProto, helper

    node = _pick(rng, [n for n in _nodes(model) if n.attribute])
    if node is None:
        return False
    i = rng.randrange(len(node.attribute))
    name = node.attribute[i].name
    replacement = rng.choice([helper.make_attribute(name, 1.5), helper.make_attribute(name, 3), helper.make_attribute(name, [2, 1]),
                              helper.make_attribute(name, "x"), helper.make_attribute(name, [0.5])])
    if node.attribute[i].type == AttributeProto.GRAPH and rng.random() < 0.5:
        replacement = helper.make_attribute(name, 7)
    node.attribute[i].CopyFrom(replacement)
    return True


def _m_drop_attribute(model, rng):
    node = _pick(rng, [n for n in _nodes(model) if n.attribute])
    if node is None:
        return False
    del node.attribute[rng.randrange(len(node.attribute))]
    return True


def _set_int(node, name, value):
    from onnx import AttributeProto, helper

    made = helper.make_attribute(name, value, attr_type=AttributeProto.INTS if isinstance(value, list) else None)
    for a in node.attribute:
        if a.name == name:
            a.CopyFrom(made)
            return
    node.attribute.append(made)


def _m_num_scan_inputs(model, rng):
    node = _pick(rng, _nodes(model, "Scan"))
    if node is None:
        return False
    _set_int(node, "num_scan_inputs", rng.choice([len(node.input) + 1, len(node.input) + 5, 0, -1, 2**40]))
    return True


def _m_scan_axes(model, rng):
    node = _pick(rng, _nodes(model, "Scan"))
    if node is None:
        return False
    name = rng.choice(["scan_input_axes", "scan_output_axes", "scan_input_directions", "scan_output_directions", "directions"])
    length = rng.choice([0, 1, 3, 9])
    _set_int(node, name, [rng.choice([0, 1, 2, -1, -7, 9, 2**40]) for _ in range(length)])
    return True


def _m_body_outputs(model, rng):
    from onnx import AttributeProto

    node = _pick(rng, [n for n in _nodes(model) if n.op_type in ("Scan", "Loop", "If")])
    if node is None:
        return False
    graphs = [a.g for a in node.attribute if a.type == AttributeProto.GRAPH]
    if not graphs:
        return False
    body = rng.choice(graphs)
    if body.output and rng.random() < 0.5:
        del body.output[rng.randrange(len(body.output))]
    elif body.output:
        body.output.append(body.output[rng.randrange(len(body.output))])
    else:
        return False
    return True


def _m_body_inputs(model, rng):
    from onnx import AttributeProto

    node = _pick(rng, [n for n in _nodes(model) if n.op_type in ("Scan", "Loop")])
    if node is None:
        return False
    body = next((a.g for a in node.attribute if a.type == AttributeProto.GRAPH), None)
    if body is None or not body.input:
        return False
    if rng.random() < 0.5:
        del body.input[rng.randrange(len(body.input))]
    else:
        body.input.append(body.input[rng.randrange(len(body.input))])
    return True


def _m_node_inputs(model, rng):
    node = _pick(rng, [n for n in _nodes(model) if n.input])
    if node is None:
        return False
    how = rng.randrange(4)
    if how == 0:
        del node.input[rng.randrange(len(node.input))]
    elif how == 1:
        node.input.append(node.input[0])
    elif how == 2:
        node.input[rng.randrange(len(node.input))] = ""
    else:
        names = [v for g in _graphs(model) for n in g.node for v in n.output] + [v.name for v in model.graph.input]
        node.input[rng.randrange(len(node.input))] = rng.choice(names)
    return True


def _m_node_outputs(model, rng):
    node = _pick(rng, [n for n in _nodes(model) if n.output])
    if node is None:
        return False
    how = rng.randrange(3)
    if how == 0 and len(node.output) > 1:
        del node.output[rng.randrange(len(node.output))]
    elif how == 1:
        other = rng.choice(_nodes(model))
        if other.output:
            node.output[0] = other.output[0]  # two producers of one name
    else:
        node.output.append(node.output[0] + "_extra")
    return True


def _m_op_type(model, rng):
    node = _pick(rng, _nodes(model))
    if node is None:
        return False
    node.op_type = rng.choice(["Add", "MatMul", "Gemm", "Tanh", "Relu", "Concat", "Transpose", "Reshape", "Scan", "Loop",
                               "Identity", "Slice", "Gather", "Squeeze", "Unsqueeze", "Split", "Sigmoid", "LSTM"])
    return True


def _m_value_type(model, rng):
    g = _pick(rng, _graphs(model))
    values = list(g.input) + list(g.output) + list(g.value_info)
    value = _pick(rng, values)
    if value is None or not value.type.HasField("tensor_type"):
        return False
    tt = value.type.tensor_type
    if rng.random() < 0.5:
        tt.elem_type = rng.choice([1, 6, 7, 9, 10, 11, 16])
    elif tt.HasField("shape"):
        dims = tt.shape.dim
        if dims and rng.random() < 0.5:
            dims[rng.randrange(len(dims))].dim_value = rng.choice([0, 1, 5, 2**31])
        else:
            dims.add().dim_value = rng.choice([1, 3])
    else:
        return False
    return True


def _m_opset(model, rng):
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = rng.choice([7, 8, 9, 11, 13, 16, 21, 25])
            return True
    return False


def _m_node_order(model, rng):
    g = _pick(rng, [g for g in _graphs(model) if len(g.node) > 1])
    if g is None:
        return False
    nodes = list(g.node)
    rng.shuffle(nodes)
    del g.node[:]
    g.node.extend(nodes)
    return True


def _m_constant_value(model, rng):
    import numpy as np
    from onnx import helper, numpy_helper

    node = _pick(rng, _nodes(model, "Constant"))
    if node is None:
        return False
    value = rng.choice([np.array([], np.float32), np.array(3, np.int64), np.ones((2, 2), np.float64), np.array([True])])
    del node.attribute[:]
    node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(value)))
    return True


MUTATIONS = {name[3:]: f for name, f in list(globals().items()) if name.startswith("_m_")}


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


def fuzz(n: int, commands=("optimize",), seed: int = 0, work: str | None = None, kind: str = "bytes",
         progress=None, start: int = 0):
    """{command: ({exit code: count}, [(label, finding)])} over n mutants per command
    (``kind``: "bytes" or "structure"; ``progress(label)`` before each run, so a run that
    aborts the process can be named; ``start``: skip the first mutants, to go on after one)."""
    import tempfile

    make = structure_mutants if kind == "structure" else mutants
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = work or tmp
        for command in commands:
            findings, codes = [], {}
            for i, (label, data) in enumerate(make(n, seed)):
                if i < start:
                    continue
                if progress is not None:
                    progress(label)
                problem = run_one(command, data, work, codes)
                if problem:
                    findings.append((label, problem))
            results[command] = (codes, findings)
    return results


def _worker(args) -> None:
    """Run mutants ``args.start``.. of one command in this process, one JSON line per mutant in
    ``args.results`` ({"i", "label", "code", "finding"}) and the label in ``args.trace`` before
    each run: if onnxruntime (or onnx) kills this process, the parent names the culprit."""
    import json

    make = structure_mutants if args.kind == "structure" else mutants
    command = args.commands
    import tempfile

    with open(args.results, "a", buffering=1) as results, open(args.trace, "w", buffering=1) as trace, \
            tempfile.TemporaryDirectory() as work:
        for i, (label, data) in enumerate(make(args.n, args.seed)):
            if i < args.start:
                continue
            trace.write(f"{i} {label}\n")
            codes: dict = {}
            problem = run_one(command, data, work, codes)
            results.write(json.dumps({"i": i, "label": label, "code": next(iter(codes), None), "finding": problem}) + "\n")


def run_command(n: int, command: str, seed: int, kind: str, log=None) -> tuple[dict, list, list, float]:
    """({exit code: count}, [(label, finding)], [(label, how the process died)], seconds) for n
    mutants of ``command``, each in a worker process that goes on after the one that killed
    it (an abort or a segfault inside an extension: no exception handler sees those)."""
    import json
    import signal
    import subprocess
    import tempfile
    import time

    started = time.perf_counter()
    codes: dict = {}
    findings, deaths = [], []
    with tempfile.TemporaryDirectory() as folder:
        results, trace = os.path.join(folder, "results.jsonl"), os.path.join(folder, "trace")
        open(results, "w").close()
        start = 0
        while start < n:
            done = subprocess.run([sys.executable, os.path.abspath(__file__), str(n), "--worker", "--commands", command,
                                   "--seed", str(seed), "--kind", kind, "--start", str(start), "--results", results,
                                   "--trace", trace], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            with open(results) as handle:
                seen = [json.loads(line) for line in handle if line.strip()]
            last = max((r["i"] for r in seen), default=start - 1)
            if done.returncode == 0 and last >= n - 1:
                break
            with open(trace, "a+") as handle:
                handle.seek(0)
                culprit = handle.read().strip().splitlines()
            culprit = culprit[-1].split(" ", 1) if culprit else [str(last + 1), "?"]
            how = (f"killed by {signal.Signals(-done.returncode).name}" if done.returncode < 0
                   else f"worker exit {done.returncode}: {done.stderr.strip()[-300:]}")
            deaths.append((culprit[1], how))
            if log is not None:
                print(f"  {command} {culprit[1]}: {how}", file=log, flush=True)
            start = int(culprit[0]) + 1
        for r in seen:
            codes[r["code"]] = codes.get(r["code"], 0) + 1
            if r["finding"]:
                findings.append((r["label"], r["finding"]))
    return codes, findings, deaths, time.perf_counter() - started


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("n", type=int)
    parser.add_argument("--commands", default="optimize")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kind", choices=("bytes", "structure"), default="bytes")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    parser.add_argument("--trace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]  # this checkout's scanopt, not an installed one
    if args.worker:
        _worker(args)
        sys.exit(0)
    for command in args.commands.split(","):
        codes, findings, deaths, seconds = run_command(args.n, command, args.seed, args.kind, log=sys.stderr)
        tally = ", ".join(f"exit {c}: {k}" for c, k in sorted(codes.items(), key=str))
        print(f"{command}: {args.n} mutants, {len(findings)} tracebacks/findings, {len(deaths)} aborts "
              f"({tally}), {seconds:.0f} s", flush=True)
        for label, problem in findings:
            print(f"--- {label}\n{problem.strip().splitlines()[-1]}")
            print(problem, file=sys.stderr)
        for label, how in deaths:
            print(f"--- {label}\nthe process died: {how}")
