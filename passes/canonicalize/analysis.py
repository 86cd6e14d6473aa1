"""What the canonicalize pass needs to know before it touches anything: which body inputs
each body output depends on and where a body value merely passes another through (whether a
Slice reverses a whole axis lives in scanopt.graph.reverses_axis). Read-only helpers; the pass decides.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from scanopt.graph import is_op, outer_captures, subgraphs_of, walk_graphs

def identity_root(tensor: gs.Tensor) -> gs.Tensor:
    """The value ``tensor`` copies through a chain of Identity nodes (itself if none)."""
    seen = set()
    while len(tensor.inputs) == 1 and is_op(tensor.inputs[0], "Identity") and id(tensor) not in seen:
        seen.add(id(tensor))
        producer = tensor.inputs[0]
        if len(producer.inputs) != 1:
            break
        tensor = producer.inputs[0]
    return tensor


def input_dependencies(body: gs.Graph) -> list[frozenset[int]]:
    """For each body output, the positions of the body inputs its value depends on.

    Follows producers inside the body, including what nested graphs read from the body
    by outer-scope capture; values of enclosing graphs are leaves.
    """
    position = {id(t): i for i, t in enumerate(body.inputs)}
    local = {id(n) for n in body.nodes}
    captures: dict[int, list[gs.Tensor]] = {}

    def reads(node: gs.Node) -> list[gs.Tensor]:
        if id(node) not in captures:
            extra = [t for _, sub in subgraphs_of(node) for t in outer_captures(sub)]
            captures[id(node)] = list(node.inputs) + extra
        return captures[id(node)]

    result = []
    for out in body.outputs:
        found, seen, stack = set(), set(), [out]
        while stack:
            t = stack.pop()
            if id(t) in seen:
                continue
            seen.add(id(t))
            if id(t) in position:
                found.add(position[id(t)])
            for producer in t.inputs:
                if id(producer) in local:
                    stack.extend(reads(producer))
        result.append(frozenset(found))
    return result


def shadows(body: gs.Graph, outer: gs.Tensor, replaced: gs.Tensor) -> bool:
    """True if the body (at any depth) has a value other than ``replaced`` (which goes)
    with ``outer``'s name, so the body could not read ``outer`` by name."""
    for level in walk_graphs(body):
        g = level.graph
        tensors = list(g.inputs) + [t for node in g.nodes for t in node.inputs + node.outputs]
        if any(t.name == outer.name and t is not outer and t is not replaced for t in tensors):
            return True
    return False
