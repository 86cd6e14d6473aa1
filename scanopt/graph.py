"""Shared helpers over onnx-graphsurgeon graphs: the one home for graph walking,
outer-scope capture, fresh names, constant lookup and cleanup.

Passes use these and never re-implement them; a second copy inside a pass is a defect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.ir import OWNER
from scanopt.protos import in_default_domain


@dataclass(frozen=True)
class GraphLevel:
    """One graph of the model: the top graph, or a body at some nesting depth.

    ``parents`` lists the enclosing graphs outermost first; ``path`` names the chain of
    nodes and attributes that leads here, e.g. ``loop_1/body > scan_3/body``.
    """

    graph: gs.Graph
    parents: tuple[gs.Graph, ...]
    path: str

    @property
    def depth(self) -> int:
        return len(self.parents)


def subgraphs_of(node: gs.Node) -> Iterator[tuple[str, gs.Graph]]:
    """(attribute name, graph) for every graph attribute of a node (Loop, If, Scan, ...)."""
    for key, value in node.attrs.items():
        if isinstance(value, gs.Graph):
            yield key, value
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if isinstance(item, gs.Graph):
                    yield f"{key}[{i}]", item


def is_op(node: gs.Node, op_type: str) -> bool:
    """True if ``node`` is the ai.onnx operator ``op_type``."""
    return node.op == op_type and in_default_domain(node.domain)


def has_node(graph: gs.Graph, node: gs.Node) -> bool:
    """Identity membership: gs.Node's == compares structure, bodies included (slow, and
    two identical nodes would be confused)."""
    return any(n is node for n in graph.nodes)


def node_label(node: gs.Node) -> str:
    """The node's name, or for an unnamed node its op and first output (always unique)."""
    if node.name:
        return node.name
    first = node.outputs[0].name if node.outputs else "?"
    return f"{node.op}->{first}"


def walk_graphs(graph: gs.Graph) -> Iterator[GraphLevel]:
    """Every graph in the model, outermost first (pre-order), with its parent chain."""

    def visit(current: gs.Graph, parents: tuple[gs.Graph, ...], path: str) -> Iterator[GraphLevel]:
        yield GraphLevel(current, parents, path)
        for node in current.nodes:
            for key, sub in subgraphs_of(node):
                step = f"{node_label(node)}/{key}"
                yield from visit(sub, parents + (current,), f"{path} > {step}" if path else step)

    yield from visit(graph, (), "")


def _local_tensor_ids(body: gs.Graph) -> set[int]:
    """ids of tensors defined inside ``body`` or any graph nested in it."""
    local: set[int] = set()
    for level in walk_graphs(body):
        g = level.graph
        local.update(id(t) for t in g.inputs)
        for node in g.nodes:
            local.update(id(t) for t in node.outputs)
            for t in node.inputs:
                if isinstance(t, gs.Constant) and getattr(t, OWNER, g) is g:
                    local.add(id(t))
    return local


def outer_captures(body: gs.Graph) -> list[gs.Tensor]:
    """Values of enclosing graphs that ``body`` (or anything nested in it) reads by name.

    In order of first use, without duplicates. An initializer counts as local when the
    body (or a nested graph) owned it in the input model, or when a pass created it for
    the body.
    """
    local = _local_tensor_ids(body)
    seen: dict[int, gs.Tensor] = {}
    for level in walk_graphs(body):
        for node in level.graph.nodes:
            for t in node.inputs:
                if t.name and id(t) not in local and id(t) not in seen:
                    seen[id(t)] = t
    return list(seen.values())


class NameAllocator:
    """Deterministic fresh names, unique across every graph of the model.

    Seeded with every tensor and node name at all nesting levels, so a new name can never
    shadow an outer value or collide with a name in a sibling body.
    """

    def __init__(self, graph: gs.Graph):
        self._taken: set[str] = set()
        for level in walk_graphs(graph):
            g = level.graph
            self._taken.update(t.name for t in g.inputs + g.outputs)
            for node in g.nodes:
                self._taken.add(node.name)
                self._taken.update(t.name for t in node.inputs + node.outputs)
        self._taken.discard("")
        self._next: dict[str, int] = {}  # hint -> the suffix to try first (names are never freed)

    @classmethod
    def from_names(cls, names: set[str]) -> "NameAllocator":
        """An allocator over names gathered elsewhere (e.g. from protos, all levels)."""
        allocator = cls.__new__(cls)
        allocator._taken = set(names) - {""}
        allocator._next = {}
        return allocator

    def fresh(self, hint: str) -> str:
        """``hint`` if free, else ``hint_1``, ``hint_2``, ... (the first free one)."""
        hint = hint or "v"
        # Every name before the remembered suffix is taken, so probing starts there: the
        # same answer as probing from 0, in O(1) per call (unrolling asks for the same hints
        # once per step).
        i = self._next.get(hint, 0)
        name = hint if i == 0 else f"{hint}_{i}"
        while name in self._taken:
            i += 1
            name = f"{hint}_{i}"
        self._next[hint] = i + 1
        self._taken.add(name)
        return name

    def __contains__(self, name: str) -> bool:
        return name in self._taken


def constant_value(tensor: gs.Tensor) -> np.ndarray | None:
    """The value of a tensor known at optimization time, else None.

    Covers initializers at any level (gs shares the outer tensor object with the body
    that captures it) and outputs of Constant nodes (every ``value*`` attribute form).
    """
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    producers = list(tensor.inputs)
    if len(producers) != 1 or not is_op(producers[0], "Constant"):
        return None
    attrs = producers[0].attrs
    if "value" in attrs:
        value = attrs["value"]
        return np.asarray(value.values if isinstance(value, gs.Constant) else value)
    scalars = {
        "value_float": np.float32,
        "value_int": np.int64,
        "value_floats": np.float32,
        "value_ints": np.int64,
    }
    for key, dtype in scalars.items():
        if key in attrs:
            return np.asarray(attrs[key], dtype=dtype)
    if "value_string" in attrs or "value_strings" in attrs:
        return np.asarray(attrs.get("value_string", attrs.get("value_strings")), dtype=object)
    return None


def cleanup(graph: gs.Graph) -> gs.Graph:
    """Remove dead nodes and tensors and restore topological order, bodies included.

    Graph inputs are kept: they are the model's interface (or a body's fixed signature).
    """
    graph.cleanup(remove_unused_graph_inputs=False, recurse_subgraphs=True)
    for level in walk_graphs(graph):
        if not is_topologically_sorted(level.graph):
            level.graph.toposort(recurse_subgraphs=False)
    return graph


def is_topologically_sorted(graph: gs.Graph) -> bool:
    """True if every node comes after the producers of its inputs (this level only).

    Checked before sorting because gs's toposort may reorder an already valid order,
    which would change the bytes of an untouched graph.
    """
    produced_here = {id(t) for node in graph.nodes for t in node.outputs}
    seen: set[int] = set()
    for node in graph.nodes:
        for t in node.inputs:
            if id(t) in produced_here and id(t) not in seen:
                return False
        seen.update(id(t) for t in node.outputs)
    return True


def dtype_of(tensor: gs.Tensor) -> np.dtype | None:
    """numpy dtype of a tensor, whatever form gs recorded it in."""
    dtype = tensor.dtype
    if dtype is None:
        return None
    if isinstance(dtype, int):
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype))
    return np.dtype(dtype)
