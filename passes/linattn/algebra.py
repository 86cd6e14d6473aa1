"""The matrix-state algebra of a linear-attention Scan body, read as a sum of monomials.

A body value that depends on the state S [*b, R, C] is read as a sum of monomials
``sign · const · Π coefficients · base`` (every product distributed), where a coefficient is a
state-free value broadcasting as one number per head (its trailing R, C or vector axis of size 1)
or, on S alone, per row (GLA's per-key decay), and a base is:

- ``("S",)``: the state (``("S", True)``: Sᵀ, only inside a read); ``("new",)``: the new state S';
- ``("outer", r, c)``: the outer product of two vector bases (r along R, c along C);
- ``("leaf", x)``: a state-free vector; ``("read", side, m, x)``: the matrix base m read with the
  state-free vector x: side "row" Σ_i x_i m_ij (q·S, Sᵀk), side "col" Σ_j m_ij x_j (S·q).

Ops read (each only where the algebra stays exact): Identity, Add, Sub, Neg, Mul and Div by a
coefficient, Mul/MatMul of Unsqueeze(x, -1) and Unsqueeze(y, -2) and the two-term Einsum (outer
products), the Einsum, MatMul of an unsqueezed vector then Squeeze, and ReduceSum of a broadcast Mul
(reads), Transpose of the last two axes. Anything else reading the state raises
:class:`NotAttention` with the node named. Which rule the sum is, is decided in :mod:`rules`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.constexpr import ConstantFolder
from scanopt.graph import constant_axes, constant_value, is_whole_slice, node_label
from scanopt.protos import in_default_domain


class NotAttention(Exception):
    """The body is not a linear-attention update; the message is the reason."""


@dataclass(eq=False)
class Lifted:
    """A per-step vector the body never holds, read from a scan input that hoist computed
    outside the loop over all steps: ``Unsqueeze(X, -1)`` (the body's ``Unsqueeze(x_t, -1)``)
    or the outer product ``X[..., :, None] * Y[..., None, :]`` (the body's k vᵀ). ``x`` is X
    ([T, *b, d], steps on axis 0, read as scan input ``j`` reads them); one object per X and
    direction, so the key of the write and of the erase (hoisted as a column and as a row) is
    one key."""

    x: gs.Tensor
    j: int

    @property
    def name(self) -> str:
        return self.x.name


@dataclass(frozen=True)
class Coef:
    """A state-free coefficient: ``tensor`` as the body uses it, ``key`` equal for two uses of
    the same numbers (the same root through Unsqueeze/Squeeze/Identity, the same per-head shape),
    ``per_row``: it varies along the state's row axis (a per-key decay)."""

    tensor: gs.Tensor
    key: tuple
    per_row: bool = False
    context: int = 0  # the rank of the value it multiplies (the state's, or a vector's)


@dataclass(frozen=True)
class Mono:
    const: float
    coefs: tuple  # Coef, sorted by key
    base: tuple

    def times(self, const: float = 1.0, coefs: tuple = ()) -> "Mono":
        return Mono(self.const * const, tuple(sorted(self.coefs + coefs, key=lambda c: repr(c.key))), self.base)

    @property
    def keys(self) -> tuple:
        return tuple(c.key for c in self.coefs)


def _producer(t: gs.Tensor):
    node = t.inputs[0] if len(t.inputs) == 1 else None
    return node if node is not None and in_default_domain(node.domain) else None


def _root(t: gs.Tensor) -> gs.Tensor:
    while True:
        node = _producer(t)
        if node is None or node.op not in ("Identity", "Unsqueeze", "Squeeze") and not _whole(node):
            return t
        t = node.inputs[0]


def _whole(node) -> bool:
    return is_whole_slice(node, ConstantFolder().value)


def _unsliced(t: gs.Tensor) -> gs.Tensor:
    """``t`` before any Slice that keeps every element (TorchScript's ``x[..., None, :]``)."""
    while (node := _producer(t)) is not None and _whole(node):
        t = node.inputs[0]
    return t


class BodyAlgebra:
    """Reads body values of a Scan whose state is ``state_in`` -> ``state_out`` (rank ``rank``)."""

    def __init__(self, state_in: gs.Tensor, new_state: set[int], depends, shape_of, rank: int,
                 scan_inputs: dict | None = None, hoisted: dict | None = None):
        """``scan_inputs``: id of a body scan input -> (outer tensor, scan axis, direction, index),
        to read the vectors and outer products hoist computed outside the loop; ``hoisted``: the
        :class:`Lifted` of each outer vector, shared by the algebras of one body."""
        self.state_in, self.new_state, self.depends, self.shape_of, self.rank = state_in, new_state, depends, shape_of, rank
        self.scan_inputs = scan_inputs or {}
        self.hoisted = {} if hoisted is None else hoisted
        self.memo: dict[int, list[Mono]] = {}

    # -- classification -------------------------------------------------------------------
    def _dependent(self, t: gs.Tensor) -> bool:
        return t is self.state_in or id(t) in self.new_state or self.depends(t)

    def _shape(self, t: gs.Tensor):
        shape = self.shape_of(t)
        if shape is None and isinstance(t, gs.Constant):
            shape = list(np.asarray(t.values).shape)
        return shape

    def rank_of(self, t: gs.Tensor) -> int | None:
        shape = self._shape(t)
        return None if shape is None else len(shape)

    def coefficient(self, t: gs.Tensor, context_rank: int, label: str) -> tuple[float, tuple]:
        """(const, (Coef,)) for a state-free ``t`` multiplying a value of ``context_rank``."""
        value = constant_value(t)
        if value is not None and np.asarray(value).size == 1:
            return float(np.asarray(value).reshape(-1)[0]), ()
        shape = self._shape(t)
        if shape is None:
            raise NotAttention(f"{label} scales by '{t.name}' of unknown shape")
        tail = 2 if context_rank == self.rank else 1
        shape = [1] * max(context_rank - len(shape), 0) + list(shape)
        if len(shape) > context_rank:
            raise NotAttention(f"{label} broadcasts '{t.name}' {list(shape)} beyond the state's rank")
        trailing = shape[context_rank - tail:]
        per_row = False
        if any(d != 1 for d in trailing):
            if tail == 2 and trailing[1] == 1:
                per_row = True  # one number per row of S (GLA's per-key decay); only S may take it
            else:
                raise NotAttention(f"{label} multiplies by '{t.name}' {list(shape)}: not one number per head "
                                   "(a trailing axis of size 1)")
        head = tuple(shape[:context_rank - tail]) + ((trailing[0],) if per_row else ())
        if any(d is None for d in head):
            raise NotAttention(f"'{t.name}' has a dim of unknown size")
        return 1.0, (Coef(t, (id(_root(t)), head, per_row), per_row, context_rank),)

    # -- reading ---------------------------------------------------------------------------
    def read(self, t: gs.Tensor) -> list[Mono]:
        """The monomials of ``t``: a matrix (rank == state rank) or a vector (one less)."""
        if isinstance(t, Lifted):
            return [Mono(1.0, (), ("leaf", t))]
        if id(t) in self.memo:
            return self.memo[id(t)]
        monos = self._read(t)
        self.memo[id(t)] = monos
        return monos

    def _read(self, t: gs.Tensor) -> list[Mono]:
        if t is self.state_in:
            return [Mono(1.0, (), ("S",))]
        if id(t) in self.new_state:
            return [Mono(1.0, (), ("new",))]
        rank = self.rank_of(t)
        node = _producer(t)
        if not self._dependent(t):
            if node is not None and _whole(node):
                return self.read(node.inputs[0])
            return self._free(t, node, rank)
        if node is None:
            raise NotAttention(f"'{t.name}' depends on the state but has no producer in the body")
        label = f"{node.op} '{node_label(node)}'"
        ins = list(node.inputs)
        if node.op == "Identity" or _whole(node):
            return self.read(ins[0])
        if rank is None:
            raise NotAttention(f"{label}: the rank of '{t.name}' is unknown")
        if node.op == "Neg":
            return [m.times(-1.0) for m in self.read(ins[0])]
        if node.op in ("Add", "Sub"):
            left, right = self.read(ins[0]), self.read(ins[1])
            return left + ([m.times(-1.0) for m in right] if node.op == "Sub" else right)
        if node.op in ("Mul", "Div", "MatMul", "Einsum") and len(ins) == 2:
            outer = self._outer(node, rank)
            if outer is not None:
                return outer
        if node.op in ("Mul", "Div") and len(ins) == 2:
            dep = [self._dependent(x) for x in ins]
            if node.op == "Div" and dep[1] or all(dep):
                raise NotAttention(f"{label} multiplies two values that depend on the state (not linear)")
            i = 0 if dep[0] else 1
            const, coefs = self.coefficient(ins[1 - i], rank, label)
            if node.op == "Div":
                if coefs or const == 0:
                    raise NotAttention(f"{label} divides by a tensor, not a constant")
                const = 1.0 / const
            inner = self.read(ins[i])
            if any(c.per_row for c in coefs) and any(m.base[0] != "S" for m in inner):
                raise NotAttention(f"{label} scales rows of more than the state")
            return [m.times(const, coefs) for m in inner]
        reads = self._reads(node, rank, label)
        if reads is not None:
            return reads
        if node.op == "Transpose":
            perm = node.attrs.get("perm")
            r = self.rank_of(ins[0])
            if perm is not None and r is not None and list(perm) == list(range(r - 2)) + [r - 1, r - 2]:
                return [Mono(m.const, m.coefs, _transposed(m.base, label)) for m in self.read(ins[0])]
        raise NotAttention(f"{label} reads the state in a way the linear-attention rules do not "
                           "(only sums, per-head scaling, outer products and reads q·S, Sᵀk)")

    def _free(self, t, node, rank) -> list[Mono]:
        """A state-free value: a vector is a leaf (through per-head scaling), a matrix must be
        an outer product (of free vectors), possibly scaled."""
        if rank == self.rank - 1:
            if node is not None and node.op in ("Mul", "Div") and len(node.inputs) == 2:
                for i in (1, 0) if node.op == "Mul" else (1,):
                    try:
                        const, coefs = self.coefficient(node.inputs[i], rank, f"{node.op} '{node_label(node)}'")
                    except NotAttention:
                        continue
                    if self.rank_of(node.inputs[1 - i]) != rank:
                        continue
                    if node.op == "Div":
                        if coefs or const == 0:
                            break
                        const = 1.0 / const
                    return [m.times(const, coefs) for m in self.read(node.inputs[1 - i])]
            return [Mono(1.0, (), ("leaf", t))]
        if rank == self.rank and node is None and id(t) in self.scan_inputs:
            lifted = self._lifted_outer(t)
            if lifted is not None:
                return lifted
        if rank == self.rank and node is not None:
            outer = self._outer(node, rank)
            if outer is not None:
                return outer
            if node.op == "Identity":
                return self.read(node.inputs[0])
            if node.op == "Neg":
                return [m.times(-1.0) for m in self.read(node.inputs[0])]
            if node.op in ("Mul", "Div") and len(node.inputs) == 2:
                for i in (1, 0) if node.op == "Mul" else (1,):
                    if self.rank_of(node.inputs[1 - i]) != rank:
                        continue
                    try:
                        const, coefs = self.coefficient(node.inputs[i], rank, f"{node.op} '{node_label(node)}'")
                    except NotAttention:
                        continue
                    if any(c.per_row for c in coefs) or (node.op == "Div" and (coefs or const == 0)):
                        continue
                    const = 1.0 / const if node.op == "Div" else const
                    return [m.times(const, coefs) for m in self.read(node.inputs[1 - i])]
        raise NotAttention(f"'{t.name}' enters the state update but is not an outer product of two vectors "
                           "(or a per-head multiple of one)")

    def _vector(self, t: gs.Tensor, axis_from_end: int) -> gs.Tensor | Lifted | None:
        """x when ``t`` = Unsqueeze(x, axis) with the axis the last (-1) or second last (-2)
        (behind a Slice that keeps every element); a :class:`Lifted` x when ``t`` is a scan
        input over Unsqueeze(X, axis) outside the loop."""
        t = _unsliced(t)
        node = _producer(t)
        if node is None and id(t) in self.scan_inputs:
            outer = self._outer_step_node(t)
            x = None if outer is None else _unsqueezed(outer, self.rank + 1, axis_from_end)
            return None if x is None else self._lifted(x, t)
        if node is None or node.op != "Unsqueeze":
            return None
        return _unsqueezed(node, self.rank, axis_from_end)

    def _outer_step_node(self, t: gs.Tensor):
        """The outer node computing scan input ``t`` over all steps (scanned on axis 0), when
        ``t`` has the state's rank."""
        outer, scan_axis, _, _ = self.scan_inputs[id(t)]
        node = _producer(outer)
        if node is None or scan_axis != 0 or self.rank_of(t) != self.rank:
            return None
        return node

    def _lifted(self, x: gs.Tensor, t: gs.Tensor) -> Lifted | None:
        _, _, direction, j = self.scan_inputs[id(t)]
        if self.rank_of(x) != self.rank:  # [T, *b, d]
            return None
        key = (id(x), direction)
        found = self.hoisted.get(key)
        if found is None:
            found = self.hoisted[key] = Lifted(x, j)
        return found

    def _pair(self, node, rank: int, vector) -> tuple | None:
        """(rows, cols) when ``node`` (of rank ``rank``) is the outer product of two vectors:
        Mul/MatMul of ``vector(a, -1)`` and ``vector(b, -2)``, or a two-term Einsum."""
        ins = list(node.inputs)
        if node.op in ("Mul", "MatMul") and len(ins) == 2:
            for a, b_ in ((0, 1), (1, 0)) if node.op == "Mul" else ((0, 1),):
                r, c = vector(ins[a], -1), vector(ins[b_], -2)
                if r is not None and c is not None:
                    return r, c
        elif node.op == "Einsum":
            terms = _einsum(node, rank - 2)
            if terms is not None and len(terms[0]) == 2:
                (x, y), out = terms
                batch = out[:-2]
                if len(out) == rank and out[-2] != out[-1] and x[:-1] == batch == y[:-1]:
                    if (x[-1], y[-1]) == (out[-2], out[-1]):
                        return ins[0], ins[1]
                    if (x[-1], y[-1]) == (out[-1], out[-2]):
                        return ins[1], ins[0]
        return None

    def _lifted_outer(self, t: gs.Tensor) -> list[Mono] | None:
        """A scan input that is the outer product of two vectors over all steps (hoisted k vᵀ)."""
        node = self._outer_step_node(t)
        if node is None or not in_default_domain(node.domain):
            return None
        pair = self._pair(node, self.rank + 1, lambda u, axis: _unsqueezed(_producer(_unsliced(u)), self.rank + 1, axis))
        if pair is None:
            return None
        rows, cols = (self._lifted(x, t) for x in pair)
        if rows is None or cols is None:
            return None
        return [Mono(1.0, (), ("outer", ("leaf", rows), ("leaf", cols)))]

    def _outer(self, node, rank) -> list[Mono] | None:
        if rank != self.rank:
            return None
        pair = self._pair(node, rank, self._vector)
        if pair is None:
            return None
        rows, cols = self.read(pair[0]), self.read(pair[1])
        for side in (rows, cols):
            for m in side:
                if m.base[0] not in ("leaf", "read"):
                    raise NotAttention(f"{node.op} '{node_label(node)}': an outer product of a matrix")
        return [Mono(a.const * b_.const, (), ("outer", a.base, b_.base)).times(1.0, a.coefs + b_.coefs)
                for a in rows for b_ in cols]

    def _reads(self, node, rank, label) -> list[Mono] | None:
        """A read of a matrix by a free vector, in the forms of the module docstring."""
        ins = list(node.inputs)
        if rank != self.rank - 1:
            return None
        if node.op == "Einsum":
            terms = _einsum(node, self.rank - 2)
            if terms is None or len(terms[0]) != 2:
                return None
            (x, y), out = terms
            for m_i, v_i, mt, vt in ((0, 1, x, y), (1, 0, y, x)):
                if len(mt) == self.rank and len(vt) == self.rank - 1 and mt[:-2] == vt[:-1] == out[:-1]:
                    if vt[-1] == mt[-2] and out[-1] == mt[-1] and mt[-1] != mt[-2]:
                        return self._read_with(ins[m_i], ins[v_i], "row", label)
                    if vt[-1] == mt[-1] and out[-1] == mt[-2] and mt[-1] != mt[-2]:
                        return self._read_with(ins[m_i], ins[v_i], "col", label)
            return None
        if node.op == "MatMul" and self.rank == 2:
            if self.rank_of(ins[0]) == 1 and self.rank_of(ins[1]) == 2:
                return self._read_with(ins[1], ins[0], "row", label)
            if self.rank_of(ins[0]) == 2 and self.rank_of(ins[1]) == 1:
                return self._read_with(ins[0], ins[1], "col", label)
        if node.op == "Squeeze":
            axes, inner = constant_axes(node), _producer(ins[0])
            if axes is None or len(axes) != 1 or inner is None:
                return None
            axis = axes[0] % self.rank
            if inner.op == "MatMul":
                x_row, x_col = self._vector(inner.inputs[0], -2), self._vector(inner.inputs[1], -1)
                if axis == self.rank - 2 and x_row is not None:
                    return self._read_with(inner.inputs[1], x_row, "row", label)
                if axis == self.rank - 1 and x_col is not None:
                    return self._read_with(inner.inputs[0], x_col, "col", label)
            if inner.op == "ReduceSum" and inner.attrs.get("keepdims", 1) == 1:
                return self._reduce_read(inner, axis, label)
            return None
        if node.op == "ReduceSum" and node.attrs.get("keepdims", 1) == 0:
            axes = node.attrs.get("axes") if len(ins) < 2 else constant_axes(node)
            if axes is None or len(axes) != 1:
                return None
            return self._reduce_read(node, axes[0] % self.rank, label)
        return None

    def _reduce_read(self, node, axis, label) -> list[Mono] | None:
        axes = node.attrs.get("axes") if len(node.inputs) < 2 else constant_axes(node)
        if axes is None or len(axes) != 1 or axes[0] % self.rank != axis:
            return None
        mul = _producer(node.inputs[0])
        if mul is None or mul.op != "Mul":
            return None
        for m_i in (0, 1):
            x = self._vector(mul.inputs[1 - m_i], -1 if axis == self.rank - 2 else -2)
            if x is not None and self.rank_of(mul.inputs[m_i]) == self.rank:
                return self._read_with(mul.inputs[m_i], x, "row" if axis == self.rank - 2 else "col", label)
        return None

    def _read_with(self, matrix: gs.Tensor, vector: gs.Tensor | Lifted, side: str, label: str) -> list[Mono]:
        if not isinstance(vector, Lifted) and self._dependent(vector):
            raise NotAttention(f"{label} reads the state with a vector that depends on the state")
        found = []
        for v in self.read(vector):
            if v.base[0] != "leaf":
                raise NotAttention(f"{label} reads with a vector that is not a plain value")
            for m in self.read(matrix):
                if m.base[0] not in ("S", "new"):
                    raise NotAttention(f"{label} reads an outer product back (a dot product of keys): "
                                       "not one of the four rules")
                base, how = m.base, side
                if base[0] == "S":  # Sᵀ read by columns is S read by rows
                    base, how = ("S",), (side if not (len(base) > 1 and base[1]) else {"row": "col", "col": "row"}[side])
                if any(c.per_row for c in m.coefs) and (base[0] != "S" or how != "row"):
                    # Σ_i x_i a_i S_ij (the per-key decayed state read by a key: gated_delta's erase)
                    # sums over the rows; read by columns a_i would scale the result per element
                    raise NotAttention(f"{label} reads a state scaled per row along its columns: not a read "
                                       "LinearAttention's rules make")
                found.append(Mono(m.const * v.const, (), ("read", how, base, v.base[1])).times(1.0, m.coefs + v.coefs))
        return found


def _unsqueezed(node, rank: int, axis_from_end: int):
    """x when ``node`` is Unsqueeze(x, axis) giving rank ``rank`` with the axis the last (-1) or
    second last (-2), else None."""
    if node is None or node.op != "Unsqueeze" or not in_default_domain(node.domain):
        return None
    axes = constant_axes(node)
    if axes is None or len(axes) != 1 or axes[0] % rank != rank + axis_from_end:
        return None
    return node.inputs[0]


def _transposed(base: tuple, label: str) -> tuple:
    if base[0] == "S":
        return ("S", not (len(base) > 1 and base[1]))
    if base[0] == "outer":
        return ("outer", base[2], base[1])
    raise NotAttention(f"{label} transposes the new state")


def _einsum(node, nb: int) -> tuple[list[list[str]], list[str]] | None:
    equation = node.attrs.get("equation", "").replace(" ", "")
    if "->" not in equation:
        return None
    lhs, out = equation.split("->")
    terms = lhs.split(",")
    if "." in equation:  # a leading ellipsis only: the shared batch axes
        if not all(term.startswith("...") and term.count(".") == 3 for term in terms + [out]):
            return None
        terms, out = [term[3:] for term in terms], out[3:]
        batch = [f"@{k}" for k in range(nb)]  # the ellipsis spelled as the state's batch axes
        return [batch + list(term) for term in terms], batch + list(out)
    return [list(term) for term in terms], list(out)
