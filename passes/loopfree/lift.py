"""Lifting Scan body nodes out of the loop: the rules ``vectorize`` and ``hoist`` share.

A body value is *per-step* when it depends on a scan element, else *invariant* (it depends
only on outer values, constants and pass-through states). Lifted out of the loop, a per-step
value of per-step rank r becomes one outer tensor of rank r + 1 whose axis 0 runs over the
steps in processing order; an invariant value is computed once, by a copy of its node.

:func:`plan_node` checks one node against its inputs' classes and ranks without touching any
graph, and returns how to emit its lifted form (a closure) or raises :class:`Declined` with the
reason. The rules (r = per-step rank of the result, axes resolved with the input's rank first):
- elementwise ops (numpy broadcasting): a per-step operand of rank < r gets unit axes after the
  step axis, so the step axis never lines up with a data axis; invariant operands are unchanged.
  Operands that broadcast one way only (PRelu's slope, Clip's bounds, CastLike's target) must
  be invariant.
- MatMul: per-step operands are padded to the larger rank; a per-step vector becomes a 1-row
  (left) or 1-column (right) matrix and that axis is squeezed afterwards.
- Gemm: MatMul on (transposed) operands, then ``alpha`` and ``beta * C``, within the dtype
  tolerance (the rounding of a fused Gemm may differ by an ulp).
- ops with axes (Softmax/LogSoftmax/Hardmax, Reduce*, ArgMax/ArgMin, Concat, Split,
  Transpose, Squeeze/Unsqueeze, Gather, Slice, TopK, LayerNormalization with invariant
  scale and bias): axes shifted by one; a default meaning
  "every axis" is made explicit; axes given as inputs must be constants.
- Reshape: a constant target shape gets a leading 0 (copy the step count).
- Einsum (explicit equations, no ellipsis): a fresh letter for the step axis leads every per-step
  operand and the result.
- anything else reading a per-step value is declined with the reason; nodes with subgraphs,
  random ops and other domains are declined even when invariant.

This is the opset-9+ counterpart of :mod:`upgrade_proof` (which edits an opset-8 body in place
and requires equal ranks); here new nodes are emitted, so operands can be padded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import math

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.emit import Emitter
from scanopt.constexpr import ConstantFolder
from scanopt.graph import dtype_of, identity_root, node_label, subgraphs_of
from scanopt.protos import in_default_domain

ELEMENTWISE = frozenset({
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Cast", "Ceil", "Cos", "Cosh", "Elu", "Erf",
    "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu", "Log",
    "Mish", "Neg", "Not", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Sinh",
    "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu", "Celu", "BitwiseNot",
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "And", "Or", "Xor", "Equal", "Greater", "Less",
    "GreaterOrEqual", "LessOrEqual", "Max", "Min", "Sum", "Mean", "Where", "BitShift", "BitwiseAnd",
    "BitwiseOr", "BitwiseXor",
})
# Ops whose inputs after the first broadcast one way only (into the first): those must be invariant.
ONE_WAY = frozenset({"PRelu", "Clip", "CastLike"})
REDUCE = frozenset({
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
})
SOFTMAX_LIKE = frozenset({"Softmax", "LogSoftmax", "Hardmax"})
RANDOM = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout",
})
NOT_LIFTED = {
    "Shape": "its result would include the step count",
    "Size": "its result would include the step count",
    "Flatten": "it always returns 2-D, so the step axis cannot be kept apart",
}


class Declined(Exception):
    """A node that cannot be lifted; the message is the reason."""


# Default memory bound of lifted per-step values (option ``vectorize_max_bytes``); vectorize
# and hoist share it because both hold T steps of a body value at once.
DEFAULT_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class Value:
    """What the planner knows of one body value."""

    per_step: bool
    rank: int | None  # per-step rank (None: unknown)


class LiftEmitter(Emitter):
    """An Emitter that also knows the step count, for broadcasting invariant values."""

    def __init__(self, builder, opset: int, steps: Callable[[], gs.Tensor]):
        super().__init__(builder, opset)
        self._steps = steps

    def length(self, x: gs.Tensor) -> gs.Tensor:
        """``x``'s size on axis 0 as int64 [1]: the step count of a value in processing order."""
        return self.op("Gather", [self.op("Shape", [x]), self.ints("first", [0])])

    def pad(self, x: gs.Tensor, count: int) -> gs.Tensor:
        """A per-step value with ``count`` unit axes inserted after the step axis."""
        return self.unsqueeze(x, list(range(1, count + 1))) if count else x

    def over_steps(self, x: gs.Tensor, rank: int) -> gs.Tensor:
        """An invariant value of rank ``rank`` repeated along a new leading step axis."""
        ones = self.ints("ones", [1] * rank)
        shape = self.op("Concat", [self._steps(), ones], axis=0)
        return self.op("Expand", [self.unsqueeze(x, [0]), shape])

    def same(self, node: gs.Node, inputs: Sequence[gs.Tensor], **overrides) -> list[gs.Tensor]:
        """``node``'s op on new inputs with some attributes changed; one output per original
        output (an omitted optional output stays omitted)."""
        attrs = {**node.attrs, **overrides}
        outputs = [self.b.variable(f"{t.name}_lifted") if t.name else gs.Variable.empty() for t in node.outputs]
        self.b.op(node.op, inputs, outputs=outputs, domain=node.domain, **attrs)
        return outputs


Emit = Callable[[LiftEmitter, list[gs.Tensor]], list[gs.Tensor]]


def copy_node(node: gs.Node) -> Emit:
    """The emitter of an invariant node: the same node on the mapped inputs."""
    return lambda e, ins: e.same(node, ins)


def plan_node(node: gs.Node, values: list[Value | None], opset: int, shape_of) -> tuple[Emit, list[Value]]:
    """(emitter, output values) for ``node`` given its inputs' values (None: an omitted input).

    Raises Declined with the reason when the node cannot be lifted.
    """
    label = f"{node.op} '{node_label(node)}'"
    if not in_default_domain(node.domain):
        raise Declined(f"{label} is not an ai.onnx op")
    if any(True for _ in subgraphs_of(node)):
        raise Declined(f"{label} has a body (control flow is not lifted)")
    if node.op in RANDOM:
        raise Declined(f"{label} draws random numbers (per step they would differ)")
    if not any(v is not None and v.per_step for v in values):
        ranks = [shape_of(t) for t in node.outputs]
        return copy_node(node), [Value(False, None if s is None else len(s)) for s in ranks]
    rule = _Rule(node, values, opset, label)
    return rule.plan()


class _Rule:
    """The per-op rules of the module docstring, for one node with a per-step input."""

    def __init__(self, node: gs.Node, values: list[Value | None], opset: int, label: str):
        self.node, self.values, self.opset, self.label = node, values, opset, label
        self.attrs = node.attrs

    # -- helpers ---------------------------------------------------------------------------
    def rank(self, i: int) -> int:
        v = self.values[i]
        if v is None or v.rank is None:
            raise Declined(f"{self.label}: the rank of '{self.node.inputs[i].name}' is unknown")
        return v.rank

    def per_step(self, i: int) -> bool:
        return i < len(self.values) and self.values[i] is not None and self.values[i].per_step

    def norm(self, axis: int, rank: int) -> int:
        if not -max(rank, 1) <= axis < max(rank, 1):
            raise Declined(f"{self.label}: axis {axis} is out of range for rank {rank}")
        return axis + rank if axis < 0 else axis

    def invariant_only(self, indices, what: str) -> None:
        for i in indices:
            if self.per_step(i):
                raise Declined(f"{self.label}: its {what} differs per step")

    def const_input(self, i: int, what: str) -> np.ndarray | None:
        """A constant optional input (None when omitted); declined when computed at run time."""
        if i >= len(self.node.inputs) or not self.node.inputs[i].name:
            return None
        self.invariant_only([i], what)
        # folded through outer scope: TorchScript computes a Slice's axes as Unsqueeze(Constant) outside the loop
        value = ConstantFolder(self.opset).value(self.node.inputs[i])
        if value is None:
            raise Declined(f"{self.label}: its {what} is computed at run time")
        return value

    def axes_of(self, key: str, input_index: int | None):
        """(axes or None, True if given as an input)."""
        if key in self.attrs:
            return list(self.attrs[key]), False
        if input_index is not None:
            value = self.const_input(input_index, key)
            if value is not None:
                return [int(a) for a in value.reshape(-1)], True
        return None, input_index is not None

    def outputs(self, *ranks: int) -> list[Value]:
        return [Value(True, r) for r in ranks]

    # -- rules -----------------------------------------------------------------------------
    def plan(self) -> tuple[Emit, list[Value]]:
        op = self.node.op
        if op in NOT_LIFTED:
            raise Declined(f"{self.label} reads a per-step value and {NOT_LIFTED[op]}")
        if op in ELEMENTWISE or op in ONE_WAY:
            return self.elementwise()
        handler = {
            "MatMul": self.matmul, "Gemm": self.gemm, "Transpose": self.transpose, "Reshape": self.reshape,
            "Concat": self.concat, "Split": self.split, "Gather": self.gather, "Squeeze": self.squeeze,
            "Unsqueeze": self.unsqueeze, "TopK": self.topk, "ArgMax": self.arg, "ArgMin": self.arg,
            "Slice": self.slice, "Einsum": self.einsum, "LayerNormalization": self.layer_norm,
        }.get(op)
        if op in REDUCE:
            handler = self.reduce
        elif op in SOFTMAX_LIKE:
            handler = self.softmax
        if handler is None:
            raise Declined(f"{self.label} reads a per-step value and is not among the ops vectorize can lift")
        return handler()

    def elementwise(self):
        if self.node.op in ONE_WAY:
            self.invariant_only(range(1, len(self.values)), "second operand (which broadcasts one way only)")
        present = [i for i, v in enumerate(self.values) if v is not None]
        r = max(self.rank(i) for i in present)
        pads = {i: r - self.rank(i) for i in present if self.per_step(i)}

        def emit(e: LiftEmitter, ins):
            return e.same(self.node, [e.pad(x, pads[i]) if i in pads else x for i, x in enumerate(ins)])

        return emit, self.outputs(*[r] * len(self.node.outputs))

    def matmul(self):
        ra, rb = self.rank(0), self.rank(1)
        fa, fb = self.per_step(0), self.per_step(1)
        # A per-step vector becomes a matrix (row on the left, column on the right) unless the
        # other operand is invariant and at most 2-D, where numpy's own vector rules already fit.
        row = fa and ra == 1 and (fb or rb > 2)
        col = fb and rb == 1
        ra2, rb2 = (2 if row else ra), (2 if col else rb)
        width = max(ra2, rb2)
        result = max(ra, rb) if min(ra, rb) >= 2 else (ra + rb - 2 if ra == 1 and rb == 1 else max(ra, rb) - 1)

        def emit(e: LiftEmitter, ins):
            a, b = ins
            if row:
                a = e.unsqueeze(a, [1])
            if col:
                b = e.unsqueeze(b, [-1])
            if fa and ra2 >= 2:
                a = e.pad(a, width - ra2)
            if fb and rb2 >= 2:
                b = e.pad(b, width - rb2)
            y = e.op("MatMul", [a, b])
            dropped = ([-2] if row else []) + ([-1] if col else [])
            return [e.squeeze(y, dropped) if dropped else y]

        if row and self.opset < 11:
            raise Declined(f"{self.label}: a per-step vector times a batched matrix needs negative Squeeze axes (opset 11+)")
        if col and self.opset < 11:
            raise Declined(f"{self.label}: a per-step right vector needs negative Unsqueeze axes (opset 11+)")
        return emit, self.outputs(result)

    def einsum(self):
        """A fresh letter for the step axis, leading each per-step operand and the result."""
        equation = self.attrs.get("equation", "").replace(" ", "")
        if "->" not in equation or "." in equation:
            raise Declined(f"{self.label}: only explicit equations ('...->...') without ellipsis are lifted")
        operands, result = equation.split("->")
        terms = operands.split(",")
        step = next((c for c in "zyxwvutsrqponmlkjihgfedcbaZYXWVUTSRQPONMLKJIHGFEDCBA" if c not in equation), None)
        if step is None or len(terms) != len(self.values):
            raise Declined(f"{self.label}: no letter left for the step axis")
        lifted = ",".join(step + t if self.per_step(i) else t for i, t in enumerate(terms)) + "->" + step + result

        def emit(e: LiftEmitter, ins):
            return e.same(self.node, ins, equation=lifted)

        return emit, self.outputs(len(result))

    def gemm(self):
        for i in (0, 1):
            if self.rank(i) != 2:
                raise Declined(f"{self.label}: operand {i} is not 2-D")
        alpha = float(self.attrs.get("alpha", 1.0))
        beta = float(self.attrs.get("beta", 1.0))
        trans = (int(self.attrs.get("transA", 0)), int(self.attrs.get("transB", 0)))
        has_c = len(self.node.inputs) > 2 and bool(self.node.inputs[2].name)
        c_pad = 2 - self.rank(2) if has_c and self.per_step(2) else 0
        dtype = next((d for d in map(dtype_of, (self.node.outputs[0], self.node.inputs[0])) if d is not None), None)
        if dtype is None and (alpha != 1.0 or (has_c and beta != 1.0)):
            raise Declined(f"{self.label}: alpha/beta need the element type, which is unknown")

        def emit(e: LiftEmitter, ins):
            ops = list(ins[:2])
            for i in (0, 1):
                if trans[i]:
                    perm = [0, 2, 1] if self.per_step(i) else [1, 0]
                    ops[i] = e.op("Transpose", [ops[i]], perm=perm)
            y = e.op("MatMul", ops)
            if alpha != 1.0:
                y = e.op("Mul", [y, e.const("alpha", np.asarray(alpha, dtype))])
            if has_c:
                c = e.pad(ins[2], c_pad)
                if beta != 1.0:
                    c = e.op("Mul", [c, e.const("beta", np.asarray(beta, dtype))])
                y = e.op("Add", [y, c])
            return [y]

        return emit, self.outputs(2)

    def transpose(self):
        r = self.rank(0)
        perm = list(self.attrs.get("perm", reversed(range(r))))
        return (lambda e, ins: e.same(self.node, ins, perm=[0] + [p + 1 for p in perm])), self.outputs(r)

    def reshape(self):
        self.invariant_only([1], "target shape")
        shape = self.const_input(1, "target shape")
        if shape is None:
            raise Declined(f"{self.label}: its target shape is computed at run time")
        shape = [int(d) for d in shape.reshape(-1)]
        allowzero = int(self.attrs.get("allowzero", 0))
        if allowzero and 0 in shape:
            raise Declined(f"{self.label}: allowzero=1 with a 0 in the target shape (an empty dim, not a copied "
                           "one; the lifted Reshape's leading 0 must copy the step count)")
        new = np.asarray([0] + shape, np.int64)

        def emit(e: LiftEmitter, ins):
            # with no 0 in the target shape allowzero changes nothing (the PyTorch exporter writes
            # allowzero=1 on every view); the lifted shape's leading 0 copies the step count
            return e.same(self.node, [ins[0], e.const("shape", new)], **({"allowzero": 0} if allowzero else {}))

        return emit, self.outputs(len(shape))

    def concat(self):
        r = self.rank(next(i for i, v in enumerate(self.values) if v is not None))
        axis = self.norm(int(self.attrs["axis"]), r) + 1

        def emit(e: LiftEmitter, ins):
            parts = [x if self.per_step(i) else e.over_steps(x, r) for i, x in enumerate(ins)]
            return e.same(self.node, parts, axis=axis)

        return emit, self.outputs(r)

    def split(self):
        self.invariant_only(range(1, len(self.values)), "split sizes")
        r = self.rank(0)
        axis = self.norm(int(self.attrs.get("axis", 0)), r) + 1
        return (lambda e, ins: e.same(self.node, ins, axis=axis)), self.outputs(*[r] * len(self.node.outputs))

    def gather(self):
        r, ri = self.rank(0), self.rank(1)
        axis = self.norm(int(self.attrs.get("axis", 0)), r)
        if self.per_step(0) and not self.per_step(1):
            return (lambda e, ins: e.same(self.node, ins, axis=axis + 1)), self.outputs(r - 1 + ri)
        if not self.per_step(0) and axis == 0:
            return (lambda e, ins: e.same(self.node, ins)), self.outputs(r - 1 + ri)
        raise Declined(f"{self.label}: per-step indices need invariant data and axis 0")

    def squeeze(self):
        axes, as_input = self.axes_of("axes", 1 if self.opset >= 13 else None)
        if not axes:
            raise Declined(f"{self.label} has no axes; it would also drop a step axis of size 1")
        r = self.rank(0)
        shifted = [self.norm(a, r) + 1 for a in axes]
        return self._with_axes(shifted, as_input, 1), self.outputs(r - len(axes))

    def unsqueeze(self):
        axes, as_input = self.axes_of("axes", 1 if self.opset >= 13 else None)
        if axes is None:
            raise Declined(f"{self.label} has no constant axes")
        r = self.rank(0) + len(axes)
        shifted = [self.norm(a, r) + 1 for a in axes]
        return self._with_axes(shifted, as_input, 1), self.outputs(r)

    def _with_axes(self, axes: list[int], as_input: bool, index: int, **extra) -> Emit:
        def emit(e: LiftEmitter, ins):
            if as_input:
                ins = list(ins)
                while len(ins) <= index:
                    ins.append(gs.Variable.empty())
                ins[index] = e.ints("axes", axes)
                return e.same(self.node, ins, **extra)
            return e.same(self.node, ins, axes=axes, **extra)

        return emit

    def reduce(self):
        axes_input = self.opset >= 18 or (self.node.op == "ReduceSum" and self.opset >= 13)
        axes, as_input = self.axes_of("axes", 1 if axes_input else None)
        r = self.rank(0)
        keep = int(self.attrs.get("keepdims", 1))
        if not axes:
            if axes_input and int(self.attrs.get("noop_with_empty_axes", 0)):
                return (lambda e, ins: [e.op("Identity", [ins[0]])]), self.outputs(r)
            if r == 0:
                raise Declined(f"{self.label} reduces a per-step scalar")
            axes = list(range(r))
        shifted = sorted({self.norm(a, r) + 1 for a in axes})
        out_rank = r if keep else r - len(shifted)
        return self._with_axes(shifted, axes_input, 1), self.outputs(out_rank)

    def arg(self):
        r = self.rank(0)
        axis = self.norm(int(self.attrs.get("axis", 0)), r) + 1
        keep = int(self.attrs.get("keepdims", 1))
        return (lambda e, ins: e.same(self.node, ins, axis=axis)), self.outputs(r if keep else r - 1)

    def softmax(self):
        r = self.rank(0)
        if r == 0:
            raise Declined(f"{self.label} on a per-step scalar")
        default = -1 if self.opset >= 13 else 1
        axis = self.norm(int(self.attrs.get("axis", default)), r) + 1
        return (lambda e, ins: e.same(self.node, ins, axis=axis)), self.outputs(r)

    def layer_norm(self):
        """Normalizes ``axis``.. to the last axis; scale and bias broadcast over those axes
        only (a per-step one would need the step axis): they must be invariant."""
        self.invariant_only(range(1, len(self.values)), "scale or bias")
        r = self.rank(0)
        axis = self.norm(int(self.attrs.get("axis", -1)), r) + 1
        return (lambda e, ins: e.same(self.node, ins, axis=axis)), self.outputs(*[r] * len(self.node.outputs))

    def topk(self):
        self.invariant_only([1], "K")
        r = self.rank(0)
        axis = self.norm(int(self.attrs.get("axis", -1)), r) + 1
        return (lambda e, ins: e.same(self.node, ins, axis=axis)), self.outputs(r, r)

    def slice(self):
        r = self.rank(0)
        if self.opset < 10:
            axes = list(self.attrs.get("axes", range(len(self.attrs["starts"]))))
            shifted = [self.norm(a, r) + 1 for a in axes]
            return (lambda e, ins: e.same(self.node, ins, axes=shifted)), self.outputs(r)
        self.invariant_only(range(1, len(self.values)), "bounds")
        axes = self.const_input(3, "axes")
        if axes is None:
            starts = self.const_input(1, "starts")
            if starts is None:
                raise Declined(f"{self.label}: without axes its starts must be constant")
            axes = np.arange(starts.size)
        shifted = [self.norm(int(a), r) + 1 for a in axes.reshape(-1)]
        return self._with_axes(shifted, True, 3), self.outputs(r)


# -- whole bodies ------------------------------------------------------------------------------
@dataclass
class LiftPlan:
    """Nodes to lift, in body order, with how to emit each; and what is known of each value."""

    steps: list[tuple[gs.Node, Emit]]
    values: dict[int, Value]  # id(body tensor) -> Value

    def value(self, t: gs.Tensor, shape_of) -> Value:
        """A body value's class: planned, else an outer value or constant (invariant)."""
        if id(t) in self.values:
            return self.values[id(t)]
        shape = shape_of(t)
        if shape is None and isinstance(t, gs.Constant):
            shape = list(np.asarray(t.values).shape)
        return Value(False, None if shape is None else len(shape))


def plan_nodes(nodes: Sequence[gs.Node], roots: dict[int, Value], opset: int, shape_of) -> LiftPlan:
    """Plan ``nodes`` (a topologically ordered part of a body) given the classes of the body
    inputs in ``roots``; every other value they read is invariant. Raises Declined."""
    plan = LiftPlan([], dict(roots))
    for node in nodes:
        values = [plan.value(t, shape_of) if t.name else None for t in node.inputs]
        emit, outs = plan_node(node, values, opset, shape_of)
        for t, v in zip(node.outputs, outs):
            if v.rank is None:  # trust a declared or inferred shape where the rule had none
                shape = shape_of(t)
                v = Value(v.per_step, None if shape is None else len(shape))
            plan.values[id(t)] = v
        plan.steps.append((node, emit))
    return plan


def emit_nodes(steps, e: LiftEmitter, mapping: dict[int, gs.Tensor]) -> None:
    """Emit planned nodes; ``mapping`` (id(body tensor) -> outer tensor) grows with their outputs.
    Values missing from ``mapping`` are read as they are (outer values, constants)."""
    for node, emit in steps:
        ins = [mapping.get(id(t), t) if t.name else gs.Variable.empty() for t in node.inputs]
        for t, new in zip(node.outputs, emit(e, ins)):
            if t.name:
                mapping[id(t)] = new


def needed_nodes(body: gs.Graph, wanted: Sequence[gs.Tensor]) -> list[gs.Node]:
    """The body nodes ``wanted`` depend on, in body order."""
    producer = {id(t): n for n in body.nodes for t in n.outputs}
    keep: set[int] = set()
    stack = [producer[id(t)] for t in wanted if id(t) in producer]
    while stack:
        node = stack.pop()
        if id(node) in keep:
            continue
        keep.add(id(node))
        stack.extend(producer[id(t)] for t in node.inputs if id(t) in producer)
    return [n for n in body.nodes if id(n) in keep]


def changing_states(body: gs.Graph, num_states: int) -> list[int]:
    """The states the body changes: those whose output is not their input (through Identity)."""
    return [i for i in range(num_states) if identity_root(body.outputs[i]) is not body.inputs[i]]


def element_value(view, j: int, element: gs.Tensor, shapes) -> Value:
    """Body input ``element`` of scan input ``j`` as a per-step value: its rank is the outer
    rank less the scan axis, else the inferred one."""
    rank = view.input_ranks[j] - 1 if view.input_ranks[j] is not None else shapes.rank(element)
    return Value(True, rank)


def to_processing_order(e: LiftEmitter, x: gs.Tensor, view, j: int) -> gs.Tensor:
    """Scan input ``j`` with its scan axis first, in the order the loop reads it."""
    axis = view.input_axes[j]
    if axis != 0:
        rank = view.input_ranks[j]
        x = e.op("Transpose", [x], perm=[axis] + [a for a in range(rank) if a != axis])
    return e.reverse(x, 0) if view.input_directions[j] else x


def from_processing_order(e: LiftEmitter, y: gs.Tensor, view, k: int, rank) -> gs.Tensor:
    """Stacked values (processing order, axis 0) as scan output ``k``: reversed when it prepends,
    its axis moved into place."""
    if view.output_directions[k]:
        y = e.reverse(y, 0)
    axis = view.output_axes[k]
    if axis < 0:
        axis += rank + 1
    if axis != 0:
        perm = list(range(1, rank + 1))
        perm.insert(axis, 0)
        y = e.op("Transpose", [y], perm=perm)
    return y


def largest_intermediate(plan: LiftPlan, trip: int | None, shapes) -> tuple[str, int]:
    """(name, bytes) of the largest per-step value lifted, T x its per-step size; symbolic dims
    (the trip count included) count as 1, unknown shapes as the largest input of their node."""
    trip = trip if trip is not None else 1
    sizes: dict[int, int] = {}
    best = ("", 0)
    for node, _ in plan.steps:
        found = step_bytes(node, [plan.values.get(id(t)) for t in node.outputs], sizes, shapes)
        sizes.update(found)
        for t in node.outputs:
            if id(t) in found and found[id(t)] * trip > best[1]:
                best = (t.name, found[id(t)] * trip)
    return best


def step_bytes(node: gs.Node, outs: Sequence[Value | None], sizes: dict[int, int], shapes) -> dict[int, int]:
    """id -> per-step bytes of ``node``'s per-step outputs (``outs``: their values); symbolic dims
    count as 1, an unknown shape as the largest of its node's inputs in ``sizes`` (earlier results)."""
    inputs = [sizes.get(id(t), 0) for t in node.inputs]
    found: dict[int, int] = {}
    for t, v in zip(node.outputs, outs):
        if not t.name or v is None or not v.per_step:
            continue
        shape = shapes.shape(t)
        if shape is None:
            found[id(t)] = max(inputs, default=0)
        else:
            found[id(t)] = math.prod(d if isinstance(d, int) else 1 for d in shape) * _itemsize(t, shapes)
    return found


def _itemsize(t: gs.Tensor, shapes) -> int:
    dtype = shapes.dtype(t)
    return dtype.itemsize if dtype is not None else 4
