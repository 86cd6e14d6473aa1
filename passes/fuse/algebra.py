"""What a body value computes, as a :class:`~scanopt.passes.fuse.poly.Poly`: match cells by algebra.

``Algebra.poly(tensor)`` expands Add/Sum/Sub/Neg in any operand order, Mul (distributed),
MatMul against a constant (either side for a vector), MatMul or Gemm of a last-axis Concat, Gemm
(transB, alpha, beta, bias), Split/Slice of the last axis, Unsqueeze/Squeeze of leading
axes and Identity, so ``x·Wᵀ + b + h·Rᵀ``, ``Gemm(x, W, b) + Gemm(h, R)`` and one fused
MatMul split into gates compare equal term by term. Constants are whatever
:mod:`scanopt.constexpr` can evaluate (a weight behind Transpose/Cast/Slice/... of
initializers). Given the body, values it reads but does not compute (an enclosing
graph's value, a loop-invariant state) are :class:`Runtime` weights. Anything the algebra
cannot express raises :class:`NoMatch` with the reason.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.constexpr import ConstantFolder
from scanopt.graph import is_op
from scanopt.passes.fuse.cuts import column_range, cut_source, is_cut, producer
from scanopt.passes.fuse.layout import _dtype
from scanopt.passes.fuse.layout import (
    LAYOUT_OPS, concat_matmul, last_axis_concat, layout_rank, runtime_matrix, same_rows, through_layout,
)
from scanopt.passes.fuse.stacked import entry, picked
from scanopt.passes.fuse.poly import (
    NoMatch, Poly, Runtime, Term, add, columns, constant, leaf, matmul, mul, runtime_matmul, scale,
)

# -- reading the graph -----------------------------------------------------------------

def resolve(tensor: gs.Tensor) -> gs.Tensor:
    """Follow Identity nodes (and Dropouts in inference mode, which copy too) back to the value
    they copy."""
    node = producer(tensor)
    while node is not None and (is_op(node, "Identity") or inference_dropout(node)):
        tensor = node.inputs[0]
        node = producer(tensor)
    return tensor


def inference_dropout(node: gs.Node) -> bool:
    """A Dropout that copies its input: no ``training_mode`` input (Dropout-12+: inference; 7-11
    have none), not Dropout-1/6 with ``is_test=0``, and no mask output asked for (a reader of
    the mask, or a body output naming it, would not be rewritten here)."""
    if not is_op(node, "Dropout") or not node.inputs:
        return False
    if len(node.inputs) > 2 and node.inputs[2].name:
        return False  # training_mode given: even a constant false is left alone
    if node.attrs.get("is_test", 1) != 1:
        return False
    return len(node.outputs) == 1 or not node.outputs[1].name


def is_algebra(node: gs.Node) -> bool:
    """True for the ops :class:`Algebra` expands (everything else makes a leaf)."""
    return node.op in _HANDLERS and is_op(node, node.op)


def describe(tensor: gs.Tensor) -> str:
    """``'name' (Op output)`` or ``'name'`` for an input: for reasons a user can read; a part
    cut from another value says what it was cut from (``Split of a LayerNormalization output``)."""
    node = producer(tensor)
    if node is None:
        return f"'{tensor.name}'"
    source = producer(cut_source(node)) if is_cut(node) else None
    if source is not None:
        return f"'{tensor.name}' ({node.op} of a {source.op} output)"
    return f"'{tensor.name}' ({node.op} output)"


class Algebra:
    """Expands body values into :class:`Poly`, memoized; ``stops`` are kept as leaves.

    ``rank(tensor)`` (optional) gives a value's rank, needed to tell that a Split,
    Slice or Concat works on the last axis when its axis is given as non-negative.
    """

    def __init__(self, rank=None, stops: Iterable[gs.Tensor] = (), body: gs.Graph | None = None,
                 varying: Iterable[gs.Tensor] = (), folder: ConstantFolder | None = None):
        self._declared_rank = rank or (lambda t: None)
        self._ranks: dict[int, int | None] = {}
        self._stops = {id(t) for t in stops}
        # With ``body``, only its nodes are expanded; every other non-constant value it reads
        # (an enclosing graph's value, a body input not in ``varying``) is a run-time constant.
        self._local = None if body is None else {id(n) for n in body.nodes}
        self._varying = {id(t) for t in varying}
        self._memo: dict[int, Poly | NoMatch] = {}
        self._fold = (folder or ConstantFolder()).value

    def const(self, tensor: gs.Tensor) -> np.ndarray | None:
        """``tensor``'s constant value, or None: what the folder evaluates, and also a CastLike of
        a constant to the dtype of its second input where that dtype is known (onnxscript writes
        ``1 - z`` as ``Sub(CastLike(1, z), z)``; the cast is the whole computation)."""
        value = self._fold(tensor)
        node = producer(tensor) if value is None else None
        if node is not None and is_op(node, "CastLike") and len(node.inputs) == 2:
            source = self._fold(node.inputs[0])
            to = None if source is None else _dtype(self, node.inputs[1])
            value = None if to is None else source.astype(to)
        return value

    def _deps(self, tensor: gs.Tensor) -> list[gs.Tensor]:
        """The values :meth:`_expand` reads to expand ``tensor`` (none for a leaf)."""
        if id(tensor) in self._stops or self.const(tensor) is not None:
            return []
        if self.is_runtime(tensor) and self._rank(tensor) == 1:
            return []
        node = producer(tensor)
        if node is None or not is_algebra(node):
            return []
        if is_op(node, "SequenceAt"):
            deps = [cut_source(node)] if cut_source(node) is not None else []
        else:
            data_only = node.op in ("Split", "Slice") + LAYOUT_OPS
            deps = [t for t in (node.inputs[:1] if data_only else node.inputs) if t.name and self.const(t) is None]
        src = producer(through_layout(self, node.inputs[0])[0]) if node.op in ("MatMul", "Gemm") else None
        if src is not None and is_op(src, "Concat"):
            deps += [t for t in src.inputs if t.name]
        return deps

    def _fill(self, tensor: gs.Tensor) -> None:
        """Expand everything ``tensor`` depends on, inputs first, without recursion: a body
        of any depth costs one visit per value and no stack."""
        stack, expanded = [tensor], set()
        while stack:
            t = stack[-1]
            if id(t) in self._memo or id(t) in self._stops:
                stack.pop()
                continue
            if id(t) not in expanded:
                expanded.add(id(t))
                stack.extend(d for d in self._deps(t) if id(d) not in self._memo and id(d) not in expanded)
                continue
            stack.pop()
            try:
                self._memo[id(t)] = self._expand(t)
            except NoMatch as exc:
                # Kept, raised only to a reader that needs the value: not every input is read as a
                # polynomial (a MatMul's constant weight), and each value is expanded once.
                self._memo[id(t)] = exc

    def seed(self, tensor: gs.Tensor, value: Poly) -> None:
        """Read ``tensor`` as ``value`` (a body scan input that is an outer projection of X,
        see :mod:`scanopt.passes.fuse.projection`)."""
        self._varying.add(id(tensor))
        self._memo[id(tensor)] = value

    def poly(self, tensor: gs.Tensor) -> Poly:
        """What ``tensor`` computes; it is expanded even if it is a stop."""
        return self._expand(tensor)

    def value(self, tensor: gs.Tensor) -> Poly:
        if id(tensor) in self._stops:
            return leaf(tensor)
        if id(tensor) not in self._memo:
            self._fill(tensor)
        found = self._memo[id(tensor)]
        if isinstance(found, NoMatch):
            raise type(found)(*found.args)  # a fresh one: re-raising one instance grows its traceback
        return found

    def _expand(self, tensor: gs.Tensor) -> Poly:
        value = self.const(tensor)
        if value is not None:
            return self._constant(tensor, value)
        if self.is_runtime(tensor) and self._rank(tensor) == 1:
            return Poly((Term((), Runtime(tensor, vector=True)),))
        node = producer(tensor)
        handler = _HANDLERS.get(node.op) if node is not None and is_op(node, node.op) else None
        if handler is None:
            return leaf(tensor)
        return handler(self, node, tensor)

    def _rank(self, tensor: gs.Tensor, depth: int = 0) -> int | None:
        """A value's rank: declared or inferred, else derived through the ops that keep or
        combine ranks (shape inference often stops at a body's Reshape of a constant); the
        derivation looks at most 64 ops back (no deep recursion)."""
        found = self._declared_rank(tensor)
        if found is not None or depth > 64:
            return found
        if id(tensor) not in self._ranks:
            self._ranks[id(tensor)] = None  # a cycle ends here
            self._ranks[id(tensor)] = self._derived_rank(tensor, depth)
        return self._ranks[id(tensor)]

    def _derived_rank(self, tensor: gs.Tensor, depth: int) -> int | None:
        value = self.const(tensor)
        if value is not None:
            return value.ndim
        node = producer(tensor)
        if node is None or not is_op(node, node.op):
            return None
        if node.op in LAYOUT_OPS:
            return layout_rank(self, node, depth)
        if node.op in _RANK_KEEPING or is_cut(node):
            source = cut_source(node) if is_cut(node) else node.inputs[0]
            return None if source is None else self._rank(source, depth + 1)
        if node.op in ("Add", "Sub", "Mul", "Div", "Sum"):
            ranks = [self._rank(t, depth + 1) for t in node.inputs]
            return None if None in ranks else max(ranks)
        if node.op == "MatMul":  # numpy's rules: a vector operand loses its axis, matrices broadcast
            a, b = (self._rank(t, depth + 1) for t in node.inputs)
            if a is None or b is None or min(a, b) < 1:
                return None
            return max(a, b) if min(a, b) >= 2 else a + b - 2
        if node.op == "Gather":
            index = self.const(node.inputs[1]) if len(node.inputs) > 1 else None
            data = self._rank(node.inputs[0], depth + 1)
            return None if index is None or data is None else data + index.ndim - 1
        return 2 if node.op == "Gemm" else None

    def is_runtime(self, tensor: gs.Tensor) -> bool:
        """A value the body reads but does not compute and that does not vary per step."""
        if self._local is None or id(tensor) in self._varying or self.const(tensor) is not None:
            return False
        node = producer(tensor)
        return node is None or id(node) not in self._local

    def _constant(self, tensor, value: np.ndarray) -> Poly:
        if value.dtype.kind != "f":
            raise NoMatch(f"'{tensor.name}' is a {value.dtype} constant in float arithmetic")
        if value.ndim > 1 and any(d != 1 for d in value.shape[:-1]):
            raise NoMatch(f"constant '{tensor.name}' of shape {list(value.shape)} is not a scalar or a row vector")
        return constant(value.reshape(-1) if value.ndim else value)

    def is_last_axis(self, tensor: gs.Tensor, axis: int) -> bool:
        if axis == -1:
            return True
        rank = self._rank(tensor)
        return rank is not None and axis == rank - 1

    def column_range(self, node: gs.Node, out: gs.Tensor, width: int | None) -> tuple[int, int]:
        """The [start, stop) that a last-axis cut ``node`` gives output ``out``."""
        return column_range(self, node, out, width)

# -- per-op expansion -------------------------------------------------------------------

def _add(alg, node, out):
    return add(*(alg.value(t) for t in node.inputs))


def _sub(alg, node, out):
    return add(alg.value(node.inputs[0]), scale(alg.value(node.inputs[1]), -1.0))


def _neg(alg, node, out):
    return scale(alg.value(node.inputs[0]), -1.0)


def _mul(alg, node, out):
    return mul(alg.value(node.inputs[0]), alg.value(node.inputs[1]))


def _weight(alg, tensor, node) -> np.ndarray:
    value = alg.const(tensor)
    if value is None:
        raise NoMatch(f"{node.op} '{node.name}' multiplies by '{tensor.name}', which is not a constant")
    if value.ndim != 2 or value.dtype.kind != "f":
        raise NoMatch(f"{node.op} '{node.name}' weight '{tensor.name}' is not a 2-D float matrix")
    return value.astype(np.float64)


def _matmul(alg, node, out):
    a, b = node.inputs
    found = runtime_matrix(alg, b)
    if found is not None or alg.is_runtime(b):
        if found is None:
            raise NoMatch(f"MatMul '{node.name}' run-time weight '{b.name}' is not known to be a matrix")
        _refuse_runtime_concat(alg, node, a, found[0])
        return runtime_matmul(alg.value(a), Runtime(found[0], transposed=found[1]))
    left = alg.const(a) is not None or (alg.is_runtime(a) and alg._rank(a) == 2)
    if left and alg.const(b) is None and not alg.is_runtime(b):
        if alg._rank(b) != 1:  # W @ v equals v @ Wᵀ only for a vector v
            raise NoMatch(f"MatMul '{node.name}' has the weight on the left of a non-vector")
        if alg.is_runtime(a):
            return runtime_matmul(alg.value(b), Runtime(a, transposed=True))
        return matmul(alg.value(b), _weight(alg, a, node).T)
    return _times_constant(alg, a, _weight(alg, b, node))


def _times_constant(alg, a, w: np.ndarray) -> Poly:
    """``a·w`` for a constant matrix ``w``; a last-axis Concat ``a`` (``Concat([x, h])·W``,
    as TF1 cells and ``Linear(cat([x, h]))`` write it) splits into one product per piece."""
    src, reshaped = last_axis_concat(alg, a, w.shape[0])
    if src is not None:
        return concat_matmul(alg, src, w, infer=not reshaped)
    return matmul(alg.value(a), w)


def _refuse_runtime_concat(alg, node, a, weight) -> None:
    src = last_axis_concat(alg, a)[0]
    if src is not None:
        raise NoMatch(f"{node.op} '{node.name}' multiplies Concat '{src.name}' by run-time weight '{weight.name}': "
                      "splitting a run-time weight's rows between the Concat's pieces is not supported")


def _gemm(alg, node, out):
    if node.attrs.get("transA", 0):
        raise NoMatch(f"Gemm '{node.name}' transposes its data operand (transA=1)")
    alpha, trans_b = float(node.attrs.get("alpha", 1.0)), bool(node.attrs.get("transB", 0))
    found = runtime_matrix(alg, node.inputs[1])
    if found is not None:
        _refuse_runtime_concat(alg, node, node.inputs[0], found[0])
        result = runtime_matmul(alg.value(node.inputs[0]), Runtime(found[0], transposed=trans_b != found[1], scale=alpha))
    else:
        w = _weight(alg, node.inputs[1], node)
        result = _times_constant(alg, node.inputs[0], (w.T if trans_b else w) * alpha)
    if len(node.inputs) > 2 and node.inputs[2].name:
        # C is any value the algebra reads: a constant, a run-time bias, or a per-step value
        # (an input projection computed outside the loop, as an LSTM's recurrent Gemm reads it).
        result = add(result, scale(alg.value(node.inputs[2]), float(node.attrs.get("beta", 1.0))))
    return result


def _cut(alg, node, out):
    source = cut_source(node)
    src = None if source is None else producer(source)
    if source is None or (src is not None and not is_algebra(src) and alg.const(source) is None
                          and not alg.is_runtime(source)):
        return leaf(out)  # a part of an activation (or input): its own value, as gates read it
    whole = alg.value(source)
    start, stop = alg.column_range(node, out, whole.width())
    return columns(whole, start, stop)


def _gather(alg, node, out):
    """Entry k of a stack of gates (:mod:`scanopt.passes.fuse.stacked`); any other Gather is a leaf."""
    found = picked(alg, node)
    return leaf(out) if found is None or _activated(alg, found[0]) else entry(alg, *found)


def _squeeze(alg, node, out):
    found = picked(alg, node)  # Squeeze(Split(stack, axis 0)[k], [0]): entry k of the stack
    if found is None:
        return same_rows(alg, node, out)
    return leaf(out) if _activated(alg, found[0]) else entry(alg, *found)


def _activated(alg, stack) -> bool:
    """A stack computed by a node the algebra does not expand (an activation): each entry is its
    own value, as gates read it (like a last-axis cut of an activation)."""
    src = producer(stack)
    return src is not None and not is_algebra(src) and alg.const(stack) is None and not alg.is_runtime(stack)


_RANK_KEEPING = {"Identity", "Neg", "Cast", "Tanh", "Sigmoid", "Relu", "LeakyRelu", "Elu", "HardSigmoid", "Softsign",
                 "Softplus", "ThresholdedRelu", "Clip", "Concat"}

_HANDLERS = {
    "Identity": same_rows,
    "Add": _add,
    "Sum": _add,
    "Sub": _sub,
    "Neg": _neg,
    "Mul": _mul,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Split": _cut,
    "Slice": _cut,
    "SequenceAt": _cut,
    "Unsqueeze": same_rows,
    "Squeeze": _squeeze,
    "Gather": _gather,
    "Reshape": same_rows,
    "Flatten": same_rows,
    "Cast": same_rows,
}
