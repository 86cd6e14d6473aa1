"""Walking onnx protos (before import into gs, or after export): the one home for it."""

from __future__ import annotations

import collections
from typing import Iterator

import onnx

DEFAULT_DOMAINS = ("", "ai.onnx")

# Ops every output element of which is an element of their first input (views, Transpose,
# Slice, Gather, Split...): a property of the elements (their sign) read through them holds.
SELECTING_OPS = frozenset(("Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Transpose", "Expand", "Slice",
                           "Gather", "GatherElements", "Tile", "Split"))
# Ops whose outputs are > 0 wherever they do not underflow to 0: exp(x), sigmoid(x), softplus(x).
POSITIVE_OPS = frozenset(("Exp", "Sigmoid", "Softplus"))


def positive_values(name: str, producers: dict, constants: dict) -> bool:
    """Whether every element of the value ``name`` is > 0 (or 0 where it underflows): an
    output of POSITIVE_OPS or a float constant > 0 (a Constant node, or ``constants``: name ->
    TensorProto), read back through SELECTING_OPS; ``producers``: output name -> NodeProto of
    the graphs it is looked up in. At most 64 nodes back."""
    from onnx import numpy_helper

    for _ in range(64):
        node = producers.get(name)
        if node is None or node.op_type == "Constant" and in_default_domain(node.domain):
            tensor = constants.get(name) if node is None else next(
                (a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)
            if tensor is None:
                return False
            value = numpy_helper.to_array(tensor)
            return value.size > 0 and value.dtype.kind == "f" and bool((value > 0).all())
        if not in_default_domain(node.domain):
            return False
        if node.op_type in POSITIVE_OPS:
            return True
        if node.op_type not in SELECTING_OPS or not node.input:
            return False
        name = node.input[0]
    return False


def in_default_domain(domain: str | None) -> bool:
    """True for the ai.onnx domain however it is spelled (gs uses None for it)."""
    return (domain or "") in DEFAULT_DOMAINS


def attribute_graphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    """The graphs an attribute holds: one for GRAPH, several for GRAPHS, none otherwise."""
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == onnx.AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def walk_proto_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every graph nested in it, pre-order. Iterative: nested generators
    would cost O(depth) per graph yielded."""
    stack = [graph]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed([sub for node in current.node for attr in node.attribute for sub in attribute_graphs(attr)]))


def function_graphs(function: onnx.FunctionProto) -> Iterator[onnx.GraphProto]:
    """Every graph nested in ``function``'s nodes, at any depth, pre-order."""
    for node in function.node:
        for attr in node.attribute:
            for sub in attribute_graphs(attr):
                yield from walk_proto_graphs(sub)


def model_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every node of ``model``: its main graph's and their bodies', then each model-local
    function's (a function's body counted once, however often it is called)."""
    nodes = [n for g in walk_proto_graphs(model.graph) for n in g.node]
    for function in model.functions:
        nodes += function.node
        nodes += [n for g in function_graphs(function) for n in g.node]
    return nodes


def fed_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a caller feeds: those without a same-named initializer (which
    would be their default)."""
    defaults = {t.name for t in graph.initializer}
    return [v for v in graph.input if v.name not in defaults]


def outer_names(graph: onnx.GraphProto) -> list[str]:
    """Names that ``graph`` (or any graph nested in it) reads but does not define: the
    values it captures from enclosing graphs, in order of first use."""
    return outer_names_by_graph(graph)[id(graph)][1]


def defined_names(graph: onnx.GraphProto) -> set[str]:
    """The values ``graph`` itself makes: its inputs, initializers (sparse ones too) and node outputs."""
    names = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    names |= {s.values.name for s in graph.sparse_initializer}
    return names | {o for n in graph.node for o in n.output if o}


def outer_names_by_graph(graph: onnx.GraphProto) -> dict[int, tuple[onnx.GraphProto, list[str]]]:
    """id(g) -> (g, :func:`outer_names` of g) for ``graph`` and every graph nested in it, in
    one bottom-up walk: each level costs its own size plus its bodies' capture lists, where
    calling :func:`outer_names` per level walks every deeper level again (quadratic in the
    nesting depth). The graphs are held, so the ids stay theirs while the dict lives."""
    found: dict[int, tuple[onnx.GraphProto, list[str]]] = {}

    def visit(g: onnx.GraphProto) -> list[str]:
        defined = defined_names(g)
        reads: dict[str, None] = {}
        for node in g.node:
            for name in node.input:
                if name and name not in defined:
                    reads.setdefault(name)
            for attr in node.attribute:
                for sub in attribute_graphs(attr):
                    for name in visit(sub):
                        if name not in defined:
                            reads.setdefault(name)
        for out in g.output:
            if out.name not in defined:
                reads.setdefault(out.name)
        found[id(g)] = (g, list(reads))
        return found[id(g)][1]

    visit(graph)
    return found


def proto_node_label(node: onnx.NodeProto) -> str:
    """The label :func:`scanopt.graph.node_label` gives this node once imported (its name,
    or its op and first output): how reports name a top-level node."""
    return node.name or f"{node.op_type}->{node.output[0] if node.output else '?'}"


def _label(node: onnx.NodeProto) -> str:
    return node.name or node.op_type


def topological_order(graph: onnx.GraphProto, captures: dict | None = None) -> tuple[list[int], list[str]]:
    """A topological order of ``graph``'s node indices (this level; a node with subgraphs
    also depends on the values they capture): ``list(range(n))`` when the nodes are already
    sorted. When there is none, also one cycle as a list of "'node' reads 'value' from
    'producer'" steps (else an empty list). ``captures``: :func:`outer_names_by_graph` of an
    enclosing graph, so the bodies' captures are not walked again per level."""
    producer = {name: i for i, node in enumerate(graph.node) for name in node.output if name}
    needs: list[list[tuple[str, int]]] = []
    for node in graph.node:
        names = list(node.input)
        for attr in node.attribute:
            for sub in attribute_graphs(attr):
                known = (captures or {}).get(id(sub))
                names += known[1] if known is not None and known[0] is sub else outer_names(sub)
        needs.append([(n, producer[n]) for n in dict.fromkeys(names) if n in producer])
    if all(p < i for i, deps in enumerate(needs) for _, p in deps):
        return list(range(len(graph.node))), []
    users: list[list[int]] = [[] for _ in graph.node]
    waiting = [0] * len(graph.node)
    for i, deps in enumerate(needs):
        for _, p in deps:
            users[p].append(i)
            waiting[i] += 1
    ready = collections.deque(i for i, w in enumerate(waiting) if w == 0)
    order: list[int] = []
    while ready:
        i = ready.popleft()
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    if len(order) == len(graph.node):
        return order, []
    return order, _one_cycle(graph, needs, {i for i, w in enumerate(waiting) if w > 0})


def _one_cycle(graph: onnx.GraphProto, needs, stuck: set[int]) -> list[str]:
    """Follow unmet dependencies among ``stuck`` nodes until one repeats."""
    path, seen = [], {}
    node = min(stuck)
    while node not in seen:
        seen[node] = len(path)
        value, producer = next((v, p) for v, p in needs[node] if p in stuck)
        path.append((node, value, producer))
        node = producer
    cycle = path[seen[node]:]
    steps = [f"reads '{v}' from '{_label(graph.node[p])}'" for _, v, p in cycle]
    return [f"'{_label(graph.node[cycle[0][0]])}' {steps[0]}"] + [f"which {step}" for step in steps[1:]]


def copy_fields(source, target, *, skip: tuple[str, ...] = ()) -> None:
    """Copy every set field of the message ``source`` but ``skip`` into ``target`` (a
    message of the same type): a copy without the fields that would cost (a model's graph,
    a graph's initializers)."""
    for descriptor, value in source.ListFields():
        if descriptor.name in skip:
            continue
        field = getattr(target, descriptor.name)
        if hasattr(field, "CopyFrom"):
            field.CopyFrom(value)
        elif hasattr(field, "extend"):
            field.extend(value)
        else:
            setattr(target, descriptor.name, value)
