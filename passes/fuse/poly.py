"""Polynomials over body values: the canonical form the fuse matcher compares cells in.

A value is a sum of terms ``(f1 ⊙ f2 ⊙ ...)·W`` plus a bias. A factor is a leaf (a body
input, an activation output, anything that is not linear algebra) or a group (a sum with
matrix terms that cannot be distributed elementwise, e.g. ``h·Rᵀ + b`` inside
``r ⊙ (h·Rᵀ + b)``); W is a constant elementwise scale or a matrix in ``x·W`` orientation,
or a :class:`Runtime` weight known only when the model runs. Weights are float64 copies.
Sizes are bounded (:data:`MAX_TERMS`, :data:`MAX_GROUP_DEPTH`) so that a pathological body
is declined with a reason instead of exhausting time or the stack.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx_graphsurgeon as gs

INT64_MAX = np.iinfo(np.int64).max
# Bounds that real cells stay far below (a GRU expands to about 10 terms, 2 levels of groups);
# past them a body is declined instead of costing quadratic time or the stack.
MAX_TERMS = 256
MAX_GROUP_DEPTH = 16


class NoMatch(Exception):
    """The value is not of the form asked for; ``str(exc)`` is the reason."""


@dataclass(frozen=True, eq=False)
class Leaf:
    tensor: gs.Tensor

    @property
    def key(self):
        return (0, self.tensor.name, id(self.tensor))


@dataclass(frozen=True, eq=False)
class Group:
    poly: "Poly"

    def __post_init__(self):
        inner = max((f.depth for t in self.poly.terms for f in t.factors if isinstance(f, Group)), default=0)
        if inner + 1 > MAX_GROUP_DEPTH:
            raise NoMatch(f"products of sums nest more than {MAX_GROUP_DEPTH} deep; no recurrent cell does")
        object.__setattr__(self, "depth", inner + 1)

    @property
    def key(self):
        return (1, "", id(self))


@dataclass(frozen=True)
class Runtime:
    """A weight known only at run time: a value of an enclosing graph or a loop-invariant
    state, in ``x·W`` orientation. A matrix is ``tensor`` [in, out] (``transposed``: the
    tensor is [out, in], as Gemm transB reads it); a vector (a bias, a peephole) is
    ``tensor`` [n]. Only columns [start, stop) are used, times ``scale``."""

    tensor: gs.Tensor
    vector: bool = False
    transposed: bool = False
    start: int = 0
    stop: int | None = None  # None: to the end
    scale: float = 1.0

    @property
    def width(self) -> int | None:
        if self.stop is not None:
            return self.stop - self.start
        shape = self.tensor.shape
        axis = 0 if self.vector or self.transposed else 1
        if not shape or len(shape) != (1 if self.vector else 2) or not isinstance(shape[axis], int):
            return None
        return shape[axis] - self.start

    @property
    def in_size(self) -> int | None:
        """Rows in x·W orientation (matrices only), when the tensor's shape tells."""
        shape = self.tensor.shape
        if self.vector or not shape or len(shape) != 2:
            return None
        size = shape[1 if self.transposed else 0]
        return size if isinstance(size, int) else None

    def cols(self, start: int, stop: int) -> "Runtime":
        return replace(self, start=self.start + start, stop=self.start + stop)

    def scaled(self, c: float) -> "Runtime":
        return replace(self, scale=self.scale * c)


def _mulw(a, b):
    """Product of two weights; a run-time weight only scales by a constant scalar."""
    if isinstance(a, Runtime) or isinstance(b, Runtime):
        rt, other = (a, b) if isinstance(a, Runtime) else (b, a)
        if isinstance(other, Runtime) or np.ndim(other) != 0:
            raise NoMatch(f"run-time weight '{rt.tensor.name}' is multiplied elementwise by a vector")
        return rt.scaled(float(other))
    return _broadcast(a, b, np.multiply)


@dataclass(frozen=True, eq=False)
class Term:
    """``(factors multiplied elementwise) ⊙ weight`` or, with ``matrix``, ``(...)·weight``."""

    factors: tuple  # of Leaf / Group, sorted by key; () for a run-time bias
    weight: np.ndarray | Runtime  # float64: shape () or (n,) elementwise; (in, out) when matrix
    matrix: bool = False

    @property
    def monomial(self) -> tuple:
        """Identity of the factor product (a multiset of leaves and groups)."""
        return tuple(f.key for f in self.factors)


@dataclass(frozen=True, eq=False)
class Poly:
    terms: tuple = ()
    bias: np.ndarray | None = None  # float64, shape () or (n,); None is zero

    def __post_init__(self):
        if len(self.terms) > MAX_TERMS:
            raise NoMatch(f"a value expands to more than {MAX_TERMS} terms; no recurrent cell does")

    @property
    def is_constant(self) -> bool:
        return not self.terms

    @property
    def elementwise(self) -> bool:
        return not any(t.matrix for t in self.terms)

    def width(self) -> int | None:
        """The last-axis size of the value, when a weight or the bias tells."""
        for t in self.terms:
            if isinstance(t.weight, Runtime):
                if t.weight.width is not None:
                    return t.weight.width
            elif t.matrix:
                return t.weight.shape[1]
            elif t.weight.ndim == 1:
                return t.weight.shape[0]
        return self.bias.shape[0] if self.bias is not None and self.bias.ndim == 1 else None


def leaf(tensor: gs.Tensor) -> Poly:
    return Poly((Term((Leaf(tensor),), np.asarray(1.0)),))


def constant(value) -> Poly:
    return Poly((), np.asarray(value, np.float64))


# -- arithmetic on polynomials ----------------------------------------------------------

def _broadcast(a: np.ndarray, b: np.ndarray, op) -> np.ndarray:
    if a.ndim and b.ndim and a.shape != b.shape:
        raise NoMatch(f"sizes {a.shape[0]} and {b.shape[0]} do not match")
    return op(a, b)


def _add_bias(a, b):
    if a is None or b is None:
        return b if a is None else a
    return _broadcast(a, b, np.add)


def add(*polys: Poly) -> Poly:
    """The sum; terms with the same factors and kind merge (``x + x`` is ``2·x``), so a long
    chain of additions stays as small as what it computes."""
    merged: dict = {}
    bias = None
    for p in polys:
        for t in p.terms:
            key = (t.monomial, t.matrix, isinstance(t.weight, Runtime))
            if key[2]:
                key += (id(t),)
            other = merged.get(key)
            if other is None:
                merged[key] = t
            elif t.matrix and other.weight.shape != t.weight.shape:
                merged[key + (id(t),)] = t
            else:
                merged[key] = Term(other.factors, _broadcast(other.weight, t.weight, np.add), t.matrix)
        bias = _add_bias(bias, p.bias)
    return Poly(tuple(merged.values()), bias)


def scale(p: Poly, c: np.ndarray) -> Poly:
    """``p ⊙ c`` for a constant scalar or vector c (a matrix term scales its columns)."""
    c = np.asarray(c, np.float64)
    terms = tuple(Term(t.factors, _broadcast_cols(t, c), t.matrix) for t in p.terms)
    return Poly(terms, None if p.bias is None else _broadcast(p.bias, c, np.multiply))


def _broadcast_cols(t: Term, c: np.ndarray) -> np.ndarray:
    if isinstance(t.weight, Runtime):
        return _mulw(t.weight, c)
    if t.matrix:
        if c.ndim and c.shape[0] != t.weight.shape[1]:
            raise NoMatch(f"sizes {t.weight.shape[1]} and {c.shape[0]} do not match")
        return t.weight * c
    return _broadcast(t.weight, c, np.multiply)


def _monomials(p: Poly) -> list[tuple[tuple, np.ndarray]]:
    """(factors, elementwise weight) pairs; a sum with matrix terms stays one group."""
    if not p.elementwise:
        return [((Group(p),), np.asarray(1.0))]
    out = [(t.factors, t.weight) for t in p.terms]
    return out + ([((), p.bias)] if p.bias is not None else [])


def mul(p: Poly, q: Poly) -> Poly:
    """Elementwise product, distributed over elementwise sums."""
    if p.is_constant or q.is_constant:
        const, other = (p, q) if p.is_constant else (q, p)
        return Poly() if const.bias is None else scale(other, const.bias)
    terms, bias = [], None
    for fa, wa in _monomials(p):
        for fb, wb in _monomials(q):
            w = _mulw(wa, wb)
            factors = tuple(sorted(fa + fb, key=lambda f: f.key))
            if factors or isinstance(w, Runtime):
                terms.append(Term(factors, w))
            else:
                bias = _add_bias(bias, w)
    return Poly(tuple(terms), bias)


def matmul(p: Poly, w: np.ndarray) -> Poly:
    """``p·W`` for a constant 2-D W [in, out]."""
    w = np.asarray(w, np.float64)
    terms = []
    for t in p.terms:
        if isinstance(t.weight, Runtime):
            raise NoMatch(f"run-time weight '{t.weight.tensor.name}' is multiplied by a constant matrix")
        if t.matrix:
            if t.weight.shape[1] != w.shape[0]:
                raise NoMatch(f"matrix sizes {t.weight.shape} and {w.shape} do not chain")
            terms.append(Term(t.factors, t.weight @ w, True))
        else:
            s = t.weight
            if s.ndim and s.shape[0] != w.shape[0]:
                raise NoMatch(f"a size-{s.shape[0]} value cannot multiply a {w.shape} matrix")
            terms.append(Term(t.factors, (s[:, None] if s.ndim else s) * w, True))
    bias = None
    if p.bias is not None:
        b = p.bias if p.bias.ndim else np.full(w.shape[0], float(p.bias))
        if b.shape[0] != w.shape[0]:
            raise NoMatch(f"a size-{b.shape[0]} bias cannot multiply a {w.shape} matrix")
        bias = b @ w
    return Poly(tuple(terms), bias)


def runtime_matmul(p: Poly, w: Runtime) -> Poly:
    """``p·W`` for a run-time W: only a single product of leaves (no bias) can carry it."""
    if len(p.terms) != 1 or p.bias is not None or p.terms[0].matrix or np.ndim(p.terms[0].weight) != 0:
        raise NoMatch(f"run-time weight '{w.tensor.name}' multiplies a sum, not a single value")
    (t,) = p.terms
    return Poly((Term(t.factors, w.scaled(float(t.weight)), True),))


def columns(p: Poly, start: int, stop: int) -> Poly:
    """Columns [start, stop) of the last axis."""
    terms = []
    for t in p.terms:
        if isinstance(t.weight, Runtime) and (t.matrix or not t.factors):
            terms.append(Term(t.factors, t.weight.cols(start, stop), t.matrix))
        elif t.matrix:
            terms.append(Term(t.factors, t.weight[:, start:stop], True))
        elif t.weight.ndim == 0 and all(isinstance(f, Group) for f in t.factors):
            terms.append(Term(tuple(Group(columns(f.poly, start, stop)) for f in t.factors), t.weight))
        else:
            names = ", ".join(f"'{f.tensor.name}'" for f in t.factors if isinstance(f, Leaf))
            raise NoMatch(f"a Split/Slice cuts {names} itself, not a matrix product")
    bias = p.bias if p.bias is None or p.bias.ndim == 0 else p.bias[start:stop]
    return Poly(tuple(terms), bias)



def format_poly(p: Poly, names: dict[int, str] | None = None) -> str:
    """A short human-readable form for reasons, e.g. ``a + -1·z⊙a + z⊙h``."""
    names = names or {}

    def factor(f) -> str:
        if isinstance(f, Leaf):
            return names.get(id(f.tensor), f"'{f.tensor.name}'")
        return "(" + format_poly(f.poly, names) + ")"

    parts = []
    for t in p.terms:
        body = "⊙".join(factor(f) for f in t.factors)
        if isinstance(t.weight, Runtime):
            parts.append(f"{body}{'·' if t.matrix else ''}{'⊙' if body and not t.matrix else ''}'{t.weight.tensor.name}'")
        elif t.matrix:
            parts.append(f"{body}·W{list(t.weight.shape)}")
        elif t.weight.ndim == 0 and t.weight == 1:
            parts.append(body)
        else:
            w = f"{float(t.weight):g}" if t.weight.ndim == 0 else "c"
            parts.append(f"{w}·{body}")
    if p.bias is not None:
        parts.append("b")
    return " + ".join(parts) or "0"
