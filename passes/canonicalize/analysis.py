"""What the canonicalize pass needs to know before it touches anything: which body inputs
each body output depends on and where a body value merely passes another through (whether a
Slice reverses a whole axis lives in scanopt.graph.reverses_axis), and which scan outputs are
elementwise functions of another's value. Read-only helpers; the pass decides.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from scanopt.graph import identity_root, is_op, outer_captures, subgraphs_of, walk_graphs


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


# Elementwise ops whose stacked application equals the stack of their per-step ones.
_UNARY = frozenset({"Identity", "Relu", "Tanh", "Sigmoid", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal",
                    "Softsign", "Softplus", "Erf", "Sin", "Cos", "Floor", "Ceil", "Round", "Sign", "Elu", "Selu",
                    "LeakyRelu", "HardSigmoid"})
_WITH_SCALAR = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"})


@dataclass
class Epilogue:
    """A scan output computed per step from another one's value by elementwise ops with
    constant scalars: ``f(y_j)`` stacked is ``f`` of ``y_j``'s stack, so it can be computed
    once after the loop (and a cell with ``h`` and ``relu(h)`` as outputs can fuse)."""

    source: int  # the scan output whose value the chain starts from
    # (op, attributes, operands, dtype) from the source's value to this output: an operand is
    # None for the running value, else its constant scalar. A copy: the body nodes may go.
    steps: list


def epilogue(y: gs.Tensor, roots: dict, body: gs.Graph, folder, rank) -> Epilogue | None:
    """The Epilogue computing body output ``y`` from one of ``roots`` ({id(identity root of a
    body output): scan output}) by body nodes, else None. A scalar operand has rank 0, or rank 1
    on a value of rank >= 1, so it never raises the rank of a step's value (nor of the stack)."""
    own = {id(n) for n in body.nodes}
    chain, value = [], y
    while not (chain and id(identity_root(value)) in roots):
        node = value.inputs[0] if len(value.inputs) == 1 else None
        if node is None or id(node) not in own or len(node.outputs) != 1 or node.domain not in (None, "", "ai.onnx"):
            return None
        if node.op in _UNARY and len(node.inputs) == 1:
            value, operands = node.inputs[0], [None]
        elif node.op in _WITH_SCALAR and len(node.inputs) == 2:
            found = [(t, folder.value(t)) for t in node.inputs]
            variable = [t for t, v in found if v is None]
            constant = [(t, v) for t, v in found if v is not None]
            if len(variable) != 1 or len(constant) != 1 or constant[0][1].size != 1:
                return None
            t, v = constant[0]
            if v.ndim > 1 or (v.ndim == 1 and not (rank(variable[0]) or 0) >= 1):
                return None
            value, operands = variable[0], [None if x is variable[0] else w for x, w in found]
        else:
            return None
        if node.op != "Identity":  # a copy: nothing to compute after the loop
            chain.append((node.op, dict(node.attrs), operands, node.outputs[0].dtype))
    return Epilogue(roots[id(identity_root(value))], chain[::-1])
