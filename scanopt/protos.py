"""Walking onnx protos (before import into gs, or after export): the one home for it."""

from __future__ import annotations

from typing import Iterator

import onnx

DEFAULT_DOMAINS = ("", "ai.onnx")


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
    """``graph`` and every graph nested in it, pre-order."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in attribute_graphs(attr):
                yield from walk_proto_graphs(sub)


def outer_names(graph: onnx.GraphProto) -> list[str]:
    """Names that ``graph`` (or any graph nested in it) reads but does not define: the
    values it captures from enclosing graphs, in order of first use."""
    found: dict[str, None] = {}

    def visit(g: onnx.GraphProto, defined: set[str]) -> None:
        defined = defined | {v.name for v in g.input} | {i.name for i in g.initializer}
        defined |= {s.values.name for s in g.sparse_initializer}
        defined |= {o for n in g.node for o in n.output if o}
        for node in g.node:
            for name in node.input:
                if name and name not in defined:
                    found.setdefault(name)
            for attr in node.attribute:
                for sub in attribute_graphs(attr):
                    visit(sub, defined)
        for out in g.output:
            if out.name not in defined:
                found.setdefault(out.name)

    visit(graph, set())
    return list(found)
