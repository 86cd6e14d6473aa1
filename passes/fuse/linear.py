"""Gate pre-activations as linear maps per role, and the small helpers the cell readers share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.graph import constant_value
from scanopt.passes.fuse.cell import Sum
from scanopt.passes.fuse.poly import Group, Leaf, NoMatch, Poly, Runtime, Term, format_poly

class _NotCellState(NoMatch):
    """The state tried as the cell state does not update like one."""


@dataclass
class _Linear:
    """A gate pre-activation as matrices per role, elementwise terms per role, bias
    (and run-time bias vectors)."""

    mats: dict
    diags: dict
    bias: np.ndarray | None
    rbias: tuple = ()

    def negated(self) -> "_Linear":
        return _Linear({k: _neg(v) for k, v in self.mats.items()}, {k: _neg(v) for k, v in self.diags.items()},
                       None if self.bias is None else -self.bias, tuple(r.scaled(-1.0) for r in self.rbias))



def _term(key, weight):
    return Term(tuple(Leaf(t) for t in key), weight)


def _count(key, tensor) -> int:
    return sum(t is tensor for t in key)


def _other(pair, tensor):
    """The factor of a two-factor product that is not ``tensor`` (itself for tensor⊙tensor)."""
    return pair[1] if pair[0] is tensor else pair[0]


def _monomials(p: Poly, what: str, linear: dict | None = None) -> list[tuple[tuple, np.ndarray]]:
    """Elementwise monomials [(leaf tensors, weight)], equal products merged, zeros dropped.
    With ``linear``, a factor that is a sum with matrix products (a gate with no nonlinearity,
    ``i ⊙ (x·W + h·R + b)``) stands as a new placeholder tensor; ``linear`` maps its id to the sum."""
    if p.bias is not None and np.any(p.bias != 0):
        raise NoMatch(f"{what} adds a constant: {format_poly(p)}")
    merged: dict = {}
    keys: dict = {}
    for t in p.terms:
        if isinstance(t.weight, Runtime):
            raise NoMatch(f"{what} reads run-time value '{t.weight.tensor.name}' outside any gate")
        groups = [f for f in t.factors if isinstance(f, Group)]
        if t.matrix or (groups and (linear is None or len(t.factors) != 2 or len(groups) != 1)):
            raise NoMatch(f"{what} has a matrix product outside any activation: {format_poly(p)}")
        ident = t.monomial
        keys.setdefault(ident, tuple(f.tensor if isinstance(f, Leaf) else _placeholder(f, linear) for f in t.factors))
        merged[ident] = t.weight if ident not in merged else merged[ident] + t.weight
    return [(keys[k], w) for k, w in merged.items() if np.any(w != 0)]


def _placeholder(group: Group, linear: dict) -> gs.Variable:
    var = gs.Variable(f"({format_poly(group.poly)})")
    linear[id(var)] = group.poly
    return var


def _neg(v):
    return v.scaled(-1.0) if isinstance(v, Runtime) else -v


def _size(v, axis) -> int | None:
    """Columns (axis 1) or rows (axis 0) of a matrix in x·W orientation; length of a vector."""
    if isinstance(v, Runtime):
        return v.in_size if axis == 0 and not v.vector else v.width
    v = np.asarray(v)
    if v.ndim == 2:
        return v.shape[axis]
    return v.shape[0] if v.ndim == 1 else None


def _onnx(m):
    """A matrix block in ONNX layout (rows = outputs); a run-time one stays as it is."""
    return m if isinstance(m, Runtime) else m.T


def _bias(lin: _Linear, size: int):
    const = _vector(lin.bias, size)
    return Sum(const, lin.rbias) if lin.rbias else const


def _cat(*blocks):
    """Blocks joined on axis 0: an array when all are constant, else the tuple of blocks."""
    if all(isinstance(b, np.ndarray) for b in blocks):
        return np.concatenate(blocks)
    return tuple(blocks)


def _is(weight, value) -> bool:
    return bool(np.all(np.asarray(weight) == value))


def _vector(v, size):
    return np.zeros(size) if v is None else np.broadcast_to(np.asarray(v, np.float64), (size,)).copy()


def _last_dim(tensor):
    shape = tensor.shape
    return shape[-1] if shape and isinstance(shape[-1], int) else None


def clip_bounds(node: gs.Node, const=constant_value) -> tuple[float | None, float | None]:
    """A Clip's (min, max), None for an absent bound; NoMatch when a bound is not constant."""
    if "min" in node.attrs or "max" in node.attrs or len(node.inputs) == 1:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
    else:
        bounds = [const(t) if t.name else None for t in node.inputs[1:3]] + [None]
        if any(t.name and b is None for t, b in zip(node.inputs[1:3], bounds)):
            raise NoMatch(f"Clip '{node.name}' bounds are not constant")
        lo, hi = (None if b is None else float(b) for b in bounds[:2])
    return (None if lo is None else float(lo)), (None if hi is None else float(hi))


def _symmetric_clip(node: gs.Node, const=constant_value) -> float:
    lo, hi = clip_bounds(node, const)
    if lo is None or hi is None or hi <= 0 or lo != -hi:
        raise NoMatch(f"Clip '{node.name}' bounds [{lo}, {hi}] are not a symmetric ±c (the clip attribute)")
    return float(hi)
