"""Scans written so that onnxruntime's CUDA EP plans their buffers right with memory-pattern
reuse on (onnxruntime issue 27887).

The CUDA EP's memory planner sizes a Scan body's buffers from the body's declared shapes. A
symbolic dim it cannot resolve counts as 1, and the run fails ("Shape mismatch attempting to
re-use buffer. {1,16,1,1} != {1,16,128,128}"); onnxruntime's inliner makes it worse for a
Scan inside a model-local function, renaming the body's values but not its value_info. The
CPU EP sizes buffers at run time and is unaffected. For a CUDA-family target, after the
passes, :func:`for_cuda`:

- inlines every function holding a Scan (at any depth, or through a call of one) at its call
  sites itself, the bodies' value_info renamed with their values
  (:func:`scanopt.functions.inline_functions`);
- in every Scan body, writes a concrete dim wherever the model's static shapes prove it
  (:class:`scanopt.dims.DimClasses`: a declared or inferred size, through Scan's shape
  contract and the ops that require equal dims) on the body's inputs and outputs (carried
  states, scan slices) and its value_info, and drops value_info naming no value of the body.

A dim only ``--input-shape`` fixes stays symbolic: the model's interface keeps its symbols, and
onnxruntime (the CPU EP too) refuses to run a body whose declared size differs from the one it
gets, so the written model would refuse the sizes the original runs. Inlining is exact and a
declared shape changes no number; the result is verified against the model before all the
same, and on failure, or when it would not validate, the step is left out with the reason.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import onnx

from scanopt.errors import ScanoptError
from scanopt.functions import call_sites, function_key, function_label, inline_functions, nodes_within
from scanopt.pass_api import NodeOutcome
from scanopt.protos import copy_fields, defined_names, function_graphs, in_default_domain, walk_proto_graphs

ISSUE = "onnxruntime issue 27887"
FIELDS = ("input", "output", "value_info")


@dataclass
class Settled:
    """The model with its Scans written for the CUDA EP, and what was done."""

    model: onnx.ModelProto  # the very input when nothing changed
    inlined: list[str] = field(default_factory=list)  # labels of the functions inlined
    refused: str = ""  # why onnx's inliner could not inline them
    scans: int = 0  # Scan bodies given a concrete dim
    dims: int = 0  # dims written concrete
    dropped: int = 0  # orphaned value_info entries dropped
    symbolic: int = 0  # dims of a body's inputs and outputs left symbolic
    symbolic_scans: int = 0  # ... in that many Scans
    declared_only: int = 0  # ... of them fixed by --input-shape alone
    unproven: str = ""  # why no dim could be proven at all

    @property
    def changed(self) -> bool:
        return bool(self.inlined or self.dims or self.dropped)

    def note(self) -> str:
        """The report's words for the target line ("" when no Scan body is concerned)."""
        parts = []
        if self.dims:
            parts.append(f"carry and slice shapes written concrete ({_count(self.dims, 'dim')}, "
                         f"{_count(self.scans, 'Scan')})")
        if self.inlined:
            parts.append(f"{_count(len(self.inlined), 'function')} holding a Scan inlined ({', '.join(self.inlined)})")
        if self.refused:
            parts.append(f"functions holding a Scan not inlined: {self.refused}")
        if self.dropped:
            parts.append(f"{_count(self.dropped, 'orphaned value_info entry', 'orphaned value_info entries')} dropped")
        if self.symbolic:
            why = self.unproven or "no static shape fixes them"
            if self.declared_only and not self.unproven:
                why += f"; {self.declared_only} fixed only by --input-shape, which the written model must not assume"
            parts.append(f"{_count(self.symbolic, 'dim')} of {_count(self.symbolic_scans, 'Scan')} left symbolic "
                         f"({why}): if the CUDA EP fails on them, create the session with enable_mem_pattern = False")
        return f"Scan bodies: {'; '.join(parts)} ({ISSUE})" if parts else ""


def _count(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def scan_functions(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """Keys of the local functions holding a Scan at any depth, or calling one that does."""
    keys = {function_key(f) for f in model.functions}
    calls = {}
    holding = set()
    for f in model.functions:
        nodes = [n for top in f.node for n in nodes_within(top)]
        if any(n.op_type == "Scan" and in_default_domain(n.domain) for n in nodes):
            holding.add(function_key(f))
        calls[function_key(f)] = {(n.domain, n.op_type) for n in nodes} & keys
    grown = True
    while grown:  # a caller of a holder holds one too
        grown = False
        for key, called in calls.items():
            if key not in holding and called & holding:
                holding.add(key)
                grown = True
    return sorted(holding)


def scan_bodies(model: onnx.ModelProto):
    """Every Scan body of the main graph at any depth, in one fixed order (a copy of the
    model yields its copies in the same order)."""
    for graph in walk_proto_graphs(model.graph):
        for node in graph.node:
            if node.op_type == "Scan" and in_default_domain(node.domain):
                yield from (a.g for a in node.attribute if a.name == "body" and a.type == onnx.AttributeProto.GRAPH)


def settle(model: onnx.ModelProto, input_shapes=None) -> Settled:
    """``model`` with its Scan-holding functions inlined and its Scan bodies' dims written
    where static shapes prove them (a new model; ``model`` itself when nothing changes)."""
    done = Settled(model)
    calls = call_sites(model)  # a function nothing calls runs no Scan: kept as it is, not dropped as inlined
    keys = [key for key in scan_functions(model) if calls.get(key)]
    current = model
    if keys:
        try:
            current = inline_functions(model, keys)
            done.inlined = [function_label(*key) for key in keys]
            done.dropped = sum(len(_orphans(sub)) for f in model.functions if function_key(f) in keys
                               for sub in function_graphs(f))  # the inlining left them out
        except (RuntimeError, ValueError) as exc:  # a call that does not fit its function, mixed opsets
            done.refused = f"onnx's inliner refused the model ({' '.join(str(exc).split())[:160]})"
    edits, drops = _plan(current, input_shapes, done)
    if edits or drops:
        if current is model:
            current = onnx.ModelProto()
            current.CopyFrom(model)
        _apply(current, edits, drops)
        done.dims = len(edits)
        done.dropped += sum(len(v) for v in drops.values())
        done.scans = len({k for k, *_ in edits})
    done.model = current
    return done


def _plan(model: onnx.ModelProto, input_shapes, done: Settled) -> tuple[list, dict]:
    """(edits, drops): (body k, field, index, axis, size) for each dim static shapes prove,
    {body k: [value_info indices naming nothing in the body]}; counts what stays symbolic."""
    bodies = list(scan_bodies(model))
    if not bodies:
        return [], {}
    from scanopt.dims import DimClasses

    proven = DimClasses(_without_defaults(model))
    declared = None
    if input_shapes:
        from scanopt.deploy import shaped_model

        declared = DimClasses(shaped_model(model, input_shapes))
    # DimClasses keys dims by value name: a name two graphs both define (a body may shadow an
    # outer name, sibling bodies may share theirs) ties unrelated dims together, and the error
    # spreads through every dim proven equal to them: then no dim is written
    # (each name once per graph: an initializer listed as a graph input too, as IR 3 and
    # keep_initializers_as_inputs write it, is one value, not a repeat)
    defined = Counter(name for g in walk_proto_graphs(model.graph) for name in defined_names(g))
    repeated = sorted(name for name, n in defined.items() if n > 1)
    if repeated:
        done.unproven = (f"value names repeat across graphs ({', '.join(repeated[:3])}"
                         f"{', ...' if len(repeated) > 3 else ''}), which scanopt's dim proofs cannot tell apart")
    edits, drops = [], {}
    for k, body in enumerate(bodies):
        orphans = _orphans(body)
        if orphans:
            drops[k] = orphans
        left = 0
        for kind in FIELDS:
            for i, value in enumerate(getattr(body, kind)):
                if (kind == "value_info" and i in orphans) or not value.type.HasField("tensor_type"):
                    continue
                for axis, dim in enumerate(value.type.tensor_type.shape.dim):
                    if dim.HasField("dim_value"):
                        continue
                    size = None if repeated else proven.size(value.name, axis)
                    if size is not None:
                        edits.append((k, kind, i, axis, size))
                    elif kind != "value_info":
                        left += 1
                        done.declared_only += declared is not None and declared.size(value.name, axis) is not None
        done.symbolic += left
        done.symbolic_scans += bool(left)
    return edits, drops


def _without_defaults(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy without the main graph's initializers that are graph inputs too:
    defaults a caller may feed with another shape, so no dim is proven from the default's."""
    inputs = {v.name for v in model.graph.input}
    if not any(t.name in inputs for t in model.graph.initializer):
        return model
    light = onnx.ModelProto()
    copy_fields(model, light, skip=("graph",))
    copy_fields(model.graph, light.graph, skip=("initializer",))
    light.graph.initializer.extend(t for t in model.graph.initializer if t.name not in inputs)
    return light


def _orphans(graph: onnx.GraphProto) -> list[int]:
    """Indices of ``graph``'s value_info entries naming no value made in it."""
    made = defined_names(graph)
    return [i for i, v in enumerate(graph.value_info) if v.name not in made]


def _apply(model: onnx.ModelProto, edits: list, drops: dict) -> None:
    bodies = list(scan_bodies(model))
    for k, kind, i, axis, size in edits:
        getattr(bodies[k], kind)[i].type.tensor_type.shape.dim[axis].dim_value = size
    for k, orphans in drops.items():
        for i in sorted(orphans, reverse=True):
            del bodies[k].value_info[i]


def for_cuda(original: onnx.ModelProto, result: tuple, *, verify: bool = True, inputs=None, engine: str = "auto",
             seeds: int = 2, input_shapes=None) -> tuple:
    """The pipeline's ``result`` (model, report) for a CUDA-family target: :func:`settle`
    applied when it verifies against ``original`` (the model the passes started from); the
    report's target line says what was done, or why not."""
    from scanopt.report import count_ops
    from scanopt.validate import validate_model

    model, report = result
    done = settle(model, input_shapes)
    note = done.note()
    if not done.changed:
        report.target = "; ".join(p for p in (report.target, note) if p)
        return model, report
    try:
        validate_model(done.model, name="model with Scan bodies written for CUDA")
        verdict = _verified(original, done.model, inputs, engine, seeds) if verify else None
    except ScanoptError as exc:
        verdict = (False, str(exc).splitlines()[0][:200])
    if verdict is not None and not verdict[0]:
        report.target = "; ".join(p for p in (report.target, f"Scan bodies left as they were: the model written "
                                              f"for {ISSUE} failed verification ({verdict[1]})") if p)
        return model, report
    report.target = "; ".join(p for p in (report.target, note) if p)
    report.modified = True
    report.ops_after = count_ops(done.model)
    report.outcomes += [NodeOutcome("functions", label, "", True, f"inlined at every call site for the CUDA EP ({ISSUE})")
                        for label in done.inlined]
    if verdict is not None:
        verification = report.verification or {"passed": True, "rolled_back": []}
        done_check = f"Scan bodies for CUDA: {verdict[1]}"
        summary = verification.get("summary")
        verification["summary"] = f"{summary}; {done_check}" if summary else done_check
        report.verification = verification
    elif report.verification is None:
        report.verification = {"passed": None, "summary": "not verified (verification disabled)"}
    return done.model, report


def _verified(original, candidate, inputs, engine, seeds) -> tuple[bool, str]:
    from scanopt.verify import compare_models

    outcome = compare_models(original, candidate, inputs=inputs, engine=engine, seeds=seeds, keep_ort=True)
    return outcome.passed, outcome.summary()
