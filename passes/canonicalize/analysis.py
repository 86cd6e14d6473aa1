"""What the canonicalize pass needs to know before it touches anything: which body inputs
each body output depends on and where a body value merely passes another through (whether a
Slice reverses a whole axis lives in scanopt.graph.reverses_axis). Read-only helpers; the
pass decides (scan outputs computed after the loop: :mod:`epilogue`).
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from scanopt.graph import outer_captures, subgraphs_of, walk_graphs


class Dependencies:
    """Which body inputs each body value depends on (positions in ``body.inputs``), memoized.

    Follows producers inside the body, including what nested graphs read from the body by
    outer-scope capture; values of enclosing graphs are leaves (they depend on nothing).
    """

    def __init__(self, body: gs.Graph):
        self._position = {id(t): i for i, t in enumerate(body.inputs)}
        self._local = {id(n) for n in body.nodes}
        self._reads: dict[int, list[gs.Tensor]] = {}
        self._of: dict[int, frozenset[int]] = {}

    def reads(self, node: gs.Node) -> list[gs.Tensor]:
        """The node's inputs and the values its nested graphs capture."""
        if id(node) not in self._reads:
            extra = [t for _, sub in subgraphs_of(node) for t in outer_captures(sub)]
            self._reads[id(node)] = list(node.inputs) + extra
        return self._reads[id(node)]

    def producer(self, t: gs.Tensor) -> gs.Node | None:
        """The body node computing ``t``, or None (a body input, constant or outer value)."""
        return t.inputs[0] if t.inputs and id(t.inputs[0]) in self._local else None

    def of(self, tensor: gs.Tensor) -> frozenset[int]:
        """Positions of the body inputs ``tensor`` depends on (iterative: bodies can be deep)."""
        stack = [(tensor, False)]
        while stack:
            t, expanded = stack.pop()
            if id(t) in self._of:
                continue
            node = self.producer(t)
            if node is None:
                self._of[id(t)] = frozenset({self._position[id(t)]} if id(t) in self._position else ())
            elif expanded:
                self._of[id(t)] = frozenset().union(*(self._of[id(r)] for r in self.reads(node)))
            else:
                stack.append((t, True))
                stack.extend((r, False) for r in self.reads(node) if id(r) not in self._of)
        return self._of[id(tensor)]


def input_dependencies(body: gs.Graph) -> list[frozenset[int]]:
    """For each body output, the positions of the body inputs its value depends on."""
    deps = Dependencies(body)
    return [deps.of(out) for out in body.outputs]


def shadows(body: gs.Graph, outer: gs.Tensor, replaced: gs.Tensor) -> bool:
    """True if the body (at any depth) has a value other than ``replaced`` (which goes)
    with ``outer``'s name, so the body could not read ``outer`` by name."""
    for level in walk_graphs(body):
        g = level.graph
        tensors = list(g.inputs) + [t for node in g.nodes for t in node.inputs + node.outputs]
        if any(t.name == outer.name and t is not outer and t is not replaced for t in tensors):
            return True
    return False
