"""What linrec's two-pass form needs to read the outputs from the local pass plus a correction.

The two-pass form runs the recurrence twice per position: once from zero in every chunk (for the
chunk ends) and again from the true chunk starts (for the outputs). When every output the loop
reads from the state is *linear* in it, y_t = L_t(h_t) + r_t, the second run is not needed:
h_t = local_t + P_t ⊙ start (P_t the decay from the chunk's start to t), so

    y_t = [L_t(local_t) + r_t]  (read in the first pass)  +  L_t(P_t ⊙ start)  (the correction)

and the correction carries only G_t = a_t ⊙ G_{t-1} from the starts: no b, no add (Mamba: 10
state-wide ops per position instead of 14; bench_mamba_forms). And when a = Exp(u) with u linear
in one per-step value x (Mamba's Exp(Δ ⊗ A)), each chunk's whole decay Π a = Exp(u(Σ x)), on the
small x, instead of a running product in the first pass (exp of a sum computed directly: no
log, no division).

This module finds both: :func:`linear_part` (the output steps with what does not read the state
dropped) and :func:`exponent_chain`.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from scanopt.passes.loopfree.linear_form import VIEWS
from scanopt.protos import in_default_domain

# Ops linear in their one state-dependent data input (the others, if any, state-free).
_LINEAR_IN_ONE = {"Mul", "MatMul", "Einsum"}
_LINEAR_VIEWS = {"Identity", "Neg", *VIEWS, "Transpose", "ReduceSum", "Slice", "Gather", "Expand"}


def linear_part(steps, new_state: set[int], shape_of) -> list | None:
    """``steps`` (plan steps reading the new state, in order) emitting only the part linear in
    it, or None when an output is not linear in the state. An Add or Sub with one operand r
    that does not read the state keeps the other (negated for ``r - L(h)``): as it is where the
    result is known to have its shape (``shape_of``: a body value's shape or None), else
    expanded by r's shape, so the correction has the output's shape whatever broadcasts."""
    reads = set(new_state)
    out = []
    for node, emit in steps:
        data = [k for k, t in enumerate(node.inputs) if id(t) in reads]
        if not data:
            out.append((node, emit))  # reads no state: emitted as it is (an index, a shape)
            continue
        op = node.op if (not isinstance(node, gs.Node) or in_default_domain(node.domain)) else None
        if op in ("Add", "Sub") and len(node.inputs) == 2 and len(data) == 1:
            k = data[0]
            kept, result = shape_of(node.inputs[k]), shape_of(node.outputs[0])
            same = kept is not None and result is not None and list(kept) == list(result)
            out.append((node, lambda e, ins, k=k, negate=op == "Sub" and k == 1, same=same:
                        [_state_part(e, ins[k], ins[1 - k], negate, same)]))
        elif op in ("Add", "Sub") and len(data) == 2:
            out.append((node, emit))
        elif op == "Div" and data == [0]:
            out.append((node, emit))
        elif op in _LINEAR_IN_ONE and len(data) == 1:
            out.append((node, emit))
        elif op in _LINEAR_VIEWS and data == [0]:
            out.append((node, emit))
        else:
            return None
        reads.update(id(t) for t in node.outputs)
    return out


def _state_part(e, kept: gs.Tensor, dropped: gs.Tensor, negate: bool, same: bool) -> gs.Tensor:
    value = e.op("Neg", [kept]) if negate else kept
    return value if same else e.op("Expand", [value, e.op("Shape", [dropped])])


@dataclass
class ExponentChain:
    """a = Exp(u), u computed from the per-step value ``x`` by ``steps``, each linear in it."""

    x: gs.Tensor
    u: gs.Tensor
    steps: list  # plan steps from x to u, in order


def exponent_chain(a: gs.Tensor, steps, available: set[int], per_step) -> ExponentChain | None:
    """The chain when ``a`` is Exp(u) with u = f(x), f linear in x, x a per-step value already
    computed (id in ``available``), every other operand not per step (``per_step(t)``); else
    None. ``steps``: the plan steps that may compute the chain (their nodes are the body's)."""
    producer = {id(t): (node, emit) for node, emit in steps for t in node.outputs}
    exp = a.inputs[0] if len(a.inputs) == 1 else None
    if not isinstance(exp, gs.Node) or exp.op != "Exp" or not in_default_domain(exp.domain):
        return None
    u = exp.inputs[0]
    chain = []
    t = u
    while id(t) not in available:
        if id(t) not in producer:
            return None
        node, emit = producer[id(t)]
        if not isinstance(node, gs.Node) or not in_default_domain(node.domain):
            return None
        varying = [k for k, i in enumerate(node.inputs) if i.name and per_step(i)]
        if len(varying) != 1:
            return None
        k = varying[0]
        if not (node.op in _LINEAR_IN_ONE or (node.op == "Div" and k == 0)
                or (node.op in ("Neg", "Identity", *VIEWS) and k == 0)):
            return None
        chain.append((node, emit))
        t = node.inputs[k]
    if not per_step(t):
        return None
    return ExponentChain(t, u, chain[::-1])
