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
from scanopt.pass_api import form_name
from scanopt.protos import attribute_graphs, fed_inputs, outer_names, positive_values, proto_node_label
from scanopt.shapes import ELEMENTWISE, SHAPE_PRESERVING, ShapeTable
from scanopt.validate import default_opset

MODEL_SECONDS = 30.0
SCAN_SECONDS = 2.0
# What a Scan's measured subgraph takes along when only the Scan reads it (see producers)
PRODUCER_OPS = SHAPE_PRESERVING | ELEMENTWISE | frozenset(("Einsum", "Transpose", "Unsqueeze", "Squeeze"))
MAX_PRODUCERS = 16

# The measuring function (tests inject timings through it): (forms, feeds, threads, seconds) -> Timings | str
measure = timing.measure


def tune(model: onnx.ModelProto, run_passes, chosen, options: dict, deployment: ShapeTable | None, progress=None):
    """({node label: choice dict}, notes) for the top-level Scans whose deployment shapes are known
    (``deployment``: a ShapeTable of the model at its declared shapes, None when none are); the
    notes hold one line per distinct decision, identical Scans grouped. ``progress(done, total)``
    counts the Scans.

    A choice dict: ``passes`` (the set to apply), ``form``, ``times`` {form: seconds},
    ``noise``, ``rounds``, ``clock``, ``where``, ``cached``, ``same`` {form: form it equals}."""
    threads = options.get("threads") or 1  # one thread, thread CPU time, unless the user names more
    retune = bool(options.get("retune"))
    target = options.get("deployment_target")  # a provider other than the CPU, measured here (scanopt.providers)
    providers = target.session_providers() if target is not None and target.mode == "measured" else None
    on_device = {"providers": providers} if providers else {}  # the CPU's call is unchanged
    budget = float(options.get("tune_seconds", MODEL_SECONDS))
    per_scan = float(options.get("tune_scan_seconds", SCAN_SECONDS))
    directory = tune_cache.cache_dir(options)
    names = [p.name for p in chosen if p.kind == "form"]  # the candidates; a normalizer is no speed choice
    neutral = [p for p in chosen if p.kind == "normalizer"]  # they run in every form, as in the pipeline
    base_options = {k: v for k, v in options.items() if k not in ("measured", "deployment", "observed")}
    base_options["target"] = "portable"
    original_shapes = ShapeTable(model)
    declared = deployment is not None
    deployment = original_shapes if deployment is None else deployment
    inits = {t.name: t for t in model.graph.initializer}
    weights = dict(inits)  # TensorProtos only (positive_values)
    inits.update((n.output[0], n) for n in model.graph.node  # a Constant node's value is copied, not fed at random
                 if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1)
    read = _read_values(model)
    index = GraphIndex(model.graph)
    measured: dict[str, dict] = {}
    groups: dict[str, tuple[list[str], object]] = {}  # one per decision: its labels, its choice or words
    by_key: dict[str, dict] = {}

    def note(key: str, label: str, what) -> None:
        groups.setdefault(key, ([], what))[0].append(label)

    deadline = time.perf_counter() + budget
    observed = set(options.get("observed") or ())  # values whose deployment shape a run gave (scanopt.observe)
    scans = [n for n in _top_level_nodes(model.graph) if n.op_type == "Scan" and n.domain in ("", "ai.onnx")] if names else []
    for done, node in enumerate(scans):
        if progress is not None:
            progress(done, len(scans))
        label = proto_node_label(node)
        sub = _extract(node, inits, original_shapes, model, read, index)
        feeds_shapes = _deployment_inputs(sub, deployment, model, index)
        if isinstance(sub, str) or isinstance(feeds_shapes, str):
            why = f"not measured ({sub if isinstance(sub, str) else feeds_shapes}); modelled instead"
            note(why, label, why)
            continue
        # inputs the model computes > 0 (a decay Tile'd over the batch from positive constants): fed
        # at random here, so the passes learn it as they do a function's (scanopt.functions.positive_inputs)
        positive = tuple(sorted(i.name for i in sub.graph.input if positive_values(i.name, index.written, weights)))
        sub_options = dict(base_options, positive_inputs=frozenset(positive)) if positive else base_options
        entry = tune_cache.key(sub, names, dict(base_options, positive_inputs=" ".join(positive)) if positive
                               else base_options, threads, providers) + _shape_key(feeds_shapes)
        if entry in by_key:  # an identical Scan (names apart) decided in this run
            measured[label] = measured[groups[entry][0][0]]
            note(entry, label, None)
            continue
        spoiled: list[str] = []
        choice = None if retune else tune_cache.load(directory, entry, malformed_choice, spoiled)
        for line in spoiled:  # one line per bad entry, then measured as if none were cached
            note(line, label, line)
        if choice is not None:
            measured[label] = dict(choice, cached=True)
            by_key[entry] = choice
            note(entry, label, measured[label])
            continue
        if time.perf_counter() > deadline:
            why = f"not measured (time budget of {budget:g} s per model spent); modelled instead"
            note(why, label, why)
            continue
        forms, same = _forms(sub, run_passes, chosen, neutral, names, sub_options)
        if len(forms) == 1:
            continue  # no pass rewrites it: nothing to choose
        feeds = _feeds(sub, feeds_shapes)
        if any(getattr(value, "size", 1) == 0 for value in feeds.values()):  # onnxruntime's Scan may die on it
            why = "not measured (an empty input at the deployment shapes: nothing to time); modelled instead"
            note(why, label, why)
            continue
        try:
            seconds = min(per_scan, max(deadline - time.perf_counter(), 0.05))
            timings = measure({name: m for name, (m, _) in forms.items()}, feeds, threads=threads, seconds=seconds,
                              patience=min(seconds, max(deadline - time.perf_counter() - seconds, 0.0)), **on_device)
        except Exception as exc:  # noqa: BLE001 - a form onnxruntime cannot run is not a winner
            why = f"not measured (onnxruntime: {str(exc).splitlines()[0][:120]}); modelled instead"
            note(why, label, why)
            continue
        stretched = ""
        if isinstance(timings, str) and timings.startswith("one run"):  # too slow whole: time it shortened
            build = lambda short: _forms(short, run_passes, chosen, neutral, names, sub_options)[0]  # noqa: E731
            try:
                timings, stretched = _measure_shortened(sub, node, default_opset(model), feeds_shapes, list(forms), build,
                                                        threads, seconds, timings)
            except Exception as exc:  # noqa: BLE001 - as above
                timings = f"shortened, onnxruntime: {str(exc).splitlines()[0][:120]}"
        if isinstance(timings, str):
            note(f"not measured ({timings}); modelled instead", label, f"not measured ({timings}); modelled instead")
            continue
        verdict = timing.decide(timings)
        best = verdict.form
        choice = {
            "form": best if verdict.outcome != "undecided" else None,
            "verdict": verdict.outcome,
            "passes": sorted(forms[best][1]),
            "times": {name: t.seconds for name, t in timings.forms.items()},
            "ratios": {name: t.ratio for name, t in timings.forms.items()},
            "noise": timings.noise,
            "rounds": timings.rounds,
            "clock": timings.clock,
            "where": (_where(node, default_opset(model), feeds_shapes) + _origin(declared, observed.intersection(feeds_shapes))
                      + stretched),
            "same": same,
            "threads": threads,
        }
        if providers:
            from scanopt.providers import form_fallbacks

            choice["fallbacks"] = form_fallbacks({name: m for name, (m, _) in forms.items()}, feeds, providers, threads)
        if verdict.final:  # a decision under high noise is measured again next run
            tune_cache.store(directory, entry, choice)
        by_key[entry] = choice
        measured[label] = dict(choice, cached=False)
        note(entry, label, measured[label])
    if progress is not None and scans:
        progress(len(scans), len(scans))
    return measured, [_group_line(labels, what) for labels, what in groups.values()]


def _group_line(labels: list[str], what) -> str:
    """The report's line for one decision and the Scans it covers."""
    label = labels[0] if len(labels) == 1 else f"{len(labels)} Scans ({labels[0]}, ...)"
    return f"{label}: {what}" if isinstance(what, str) else _line(label, what, len(labels))


def _measure_shortened(sub, node, opset: int, shapes: dict, names: list[str], build, threads: int, seconds: float,
                       why: str):
    """(Timings extrapolated to the full length, the report's words), or why not: every form of
    ``names`` timed at tune_short.STEPS steps and twice that (``build``: short subgraph -> forms);
    where one round of those is over the budget, at tune_short.FEWEST_STEPS and twice that, and
    if that is still over, with the budget check relaxed (timing.MIN_ROUNDS rounds: a big
    model is measured short rather than guessed)."""
    from scanopt import tune_short

    found = f"{why}; not shortened"
    for steps, check in ((tune_short.STEPS, True), (tune_short.FEWEST_STEPS, True), (tune_short.FEWEST_STEPS, False)):
        cuts = [tune_short.shortened(sub, node, opset, shapes, n) for n in (steps, 2 * steps)]
        if any(isinstance(c, str) for c in cuts):
            return f"{why}; not shortened: {next(c for c in cuts if isinstance(c, str))}", ""
        (short, short_shapes, total), (longer, longer_shapes, _) = cuts
        short_forms, longer_forms = build(short), build(longer)
        kept = [n for n in names if n in short_forms and n in longer_forms]
        if len(kept) < 2 or kept[0] != names[0]:
            return f"{why}; shortened to {steps} steps, its forms differ", ""
        models = tune_short.timed_forms({n: short_forms[n][0] for n in kept}, {n: longer_forms[n][0] for n in kept})
        longer_feeds = _feeds(longer, longer_shapes)
        timings = measure(models, _feeds(short, short_shapes), threads=threads, seconds=seconds,
                          form_feeds={n: longer_feeds for n in models if n.endswith(tune_short.LONGER)},
                          **({} if check else {"check_budget": False, "patience": 0.0}))
        if not isinstance(timings, str):
            return (tune_short.extrapolate(timings, kept, steps, total),
                    f"; measured at T={steps} and T={2 * steps}, extrapolated per step to T={total}"
                    + ("" if check else f" (one round over the {seconds:g} s budget, timed anyway)"))
        found = f"{why}; at {steps} steps: {timings}"
        if not timings.startswith("one run"):
            break
    return found, ""


CHOICE_FIELDS = {"passes": (list, "a list"), "times": (dict, "an object"), "noise": ((int, float), "a number"),
                 "rounds": (int, "an integer"), "clock": (str, "a string"), "where": (str, "a string"),
                 "same": (dict, "an object")}


def malformed_choice(choice: dict) -> str | None:
    """Why a cached choice cannot be used (what the report and the cost policy read), or None."""
    reason = tune_cache.mistyped(choice, CHOICE_FIELDS)
    if reason:
        return reason
    times = choice["times"]
    if not all(isinstance(k, str) and tune_cache.is_number(v) for k, v in times.items()):
        return "'times' holds a value that is not a number of seconds"
    form = choice.get("form")
    if form is not None and not isinstance(form, str):
        return "'form' is not a string"
    for needed in (form_name(()), form):
        if needed is not None and needed not in times:
            return f"'times' has no '{needed}'"
    if not all(isinstance(p, str) for p in choice["passes"]):
        return "'passes' holds a value that is not a string"
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in choice["same"].items()):
        return "'same' holds a value that is not a string"
    if not tune_cache.is_number(choice["noise"]) or not tune_cache.is_number(choice["rounds"]):
        return "'noise' or 'rounds' is out of range"
    fallbacks = choice.get("fallbacks") or {}
    if not isinstance(fallbacks, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(n, str) for n in v) for k, v in fallbacks.items()):
        return "'fallbacks' is not an object of lists of node names"
    threads = choice.get("threads")
    if threads is not None and not (isinstance(threads, int) and not isinstance(threads, bool)):
        return "'threads' is not an integer"
    return None


def _top_level_nodes(graph: onnx.GraphProto):
    """The graph's nodes, and those of each If's else branch (where an empty-input guard puts a
    Scan: it reads the top graph's values, so it is cut out and timed as a top-level one)."""
    for node in graph.node:
        yield node
        if node.op_type == "If":
            for attribute in node.attribute:
                if attribute.name == "else_branch":
                    yield from attribute.g.node


def _origin(declared: bool, observed: set[str]) -> str:
    """Where the measured shapes came from, for the report."""
    if not declared:
        return " (static)"
    return " (declared; observed in a run)" if observed else " (declared)"


def _line(label: str, choice: dict, count: int = 1) -> str:
    """The report's line for a measured Scan (``count`` identical ones): every form's time and
    the one kept, in words that match the numbers."""
    # the loop first, then fastest first: the same line whether measured now or read from the cache
    order = sorted(choice["times"].items(), key=lambda item: (item[0] != "loop", item[1]))
    times = ", ".join(f"{name} {t * 1e3:.3g} ms" for name, t in order)
    how = "cached" if choice.get("cached") else f"{choice['rounds']} rounds, noise {choice['noise'] * 100:.0f}%"
    how += ", measured once" if count > 1 and not choice.get("cached") else ""
    if choice.get("form") is None:
        return f"{label}: {undecided_text(choice)} ({choice['where']}); modelled instead"
    won = choice["form"]
    if won == "loop":
        why = "no form faster beyond the noise"
    else:
        why = f"{choice['times']['loop'] / choice['times'][won]:.2f}x faster than the loop"
    fallbacks = "".join(f"; {form} left on another provider: {', '.join(nodes)}"
                        for form, nodes in (choice.get("fallbacks") or {}).items() if nodes)
    return f"{label}: {times} -> {won} ({why}; {choice['where']}, {how}){fallbacks}"


def undecided_text(choice: dict) -> str:
    """What a measurement the noise left open says (the report's and the cost note's words)."""
    order = sorted(choice["times"].items(), key=lambda item: (item[0] != "loop", item[1]))
    times = ", ".join(f"{name} {t * 1e3:.3g} ms" for name, t in order)
    return f"measured {times}: undecided under noise {choice['noise'] * 100:.0f}% after {choice['rounds']} rounds"


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
    for node in _top_level_nodes(model.graph):
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
        if node.op_type == "If":  # an else branch's outputs are the If's (a guarded Scan's results)
            read.update(o.name for a in node.attribute if a.name == "else_branch" for o in a.g.output)
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


def _deployment_inputs(sub, deployment: ShapeTable, model: onnx.ModelProto | None = None,
                       index: GraphIndex | None = None):
    """{input name: (elem type, concrete shape)} of the subgraph at the deployment shapes, or why not.
    The reason's hint names only what ``--input-shape`` accepts: graph inputs."""
    if isinstance(sub, str):
        return sub
    found = {}
    for value in sub.graph.input:
        elem, shape = deployment.type_of(value.name)
        if not elem or shape is None or not all(isinstance(d, int) for d in shape):
            dims = "?" if shape is None else ",".join(str(d) if isinstance(d, int) else "?" for d in shape)
            return f"deployment shape of '{value.name}' unknown: [{dims}]; " + _declare_hint(value.name, deployment, model, index)
        found[value.name] = (elem, tuple(shape))
    from scanopt.inputs import numpy_dtype, over_feed_budget

    return over_feed_budget({name: (numpy_dtype(elem, name), shape) for name, (elem, shape) in found.items()}) or found


def _declare_hint(name: str, deployment: ShapeTable, model: onnx.ModelProto | None, index: GraphIndex | None) -> str:
    """What to declare for ``name``: itself when it is a graph input, else the graph inputs it is
    computed from whose deployment shape is not known."""
    if model is None:
        return "declare it with --input-shape"
    fed = [v.name for v in fed_inputs(model.graph)]
    if name in fed:
        return "declare it with --input-shape"
    index = index or GraphIndex(model.graph)
    seen, pending, sources = {name}, [name], set()
    while pending:
        producer = index.written.get(pending.pop())
        for read in node_reads(producer) if producer is not None else ():
            if read in seen:
                continue
            seen.add(read)
            if read in fed:
                sources.add(read)
            else:
                pending.append(read)
    unknown = [n for n in fed if n in sources and not _static(deployment.type_of(n)[1])]
    if unknown:
        return f"it is computed from {', '.join(unknown)}: declare {'it' if len(unknown) == 1 else 'them'} with --input-shape"
    return "it is computed in the model and its shape is known only when it runs"


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def _shape_key(shapes: dict) -> str:
    import hashlib

    # in the subgraph's input order (the signature's canonical names), not by name: twins share it
    return "-" + hashlib.sha256(repr([v[1] for v in shapes.values()]).encode()).hexdigest()[:12]


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
