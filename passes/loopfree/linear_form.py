"""Recognizing a linear state update h' = a ⊙ h + b in a Scan body, a and b free of every state.

The update is read as algebra over the nodes that lead from the body input h to the body
output h': Identity, Neg, Add, Sub, Mul (one side free of h), Div (divisor free of h), Where
whose condition is free of h (each branch's a and b selected: torch.lerp's decomposition, a
masked update ``where(m, a*h + x, h)``), and a
reshape (Squeeze, Unsqueeze, Reshape, Flatten) between static shapes of as many elements as
the state that only adds or removes unit axes (a decay [1, H] broadcast against a state [H],
squeezed back: broadcasting that adds no elements only puts unit axes in front, so h keeps its
elements in order, and a and b are reshaped with it, :class:`Term` "view"). Each
step keeps the form (a, b) with ``a`` the coefficient of h and ``b`` the rest, both
:class:`Term` trees over body values that do not depend on h. Anything else reading h (a
Tanh, h ⊙ h, a MatMul with h, a division by h) is not linear and declined with the node
named. a = 1 (sums) and b = 0 (products) are kept apart so the cheaper forms can be chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.graph import node_label
from scanopt.protos import in_default_domain


class NotLinear(Exception):
    """The update is not h' = a ⊙ h + b; the message is the reason."""


@dataclass(frozen=True)
class Term:
    """An h-free expression: a body value (``leaf``) or an op over terms."""

    op: str  # "leaf", "one", "zero", "mul", "add", "sub", "neg", "div", "view", "where" (cond, then, else)
    args: tuple = ()
    tensor: gs.Tensor | None = None
    shapes: tuple = ()  # "view": (the static shape the argument is expanded to, the shape it is reshaped to)

    def leaves(self) -> list[gs.Tensor]:
        if self.op == "leaf":
            return [self.tensor]
        return [t for arg in self.args for t in arg.leaves()]


ONE = None  # the coefficient 1 (h itself)
ZERO = Term("zero")  # a Where branch free of h (coefficient 0), or with no b


@dataclass
class LinearUpdate:
    """h' = a ⊙ h + b for one state; ``a`` None means 1, ``b`` None means 0."""

    a: Term | None
    b: Term | None
    chain: set[int] = field(default_factory=set)  # id() of the nodes h flows through to h'

    @property
    def is_sum(self) -> bool:
        return self.a is None

    @property
    def is_product(self) -> bool:
        return self.b is None


VIEWS = ("Squeeze", "Unsqueeze", "Reshape", "Flatten")


def linear_update(h_in: gs.Tensor, h_out: gs.Tensor, depends_on_h, shape_of=lambda t: None) -> LinearUpdate:
    """The (a, b) of ``h_out`` in terms of ``h_in``; raises NotLinear. ``depends_on_h(t)``:
    True if body value ``t`` depends on ``h_in``; ``shape_of(t)``: its inferred shape, where
    known (a reshape on the way to h' is kept linear only between static shapes)."""
    chain: set[int] = set()

    def leaf(t: gs.Tensor) -> Term:
        return Term("leaf", tensor=t)

    def form(t: gs.Tensor) -> tuple[Term | None, Term | None]:
        if t is h_in:
            return ONE, None
        node = t.inputs[0] if len(t.inputs) == 1 else None
        if node is None:
            raise NotLinear(f"'{t.name}' depends on the state but has no producer in the body")
        label = f"{node.op} '{node_label(node)}'"
        if not in_default_domain(node.domain):
            raise NotLinear(f"{label} reads the state and is not an ai.onnx op")
        chain.add(id(node))
        ins = list(node.inputs)
        dep = [depends_on_h(x) for x in ins]
        if node.op == "Identity":
            return form(ins[0])
        if node.op == "Neg":
            a, b = form(ins[0])
            return _neg(a), (None if b is None else Term("neg", (b,)))
        if node.op in ("Add", "Sub"):
            forms = [form(x) if d else (False, leaf(x)) for x, d in zip(ins, dep)]
            (a1, b1), (a2, b2) = forms
            sign = node.op == "Sub"
            a = _combine_a(a1, a2, sign)
            b = _combine(b1, b2, "sub" if sign else "add")
            return a, b
        if node.op == "Mul":
            if all(dep):
                raise NotLinear(f"{label} multiplies the state by itself (quadratic, not linear)")
            i = 0 if dep[0] else 1
            a, b = form(ins[i])
            k = leaf(ins[1 - i])
            return _scale(a, k, "mul"), (None if b is None else Term("mul", (b, k)))
        if node.op == "Div":
            if dep[1]:
                raise NotLinear(f"{label} divides by a value that depends on the state")
            a, b = form(ins[0])
            k = leaf(ins[1])
            return _scale(a, k, "div"), (None if b is None else Term("div", (b, k)))
        if node.op == "Where":  # torch.lerp's two branches, a masked update: each branch's (a, b), selected
            if dep[0]:
                raise NotLinear(f"{label} selects by a condition that depends on the state")
            (a1, b1), (a2, b2) = (form(x) if d else (False, leaf(x)) for x, d in zip(ins[1:], dep[1:]))
            cond = leaf(ins[0])
            b = None if b1 is None and b2 is None else Term("where", (cond, b1 or ZERO, b2 or ZERO))
            return Term("where", (cond, _coefficient(a1), _coefficient(a2))), b
        if node.op in VIEWS:
            if any(dep[1:]):
                raise NotLinear(f"{label} reshapes by a value that depends on the state")
            pre, out = _static_view(shape_of(ins[0]), shape_of(t), shape_of(h_in), label)
            a, b = form(ins[0])
            return _view(a, pre, out), _view(b, pre, out)
        if node.op in ("MatMul", "Gemm", "Einsum") and sum(dep) == 1:  # Gated DeltaNet's S - β(S k)kᵀ + β v kᵀ
            raise NotLinear(f"{label} multiplies the state by a matrix: linear, but not elementwise a ⊙ h + b, "
                            "which the parallel forms need")
        raise NotLinear(f"{label} reads the state nonlinearly (only Add, Sub, Mul, Div, Neg, Identity, Where by "
                        "a state-free condition and a reshape back to the state's shape keep it linear)")

    a, b = form(h_out)
    if a is False:
        raise NotLinear("the new state does not depend on the old one")
    return LinearUpdate(a, b, chain)


def _static_view(pre, out, state, label: str) -> tuple[tuple, tuple]:
    """(pre, out) shapes of a reshape on the update's way to h', where it keeps the update
    linear: all static, as many elements as the state, and ``out`` the state's dims with unit
    axes added or removed (so h stays its own elements in order); else NotLinear."""
    static = [s is not None and all(isinstance(d, (int, np.integer)) and d >= 0 for d in s) for s in (pre, out, state)]
    if not all(static):
        raise NotLinear(f"{label} reshapes the state's update and its shapes are not all static")
    wide = [int(d) for d in state if d != 1]
    if [int(d) for d in out if d != 1] != wide or int(np.prod(pre, dtype=np.int64)) != int(np.prod(state, dtype=np.int64)):
        raise NotLinear(f"{label} reshapes the state's update from {list(pre)} to {list(out)}, not to the "
                        f"state's shape {list(state)} up to unit axes")
    return tuple(int(d) for d in pre), tuple(int(d) for d in out)


def _view(term, pre: tuple, out: tuple):
    """``term`` (a coefficient, or None for 1 / 0) expanded to ``pre`` and reshaped to ``out``."""
    if term is None or pre == out:
        return term
    return Term("view", (term,), shapes=(pre, out))


def _coefficient(a) -> Term:
    """A Where branch's coefficient of h as a term: 1 for h itself, 0 for a branch free of h."""
    return Term("one") if a is ONE else ZERO if a is False else a


def _neg(a):
    if a is False:
        return False
    return Term("neg", (Term("one"),)) if a is ONE else Term("neg", (a,))


def _scale(a, k: Term, op: str):
    if a is False:
        return False
    return Term(op, (Term("one"), k)) if a is ONE and op == "div" else (k if a is ONE else Term(op, (a, k)))


def _combine_a(a1, a2, subtract: bool):
    """The coefficient of h in a1·h ± a2·h; False marks a side free of h."""
    if a2 is False:
        return a1
    if a1 is False:
        return _neg(a2) if subtract else a2
    one = Term("one")
    return Term("sub" if subtract else "add", (one if a1 is ONE else a1, one if a2 is ONE else a2))


def _combine(b1, b2, op: str):
    if b2 is None:
        return b1
    if b1 is None:
        return Term("neg", (b2,)) if op == "sub" else b2
    return Term(op, (b1, b2))
