"""Recognizing a linear state update h' = a ⊙ h + b in a Scan body, a and b free of every state.

The update is read as algebra over the nodes that lead from the body input h to the body
output h': Identity, Neg, Add, Sub, Mul (one side free of h) and Div (divisor free of h). Each
step keeps the form (a, b) with ``a`` the coefficient of h and ``b`` the rest, both
:class:`Term` trees over body values that do not depend on h. Anything else reading h (a
Tanh, h ⊙ h, a MatMul with h, a division by h) is not linear and declined with the node
named. a = 1 (sums) and b = 0 (products) are kept apart so the cheaper forms can be chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_graphsurgeon as gs

from scanopt.graph import node_label
from scanopt.protos import in_default_domain


class NotLinear(Exception):
    """The update is not h' = a ⊙ h + b; the message is the reason."""


@dataclass(frozen=True)
class Term:
    """An h-free expression: a body value (``leaf``) or an op over terms."""

    op: str  # "leaf", "mul", "add", "sub", "neg", "div"
    args: tuple = ()
    tensor: gs.Tensor | None = None

    def leaves(self) -> list[gs.Tensor]:
        if self.op == "leaf":
            return [self.tensor]
        return [t for arg in self.args for t in arg.leaves()]


ONE = None  # the coefficient 1 (h itself)


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


def linear_update(h_in: gs.Tensor, h_out: gs.Tensor, depends_on_h) -> LinearUpdate:
    """The (a, b) of ``h_out`` in terms of ``h_in``; raises NotLinear. ``depends_on_h(t)``:
    True if body value ``t`` depends on ``h_in``."""
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
        raise NotLinear(f"{label} reads the state nonlinearly (only Add, Sub, Mul, Div, Neg, Identity keep it linear)")

    a, b = form(h_out)
    if a is False:
        raise NotLinear("the new state does not depend on the old one")
    return LinearUpdate(a, b, chain)


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
