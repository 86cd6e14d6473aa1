"""Which dims of a model must be equal, from what its ops require, not from their names.

Exporters name symbolic dims carelessly: tf2onnx gives every unknown dim its own
``unk__N``, so two dims that are one batch never share a symbol. Here every axis of every
value (at every nesting level) is a variable, and ops that require two dims to be equal
unify them (union-find):

- declarations: a fixed size pins a class; a symbolic name is one variable per graph
  (the main graph's names are global, a body's are its own);
- shape-keeping ops (unary elementwise, Cast, Identity...) and Transpose's permutation;
- Concat: every non-axis dim of every operand and of the result;
- MatMul and Gemm: the contraction dims, and the result's rows and columns;
- Scan's contract at every version: an outer state has its body state's shape (Scan-8:
  batch in front), a body's state output its state input's, an outer scan input or output
  is the body's slice with the sequence axis inserted, all of them share one trip count
  (Scan-8: one batch too);
- provenance of shape tensors: ``Shape -> Gather/Slice/Concat/Unsqueeze/Squeeze/Cast ->
  ConstantOfShape / Expand / Reshape`` makes the result's axis the dim it was read from.

These are *exact*: a pass may rely on them (:meth:`DimClasses.same`). Elementwise
broadcasting of equal-rank operands (Add, Mul, ...) only says "equal, or one of them is
1", a Loop-carried value may change shape per iteration and an If's branches may differ:
those are kept apart (``likely=True``) for feed synthesis, which wants consistent sizes
but proves nothing with them.
"""

from __future__ import annotations

import math

import onnx

from scanopt.protos import in_default_domain
from scanopt.shapes import ELEMENTWISE, SHAPE_PRESERVING, einsum_terms, inferred_model  # noqa: F401 - re-exported

Key = tuple  # ("v", value name, axis) | ("s", graph id, symbol)
Element = tuple | int | None  # what one element of a 1-D int tensor is: a dim key, a constant, or unknown


def find_root(parent, key):
    """The root of ``key`` in a union-find forest ``parent`` (a list or a dict: key -> parent),
    compressing the path iteratively (bodies nest deep enough to overflow recursion)."""
    root = key
    while parent[root] != root:
        root = parent[root]
    while parent[key] != root:
        parent[key], key = root, parent[key]
    return root


class SizedUnionFind:
    """Union-find over dims whose root may be pinned to a size. Two classes pinned to
    different sizes stay apart (contradictory declarations: running the model decides);
    subclasses hear of that in :meth:`_conflict` and carry their own per-root facts over
    in :meth:`_merged`."""

    def __init__(self):
        self.parent: dict = {}
        self.size: dict = {}  # a root's fixed size

    def find(self, key):
        self.parent.setdefault(key, key)
        return find_root(self.parent, key)

    def union(self, a, b) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        sa, sb = self.size.get(ra), self.size.get(rb)
        if sa is not None and sb is not None and sa != sb:
            self._conflict(ra, sa, sb)
            return
        self.parent[rb] = ra
        if sa is None and sb is not None:
            self.size[ra] = sb
        self._merged(ra, rb)

    def pin(self, key, size: int) -> None:
        self.size.setdefault(self.find(key), size)

    def _conflict(self, root, size_a: int, size_b: int) -> None:
        pass

    def _merged(self, root, absorbed) -> None:
        pass


class DimClasses:
    """Equivalence classes of the dims of every value of ``model``, at every level.

    ``same((name, axis), (name, axis))`` is True only when the ops prove them equal;
    ``same(..., likely=True)`` also counts equal-rank elementwise broadcasting. Names are
    the model's value names (unique across levels, as ONNX requires); negative axes count
    from the end when the rank is known.
    """

    def __init__(self, model: onnx.ModelProto, *, inferred: bool = False):
        self._exact = SizedUnionFind()
        self._likely = SizedUnionFind()
        self._rank: dict[str, int] = {}
        self._elements: dict[str, list[Element]] = {}  # 1-D int tensors: what each element is
        self._trips: list[Key] = []  # one per Scan: its trip count
        if not inferred:  # ``inferred``: the caller passes a model shape inference already ran on
            model = inferred_model(model) or model
        self._main = model.graph
        self.incomplete: str | None = None  # why the walk stopped early, if it did
        try:
            self._walk(model.graph)
        except Exception as exc:  # noqa: BLE001 - every fact found so far is still true
            self.incomplete = f"{type(exc).__name__}: {exc}"

    # -- queries -----------------------------------------------------------------------------

    def same(self, a: tuple[str, int], b: tuple[str, int], *, likely: bool = False) -> bool:
        ka, kb = self._key(*a), self._key(*b)
        if ka is None or kb is None:
            return False
        uf = self._likely if likely else self._exact
        return ka == kb or uf.find(ka) == uf.find(kb)

    def root(self, name: str, axis: int, *, likely: bool = False) -> Key | None:
        """A token naming the class of ``name``'s ``axis`` (equal tokens: equal dims)."""
        key = self._key(name, axis)
        if key is None:
            return None
        return (self._likely if likely else self._exact).find(key)

    def is_trip_count(self, name: str, axis: int) -> bool:
        """True when ``name``'s ``axis`` is (likely) some Scan's sequence length."""
        key = self._key(name, axis)
        if key is None:
            return False
        root = self._likely.find(key)
        return any(self._likely.find(trip) == root for trip in self._trips)

    def size(self, name: str, axis: int) -> int | None:
        """The fixed size the class of ``name``'s ``axis`` is declared to have, if any."""
        key = self._key(name, axis)
        return None if key is None else self._exact.size.get(self._exact.find(key))

    def rank(self, name: str) -> int | None:
        return self._rank.get(name)

    def _key(self, name: str, axis: int) -> Key | None:
        rank = self._rank.get(name)
        if axis < 0:
            if rank is None:
                return None
            axis += rank
        if axis < 0 or (rank is not None and axis >= rank):
            return None
        return ("v", name, axis)

    # -- facts -------------------------------------------------------------------------------

    def _equal(self, a: Key | None, b: Key | None) -> None:
        if a is not None and b is not None:
            self._exact.union(a, b)
            self._likely.union(a, b)

    def _maybe_equal(self, a: Key | None, b: Key | None) -> None:
        if a is not None and b is not None:
            self._likely.union(a, b)

    def _axis(self, name: str, axis: int) -> Key | None:
        return self._key(name, axis) if name else None

    def _declare(self, value: onnx.ValueInfoProto, graph: onnx.GraphProto) -> None:
        if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
            return
        dims = value.type.tensor_type.shape.dim
        self._rank.setdefault(value.name, len(dims))
        scope = 0 if graph is self._main else id(graph)
        for axis, dim in enumerate(dims):
            key = ("v", value.name, axis)
            if dim.HasField("dim_value"):
                self._exact.pin(key, dim.dim_value)
                self._likely.pin(key, dim.dim_value)
            elif dim.dim_param:
                self._equal(key, ("s", scope, dim.dim_param))

    def _declare_all(self, graph: onnx.GraphProto) -> None:
        for value in list(graph.input) + list(graph.output) + list(graph.value_info):
            self._declare(value, graph)

    def _walk(self, graph: onnx.GraphProto) -> None:
        self._declare_all(graph)
        for init in graph.initializer:
            self._rank.setdefault(init.name, len(init.dims))
            for axis, size in enumerate(init.dims):
                self._exact.pin(("v", init.name, axis), size)
                self._likely.pin(("v", init.name, axis), size)
            if init.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and len(init.dims) <= 1:
                self._constant_elements(init.name, init)
        for node in graph.node:
            if not in_default_domain(node.domain):
                continue
            try:
                self._node(node, graph)
            except (IndexError, ValueError, KeyError):  # a malformed node proves nothing
                continue

    def _constant_elements(self, name: str, tensor: onnx.TensorProto) -> None:
        if tensor.data_type not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) or len(tensor.dims) > 1:
            return
        values = onnx.numpy_helper.to_array(tensor).reshape(-1)
        if values.size <= 64:
            self._elements[name] = [int(v) for v in values]

    def _node(self, node: onnx.NodeProto, graph: onnx.GraphProto) -> None:
        op, ins, outs = node.op_type, list(node.input), list(node.output)
        attrs = {a.name: a for a in node.attribute}
        if not outs:
            return
        out = outs[0]
        if op == "Constant" and "value" in attrs:
            self._rank.setdefault(out, len(attrs["value"].t.dims))
            self._constant_elements(out, attrs["value"].t)
        elif op in SHAPE_PRESERVING and ins:
            self._same_shape(ins[0], out)
            if op in ("Identity", "Cast") and ins[0] in self._elements:
                self._elements[out] = self._elements[ins[0]]
        elif op == "Transpose" and ins:
            rank = self._rank.get(ins[0])
            perm = list(attrs["perm"].ints) if "perm" in attrs else (list(range(rank))[::-1] if rank else None)
            for j, i in enumerate(perm or ()):
                self._equal(self._axis(out, j), self._axis(ins[0], i))
        elif op == "Concat":
            self._concat(ins, out, attrs["axis"].i if "axis" in attrs else 0)
        elif op in ELEMENTWISE:
            self._broadcast(ins, out)
        elif op == "MatMul" and len(ins) == 2:
            self._matmul(ins[0], ins[1], out)
        elif op == "Gemm" and len(ins) >= 2:
            ta = bool(attrs["transA"].i) if "transA" in attrs else False
            tb = bool(attrs["transB"].i) if "transB" in attrs else False
            a, b = ins[0], ins[1]
            self._equal(self._axis(a, 0 if ta else 1), self._axis(b, 1 if tb else 0))
            self._equal(self._axis(out, 0), self._axis(a, 1 if ta else 0))
            self._equal(self._axis(out, 1), self._axis(b, 0 if tb else 1))
        elif op == "Scan" and "body" in attrs:
            self._scan(node, attrs, graph)
        elif op == "Loop" and "body" in attrs:
            self._loop(node, attrs["body"].g)
        elif op == "Gather" and len(ins) == 2:
            self._gather(ins[0], ins[1], out, attrs["axis"].i if "axis" in attrs else 0)
            self._shape_provenance(op, ins, out, attrs)
        elif op == "Einsum" and "equation" in attrs:
            self._einsum(ins, out, attrs["equation"].s)
        elif op == "Split" and ins:
            axis = attrs["axis"].i if "axis" in attrs else 0
            for name in outs:
                self._same_shape_but(ins[0], name, axis)
        elif op in ("Unsqueeze", "Squeeze") and ins:
            self._unsqueeze(op, ins, out, attrs)
            self._shape_provenance(op, ins, out, attrs)
        elif op == "If":
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    self._walk(attr.g)
                    for value, name in zip(attr.g.output, outs):  # the branches may differ
                        self._same_shape(value.name, name, exact=False)
        else:
            self._shape_provenance(op, ins, out, attrs)

    def _same_shape(self, a: str, b: str, *, exact: bool = True) -> None:
        rank = self._rank.get(a, self._rank.get(b))
        if rank is None:
            return
        self._rank.setdefault(a, rank)
        self._rank.setdefault(b, rank)
        if self._rank[a] != self._rank[b]:
            return
        unify = self._equal if exact else self._maybe_equal
        for axis in range(rank):
            unify(("v", a, axis), ("v", b, axis))

    def _same_shape_but(self, a: str, b: str, axis: int) -> None:
        rank = self._rank.get(a)
        if rank is None or self._rank.get(b, rank) != rank:
            return
        self._rank.setdefault(b, rank)
        for other in range(rank):
            if other != (axis + rank if axis < 0 else axis):
                self._equal(("v", a, other), ("v", b, other))

    def _einsum(self, ins: list[str], out: str, equation: bytes) -> None:
        """One letter is one dim in every term (explicit form, no ellipsis). Likely only: a
        letter's dim of 1 may broadcast in some implementations."""
        parsed = einsum_terms(equation)
        if parsed is None:
            return
        terms, result = parsed
        if len(terms) != len(ins):
            return
        seen: dict[str, Key] = {}
        for name, term in list(zip(ins, terms)) + [(out, result)]:
            if not name or self._rank.get(name, len(term)) != len(term):
                continue
            self._rank.setdefault(name, len(term))
            for axis, letter in enumerate(term):
                key = ("v", name, axis)
                if letter in seen:
                    self._maybe_equal(seen[letter], key)
                else:
                    seen[letter] = key

    def _unsqueeze(self, op: str, ins: list[str], out: str, attrs: dict) -> None:
        """The data axes an Unsqueeze or Squeeze keeps, by its constant axes."""
        if "axes" in attrs:
            axes = list(attrs["axes"].ints)
        elif len(ins) > 1 and all(isinstance(e, int) for e in self._elements.get(ins[1], [None])):
            axes = self._elements[ins[1]]
        else:
            return
        rank = self._rank.get(ins[0])
        if rank is None:
            return
        wide = rank + len(axes) if op == "Unsqueeze" else rank
        marked = {a + wide if a < 0 else a for a in axes}
        kept = [a for a in range(wide) if a not in marked]
        if len(kept) != (rank if op == "Unsqueeze" else wide - len(marked)):
            return
        self._rank.setdefault(out, wide - len(marked) if op == "Squeeze" else wide)
        for narrow, axis in enumerate(kept):
            if op == "Unsqueeze":
                self._equal(("v", ins[0], narrow), ("v", out, axis))
            else:
                self._equal(("v", ins[0], axis), ("v", out, narrow))

    def _concat(self, ins: list[str], out: str, axis: int) -> None:
        rank = self._rank.get(out) or next((self._rank[n] for n in ins if n in self._rank), None)
        if rank is None:
            return
        axis = axis + rank if axis < 0 else axis
        for name in ins:
            if self._rank.get(name) != rank:
                continue
            for other in range(rank):
                if other != axis:
                    self._equal(("v", name, other), ("v", out, other))
        if rank == 1 and axis == 0:  # a shape being built: its elements, in order
            parts = [self._elements.get(n) for n in ins if n]
            if all(p is not None for p in parts):
                self._elements[out] = [e for p in parts for e in p]

    def _broadcast(self, ins: list[str], out: str) -> None:
        """Multidirectional broadcasting, axes aligned from the right. Where one operand alone
        reaches an output axis (the others are shorter or declared 1 there) the output axis
        is that operand's: exact. Where several do, each is equal to the others unless it is 1
        at run time: likely only."""
        ranked = [n for n in ins if n and n in self._rank]
        if not ranked or len(ranked) < len([n for n in ins if n]):
            return
        rank = max(self._rank[n] for n in ranked)
        if self._rank.get(out, rank) != rank:
            return
        self._rank.setdefault(out, rank)
        for axis in range(rank):
            keys = []
            for name in ranked:
                own = axis - (rank - self._rank[name])
                if own >= 0 and self._exact.size.get(self._exact.find(("v", name, own))) != 1:
                    keys.append(("v", name, own))
            if len(keys) == 1:
                self._equal(keys[0], ("v", out, axis))
            for key in keys[1:] if len(keys) > 1 else ():
                self._maybe_equal(keys[0], key)
                self._maybe_equal(keys[0], ("v", out, axis))

    def _matmul(self, a: str, b: str, out: str) -> None:
        ra, rb = self._rank.get(a), self._rank.get(b)
        if ra is None or rb is None:
            return
        if rb == 1:
            self._equal(self._axis(a, ra - 1), self._axis(b, 0))
        elif ra >= 1:
            self._equal(self._axis(a, ra - 1), self._axis(b, rb - 2))
            self._equal(self._axis(out, -1), self._axis(b, rb - 1))
        if ra >= 2:
            self._equal(self._axis(out, -2 if rb >= 2 else -1), self._axis(a, ra - 2))

    # -- shape tensors -----------------------------------------------------------------------

    def _shape_provenance(self, op: str, ins: list[str], out: str, attrs: dict) -> None:
        """Follow 1-D int tensors that hold dims, and bind the axes of what they shape."""
        elements = self._elements
        if op == "Shape" and ins and ins[0] in self._rank:
            rank = self._rank[ins[0]]
            start = attrs["start"].i if "start" in attrs else 0
            end = attrs["end"].i if "end" in attrs else rank
            start, end = (max(0, min(rank, v + rank if v < 0 else v)) for v in (start, end))
            elements[out] = [("v", ins[0], axis) for axis in range(start, end)]
        elif op == "Gather" and len(ins) == 2 and ins[0] in elements and ins[1] in elements:
            axis = attrs["axis"].i if "axis" in attrs else 0
            source, index = elements[ins[0]], elements[ins[1]]
            if axis == 0 and all(isinstance(i, int) and -len(source) <= i < len(source) for i in index):
                elements[out] = [source[i] for i in index]
        elif op in ("Unsqueeze", "Squeeze") and ins and ins[0] in elements:
            elements[out] = elements[ins[0]]
        elif op == "Slice" and len(ins) >= 3 and ins[0] in elements:
            starts, ends = elements.get(ins[1]), elements.get(ins[2])
            steps = elements.get(ins[4]) if len(ins) > 4 and ins[4] else [1]
            if starts and ends and steps and len(starts) == 1 and all(isinstance(v, int) for v in starts + ends + steps):
                elements[out] = elements[ins[0]][slice(starts[0], ends[0], steps[0])]
        elif op == "ConstantOfShape" and ins and ins[0] in elements:
            for axis, element in enumerate(elements[ins[0]]):
                self._bind(out, axis, element)
        elif op == "Reshape" and len(ins) >= 2 and ins[1] in elements:
            allowzero = bool(attrs["allowzero"].i) if "allowzero" in attrs else False
            target = elements[ins[1]]
            for axis, element in enumerate(target):
                if element == 0 and not allowzero:
                    self._equal(self._axis(out, axis), self._axis(ins[0], axis))
                else:
                    self._bind(out, axis, element)
            self._reshape_inferred_axis(ins[0], out, target)
        elif op == "Expand" and len(ins) >= 2 and ins[1] in elements:
            target = elements[ins[1]]
            rank = self._rank.get(ins[0])
            for axis, element in enumerate(target):
                source_axis = None if rank is None else axis - (len(target) - rank)
                source_size = None
                if rank is not None and source_axis is not None and source_axis >= 0:
                    source_size = self._exact.size.get(self._exact.find(("v", ins[0], source_axis)))
                if rank is not None and (source_axis < 0 or source_size == 1):
                    self._bind(out, axis, element)  # the target alone decides this axis
                elif element == 1 and source_axis is not None and source_axis >= 0:
                    self._equal(self._axis(out, axis), self._axis(ins[0], source_axis))

    def _reshape_inferred_axis(self, source: str, out: str, target: list[Element]) -> None:
        """A Reshape's -1 is the one unsized dim of its input when every other dim on both
        sides is a known size and the sizes match (tf2onnx's Reshape(mask [B], [-1, 1]))."""
        rank = self._rank.get(source)
        if rank is None or target.count(-1) != 1 or not all(isinstance(e, int) and e > 0 for e in target if e != -1):
            return
        sizes = [self._exact.size.get(self._exact.find(("v", source, a))) for a in range(rank)]
        unsized = [a for a, size in enumerate(sizes) if size is None]
        known = [s for s in sizes if s is not None]
        if len(unsized) == 1 and math.prod(known) == math.prod(e for e in target if e != -1):
            self._equal(("v", out, target.index(-1)), ("v", source, unsized[0]))

    def _bind(self, name: str, axis: int, element: Element) -> None:
        key = self._axis(name, axis) or ("v", name, axis)
        if isinstance(element, tuple):
            self._equal(key, element)
        elif isinstance(element, int) and element >= 0:
            self._exact.pin(key, element)
            self._likely.pin(key, element)

    # -- control flow ------------------------------------------------------------------------

    def _scan(self, node: onnx.NodeProto, attrs: dict, graph: onnx.GraphProto) -> None:
        body = attrs["body"].g
        self._declare_all(body)
        m = attrs["num_scan_inputs"].i if "num_scan_inputs" in attrs else 0
        v8 = "scan_input_axes" not in attrs and self._is_scan8(node, body, m)
        operands = list(node.input)[1:] if v8 else list(node.input)
        n = len(operands) - m
        if n < 0 or len(body.input) != len(operands) or len(body.output) < n:
            return
        lead = [("scan", id(node), "batch")] if v8 else []
        trip = ("scan", id(node), "trip")
        self._trips.append(trip)
        in_axes = list(attrs["scan_input_axes"].ints) if "scan_input_axes" in attrs else [0] * m
        out_axes = list(attrs["scan_output_axes"].ints) if "scan_output_axes" in attrs else [0] * (len(node.output) - n)
        if v8 and node.input and node.input[0]:
            self._equal(self._axis(node.input[0], 0), lead[0])
        for i, outer in enumerate(operands):
            inner = body.input[i].name
            if i < n:
                self._contract(outer, inner, lead, None, 0)
                self._same_shape(inner, body.output[i].name)
                if i < len(node.output):
                    self._contract(node.output[i], body.output[i].name, lead, None, 0)
            else:
                axis = 1 if v8 else (in_axes[i - n] if i - n < len(in_axes) else 0)
                self._contract(outer, inner, lead, trip, axis)
        for k, outer in enumerate(list(node.output)[n:]):
            if n + k < len(body.output):
                axis = 1 if v8 else (out_axes[k] if k < len(out_axes) else 0)
                self._contract(outer, body.output[n + k].name, lead, trip, axis)
        self._walk(body)

    def _is_scan8(self, node: onnx.NodeProto, body: onnx.GraphProto, m: int) -> bool:
        """Scan-8 has sequence_lens in front: one more operand than body inputs."""
        return len(node.input) == len(body.input) + 1

    def _contract(self, outer: str, inner: str, lead: list, trip, axis: int) -> None:
        """outer = lead + inner, with ``trip`` inserted at ``axis`` (of outer) when given."""
        if not outer:
            return
        rank = self._rank.get(inner)
        outer_rank = self._rank.get(outer)
        if rank is None and outer_rank is not None:
            rank = outer_rank - len(lead) - (trip is not None)
        if rank is None or rank < 0:
            return
        full = rank + len(lead) + (trip is not None)
        if outer_rank is not None and outer_rank != full:
            return
        self._rank.setdefault(outer, full)
        self._rank.setdefault(inner, rank)
        inner_axes: list = [("v", inner, a) for a in range(rank)]
        if trip is not None:
            axis = axis + full if axis < 0 else axis
            if lead:  # Scan-8: batch axis 0, sequence axis 1
                layout = lead + [trip] + inner_axes
            elif 0 <= axis <= rank:
                layout = inner_axes[:axis] + [trip] + inner_axes[axis:]
            else:
                return
        else:
            layout = lead + inner_axes
        for a, key in enumerate(layout):
            self._equal(("v", outer, a), key)

    def _gather(self, data: str, indices: str, out: str, axis: int) -> None:
        """Gather's result is data's shape with ``axis`` replaced by the indices' shape."""
        rank, index_rank = self._rank.get(data), self._rank.get(indices)
        if rank is None or index_rank is None:
            return
        axis = axis + rank if axis < 0 else axis
        if not 0 <= axis < rank:
            return
        self._rank.setdefault(out, rank - 1 + index_rank)
        if self._rank[out] != rank - 1 + index_rank:
            return
        for j in range(rank):
            if j != axis:
                self._equal(("v", out, j if j < axis else j - 1 + index_rank), ("v", data, j))
        for j in range(index_rank):
            self._equal(("v", out, axis + j), ("v", indices, j))

    def _loop_reads(self, node: onnx.NodeProto, body: onnx.GraphProto) -> None:
        """An outer tensor a Loop body gathers one row of per step (``Gather(x, i)``, axis 0,
        a scalar index the body receives) has likely as many rows as the Loop has trips,
        when the trip count is a dim: the per-step reads of TorchScript, tf2onnx's
        TensorList reads. Likely only (the index could stop early or skip): feeds want it."""
        trip = self._elements.get(node.input[0]) if node.input and node.input[0] else None
        if not trip or len(trip) != 1 or not isinstance(trip[0], tuple):
            return
        local = {v.name for v in body.input} | {t.name for t in body.initializer}
        local |= {o for n in body.node for o in n.output}
        received = {v.name for v in body.input}
        for inner in body.node:
            attrs = {a.name: a for a in inner.attribute}
            axis = attrs["axis"].i if "axis" in attrs else 0
            if (inner.op_type == "Gather" and in_default_domain(inner.domain) and len(inner.input) == 2
                    and inner.input[0] not in local and inner.input[1] in received and axis == 0
                    and self._rank.get(inner.input[1]) == 0):
                self._maybe_equal(self._axis(inner.input[0], 0), trip[0])

    def _loop(self, node: onnx.NodeProto, body: onnx.GraphProto) -> None:
        self._declare_all(body)
        self._loop_reads(node, body)
        carried = list(node.input)[2:]
        for k, outer in enumerate(carried):  # Loop-carried shapes may change per iteration
            if k + 2 < len(body.input) and outer:
                self._same_shape(outer, body.input[k + 2].name, exact=False)
                if k + 1 < len(body.output):
                    self._same_shape(body.input[k + 2].name, body.output[k + 1].name, exact=False)
                if k < len(node.output):
                    self._same_shape(node.output[k], body.input[k + 2].name, exact=False)
        self._walk(body)
