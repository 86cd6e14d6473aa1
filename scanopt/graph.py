"""Shared helpers over onnx-graphsurgeon graphs: the one home for graph walking,
outer-scope capture, fresh names, constant lookup and cleanup.

Passes use these and never re-implement them; a second copy inside a pass is a defect.
"""

from __future__ import annotations

import bisect
import heapq
from contextlib import contextmanager
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
    two identical nodes would be confused). Inside :func:`editing` a hit costs O(log n)
    (:func:`_position`); a miss, and any call outside, scans the list (in C)."""
    return _position(graph, node) is not None


def node_position(graph: gs.Graph, node: gs.Node) -> int:
    """The index of ``node`` in ``graph.nodes`` (by identity; through the position index
    inside :func:`editing`). Raises ValueError if ``graph`` does not hold it."""
    position = _position(graph, node)
    if position is None:
        raise ValueError(f"node '{node.name}' is not in graph '{graph.name}'")
    return position


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


def is_removed(node: gs.Node) -> bool:
    """True for a node taken out of its graph by :func:`scanopt.rewrite.detach` or
    :func:`cleanup` (both unhook its tensors): an O(1) test, where has_node is O(graph).
    Only nodes with outputs qualify (every op scanopt rewrites has one)."""
    return not node.outputs


_LABEL = "_scanopt_label"


def node_label(node: gs.Node) -> str:
    """The node's name, or for an unnamed node its op and first output (always unique). An
    unnamed node keeps the label it had when first asked, so a pass that renames or drops
    its first output (canonicalize) does not split its report entries or rollback keys."""
    if node.name:
        return node.name
    label = getattr(node, _LABEL, None)
    if label is None:
        first = node.outputs[0].name if node.outputs else "?"
        label = f"{node.op}->{first}"
        setattr(node, _LABEL, label)
    return label


def walk_graphs(graph: gs.Graph) -> Iterator[GraphLevel]:
    """Every graph in the model, outermost first (pre-order), with its parent chain.

    Iterative: nested generators (``yield from`` per level) would resume every enclosing
    level's generator for each graph yielded, O(depth) per graph. A level's bodies are
    listed when the walk comes back from yielding it (after the caller's look at it)."""
    stack = [(graph, (), "")]
    while stack:
        current, parents, path = stack.pop()
        yield GraphLevel(current, parents, path)
        inner, children = parents + (current,), []
        for node in current.nodes:
            for key, sub in subgraphs_of(node):
                step = f"{node_label(node)}/{key}"
                children.append((sub, inner, f"{path} > {step}" if path else step))
        stack.extend(reversed(children))


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
        self._next: dict[str, int] = {}
        self._taken: set[str] = set()
        for level in walk_graphs(graph):
            g = level.graph
            self._taken.update(t.name for t in g.inputs + g.outputs)
            for node in g.nodes:
                self._taken.add(node.name)
                self._taken.update(t.name for t in node.inputs + node.outputs)
        self._taken.discard("")

    @classmethod
    def from_names(cls, names: set[str]) -> "NameAllocator":
        """An allocator over names gathered elsewhere (e.g. from protos, all levels)."""
        allocator = cls.__new__(cls)
        allocator._next = {}
        allocator._taken = set(names) - {""}
        return allocator

    def fresh(self, hint: str) -> str:
        """``hint`` if free, else ``hint_1``, ``hint_2``, ... (the first free one).

        Names are never released, so probing resumes where the last call for the same
        hint stopped: amortized O(1) per name instead of O(names with that hint).
        """
        hint = hint or "v"
        i = self._first_try(hint)
        name = hint if i == 0 else f"{hint}_{i}"
        while name in self:
            i += 1
            name = f"{hint}_{i}"
        self._next[hint] = i + 1
        self._taken.add(name)
        return name

    def _first_try(self, hint: str) -> int:
        return self._next.get(hint, 0)

    def __contains__(self, name: str) -> bool:
        return name in self._taken

    def draft(self) -> "NameAllocator":
        """An allocator for something built only to be looked at and thrown away (a match
        trying a variant of a Scan): its names avoid every name taken here, yet taking them
        reserves nothing here, so a proposal leaves the names a rewrite gets unchanged."""
        return _DraftAllocator(self)


class _DraftAllocator(NameAllocator):
    """See :meth:`NameAllocator.draft`: own names on top of the parent's, read-only there."""

    def __init__(self, parent: NameAllocator):  # noqa: super().__init__ would walk a graph
        self._parent = parent
        self._next = {}
        self._taken = set()

    def _first_try(self, hint: str) -> int:
        return max(self._next.get(hint, 0), self._parent._first_try(hint))

    def __contains__(self, name: str) -> bool:
        return name in self._taken or name in self._parent


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


# A Slice start at or above this (or an end at or below its negation) is clamped to the
# axis end for any tensor that fits in memory: no axis has 2**62 elements.
HUGE = 2**62


def constant_axes(node: gs.Node, index: int = 1) -> list[int] | None:
    """The ``axes`` of a Reduce*/Squeeze/Unsqueeze node: its attribute (older opsets) or its
    input ``index`` when that is known at optimization time; None when omitted or computed."""
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    if len(node.inputs) > index and node.inputs[index].name:
        value = constant_value(node.inputs[index])
        return None if value is None else [int(a) for a in np.asarray(value).reshape(-1)]
    return None


def guard_branch(path: str) -> bool:
    """Whether a graph path is the else branch of a top-level If: where the empty-input guards
    of fuse, loop_to_scan and upgrade put the work. A Scan there is measured and reported as a
    top-level one (levels are joined by " > ")."""
    return " > " not in path and path.endswith("/else_branch")


def is_whole_slice(node: gs.Node, value=constant_value) -> bool:
    """True when ``node`` is a Slice that keeps every element in order: starts 0, ends at or
    past :data:`HUGE`, steps 1 (or absent), all known at optimization time (``value``: how a
    tensor's value is read; a ConstantFolder's ``value`` sees computed constants). TorchScript
    writes one for every ``x[..., None, :]``, its axes and steps Unsqueezes of Constants."""
    if not is_op(node, "Slice") or len(node.inputs) < 3 or "starts" in node.attrs:
        return False
    values = [value(t) if t.name else None for t in node.inputs[1:5]]
    starts, ends = values[0], values[1]
    steps = values[3] if len(values) > 3 and node.inputs[4].name else None
    if starts is None or ends is None or (len(node.inputs) > 4 and node.inputs[4].name and steps is None):
        return False
    starts, ends = np.asarray(starts).reshape(-1), np.asarray(ends).reshape(-1)
    steps = np.ones_like(starts) if steps is None else np.asarray(steps).reshape(-1)
    return starts.size == ends.size == steps.size and bool(np.all(starts == 0) and np.all(ends >= HUGE)
                                                           and np.all(steps == 1))


def reverses_axis(node: gs.Node, axis: int, rank: int | None, opset: int) -> bool:
    """True if ``node`` is a Slice (opset 10+) that reverses its data along ``axis`` whole,
    for every length: one step of -1 from the last element past the first."""
    if opset < 10 or not is_op(node, "Slice") or len(node.inputs) != 5 or len(node.outputs) != 1:
        return False
    values = [constant_value(t) if t.name else None for t in node.inputs[1:]]
    if any(v is None or v.size != 1 or v.dtype.kind not in "iu" for v in values):
        return False
    starts, ends, axes, steps = (int(v.reshape(-1)[0]) for v in values)
    if axes < 0:
        if rank is None:
            return False
        axes += rank
    return steps == -1 and axes == axis and (starts == -1 or starts >= HUGE) and ends <= -HUGE


def cleanup(graph: gs.Graph) -> gs.Graph:
    """Remove dead nodes and restore topological order, bodies included. Linear in the
    model (gs's own cleanup tests graph inputs against a list with a name-comparing ==).

    A node is live when a graph output, or a live node at this level or in a live
    node's bodies (outer-scope reads), reads one of its outputs. Graph inputs are kept:
    they are the model's interface (or a body's fixed signature). Removed nodes are
    unhooked from their tensors, like :func:`scanopt.rewrite.detach` does.
    """
    _clean(graph)
    sort_all(graph)
    return graph


def _clean(graph: gs.Graph) -> dict[int, gs.Tensor]:
    """Drop this level's dead nodes (after cleaning the bodies of live ones); return the
    tensors the remaining graph reads that it does not define (its captures), by id."""
    producer = {id(t): node for node in graph.nodes for t in node.outputs}
    live: set[int] = set()
    reads: dict[int, gs.Tensor] = {}
    stack = [t for t in graph.outputs]
    while stack:
        tensor = stack.pop()
        node = producer.get(id(tensor))
        if node is None:
            reads.setdefault(id(tensor), tensor)
            continue
        if id(node) in live:
            continue
        live.add(id(node))
        stack.extend(node.inputs)
        for _, sub in subgraphs_of(node):
            stack.extend(_clean(sub).values())
    kept = []
    for node in graph.nodes:
        if id(node) in live:
            kept.append(node)
        else:
            node.inputs.clear()
            node.outputs.clear()
    if len(kept) != len(graph.nodes):
        graph.nodes[:] = kept
    defined = {id(t) for t in graph.inputs}
    return {i: t for i, t in reads.items() if i not in defined}


_SORT_DEFERRED = [0]
# id(top graph) -> its _OutputIndex, while a pass runs
_OUTPUT_INDEX: dict[int, "_OutputIndex"] = {}


class _OutputIndex:
    """id(tensor) -> [(graph listing it as an output, at position)] for every graph under a
    root, built on first use (a pass that rewrites nothing never asks)."""

    def __init__(self, root: gs.Graph):
        self.root = root
        self.entries: dict[int, list[tuple[gs.Graph, int]]] | None = None

    def get(self, key: int, default=()):
        if self.entries is None:
            self.entries = {}
            for level in walk_graphs(self.root):
                for position, t in enumerate(level.graph.outputs):
                    self.entries.setdefault(id(t), []).append((level.graph, position))
        return self.entries.get(key, default)

    def add(self, key: int, found: list[tuple[gs.Graph, int]]) -> None:
        if self.entries is not None:  # else the build will see it
            self.entries.setdefault(key, []).extend(found)


class EditSession:
    """What :func:`editing` hands its caller: set ``changed = False`` when the pass
    rewrote nothing, so the graph is not checked for order again."""

    changed = True


@contextmanager
def editing(root: gs.Graph):
    """The bookkeeping of one pass over ``root``, done once instead of per rewrite
    (which would make the pass quadratic in the number of Scans):

    - :func:`is_topologically_sorted` answers True without looking; every level that
      lost its order is sorted once at the end (:func:`sort_all`), unless the caller
      says nothing changed (:class:`EditSession`);
    - :func:`in_graph_outputs` looks graph outputs up in an index built once, on first
      use. Hits are re-checked against the graph, so removed outputs are never reported;
      :func:`scanopt.rewrite.replace_all_uses` records the outputs it redirects
      (:func:`note_output`). Outputs a rewrite gives a body it creates are not indexed:
      they are new values, not the Scan outputs a later rewrite asks about;
    - :func:`has_node` and :func:`remove_node` find nodes through a position index
      (:class:`_NodeIndex`).
    """
    session = EditSession()
    _SORT_DEFERRED[0] += 1
    _OUTPUT_INDEX[id(root)] = _OutputIndex(root)
    try:
        yield session
    finally:
        _SORT_DEFERRED[0] -= 1
        _OUTPUT_INDEX.pop(id(root), None)
        if not _SORT_DEFERRED[0]:
            _POSITIONS.clear()
    if session.changed:
        sort_all(root)


# While a pass runs (editing): id(graph) -> _NodeIndex, so finding or removing a node
# costs O(log n) instead of a scan of the list.
_POSITIONS: dict[int, "_NodeIndex"] = {}


class _NodeIndex:
    """Where each node of one graph stands, kept up to date for the edits passes make in
    bulk (removals through :func:`remove_node`, appends): a node's slot is its position
    when indexed; its position now is that slot minus the removals before it. Every hit
    is checked against the list, so an edit the index does not know (an insertion, a
    sort) can only cause a miss, and a miss falls back to a scan and a rebuild."""

    def __init__(self, graph: gs.Graph):
        self.graph = graph
        self.slots = {id(n): k for k, n in enumerate(graph.nodes)}
        self.removed: list[int] = []  # slots of removed nodes, sorted
        self.next_slot = len(graph.nodes)

    def find(self, node: gs.Node) -> int | None:
        nodes = self.graph.nodes
        # Nodes appended since the last look take the next slots (their position now
        # plus the removals, all of which are of earlier slots).
        while self.next_slot - len(self.removed) < len(nodes):
            self.slots.setdefault(id(nodes[self.next_slot - len(self.removed)]), self.next_slot)
            self.next_slot += 1
        slot = self.slots.get(id(node))
        if slot is None:
            return None
        position = slot - bisect.bisect_left(self.removed, slot)
        return position if 0 <= position < len(nodes) and nodes[position] is node else None

    def remove(self, position: int) -> None:
        slot = self.slots.pop(id(self.graph.nodes[position]))
        del self.graph.nodes[position]
        bisect.insort(self.removed, slot)


def _position(graph: gs.Graph, node: gs.Node) -> int | None:
    """The index of ``node`` in ``graph.nodes`` (by identity), or None."""
    index = _POSITIONS.get(id(graph)) if _SORT_DEFERRED[0] else None
    if index is not None and index.graph is graph:
        found = index.find(node)
        if found is not None:
            return found
    ids = list(map(id, graph.nodes))  # identity, in C: gs.Node's == compares structure
    if _SORT_DEFERRED[0] and (index is None or index.graph is not graph or id(node) in ids):
        _POSITIONS[id(graph)] = _NodeIndex(graph)  # missing or stale: rebuild once
    return ids.index(id(node)) if id(node) in ids else None


def remove_node(graph: gs.Graph, node: gs.Node) -> None:
    """Delete ``node`` (by identity) from ``graph.nodes`` if it is there. Inside
    :func:`editing` the node's position comes from an index (see :class:`_NodeIndex`)."""
    position = _position(graph, node)
    if position is None:
        return
    index = _POSITIONS.get(id(graph))
    if index is not None and index.graph is graph and index.find(node) == position:
        index.remove(position)
    else:
        del graph.nodes[position]


def in_graph_outputs(tensor: gs.Tensor, root: gs.Graph) -> bool:
    """True if ``tensor`` is listed as an output of ``root`` or of any graph under it."""
    index = _OUTPUT_INDEX.get(id(root))
    if index is None or index.root is not root:
        return any(id(tensor) in map(id, level.graph.outputs) for level in walk_graphs(root))
    return any(_lists(graph.outputs, tensor, position) for graph, position in index.get(id(tensor), ()))


def _lists(items: list, item, position: int) -> bool:
    """``item`` is in ``items`` (by identity), looked for at ``position`` first."""
    if position < len(items) and items[position] is item:
        return True
    return id(item) in map(id, items)


def output_positions(tensor: gs.Tensor, graph: gs.Graph) -> list[int]:
    """Where ``graph`` lists ``tensor`` among its outputs (by identity), in order. Inside
    :func:`editing` the top graph's list (one entry or more per Scan in a wide model) is
    looked up in the index and checked; a body's list (short, and edited by passes
    directly) is scanned."""
    outputs = graph.outputs
    index = _OUTPUT_INDEX.get(id(graph))
    if index is not None and index.root is graph:
        entries = [p for g, p in index.get(id(tensor)) if g is graph]
        hits = sorted({p for p in entries if p < len(outputs) and outputs[p] is tensor})
        if hits or not entries:
            return hits
    if id(tensor) not in map(id, outputs):  # in C: most tensors are not outputs
        return []
    return [p for p, t in enumerate(outputs) if t is tensor]


def note_output(tensor: gs.Tensor, graph: gs.Graph, positions: list[int] = (0,)) -> None:
    """Record that ``graph`` now lists ``tensor`` among its outputs at ``positions``
    (see :func:`editing`)."""
    for index in _OUTPUT_INDEX.values():
        index.add(id(tensor), [(graph, p) for p in positions])


def sort_level(graph: gs.Graph) -> None:
    """Restore topological order at one level (its bodies untouched) if it lost it: what a
    pass's end of :func:`editing` does for every level, done for one level in between."""
    captures = _captures_by_graph(graph)
    if not _is_sorted(graph, captures):
        toposort(graph, captures)


def sort_all(graph: gs.Graph) -> None:
    """Restore topological order at every level that lost it (untouched levels keep
    their bytes). One walk: what each body reads from outside is computed bottom-up once."""
    captures = _captures_by_graph(graph)
    for level in walk_graphs(graph):
        if not _is_sorted(level.graph, captures):
            toposort(level.graph, captures)


def is_topologically_sorted(graph: gs.Graph) -> bool:
    """True if every node comes after the producers of its inputs (this level only).

    Checked before sorting because gs's toposort may reorder an already valid order,
    which would change the bytes of an untouched graph. Inside :func:`editing`
    always True (the graph is sorted once at the end).
    """
    return bool(_SORT_DEFERRED[0]) or _is_sorted(graph, _captures_by_graph(graph))


def _captures_by_graph(root: gs.Graph) -> dict[int, list[gs.Tensor]]:
    """id(graph) -> the values of enclosing graphs it (or anything nested in it) reads,
    for every graph under ``root``, in one post-order walk."""
    found: dict[int, list[gs.Tensor]] = {}

    def visit(graph: gs.Graph) -> list[gs.Tensor]:
        defined = {id(t) for t in graph.inputs}
        defined.update(id(t) for node in graph.nodes for t in node.outputs)
        reads: dict[int, gs.Tensor] = {}
        for node in graph.nodes:
            for t in node.inputs:
                if id(t) not in defined:
                    reads.setdefault(id(t), t)
            for _, sub in subgraphs_of(node):
                for t in visit(sub):
                    if id(t) not in defined:
                        reads.setdefault(id(t), t)
        for t in graph.outputs:
            if id(t) not in defined:
                reads.setdefault(id(t), t)
        found[id(graph)] = list(reads.values())
        return found[id(graph)]

    visit(root)
    return found


def _is_sorted(graph: gs.Graph, captures: dict[int, list[gs.Tensor]]) -> bool:
    produced_here = {id(t) for node in graph.nodes for t in node.outputs}
    seen: set[int] = set()
    for node in graph.nodes:
        for t in _node_reads(node, captures):
            if id(t) in produced_here and id(t) not in seen:
                return False
        seen.update(id(t) for t in node.outputs)
    return True


def _node_reads(node: gs.Node, captures: dict[int, list[gs.Tensor]]) -> list[gs.Tensor]:
    """A node's inputs and, for a node with bodies, the outer values they read."""
    reads = list(node.inputs)
    for _, sub in subgraphs_of(node):
        reads += captures[id(sub)] if id(sub) in captures else outer_captures(sub)
    return reads


def toposort(graph: gs.Graph, captures: dict[int, list[gs.Tensor]] | None = None) -> None:
    """Stable topological sort of one level: among ready nodes the earliest in the
    current order goes first, so a sorted prefix stays as it is. Outer values read
    inside a node's bodies count as its inputs. O(n log n)."""
    nodes = list(graph.nodes)
    producer = {id(t): i for i, node in enumerate(nodes) for t in node.outputs}
    waiting = [0] * len(nodes)
    readers: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        deps = {producer[id(t)] for t in _node_reads(node, captures or {}) if id(t) in producer} - {i}
        waiting[i] = len(deps)
        for d in deps:
            readers[d].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for r in readers[i]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(order) != len(nodes):  # a cycle: leave the rest in their order, as gs does
        placed = {id(n) for n in order}
        order += [n for n in nodes if id(n) not in placed]
    graph.nodes[:] = order


def dtype_of(tensor: gs.Tensor) -> np.dtype | None:
    """numpy dtype of a tensor, whatever form gs recorded it in."""
    dtype = tensor.dtype
    if dtype is None:
        return None
    if isinstance(dtype, int):
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype))
    return np.dtype(dtype)
