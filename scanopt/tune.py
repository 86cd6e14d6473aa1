"""Measure each Scan's candidate forms where the model runs, and keep the fastest.

A candidate is the pipeline run on the Scan's own subgraph (the Scan, the outer values
its body reads as inputs or weights) with a chosen set of passes allowed: none (the
original loop), each rewriting pass alone (native op, hoisted, vectorized, unrolled, and
any pass registered later), and each pair of passes that apply alone (in pipeline order:
fuse then hoist of what is left is "hoisted+native"; a pair that builds the same model as
one of its passes is that form, and the report says so), and a pass alone followed by one
that rewrites only what it leaves (fuse's per-step cell-state loop made loop-free by linrec:
"native+linrec"); a Scan a rewrite emits follows the measured choice of the Scan it replaced
(``PassContext.derived``). The forms are built from the
subgraph as the model declares it (symbolic dims stay symbolic, so a form is one the real
model can take) and timed on inputs at the deployment shapes (static, declared with
``input_shapes`` or implied by user feeds) with :mod:`scanopt.timing`.

Bounds: ``tune_scan_seconds`` (default :data:`SCAN_SECONDS`) per distinct Scan,
``tune_seconds`` (default :data:`MODEL_SECONDS`) per model; a Scan over the budget, nested
in another node, or with a deployment dim unknown is decided by the analytic model
(:mod:`scanopt.cost`). Choices are cached on disk (:mod:`scanopt.tune_cache`): identical
Scans and re-runs cost one measurement, and a re-run gives byte-identical output.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import onnx

from scanopt import timing, tune_cache
from scanopt.cost import NEUTRAL_PASSES, form_name
from scanopt.protos import attribute_graphs, outer_names, proto_node_label
from scanopt.shapes import ELEMENTWISE, SHAPE_PRESERVING, ShapeTable
from scanopt.validate import default_opset

MODEL_SECONDS = 30.0
SCAN_SECONDS = 2.0
NOT_CANDIDATES = NEUTRAL_PASSES + ("upgrade",)  # upgrade is what a migration needs, never a speed choice
# What a Scan's measured subgraph takes along when only the Scan reads it (see producers)
PRODUCER_OPS = SHAPE_PRESERVING | ELEMENTWISE | frozenset(("Einsum", "Transpose", "Unsqueeze", "Squeeze"))
MAX_PRODUCERS = 16

# The measuring function (tests inject timings through it): (forms, feeds, threads, seconds) -> Timings | str
measure = timing.measure


def tune(model: onnx.ModelProto, run_passes, chosen, options: dict, deployment: ShapeTable | None):
    """({node label: choice dict}, notes) for the top-level Scans whose deployment shapes are known
    (``deployment``: a ShapeTable of the model at its declared shapes, None when none are).

    A choice dict: ``passes`` (the set to apply), ``form``, ``times`` {form: seconds},
    ``noise``, ``rounds``, ``clock``, ``where``, ``cached``, ``same`` {form: form it equals}."""
    threads = options.get("threads")
    budget = float(options.get("tune_seconds", MODEL_SECONDS))
    per_scan = float(options.get("tune_scan_seconds", SCAN_SECONDS))
    directory = tune_cache.cache_dir(options)
    names = [p.name for p in chosen if p.name not in NOT_CANDIDATES]
    neutral = [p for p in chosen if p.name in NEUTRAL_PASSES]
    base_options = {k: v for k, v in options.items() if k not in ("measured", "deployment", "observed")}
    base_options["target"] = "portable"
    original_shapes = ShapeTable(model)
    declared = deployment is not None
    deployment = original_shapes if deployment is None else deployment
    inits = {t.name: t for t in model.graph.initializer}
    inits.update((n.output[0], n) for n in model.graph.node  # a Constant node's value is copied, not fed at random
                 if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1)
    read = _read_values(model)
    index = GraphIndex(model.graph)
    measured: dict[str, dict] = {}
    notes: list[str] = []
    by_key: dict[str, dict] = {}
    deadline = time.perf_counter() + budget
    observed = set(options.get("observed") or ())  # values whose deployment shape a run gave (scanopt.observe)
    for node in model.graph.node:
        if node.op_type != "Scan" or node.domain not in ("", "ai.onnx") or not names:
            continue
        label = proto_node_label(node)
        sub = _extract(node, inits, original_shapes, model, read, index)
        feeds_shapes = _deployment_inputs(sub, deployment)
        if isinstance(sub, str) or isinstance(feeds_shapes, str):
            notes.append(f"{label}: not measured ({sub if isinstance(sub, str) else feeds_shapes}); modelled instead")
            continue
        entry = tune_cache.key(sub, names, base_options, threads) + _shape_key(feeds_shapes)
        choice = by_key.get(entry) or tune_cache.load(directory, entry, malformed_choice, notes, f"{label}: ")
        if choice is not None:
            measured[label] = dict(choice, cached=True)
            by_key[entry] = choice
            notes.append(_line(label, measured[label]))
            continue
        if time.perf_counter() > deadline:
            notes.append(f"{label}: not measured (time budget of {budget:g} s per model spent); modelled instead")
            continue
        forms, same = _forms(sub, run_passes, chosen, neutral, names, base_options)
        if len(forms) == 1:
            continue  # no pass rewrites it: nothing to choose
        feeds = _feeds(sub, feeds_shapes)
        try:
            timings = measure({name: m for name, (m, _) in forms.items()}, feeds, threads=threads,
                              seconds=min(per_scan, max(deadline - time.perf_counter(), 0.05)))
        except Exception as exc:  # noqa: BLE001 - a form onnxruntime cannot run is not a winner
            notes.append(f"{label}: not measured (onnxruntime: {str(exc).splitlines()[0][:120]}); modelled instead")
            continue
        if isinstance(timings, str):
            notes.append(f"{label}: not measured ({timings}); modelled instead")
            continue
        best = timing.best_form(timings)
        choice = {
            "form": best,
            "passes": sorted(forms[best][1]),
            "times": {name: t.seconds for name, t in timings.forms.items()},
            "ratios": {name: t.ratio for name, t in timings.forms.items()},
            "noise": timings.noise,
            "rounds": timings.rounds,
            "clock": timings.clock,
            "where": _where(node, default_opset(model), feeds_shapes) + _origin(declared, observed.intersection(feeds_shapes)),
            "same": same,
            "threads": threads,
        }
        tune_cache.store(directory, entry, choice)
        by_key[entry] = choice
        measured[label] = dict(choice, cached=False)
        notes.append(_line(label, measured[label]))
    return measured, notes


CHOICE_FIELDS = {"form": (str, "a string"), "passes": (list, "a list"), "times": (dict, "an object"),
                 "noise": ((int, float), "a number"), "rounds": (int, "an integer"), "clock": (str, "a string"),
                 "where": (str, "a string"), "same": (dict, "an object")}


def malformed_choice(choice: dict) -> str | None:
    """Why a cached choice cannot be used (what the report and the cost policy read), or None."""
    reason = tune_cache.mistyped(choice, CHOICE_FIELDS)
    if reason:
        return reason
    times = choice["times"]
    if not all(isinstance(k, str) and tune_cache.is_number(v) for k, v in times.items()):
        return "'times' holds a value that is not a number of seconds"
    for needed in (form_name(()), choice["form"]):
        if needed not in times:
            return f"'times' has no '{needed}'"
    if not all(isinstance(p, str) for p in choice["passes"]):
        return "'passes' holds a value that is not a string"
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in choice["same"].items()):
        return "'same' holds a value that is not a string"
    if not tune_cache.is_number(choice["noise"]) or not tune_cache.is_number(choice["rounds"]):
        return "'noise' or 'rounds' is out of range"
    threads = choice.get("threads")
    if threads is not None and not (isinstance(threads, int) and not isinstance(threads, bool)):
        return "'threads' is not an integer"
    return None


def _origin(declared: bool, observed: set[str]) -> str:
    """Where the measured shapes came from, for the report."""
    if not declared:
        return " (static)"
    return " (declared; observed in a run)" if observed else " (declared)"


def _line(label: str, choice: dict) -> str:
    """The report's line for a measured Scan: every form's time and the one kept."""
    # the loop first, then fastest first: the same line whether measured now or read from the cache
    order = sorted(choice["times"].items(), key=lambda item: (item[0] != "loop", item[1]))
    times = ", ".join(f"{name} {t * 1e3:.3g} ms" for name, t in order)
    return (f"{label}: {times} -> {choice['form']} ({choice['where']}"
            + (", cached" if choice.get("cached") else f", {choice['rounds']} rounds, noise {choice['noise'] * 100:.0f}%")
            + ")")


def _forms(sub, run_passes, chosen, neutral, names, options) -> tuple[dict, dict]:
    """{form name: (model, passes)} built from ``sub``, the original first; and
    {pair form: the form it turned out identical to}."""
    shapes = ShapeTable(sub)  # one inference of the subgraph for every candidate (read-only)

    def run(allowed: set[str]):
        selected = [p for p in chosen if p in neutral or p.name in allowed]
        result, report = run_passes(sub, selected, options, frozenset(), None, shapes)
        applied = {o.pass_name for o in report.outcomes if o.applied and o.pass_name in allowed}
        return result, applied

    loop, _ = run(set())
    forms = {form_name(()): (loop, frozenset())}
    seen = {loop.SerializeToString(deterministic=True): form_name(())}
    alone = []
    for name in names:
        result, applied = run({name})
        if name in applied:
            alone.append(name)
            forms[form_name((name,))] = (result, frozenset({name}))
            seen.setdefault(result.SerializeToString(deterministic=True), form_name((name,)))
    # A pass that does not apply to the Scan but to what another pass leaves (linrec on fuse's
    # cell-state loop): that pair is a form too.
    follow_ups = [(first, then) for first in alone if _loops(forms[form_name((first,))][0])
                  for then in names if then not in alone]
    same = {}
    for pair in list(itertools.combinations(alone, 2)) + follow_ups:
        result, applied = run(set(pair))
        if applied != set(pair):
            if pair not in follow_ups:  # a follow-up that does not apply is no form at all
                same[form_name(pair)] = form_name(tuple(applied))
            continue
        text = result.SerializeToString(deterministic=True)
        if text in seen:
            same[form_name(pair)] = seen[text]
            continue
        seen[text] = form_name(pair)
        forms[form_name(pair)] = (result, frozenset(pair))
    return forms, same


def _loops(model: onnx.ModelProto) -> bool:
    """Whether a form still has a top-level Scan or Loop (another pass may rewrite it)."""
    return any(n.op_type in ("Scan", "Loop") for n in model.graph.node)


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Every value ``node`` reads from its graph: its inputs, then what its bodies capture."""
    reads = [n for n in node.input if n]
    for attr in node.attribute:
        for g in attribute_graphs(attr):
            reads += [n for n in outer_names(g) if n not in reads]
    return list(dict.fromkeys(reads))


def unknown_reads(model: onnx.ModelProto, deployment: ShapeTable) -> dict[str, int]:
    """{name: elem type} of the values the top-level Scans read (weights apart) whose
    shape at the deployment shapes is not static: what :mod:`scanopt.observe` learns by a run."""
    inits = {t.name for t in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type != "Scan" or node.domain not in ("", "ai.onnx"):
            continue
        for name in node_reads(node):
            elem, shape = deployment.type_of(name)
            if name not in inits and elem and (shape is None or not all(isinstance(d, int) for d in shape)):
                found[name] = elem
    return found


def _read_values(model: onnx.ModelProto) -> set[str]:
    """The names the model reads (graph outputs, node inputs, values bodies capture)."""
    read = {o.name for o in model.graph.output}
    for node in model.graph.node:
        read.update(node_reads(node))
    return read


def _extract(node: onnx.NodeProto, inits: dict, shapes: ShapeTable, model: onnx.ModelProto, read: set[str],
             index: GraphIndex):
    """A model computing just ``node`` and the per-step producers only it reads (:func:`producers`;
    their reads and the Scan's as inputs, weights or Constant nodes, its outputs the model reads
    as outputs: a final value nobody reads stays dead, as it is in the model, so canonicalize
    drops it here too), or why not."""
    inputs, initializers, constants = [], [], []
    taken = producers(node, model, index)
    made = {name for p in taken for name in p.output}
    for name in dict.fromkeys(name for nd in taken + [node] for name in node_reads(nd) if name not in made):
        if name in inits:  # an initializer, or a Constant node (a Slice's axes, a shape) copied along
            (constants if isinstance(inits[name], onnx.NodeProto) else initializers).append(inits[name])
            continue
        value = _typed(name, shapes)
        if value is None:
            return f"type of '{name}' unknown"
        inputs.append(value)
    outputs = []
    for name in node.output:
        if name and name in read:
            value = _typed(name, shapes)
            if value is None:
                return f"type of '{name}' unknown"
            outputs.append(value)
    if not outputs:
        return "no output of it is read"
    graph = onnx.helper.make_graph([*constants, *taken, node], "tune", inputs, outputs, initializer=initializers)
    return onnx.helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)


class GraphIndex:
    """Who writes and who reads each value of a graph, built once per model (not per Scan)."""

    def __init__(self, graph: onnx.GraphProto):
        self.nodes = list(graph.node)
        self.written = {name: nd for nd in graph.node for name in nd.output}
        self.readers: dict[str, list] = {}
        for nd in graph.node:
            for name in node_reads(nd):
                self.readers.setdefault(name, []).append(nd)
        self.outputs = {v.name for v in graph.output}


def producers(node: onnx.NodeProto, model: onnx.ModelProto, index: GraphIndex | None = None) -> list[onnx.NodeProto]:
    """The nodes computing ``node``'s scan inputs that nothing else reads (up to
    :data:`MAX_PRODUCERS`, ops of :data:`PRODUCER_OPS`, in the model's order): a pass may take them
    into the steps (linrec's module absorb: mamba-minimal's deltaA and deltaB_u), so every form
    is measured with them and the choice is the model's, not the Scan's alone."""
    index = index or GraphIndex(model.graph)
    written, readers, outputs = index.written, index.readers, index.outputs
    m = next((a.i for a in node.attribute if a.name == "num_scan_inputs"), 0)
    pending = [name for name in node.input[len(node.input) - m:] if name]
    taken: dict[int, onnx.NodeProto] = {}
    changed = True
    while changed and len(taken) < MAX_PRODUCERS:
        changed = False
        for name in list(pending):
            nd = written.get(name)
            if nd is None or id(nd) in taken or nd.op_type not in PRODUCER_OPS or nd.domain not in ("", "ai.onnx"):
                continue
            if any(o in outputs or any(r is not node and id(r) not in taken for r in readers.get(o, [])) for o in nd.output):
                continue
            taken[id(nd)] = nd
            pending += [i for i in nd.input if i and i not in pending]
            changed = True
            if len(taken) == MAX_PRODUCERS:
                break
    return [nd for nd in index.nodes if id(nd) in taken]


def _typed(name: str, shapes: ShapeTable) -> onnx.ValueInfoProto | None:
    elem, shape = shapes.type_of(name)
    if not elem:
        return None
    dims = None if shape is None else [d if isinstance(d, int) else (d or f"{name}_d{i}") for i, d in enumerate(shape)]
    return onnx.helper.make_tensor_value_info(name, elem, dims)


def _deployment_inputs(sub, deployment: ShapeTable):
    """{input name: (elem type, concrete shape)} of the subgraph at the deployment shapes, or why not."""
    if isinstance(sub, str):
        return sub
    found = {}
    for value in sub.graph.input:
        elem, shape = deployment.type_of(value.name)
        if not elem or shape is None or not all(isinstance(d, int) for d in shape):
            dims = "?" if shape is None else ",".join(str(d) if isinstance(d, int) else "?" for d in shape)
            return f"deployment shape of '{value.name}' unknown: [{dims}]; declare it with --input-shape"
        found[value.name] = (elem, tuple(shape))
    from scanopt.inputs import numpy_dtype, over_feed_budget

    return over_feed_budget({name: (numpy_dtype(elem, name), shape) for name, (elem, shape) in found.items()}) or found


def _shape_key(shapes: dict) -> str:
    import hashlib

    return "-" + hashlib.sha256(repr(sorted((k, v[1]) for k, v in shapes.items())).encode()).hexdigest()[:12]


def _feeds(sub, shapes: dict) -> dict:
    from scanopt.inputs import numpy_dtype, random_array

    rng = np.random.default_rng(0)
    return {name: random_array(rng, numpy_dtype(elem, name), shape) for name, (elem, shape) in shapes.items()}


def _where(node: onnx.NodeProto, opset: int, shapes: dict) -> str:
    """T and B of the Scan at the deployment shapes, e.g. ``T=100 B=8``."""
    from scanopt.cost import scan_dims
    from scanopt.scan_view import ScanView

    view = ScanView.from_proto(node, opset, lambda name: shapes[name][1] if name in shapes else None)
    if not view.scan_inputs or view.scan_inputs[0] not in shapes:
        return ", ".join(f"{k}[{','.join(map(str, v[1]))}]" for k, v in shapes.items())
    T, B, _ = scan_dims(shapes[view.scan_inputs[0]][1], view)
    return f"T={'?' if T is None else T} B={'?' if B is None else B}"
