"""The shapes a model's graph inputs can take, from everything the model says about them.

A graph input often declares no shape, or only symbolic dims, while the model pins the
sizes elsewhere: a Scan body declares its state as [1], an input feeds a MatMul with a
[3, 4] weight, a Reshape to a constant shape. Binding each unknown dim on its own then
gives inputs the model rejects, and verification proves nothing. Here every dim of
every graph input is a variable; declarations unify them:

- the graph's own declarations (a symbolic name is one variable across all inputs);
- Scan's shape contract, at every nesting level: an outer state has its body input's
  shape (Scan-8: with the batch axis in front), a body's state output has its state
  input's shape, an outer scan input is the body's slice with the sequence axis
  inserted at its axis (Scan-8: batch axis 0, sequence axis 1), and all scan inputs of
  one Scan share one sequence length (its trip count) and, for Scan-8, one batch;
- Loop's: a body's loop-carried input has the shape of the node's operand;
- onnx shape inference, for operands computed from graph inputs (symbolic dims carry);
- what ops require (scanopt.dims: Concat, MatMul, broadcasting, Shape provenance...), so
  dims exporters name apart (tf2onnx's ``unk__N``) get one size when they are one dim;
- hints where a size is only likely: initializer dims an input meets in an elementwise
  op, MatMul/Gemm weights, Reshape and Expand targets.

:meth:`InputShapes.attempts` then turns variables into sizes: the seed's preferred sizes
first (trip counts reach past unroll thresholds), then all-ones and a few others. The
caller runs the model on each attempt and keeps the first one it accepts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import onnx

from scanopt.dims import ELEMENTWISE, SHAPE_PRESERVING, DimClasses, SizedUnionFind
from scanopt.shapes import inferred_model
from scanopt.protos import in_default_domain, walk_proto_graphs
from scanopt.validate import default_opset

# Sizes given to free dims (trip counts apart, below): at seed 0 the i-th distinct symbolic
# name gets FIRST_SEED_SIZES[i % len] -- every dim at least 2 and distinct from its neighbours,
# so a batch of 2+ runs beside a long sequence (issue 20: T >= 2 and B >= 2 at one seed) and a
# swapped pair of dims shows; at seed 1 every free dim is 1 (what broadcasts); later seeds mix
# them: DIM_SIZES[(seed + i) % len]. Unnamed dims share the first name's size (two of them
# often meet in one elementwise op).
FIRST_SEED_SIZES = (8, 3, 5, 2)
DIM_SIZES = (8, 1, 3, 2)


def free_size(seed: int, index: int) -> int:
    """The size of the ``index``-th free symbolic dim (in input order, trip counts apart) at ``seed``."""
    if seed == 0:
        return FIRST_SEED_SIZES[index % len(FIRST_SEED_SIZES)]
    if seed == 1:
        return 1
    return DIM_SIZES[(seed + index) % len(DIM_SIZES)]
# Sizes given to free trip counts (a Scan's sequence axis). Seed 0 runs a long sequence
# (LONG_TRIP, issue 19: wrong only past step 12 must be caught, and float drift that grows
# with the length must show), seed 1 a single step, later seeds the sizes in between that
# sit around the unroll threshold (4). Every trip count a rewrite depends on is static (the
# unroll pass takes only static lengths), and a static length is fed as declared, so
# LONG_TRIP only has to be long, not larger than a threshold. The synthesizer shortens it
# when the feeds would not fit the memory budget (scanopt.inputs).
LONG_TRIP = 64
TRIP_SIZES = (LONG_TRIP, 1, 9, 5, 3, 12, 2)
# Only one free trip count (the first, in input order) gets a long length; others get at most
# this: nested Scans multiply their lengths, and the reference executor steps in Python.
OTHER_TRIP_MAX = 12
# Fallback attempts after the seed's preferred sizes, in order: (free size, use hints).
FALLBACKS = ((1, True), (1, False), (2, True), (3, True))

# Ops whose output has their first input's shape: an undeclared input behind a chain of
# them gets the shape its consumer implies (SHAPE_PRESERVING, from scanopt.dims).


class _Dims(SizedUnionFind):
    """Dim variables (numbered in creation order) with what feeds need per class: a label
    users recognize (the symbolic name, or input[axis]), whether it is a trip count, a
    likely size; contradictory pins are kept as conflicts for the report."""

    def __init__(self):
        super().__init__()
        self.label: dict[int, str] = {}
        self.trip: set[int] = set()
        self.hint: dict[int, int] = {}
        self.conflicts: list[str] = []

    def new(self, size: int | None = None, label: str | None = None) -> int:
        var = len(self.parent)
        self.parent[var] = var
        if size is not None:
            self.size[var] = size
        if label:
            self.label[var] = label
        return var

    def _conflict(self, root: int, size_a: int, size_b: int) -> None:
        self.conflicts.append(f"{self.name(root)} is declared {size_a} in one place and {size_b} in another")

    def _merged(self, root: int, absorbed: int) -> None:
        if root not in self.label and absorbed in self.label:
            self.label[root] = self.label[absorbed]
        if absorbed in self.trip:
            self.trip.add(root)
        if root not in self.hint and absorbed in self.hint:
            self.hint[root] = self.hint[absorbed]

    def name(self, var: int) -> str:
        return self.label.get(self.find(var), f"dim{var}")


Template = list[int]  # one dim variable per axis


@dataclass(frozen=True)
class Attempt:
    """One assignment of sizes to every graph input, and how it was chosen."""

    shapes: dict[str, tuple[int, ...]]
    sizes: dict[str, int]  # the free dims by label, for the report
    kind: str  # "seed" or "fallback"

    def describe(self) -> str:
        if not self.sizes:
            return "declared sizes"
        shown = list(self.sizes.items())[:6]
        more = f" +{len(self.sizes) - 6} more" if len(self.sizes) > 6 else ""
        return " ".join(f"{k}={v}" for k, v in shown) + more


class InputShapes:
    """Templates of the required graph inputs; :meth:`attempts` gives concrete shapes per seed."""

    def __init__(self, model: onnx.ModelProto, names: list[str]):
        self.dims = _Dims()
        self.names = names
        self._main = model.graph
        self._symbols: dict[tuple[int, str], int] = {}  # (graph id, symbolic name) -> var
        self._main_symbols: list[int] = []  # vars of symbolic names, in first-seen order
        self.templates: dict[str, Template | None] = {}
        self._initializers: dict[str, tuple[int, ...]] = {}
        self._constants: dict[str, list[int]] = {}
        self._inferred: dict[str, onnx.ValueInfoProto] = {}
        graph = self._main
        declared = {v.name: v for v in graph.input}
        for name in names:
            self.templates[name] = self._template(declared[name], graph, name)
        self._read_constants(model)
        self._read_inference(model)
        opset = default_opset(model) or 0
        self._producers = self._shape_keeping_producers(graph)
        env = {name: t for name, t in self.templates.items() if t is not None}
        try:
            self._constrain(graph, env, opset)
        except Exception as exc:  # noqa: BLE001 - a model this walk misreads still gets its declared shapes
            self.dims.conflicts.append(f"shape derivation stopped: {type(exc).__name__}: {exc}")
        self._unify_by_ops(model)
        # An input no declaration reaches keeps an unknown rank (None).

    def _unify_by_ops(self, model: onnx.ModelProto) -> None:
        """One variable per class of scanopt.dims (what ops require, not what names say:
        tf2onnx's ``unk__N`` dims are all distinct), broadcasting included: feeds must be
        consistent, they need not prove anything."""
        inferred = getattr(self, "_inferred_model", None)
        classes = DimClasses(inferred, inferred=True) if inferred is not None else DimClasses(model)
        if classes.incomplete:
            self.dims.conflicts.append(f"dim unification stopped: {classes.incomplete}")
        first: dict = {}
        for name in self.names:
            for axis, var in enumerate(self.templates.get(name) or ()):
                root = classes.root(name, axis, likely=True)
                if root is not None:
                    self.dims.union(first.setdefault(root, var), var)

    # -- templates ---------------------------------------------------------------------

    def _template(self, value: onnx.ValueInfoProto, graph: onnx.GraphProto, owner: str) -> Template | None:
        """Variables for a declared value's axes; None when the rank is not declared."""
        if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
            return None
        template = []
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                template.append(self.dims.new(dim.dim_value, f"{owner}[{axis}]"))
            elif dim.dim_param:
                template.append(self._symbol(graph, dim.dim_param))
            else:
                template.append(self.dims.new(None, f"{owner}[{axis}]"))
        return template

    def _symbol(self, graph: onnx.GraphProto, name: str) -> int:
        """One variable per symbolic name per graph (the main graph's names are global)."""
        key = (0 if graph is self._main else id(graph), name)
        if key not in self._symbols:
            self._symbols[key] = self.dims.new(None, name)
            if key[0] == 0:
                self._main_symbols.append(self._symbols[key])
        return self._symbols[key]

    def _read_constants(self, model: onnx.ModelProto) -> None:
        for graph in walk_proto_graphs(model.graph):
            for init in graph.initializer:
                self._initializers[init.name] = tuple(init.dims)
                if init.data_type == onnx.TensorProto.INT64 and len(init.dims) == 1 and init.dims[0] <= 8:
                    self._constants[init.name] = [int(v) for v in onnx.numpy_helper.to_array(init)]
            for node in graph.node:
                if node.op_type == "Constant" and in_default_domain(node.domain) and node.output:
                    value = next((a.t for a in node.attribute if a.name == "value"), None)
                    if value is not None:
                        self._initializers[node.output[0]] = tuple(value.dims)
                        if value.data_type == onnx.TensorProto.INT64 and len(value.dims) == 1 and value.dims[0] <= 8:
                            self._constants[node.output[0]] = [int(v) for v in onnx.numpy_helper.to_array(value)]

    def _read_inference(self, model: onnx.ModelProto) -> None:
        """Shapes onnx infers for computed values (symbolic dims propagate by name)."""
        inferred = inferred_model(model)  # shared with the pipeline's ShapeTable of this model
        self._inferred_model = inferred  # for _unify_by_ops: one inference, not two
        if inferred is None:
            return
        for graph in walk_proto_graphs(inferred.graph):
            for value in graph.value_info:
                self._inferred.setdefault(value.name, value)

    def _lookup(self, name: str, env: dict[str, Template], graph: onnx.GraphProto) -> Template | None:
        """The template of an operand: known, or from shape inference (computed values)."""
        if name in env:
            return env[name]
        if self.templates.get(name) is not None:  # a graph input sized inside a nested body
            return self.templates[name]
        if name in self._initializers:
            env[name] = [self.dims.new(d, f"{name}[{i}]") for i, d in enumerate(self._initializers[name])]
            return env[name]
        if name in self._inferred:
            template = self._template(self._inferred[name], self._main, name)
            if template is not None:
                if self._undeclared(name):  # computed from an undeclared input: that input gets it
                    self._set_input(name, template, env)
                env[name] = template
            return template
        return None

    # -- constraints -----------------------------------------------------------------------

    def _shape_keeping_producers(self, graph: onnx.GraphProto) -> dict[str, tuple[str, list[int] | None]]:
        """output -> (input, perm) for main-graph ops whose output has their input's shape
        (perm: a Transpose's): unary elementwise ops, Transpose, and Slices that keep every
        element (PyTorch's flip is a Slice from -1 to INT64_MIN with step -1)."""
        producers = {}
        for node in graph.node:
            if not in_default_domain(node.domain) or not node.input or not node.output:
                continue
            if node.op_type in SHAPE_PRESERVING or (node.op_type == "Slice" and self._whole_slice(node)):
                producers[node.output[0]] = (node.input[0], None)
            elif node.op_type == "Transpose":
                perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
                if perm is not None:
                    producers[node.output[0]] = (node.input[0], perm)
        return producers

    def _whole_slice(self, node) -> bool:
        ins = list(node.input) + [""] * 5
        starts, ends, steps = (self._constants.get(n) for n in (ins[1], ins[2], ins[4]))
        if starts is None or ends is None or (ins[4] and steps is None):
            return False
        steps = steps or [1] * len(starts)
        big = 2**31 - 1
        return all(
            (step == 1 and start == 0 and end >= big) or (step == -1 and (start == -1 or start >= big) and end <= -big)
            for start, end, step in zip(starts, ends, steps)
        )

    def _behind(self, name: str):
        """(graph input or None, [perms]) reached from ``name`` through shape-keeping ops."""
        perms, seen = [], set()
        while name not in self.templates and name in self._producers and name not in seen:
            seen.add(name)
            name, perm = self._producers[name]
            perms.append(perm)
        return (name if name in self.templates else None), perms

    def _set_input(self, name: str, template: Template, env: dict[str, Template]) -> None:
        """Give a graph input without a declared rank (or one behind shape-keeping ops)
        the template its use implies."""
        env[name] = template
        source, perms = self._behind(name)
        for perm in perms:
            if perm is not None:
                if sorted(perm) != list(range(len(template))):
                    return
                unpermuted = [0] * len(template)
                for axis, var in zip(perm, template):  # output axis j is input axis perm[j]
                    unpermuted[axis] = var
                template = unpermuted
        if source is not None and self.templates[source] is None:
            self.templates[source] = env[source] = template

    def _undeclared(self, name: str) -> bool:
        """True for a graph input of unknown rank, directly or behind shape-keeping ops."""
        source, _ = self._behind(name)
        return source is not None and self.templates[source] is None

    def _unify(self, a: Template, b: Template) -> None:
        if len(a) == len(b):
            for x, y in zip(a, b):
                self.dims.union(x, y)

    def _constrain(self, graph: onnx.GraphProto, env: dict[str, Template], opset: int) -> None:
        for node in graph.node:
            if not in_default_domain(node.domain):
                continue
            if node.op_type == "Scan":
                self._scan(node, graph, env, opset)
            elif node.op_type == "Loop":
                self._loop(node, graph, env, opset)
            elif node.op_type == "If":
                for attr in node.attribute:
                    if attr.type == onnx.AttributeProto.GRAPH:
                        self._constrain(attr.g, dict(env), opset)
            else:
                self._hints(node, graph, env)

    def _body_inputs(self, body: onnx.GraphProto) -> list[Template | None]:
        return [self._template(v, body, v.name) for v in body.input]

    def _body_outputs(self, body: onnx.GraphProto) -> list[Template | None]:
        return [self._template(v, body, v.name) for v in body.output]

    def _scan(self, node, graph, env, opset: int) -> None:
        attrs = {a.name: a for a in node.attribute}
        body = attrs["body"].g if "body" in attrs else None
        if body is None:
            return
        m = attrs["num_scan_inputs"].i if "num_scan_inputs" in attrs else 0
        v8 = opset < 9
        operands = list(node.input)[1:] if v8 else list(node.input)
        n = len(operands) - m
        if n < 0 or len(body.input) != len(operands):
            return  # malformed: validation reports it
        inner_in, inner_out = self._body_inputs(body), self._body_outputs(body)
        lead: list[int] = []
        if v8:
            lead = [self.dims.new(None, f"{node.name or 'Scan'}.batch")]
            if node.input and node.input[0]:
                lens = self._lookup(node.input[0], env, graph)
                if lens is None and self._undeclared(node.input[0]):
                    self._set_input(node.input[0], lead[:], env)
                elif lens is not None and len(lens) == 1:
                    self.dims.union(lead[0], lens[0])
        trip = self.dims.new(None, f"{node.name or 'Scan'}.length")
        self.dims.trip.add(trip)
        axes = [a for a in attrs["scan_input_axes"].ints] if "scan_input_axes" in attrs else [0] * m
        body_env = dict(env)
        for i, name in enumerate(operands):
            inner = inner_in[i]
            outer = self._lookup(name, env, graph) if name else None
            if i < n:  # state: outer = lead + inner; a body state output has its input's shape
                if inner is None and outer is not None and len(outer) >= len(lead):
                    inner = outer[len(lead):]
                if inner is not None:
                    if i < len(inner_out) and inner_out[i] is not None:
                        self._unify(inner, inner_out[i])
                    if outer is None and self._undeclared(name):
                        self._set_input(name, lead + inner, env)
                    elif outer is not None:
                        self._unify(outer, lead + inner)
            else:  # scan input: outer = lead + inner with the sequence axis inserted
                axis = 1 if v8 else (axes[i - n] if i - n < len(axes) else 0)
                rank = (len(inner) + 1 + len(lead)) if inner is not None else (len(outer) if outer is not None else None)
                if rank is None:
                    continue
                axis = axis + rank if axis < 0 else axis
                if v8:
                    if inner is None and outer is not None and len(outer) >= 2:
                        inner = outer[2:]
                    full = None if inner is None else lead + [trip] + inner
                else:
                    if inner is None and outer is not None and 0 <= axis < len(outer):
                        inner = outer[:axis] + outer[axis + 1:]
                    full = None if inner is None or not 0 <= axis <= len(inner) else inner[:axis] + [trip] + inner[axis:]
                if full is None:
                    continue
                if outer is None and self._undeclared(name):
                    self._set_input(name, full, env)
                elif outer is not None:
                    self._unify(outer, full)
            if inner is not None:
                body_env[body.input[i].name] = inner
        self._constrain(body, body_env, opset)

    def _loop(self, node, graph, env, opset: int) -> None:
        body = next((a.g for a in node.attribute if a.name == "body"), None)
        if body is None:
            return
        inner_in, inner_out = self._body_inputs(body), self._body_outputs(body)
        body_env = dict(env)
        for k, name in enumerate(list(node.input)[2:]):
            i = k + 2
            if i >= len(inner_in):
                break
            outer = self._lookup(name, env, graph) if name else None
            inner = inner_in[i] or outer
            if inner is None:
                continue
            if outer is not None:
                self._unify(outer, inner)
            elif self._undeclared(name):
                self._set_input(name, inner, env)
            if k + 1 < len(inner_out) and inner_out[k + 1] is not None:
                self._unify(inner, inner_out[k + 1])
            body_env[body.input[i].name] = inner
        self._constrain(body, body_env, opset)

    def _hints(self, node, graph, env) -> None:
        """Likely sizes of input dims from constants they meet (not binding: broadcasting may allow 1)."""
        ins = list(node.input)
        if node.op_type in ELEMENTWISE:
            consts = [self._initializers[n] for n in ins if n in self._initializers]
            for name in ins:
                template = env.get(name)
                if template is None or name in self._initializers:
                    continue
                for dims in consts:
                    for var, size in zip(reversed(template), reversed(dims)):
                        if size != 1:
                            self.dims.hint.setdefault(self.dims.find(var), size)
        elif node.op_type in ("MatMul", "Gemm") and len(ins) >= 2 and ins[0] in env and ins[1] in self._initializers:
            weight = self._initializers[ins[1]]
            transposed = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
            if len(weight) >= 2 and env[ins[0]]:
                k = weight[-1] if transposed else weight[-2]
                self.dims.hint.setdefault(self.dims.find(env[ins[0]][-1]), k)
        elif node.op_type in ("Reshape", "Expand") and len(ins) >= 2 and ins[0] in env and ins[1] in self._constants:
            target = self._constants[ins[1]]
            template = env[ins[0]]
            if node.op_type == "Expand":
                for var, size in zip(reversed(template), reversed(target)):
                    if size > 1:
                        self.dims.hint.setdefault(self.dims.find(var), size)
            elif len(target) == len(template) and all(s > 0 for s in target):
                for var, size in zip(template, target):
                    self.dims.hint.setdefault(self.dims.find(var), size)
            elif all(s > 0 for s in target):  # same element count: the free dims make up the rest
                roots = [self.dims.find(v) for v in template]
                free = [r for r in roots if r not in self.dims.size]
                fixed = math.prod(self.dims.size[r] for r in roots if r in self.dims.size)
                total = math.prod(target)
                if free and fixed and total % fixed == 0:
                    self.dims.hint.setdefault(free[0], total // fixed)
                    for root in free[1:]:
                        self.dims.hint.setdefault(root, 1)

    # -- sizes ---------------------------------------------------------------------------

    @property
    def conflicts(self) -> list[str]:
        """Declarations that disagree, and a derivation walk that stopped (with why)."""
        return list(self.dims.conflicts)

    def unknown_rank(self) -> list[str]:
        return [n for n in self.names if self.templates.get(n) is None]

    def attempts(self, seed: int, *, trip: int | None = None) -> Iterator[Attempt]:
        """The seed's preferred sizes, then the fallbacks (duplicates left out). ``trip``
        replaces the seed's size for free trip counts (to fit a memory budget)."""
        seen = set()
        preferred = self._assign(seed, None, True, trip)
        for attempt in (preferred, *(self._assign(seed, f, h) for f, h in FALLBACKS)):
            key = tuple(sorted(attempt.shapes.items()))
            if key not in seen:
                seen.add(key)
                yield attempt

    def trip_size(self, seed: int) -> int | None:
        """The size the seed gives free trip counts, or None when the inputs have none."""
        d = self.dims
        roots = {d.find(v) for n in self.names for v in self.templates.get(n) or ()}
        if any(r in d.trip and r not in d.size for r in roots):
            return TRIP_SIZES[seed % len(TRIP_SIZES)]
        return None

    def _assign(self, seed: int, free: int | None, hints: bool, trip: int | None = None) -> Attempt:
        d = self.dims
        symbols: dict = {}  # free symbols in input order, numbered without the trip counts
        for v in self._main_symbols:
            root = d.find(v)
            if root not in symbols and root not in d.trip and root not in d.size:
                symbols[root] = len(symbols)
        sizes: dict[int, int] = {}
        labels: dict[str, int] = {}
        long_given = False
        for name in self.names:
            for var in self.templates.get(name) or ():
                root = d.find(var)
                if root in sizes:
                    continue
                if root in d.size:
                    sizes[root] = d.size[root]
                    continue
                if hints and root in d.hint:
                    size = d.hint[root]
                elif free is not None:
                    size = free
                elif root in d.trip:
                    size = trip if trip is not None else TRIP_SIZES[seed % len(TRIP_SIZES)]
                    if long_given:
                        size = min(size, OTHER_TRIP_MAX)
                    long_given = long_given or size > OTHER_TRIP_MAX
                elif root in symbols:
                    size = free_size(seed, symbols[root])
                else:
                    size = free_size(seed, 0)
                sizes[root] = size
                label, count = d.name(root), 2
                while label in labels:
                    label, count = f"{d.name(root)}#{count}", count + 1
                labels[label] = size
        shapes = {n: tuple(sizes[d.find(v)] for v in self.templates[n]) for n in self.names if self.templates.get(n) is not None}
        return Attempt(shapes, labels, "seed" if free is None else "fallback")
