"""Which of LinearAttention's four update rules a body's monomials (module algebra) are.

With S [*b, dk, dv] (rows the keys; ``transposed``: stored [*b, dv, dk], the same with rows and
columns swapped), a decay a (per head, or per key row) and a write coefficient β:

- linear:      S' = S + k vᵀ                         (a = 1, no erase term)
- gated:       S' = a S + k vᵀ                       (any positive a: exp(g), a sigmoid, a constant)
- delta:       S' = S + β k vᵀ − β k (Sᵀk)ᵀ          (β k (v − Sᵀk)ᵀ, distributed)
- gated_delta: S' = a S + β k vᵀ − β k ((a S)ᵀk)ᵀ    (the read is of the decayed state; a per head
                                                     or per key row, as in gated)

The erase term must use the very key of the write (the same value, also inside the read) and
its coefficients must be exactly the write's times the decay's (same values, constants equal to
1e-6 relative); a β of 1 is β = 1. Every scan output is c·(q·S'), c a constant (the scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from scanopt.passes.linattn.algebra import Mono, NotAttention


@dataclass(frozen=True)
class Rule:
    name: str  # "linear", "gated", "delta", "gated_delta"
    transposed: bool
    keys: gs.Tensor  # body values, per step [*b, dk]
    values: gs.Tensor  # [*b, dv]
    query: gs.Tensor | None  # None: the Scan has no output reading the state
    write: tuple  # (const, Coefs): multiply the values (linear, gated) or the β (delta rules)
    decay: tuple | None  # (const, Coefs) of a, None for a = 1
    scale: float
    per_key_decay: bool = False


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b))


def classify(update: list[Mono], outputs: list[list[Mono]]) -> Rule:
    states = [m for m in update if m.base[0] == "S"]
    writes = [m for m in update if m.base[0] == "outer" and m.base[1][0] == "leaf" and m.base[2][0] == "leaf"]
    erases = [m for m in update if m.base[0] == "outer" and m not in writes]
    others = [m for m in update if m.base[0] not in ("S", "outer")]
    if others:
        raise NotAttention(f"the new state holds a term {others[0].base[0]} that is neither the state nor an outer "
                           "product")
    if len(states) != 1 or len(states[0].base) > 1 and states[0].base[1]:
        raise NotAttention(f"the new state holds the old one {len(states)} times (or transposed): not S' = a S + ...")
    if len(writes) != 1:
        raise NotAttention(f"the new state adds {len(writes)} outer products of step values, not one")
    if len(erases) > 1:
        raise NotAttention("the new state subtracts more than one product read from the state")
    orientation = set()
    if erases:
        r, c = erases[0].base[1], erases[0].base[2]
        if r[0] == "leaf" and c[0] == "read" and c[1] == "row" and c[2] == ("S",):
            orientation.add(False)
        elif c[0] == "leaf" and r[0] == "read" and r[1] == "col" and r[2] == ("S",):
            orientation.add(True)
        else:
            raise NotAttention("the subtracted product is not k (Sᵀk)ᵀ (a key times the state read by that key)")
    query, scale = None, 1.0
    if len(outputs) > 1:
        raise NotAttention(f"{len(outputs)} scan outputs: LinearAttention gives one output per query")
    for monos in outputs:
        if len(monos) != 1 or monos[0].base[0] != "read" or monos[0].base[2] != ("new",):
            raise NotAttention("a scan output is not the new state read by a query (q·S' or S'·q)")
        m = monos[0]
        if m.coefs:
            raise NotAttention(f"the output is scaled by '{m.coefs[0].tensor.name}', not a constant scale")
        if m.const == 0:
            raise NotAttention("the output is scaled by 0")
        orientation.add(m.base[1] == "col")
        query, scale = m.base[3], m.const
    if len(orientation) > 1:
        raise NotAttention("the state is read by rows in one place and by columns in another")
    transposed = bool(orientation and orientation.pop())
    write = writes[0]
    keys, values = (write.base[2][1], write.base[1][1]) if transposed else (write.base[1][1], write.base[2][1])
    state = states[0]
    decay = None if not state.coefs and _close(state.const, 1.0) else (state.const, state.coefs)
    per_key = any(c.per_row for c in state.coefs)
    if per_key and transposed:
        raise NotAttention("the decay varies along the state's value axis: LinearAttention decays per key")
    if decay is not None and state.const <= 0:
        raise NotAttention(f"the state is scaled by {state.const:g}: LinearAttention takes a positive decay (exp(g))")
    if any(c.per_row for c in write.coefs):
        raise NotAttention("the written product is scaled per key row")
    if not erases:
        return Rule("gated" if decay else "linear", transposed, keys, values, query, (write.const, write.coefs), decay,
                    scale, per_key)
    erase = erases[0]
    read = erase.base[2] if not transposed else erase.base[1]
    leaf = erase.base[1][1] if not transposed else erase.base[2][1]
    if leaf is not keys or read[3] is not keys:
        raise NotAttention("the subtracted product uses another key than the written one: not the delta rule")
    wanted = sorted(write.keys + state.keys, key=repr)
    if sorted(erase.keys, key=repr) != wanted or not _close(erase.const, -write.const * state.const):
        raise NotAttention("the subtracted product's coefficients are not the write's β times the decay: "
                           "not β k (v − a Sᵀk)ᵀ")
    return Rule("gated_delta" if decay else "delta", transposed, keys, values, query, (write.const, write.coefs),
                decay, scale, per_key)
