"""The proof behind the upgrade pass's strategy (b): a Scan-8 body is batch-polymorphic.

Strategy (b) runs the body once per step on the whole batch: every value that depends on
a state or a scan element (a *batched* value) gets a new leading axis B, and every other
value (constants, outer-scope reads, and what is computed only from them) keeps its shape.
That is equivalent to running the body per item only if every node computes, on the
batched values, the per-item results stacked along the new axis. This module proves it
node by node, conservatively, with the semantics of opset 8 (a Scan-8 body is always at
opset 8), and lists the attribute and constant edits that shift axes by one. Anything it
cannot prove is declined with a reason; the pass then falls back to strategy (c).

The rules, with r the per-item rank of the result:
- elementwise unary ops: any rank.
- broadcasting ops (numpy rules): every batched operand has per-item rank r and every
  other operand rank <= r; otherwise the new axis would align with a non-batch axis.
- MatMul: left batched (right not): left rank 1 with right rank <= 2, or left rank >= 2
  with right rank <= left rank; right batched (left not): right rank >= 2 and left rank
  <= right rank; both batched: equal ranks >= 2.
- ops with axes (Softmax/LogSoftmax/Hardmax, Concat, Transpose, Reduce*, ArgMax/ArgMin,
  Squeeze/Unsqueeze, Gather, Slice, Split, Pad): axes shifted by one, negative ones
  resolved first (their rank must be known); a default that means "every axis" is
  made explicit. Concat needs every operand batched; Gather needs exactly one operand
  batched (indices only with axis 0); Squeeze needs explicit axes (B may be 1).
- Reshape and Tile: the shape/repeats must be constants; they get a leading 0 / 1.
  Expand: the target shape has a static length <= the per-item rank of its input.
- anything else that touches a batched value (Shape, Size, Gemm, Flatten, control flow,
  random ops, other domains) is declined.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.graph import constant_value, node_label, outer_captures, subgraphs_of
from scanopt.protos import in_default_domain

UNARY = frozenset({
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Cast", "Ceil", "Clip", "Cos", "Cosh",
    "Dropout", "Elu", "Erf", "Exp", "Floor", "HardSigmoid", "Identity", "IsInf", "IsNaN", "LeakyRelu",
    "Log", "Neg", "Not", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Sinh",
    "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu",
})
BROADCASTING = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less",
    "Max", "Min", "Sum", "Mean", "PRelu",
})
REDUCE = frozenset({
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
})
COERCED_2D = frozenset({"Softmax", "LogSoftmax", "Hardmax"})  # axis default 1 at opset 8
RANDOM = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"})
DECLINED = {
    "Shape": "its result would include the batch size",
    "Size": "its result would include the batch size",
    "Gemm": "it takes 2-D operands only; a batched operand would be 3-D",
    "Flatten": "it always returns 2-D; the batch axis cannot be kept apart",
}

ShapeOf = Callable[[gs.Tensor], "list | None"]


@dataclass
class BatchPlan:
    """What strategy (b) changes in the body: values that gain the batch axis, and edits."""

    batched: list[gs.Tensor] = field(default_factory=list)
    attr_edits: list[tuple[gs.Node, str, object]] = field(default_factory=list)
    input_edits: list[tuple[gs.Node, int, np.ndarray]] = field(default_factory=list)


class _Declined(Exception):
    pass


def prove_batch_polymorphic(body: gs.Graph, shape_of: ShapeOf) -> BatchPlan | str:
    """A BatchPlan if every node of ``body`` is batch-polymorphic, else the reason why not.

    ``shape_of(tensor)`` gives a value's per-item shape (declared or inferred) or None.
    """
    plan = BatchPlan(batched=list(body.inputs))
    batched = {id(t) for t in body.inputs}
    try:
        for node in body.nodes:
            flags = [bool(t.name) and id(t) in batched for t in node.inputs]
            label = f"{node.op} '{node_label(node)}'"
            if not in_default_domain(node.domain):
                raise _Declined(f"{label} is not an ai.onnx op (e.g. an already rewritten nested Scan)")
            if node.op in RANDOM:
                raise _Declined(f"{label} draws random numbers; per item they would differ")
            captures_batched = any(
                id(t) in batched for _, sub in subgraphs_of(node) for t in outer_captures(sub)
            )
            if not any(flags) and not captures_batched:
                continue  # computed from constants and outer values only: the same for every item
            if captures_batched or any(True for _ in subgraphs_of(node)):
                raise _Declined(f"{label} has a body that reads per-item values")
            _check_node(node, flags, shape_of, plan, label)
            for t in node.outputs:
                batched.add(id(t))
                plan.batched.append(t)
    except _Declined as exc:
        return str(exc)
    for i, t in enumerate(body.outputs):
        if id(t) not in batched:
            return f"body output {i} ('{t.name}') does not depend on the states or scan inputs"
    return plan


def _check_node(node: gs.Node, flags: list[bool], shape_of: ShapeOf, plan: BatchPlan, label: str) -> None:
    op, attrs = node.op, node.attrs

    def rank(t: gs.Tensor) -> int:
        shape = shape_of(t)
        if shape is None:
            raise _Declined(f"{label}: the rank of '{t.name}' is unknown")
        return len(shape)

    def norm(axis: int, t: gs.Tensor, extra: int = 0) -> int:
        """``axis`` of ``t`` (rank + ``extra``) made non-negative; the rank is needed only then."""
        if axis >= 0:
            return axis
        r = rank(t) + extra
        if axis + r < 0:
            raise _Declined(f"{label}: axis {axis} is out of range for rank {r}")
        return axis + r

    def shift(key: str, values) -> None:
        plan.attr_edits.append((node, key, values))

    if op in UNARY:
        return
    if op in DECLINED:
        raise _Declined(f"{label} touches a per-item value and {DECLINED[op]}")
    if op in BROADCASTING:
        present = [(t, f) for t, f in zip(node.inputs, flags) if t.name]
        ranks = [rank(t) for t, _ in present]
        r = max(ranks)
        for (t, f), rk in zip(present, ranks):
            if f and rk != r:
                raise _Declined(f"{label} broadcasts a per-item value of rank {rk} against rank {r}; "
                                f"the batch axis would line up with a data axis")
        if op == "PRelu" and not flags[0]:
            raise _Declined(f"{label}: only the slope is per-item")
        return
    if op == "MatMul":
        ra, rb = rank(node.inputs[0]), rank(node.inputs[1])
        fa, fb = flags[0], flags[1]
        if fa and fb:
            ok = ra == rb >= 2
        elif fa:
            ok = (ra == 1 and rb <= 2) or (ra >= 2 and rb <= ra)
        else:
            ok = rb >= 2 and ra <= rb
        if not ok:
            raise _Declined(f"{label} multiplies ranks {ra} x {rb} with the batched operand(s) "
                            f"{'both' if fa and fb else 'left' if fa else 'right'}; broadcasting would misplace the batch axis")
        return
    if op in COERCED_2D:
        axis = attrs.get("axis", 1)
        shift("axis", norm(axis, node.inputs[0]) + 1)
        return
    if op == "Concat":
        if not all(flags[i] for i, t in enumerate(node.inputs) if t.name):
            raise _Declined(f"{label} joins per-item values with shared ones (ranks would differ)")
        axis = attrs["axis"]
        shift("axis", norm(axis, node.inputs[0]) + 1)
        return
    if op == "Transpose":
        perm = attrs.get("perm")
        if perm is None:
            perm = list(reversed(range(rank(node.inputs[0]))))
        shift("perm", [0] + [p + 1 for p in perm])
        return
    if op in REDUCE:
        axes = attrs.get("axes")
        if axes is None:  # every axis of the item, but not the batch axis
            r = rank(node.inputs[0])
            if r == 0:
                raise _Declined(f"{label} reduces a scalar")
            axes = list(range(r))
        shift("axes", [norm(a, node.inputs[0]) + 1 for a in axes])
        return
    if op in ("ArgMax", "ArgMin", "Split"):
        axis = attrs.get("axis", 0)
        shift("axis", norm(axis, node.inputs[0]) + 1)
        return
    if op in ("Squeeze", "Unsqueeze"):
        axes = attrs.get("axes")
        if axes is None:
            raise _Declined(f"{label} has no axes; it would also drop a batch of size 1")
        extra = len(axes) if op == "Unsqueeze" else 0  # Unsqueeze axes index the output
        shift("axes", [norm(a, node.inputs[0], extra) + 1 for a in axes])
        return
    if op == "Gather":
        axis = attrs.get("axis", 0)
        if flags[0] and not flags[1]:
            shift("axis", norm(axis, node.inputs[0]) + 1)
            return
        if not flags[0] and flags[1] and norm(axis, node.inputs[0]) == 0:
            return
        raise _Declined(f"{label}: per-item indices need axis 0 and shared data")
    if op == "Slice":
        starts = attrs["starts"]
        axes = attrs.get("axes", list(range(len(starts))))
        shift("axes", [norm(a, node.inputs[0]) + 1 for a in axes])
        return
    if op == "Pad":
        pads = list(attrs["pads"])
        half = len(pads) // 2
        shift("pads", [0] + pads[:half] + [0] + pads[half:])
        return
    if op in ("Reshape", "Tile"):
        what = "target shape is" if op == "Reshape" else "repeats are"
        if flags[1]:
            raise _Declined(f"{label}: its {what} computed from per-item values")
        value = constant_value(node.inputs[1])
        if value is None:
            raise _Declined(f"{label}: its {what} computed at run time")
        lead = 0 if op == "Reshape" else 1  # 0 copies the batch dim; a repeat of 1 keeps it
        plan.input_edits.append((node, 1, np.concatenate([[lead], value.reshape(-1)]).astype(np.int64)))
        return
    if op == "Expand":
        if not flags[0] or flags[1]:
            raise _Declined(f"{label}: only the expanded input may be per-item")
        target = shape_of(node.inputs[1])
        length = target[0] if target is not None and len(target) == 1 else None
        if not isinstance(length, int) or length > rank(node.inputs[0]):
            raise _Declined(f"{label}: its target shape may be longer than the per-item input's rank")
        return
    raise _Declined(f"{label} touches a per-item value and is not on the list of ops proven batch-polymorphic")
