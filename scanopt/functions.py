"""Scans and Loops inside model-local functions (FunctionProto), which PyTorch's dynamo
exporter and onnxscript write for layers.

The passes rewrite the main graph and the bodies in it. Before they run, the pipeline calls
:func:`prepare_functions`:

- a function with a loop and a single call site in the model's graphs is inlined there
  (onnx's inliner), so the passes see its loops like any other;
- a function with a loop and several call sites is optimized in place: its body becomes a
  model of its own (input types from the call sites, which must agree on element types and
  ranks), the passes run on it, and the rewritten body replaces the old one, so every call
  sees it. The whole model, through all its callers, is then verified against the
  original; a function whose rewrite fails keeps its old body. Declared input shapes
  (``--input-shape``) reach its body as the deployment shapes of its inputs where every call
  site gets the same static shape from them (the body's interface stays as the calls type it);
- functions without loops, and functions that take attributes, stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
import onnx.inliner
from onnx import helper as oh

from scanopt.errors import ScanoptError
from scanopt.pass_api import NodeOutcome
from scanopt.protos import attribute_graphs, function_graphs, model_nodes, positive_values, walk_proto_graphs
from scanopt.shapes import ShapeTable

LOOP_OPS = ("Scan", "Loop")


@dataclass
class PreparedModel:
    model: onnx.ModelProto
    outcomes: list[NodeOutcome] = field(default_factory=list)
    summaries: list[str] = field(default_factory=list)  # verification of each rewritten function


def function_key(f) -> tuple[str, str]:
    return f.domain, f.name


def _has_loop(nodes) -> bool:
    return any(n.op_type in LOOP_OPS or any(_has_loop(g.node) for a in n.attribute for g in attribute_graphs(a))
               for n in nodes)


def call_sites(model: onnx.ModelProto) -> dict[tuple[str, str], list[onnx.NodeProto]]:
    """Calls of each local function from the main graph (bodies included) and from functions."""
    keys = {function_key(f) for f in model.functions}
    found: dict[tuple[str, str], list] = {k: [] for k in keys}
    for n in model_nodes(model):
        if (n.domain, n.op_type) in keys:
            found[(n.domain, n.op_type)].append(n)
    return found


def prepare_functions(model: onnx.ModelProto, run_passes, verify, shapes=None) -> PreparedModel | None:
    """The model with its loop-holding functions inlined or optimized (the same object
    when none changed), and what was done or why not; None when no function has a loop.
    ``run_passes(model, shapes, positive) -> (model, report)`` runs the chosen passes on one model, deciding
    for ``shapes`` ({input name: dims}: the deployment shapes of a function body's inputs, where the
    declared ``shapes`` of the model's inputs give every call site the same static shape), with
    ``positive`` the body's inputs every caller passes values > 0 (:func:`positive_inputs`);
    ``verify(candidate) -> (passed, summary) | None`` checks a candidate against the
    original (None: verification is off)."""
    loopy = [f for f in model.functions if _has_loop(f.node)]
    if not loopy:
        return None
    calls = call_sites(model)
    main_calls = {id(n) for g in walk_proto_graphs(model.graph) for n in g.node}
    inline = [function_key(f) for f in loopy if len(calls[function_key(f)]) == 1
              and id(calls[function_key(f)][0]) in main_calls and not _takes_attributes(f)]
    prepared = PreparedModel(model)
    current = model
    if inline:
        try:
            current = inline_functions(model, inline)
        except (RuntimeError, ValueError) as exc:  # a call that does not fit its function, mixed opsets
            why = " ".join(str(exc).split())[:200]
            for domain, name in inline:
                prepared.outcomes.append(NodeOutcome("functions", function_label(domain, name), "", False,
                                                     f"not inlined: onnx's inliner refused the model ({why})"))
            inline = []
    if inline:
        verdict = verify(current)  # inlining is exact by construction; verified all the same
        if verdict is not None and not verdict[0]:
            current = model
            for domain, name in inline:
                prepared.outcomes.append(NodeOutcome("functions", function_label(domain, name), "", False,
                                                     f"not inlined: the inlined model failed verification ({verdict[1]})"))
            inline = []
        elif verdict is not None:
            prepared.summaries.append(f"inlined {', '.join(function_label(*key) for key in inline)}: {verdict[1]}")
        for domain, name in inline:
            prepared.outcomes.append(NodeOutcome("functions", function_label(domain, name), "", True,
                                                 "inlined at its single call site: its loops are optimized there"))
    for f in loopy:
        key = function_key(f)
        if key in inline:
            continue
        label = function_label(*key)
        body = _standalone(current, f)
        if isinstance(body, str):
            prepared.outcomes.append(NodeOutcome("functions", label, "", False, body))
            continue
        try:
            rewritten, report = run_passes(body, _deployed_dims(current, f, shapes) if shapes else {},
                                           positive_inputs(current, f))
        except ScanoptError as exc:
            prepared.outcomes.append(NodeOutcome("functions", label, "", False, f"its body cannot be optimized alone: {exc}"))
            continue
        prefix = f"function {label}"
        outcomes = [NodeOutcome(o.pass_name, f"{label}: {o.node}", f"{prefix} > {o.path}" if o.path else prefix, o.applied,
                                o.detail, o.expected) for o in report.outcomes]
        if not report.modified:
            prepared.outcomes += outcomes
            continue
        candidate = _with_function(current, f, rewritten)
        verdict = verify(candidate)
        if verdict is not None and not verdict[0]:
            prepared.outcomes += [o for o in outcomes if not o.applied]
            prepared.outcomes.append(NodeOutcome("functions", label, "", False,
                                                 f"rolled back: the rewritten body failed verification ({verdict[1]})"))
            continue
        if verdict is not None:
            prepared.summaries.append(f"function {label}: {verdict[1]}")
        prepared.outcomes += outcomes
        current = candidate
    prepared.model = current  # the very same object when no function changed
    return prepared if prepared.outcomes else None


INLINE_MARK = "\x00scanopt-inline:"  # a temporary doc_string naming a function's subgraph across inlining


def inline_functions(model: onnx.ModelProto, keys) -> onnx.ModelProto:
    """A new model with the functions ``keys`` ((domain, name)) inlined at every call site
    (onnx's inliner), the functions left without a call dropped, and the value_info of each
    inlined subgraph (a Scan's body) kept on the renamed values. onnx's inliner, like
    onnxruntime's (onnxruntime issue 27887), renames a body's values but not its value_info,
    leaving entries that name nothing; onnxruntime's CUDA EP then plans the body's buffers
    without shapes. Raises what the inliner raises. ``model`` is marked while the inliner
    runs and restored after."""
    keys = {tuple(k) for k in keys}
    plans: dict[str, tuple] = {}  # mark -> (the graph's doc_string, its op types, its value_info by position)
    marked: list[onnx.GraphProto] = []
    try:
        for f in model.functions:
            if function_key(f) not in keys:
                continue
            for sub in function_graphs(f):
                if sub.doc_string.startswith(INLINE_MARK):
                    raise ValueError("a subgraph's doc_string is scanopt's own inlining mark")
                mark = f"{INLINE_MARK}{len(plans)}"
                plans[mark] = (sub.doc_string, [n.op_type for n in sub.node], _value_info_positions(sub))
                sub.doc_string = mark
                marked.append(sub)
        inlined = onnx.inliner.inline_selected_functions(model, sorted(keys))
    finally:
        for sub in marked:
            sub.doc_string = plans[sub.doc_string][0]
    graphs = list(walk_proto_graphs(inlined.graph))
    graphs += [g for f in inlined.functions for g in function_graphs(f)]
    for g in graphs:
        if g.doc_string in plans:
            doc, ops, positions = plans[g.doc_string]
            g.doc_string = doc
            same = [n.op_type for n in g.node] == ops  # else a call inside it was inlined too: nodes moved
            renamed = _renamed_value_info(g, positions) if same else []
            del g.value_info[:]
            g.value_info.extend(renamed)
    used = call_sites(inlined)
    kept = [f for f in inlined.functions if function_key(f) not in keys or used.get(function_key(f))]
    del inlined.functions[:]
    inlined.functions.extend(kept)
    return inlined


def _value_info_positions(graph: onnx.GraphProto) -> list:
    """``graph``'s value_info as (("input", i) or ("node", k, j), entry): where each value is
    made in the graph, which renaming keeps. An entry naming nothing made there is left out."""
    made = {v.name: ("input", i) for i, v in enumerate(graph.input)}
    for k, node in enumerate(graph.node):
        for j, out in enumerate(node.output):
            if out:
                made.setdefault(out, ("node", k, j))
    return [(made[v.name], v) for v in graph.value_info if v.name in made]


def _renamed_value_info(graph: onnx.GraphProto, positions: list) -> list:
    """The entries of :func:`_value_info_positions` named as ``graph``, the inlined copy of
    the same nodes, names the same values."""
    renamed = []
    for where, entry in positions:
        if where[0] == "input":
            name = graph.input[where[1]].name if where[1] < len(graph.input) else ""
        else:
            node = graph.node[where[1]]
            name = node.output[where[2]] if where[2] < len(node.output) else ""
        if name:
            copy = onnx.ValueInfoProto()
            copy.CopyFrom(entry)
            copy.name = name
            renamed.append(copy)
    return renamed


def function_label(domain: str, name: str) -> str:
    return f"{domain}.{name}" if domain else name


def _takes_attributes(f: onnx.FunctionProto) -> bool:
    return bool(len(f.attribute) or len(f.attribute_proto))


def _standalone(model: onnx.ModelProto, f: onnx.FunctionProto, depth: int = 0) -> onnx.ModelProto | str:
    """The function's body as a model whose inputs have the types its call sites give,
    or the reason it cannot be one."""
    if _takes_attributes(f):
        return "takes attributes: its body depends on the call site, so it stays as it is"
    calls = call_sites(model)[function_key(f)]
    if not calls:
        return "never called"
    tables = _value_types(model, f, calls, depth)
    if isinstance(tables, str):
        return tables
    inputs = []
    for k, name in enumerate(f.input):
        seen = [table.type_of(c.input[k]) if k < len(c.input) and c.input[k] else (None, None)
                for c, table in zip(calls, tables)]
        elems = {e for e, _ in seen}
        ranks = {None if s is None else len(s) for _, s in seen}
        if len(elems) != 1 or None in elems or len(ranks) != 1:
            return (f"its call sites give input '{name}' different or unknown types; the body is optimized "
                    "only for one type per input")
        shape = _merged([s for _, s in seen], f"{f.name}_{k}")
        inputs.append(oh.make_tensor_value_info(name, elems.pop(), shape))
    outputs = [onnx.ValueInfoProto(name=o) for o in f.output]
    graph = oh.make_graph(list(f.node), f.name, inputs, outputs)
    opsets = list(f.opset_import) or list(model.opset_import)
    body = oh.make_model(graph, opset_imports=opsets, ir_version=model.ir_version)
    body.functions.extend(g for g in model.functions if function_key(g) != function_key(f))
    try:
        inferred = onnx.shape_inference.infer_shapes(body)
    except (onnx.shape_inference.InferenceError, ValueError) as exc:
        return f"shape inference fails on its body ({str(exc).splitlines()[0]})"
    for out, typed in zip(body.graph.output, inferred.graph.output):
        if typed.type.HasField("tensor_type") and typed.type.tensor_type.elem_type:
            out.CopyFrom(typed)
    return body


def positive_inputs(model: onnx.ModelProto, f: onnx.FunctionProto) -> list[str]:
    """The inputs of ``f`` that every call passes values > 0 (or 0 where they underflow): an
    Exp, Sigmoid or Softplus output or a constant > 0, read through ops that only select
    elements (SELECTING_OPS: Split, Squeeze, Slice...) in the calling graph. A decay that the
    caller computes as a sigmoid and hands to a per-head function is one; linattn needs its log
    to exist. What the calls prove, not what the body alone does: the rewritten function is
    verified through its callers."""
    calls = call_sites(model)[function_key(f)]
    if not calls:
        return []
    main = [g for g in walk_proto_graphs(model.graph)]
    main_nodes = {id(n) for g in main for n in g.node}
    scopes = []  # per call: (producer of each name, constant values by name) of the calling graph
    for call in calls:
        if id(call) in main_nodes:
            graphs = main
        else:
            caller = next((g for g in model.functions if any(n is call for top in g.node for n in nodes_within(top))),
                          None)
            if caller is None:
                return []
            graphs = [caller]
        producers = {out: n for g in graphs for n in g.node for out in n.output if out}
        constants = {t.name: t for g in graphs if isinstance(g, onnx.GraphProto) for t in g.initializer}
        scopes.append((producers, constants))
    return [name for k, name in enumerate(f.input)
            if all(k < len(c.input) and c.input[k] and positive_values(c.input[k], *scope)
                   for c, scope in zip(calls, scopes))]


def _deployed_dims(model: onnx.ModelProto, f: onnx.FunctionProto, shapes) -> dict[str, list[int]]:
    """{input of ``f``: dims} that the model's declared input ``shapes`` give ``f``'s inputs: the
    shape every call site agrees on, fully static (an input the calls disagree on, or leave
    partly unknown, is left out: the cost policy then assumes its usual range)."""
    from scanopt.deploy import shaped_model

    deployed = shaped_model(model, shapes)
    calls = call_sites(deployed)[function_key(f)]
    tables = _value_types(deployed, f, calls) if calls else "never called"
    if isinstance(tables, str):
        return {}
    dims = {}
    for k, name in enumerate(f.input):
        seen = [table.type_of(c.input[k])[1] if k < len(c.input) and c.input[k] else None for c, table in zip(calls, tables)]
        if seen[0] is not None and all(s == seen[0] for s in seen) and all(isinstance(d, int) for d in seen[0]):
            dims[name] = list(seen[0])
    return dims


def _value_types(model: onnx.ModelProto, f: onnx.FunctionProto, calls: list, depth: int = 0) -> list[ShapeTable] | str:
    """Per call of ``f``, the table that types its actual inputs: the model's for a call in
    its graphs, the calling function's standalone body for a call inside another function
    (onnxscript: a layer calling a layer), whose own inputs come from its callers in turn."""
    main = ShapeTable(model)
    main_nodes = {id(n) for g in walk_proto_graphs(model.graph) for n in g.node}
    tables = []
    for call in calls:
        if id(call) in main_nodes:
            tables.append(main)
            continue
        caller = next((g for g in model.functions
                       if any(n is call for top in g.node for n in nodes_within(top))), None)
        if caller is None or depth > len(model.functions):
            return "its call sites give input types that cannot be read"
        body = _standalone(model, caller, depth + 1)
        if isinstance(body, str):
            return f"its caller {function_label(*function_key(caller))} cannot be typed alone: {body}"
        tables.append(ShapeTable(body))
    return tables


def nodes_within(node: onnx.NodeProto):
    """``node`` and every node of the graphs nested in it."""
    yield node
    for attr in node.attribute:
        for g in attribute_graphs(attr):
            for sub in walk_proto_graphs(g):
                yield from sub.node


def _merged(shapes: list, prefix: str):
    """One shape for every call site: a dim they all give equal stays, others get a name."""
    if shapes[0] is None:
        return None
    merged = []
    for j, dims in enumerate(zip(*shapes)):
        merged.append(dims[0] if all(d == dims[0] and d is not None for d in dims) else f"{prefix}_d{j}")
    return merged


def _with_function(model: onnx.ModelProto, f: onnx.FunctionProto, body: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose function ``f`` has the nodes of ``body`` (its initializers
    as Constant nodes: a function holds none)."""
    candidate = onnx.ModelProto()
    candidate.CopyFrom(model)
    target = next(g for g in candidate.functions if function_key(g) == function_key(f))
    constants = [oh.make_node("Constant", [], [t.name], value=t) for t in body.graph.initializer]
    del target.node[:]
    target.node.extend(constants + list(body.graph.node))
    del target.value_info[:]
    known = {(o.domain or ""): o.version for o in target.opset_import}
    for o in body.opset_import:
        if (o.domain or "") not in known:
            target.opset_import.append(o)
            if all((m.domain or "") != (o.domain or "") for m in candidate.opset_import):
                candidate.opset_import.append(o)
    return candidate
