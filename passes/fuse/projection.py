"""Scan inputs that are input projections computed outside the loop: ``X·W + b`` over the
whole sequence, whole or cut per gate (scanopt's hoist writes this form, and so do hand
authors). The body's per-step slice of ``X·W + b`` is ``x_t·W + b``, so the cell is read
over a stand-in ``x_t`` of X (each such body input seeded with its value over ``x_t``) and
the native op takes X itself, with the projection folded into its W and B.

Only projections on the last axis by a constant matrix and a constant row bias are read
(MatMul, Gemm, Add, and last-axis Split/Slice of them, computed on X's rows flattened to
[-1, I] and reshaped back to X's leading dims too); X must have the projection's rank
(the same rows, so its per-step slice is the body's row block), and every scan input must
come from the same X along the same axis and direction. The outer projection itself is
left alone: it stays while anything else reads it, the cleanup pass removes it otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.graph import is_op
from scanopt.passes.fuse.algebra import Algebra
from scanopt.passes.fuse.cuts import column_range, cut_source, is_cut, producer
from scanopt.passes.fuse.poly import Leaf, NoMatch, Poly, Term


@dataclass
class Projection:
    source: gs.Tensor  # X, outside the Scan
    x: gs.Variable  # the stand-in for X's per-step slice inside the body
    seeds: dict  # id(body scan input) -> its value (Poly) over ``x``


def projected_inputs(node: gs.Node, view, ctx, folder) -> Projection | None:
    """The common X of a Scan whose scan inputs are all projections of it, or None."""
    n, first = view.num_states, int(view.batched)
    if view.batched:
        return None  # Scan-8 reads per batch item; its projections are not cut the same way
    body = node.attrs["body"]
    outer = Algebra(ctx.shapes.rank, folder=folder)  # constants and ranks of the enclosing graph
    found = []
    for k in range(view.num_scan_inputs):
        try:
            found.append(_affine(node.inputs[first + n + k], outer, ctx.shapes.dims))
        except NoMatch:
            return None
    sources = {id(x) for x, _, _ in found}
    if len(sources) != 1 or len(set(view.input_axes)) != 1 or len(set(view.input_directions)) != 1:
        return None
    x_outer = found[0][0]
    width = {w.shape[0] for _, w, _ in found}
    x_rank, p_rank = outer._rank(x_outer), outer._rank(node.inputs[first + n])
    body_shape = ctx.shapes.shape(body.inputs[n])
    if len(width) != 1 or x_rank is None or x_rank != p_rank or body_shape is None or len(body_shape) != x_rank - 1:
        return None
    x = gs.Variable(f"{x_outer.name}_step", dtype=np.float32, shape=list(body_shape[:-1]) + [width.pop()])
    seeds = {}
    for k, (_, w, b) in enumerate(found):
        seeds[id(body.inputs[n + k])] = Poly((Term((Leaf(x),), w, matrix=True),), b)
    return Projection(x_outer, x, seeds)


def _affine(tensor: gs.Tensor, alg: Algebra, dims=None) -> tuple[gs.Tensor, np.ndarray, np.ndarray | None]:
    """(X, W [I, G], b [G] or None) with ``tensor == X·W + b`` along the last axis.
    ``dims`` (the model's DimClasses) lets a projection of X's flattened rows reshaped back
    to X's leading dims count as one of X."""
    node = producer(tensor)
    if node is None:
        raise NoMatch("not computed")
    if is_op(node, "Reshape") and dims is not None:
        return _unflattened(node, tensor, alg, dims)
    if is_cut(node) and not is_op(node, "SequenceAt"):
        x, w, b = _affine(cut_source(node), alg)
        start, stop = column_range(alg, node, tensor, w.shape[1])
        return x, w[:, start:stop], None if b is None else b[start:stop]
    if is_op(node, "Add") and len(node.inputs) == 2:
        for k in (0, 1):
            bias = alg.const(node.inputs[k])
            if bias is not None:
                x, w, b = _affine(node.inputs[1 - k], alg)
                row = _row(bias, w.shape[1])
                return x, w, row if b is None else b + row
        raise NoMatch("an Add of two run-time values")
    if is_op(node, "MatMul"):
        w = alg.const(node.inputs[1])
        if w is None or w.ndim != 2 or w.dtype.kind != "f" or alg.const(node.inputs[0]) is not None:
            raise NoMatch("not a product by a constant matrix")
        return node.inputs[0], w.astype(np.float64), None
    if is_op(node, "Gemm") and not node.attrs.get("transA", 0):
        w = alg.const(node.inputs[1])
        if w is None or w.ndim != 2 or w.dtype.kind != "f":
            raise NoMatch("not a product by a constant matrix")
        w = (w.T if node.attrs.get("transB", 0) else w).astype(np.float64) * float(node.attrs.get("alpha", 1.0))
        b = None
        if len(node.inputs) > 2 and node.inputs[2].name:
            c = alg.const(node.inputs[2])
            if c is None:
                raise NoMatch("a run-time Gemm bias")
            b = _row(c, w.shape[1]) * float(node.attrs.get("beta", 1.0))
        return node.inputs[0], w, b
    raise NoMatch(f"a {node.op} output")


def _unflattened(node: gs.Node, tensor: gs.Tensor, alg: Algebra, dims) -> tuple[gs.Tensor, np.ndarray, np.ndarray | None]:
    """``Reshape(Reshape(X, [-1, I])·W + b, lead(X) ++ [G])`` (Dense layers as tf2onnx and
    Keras write them, a Gemm needing 2-D) is ``X·W + b``: the rows flatten and unflatten in
    the same order when the target's leading dims are X's, which the dims the graph proves
    equal (the target built from ``Shape(X)``) must show."""
    x, w, b = _affine(node.inputs[0], alg)
    flat = producer(x)
    shape = alg.const(flat.inputs[1]) if flat is not None and is_op(flat, "Reshape") and len(flat.inputs) > 1 else None
    if shape is None or [int(v) for v in shape.reshape(-1)] != [-1, w.shape[0]]:
        raise NoMatch("a Reshape of a projection not computed on X's rows flattened to [-1, I]")
    source, rank = flat.inputs[0], alg._rank(flat.inputs[0])
    if rank is None or alg._rank(tensor) != rank or \
            not all(dims.same((tensor.name, a), (source.name, a)) for a in range(rank - 1)):
        raise NoMatch(f"a Reshape of a projection not proven to restore the leading dims of '{source.name}'")
    return source, w, b


def _row(value: np.ndarray, width: int) -> np.ndarray:
    """A constant added along the last axis as a [width] row, or NoMatch."""
    if value.dtype.kind != "f" or (value.ndim > 1 and any(d != 1 for d in value.shape[:-1])):
        raise NoMatch("the bias is not a row")
    row = np.broadcast_to(value.reshape(-1).astype(np.float64), (width,)) if value.size in (1, width) else None
    if row is None:
        raise NoMatch("the bias does not fit the projection")
    return row.copy()


# -- finding the Scans that read a projection of X (bidirectional partners) ----------------

def projected_from(t: gs.Tensor, depth: int = 0) -> gs.Tensor | None:
    """The value a projection chain (the ops of :func:`projection_readers`) computes ``t``
    from, or None."""
    node = t.inputs[0] if len(t.inputs) == 1 else None
    if node is None or depth > 4:
        return None
    if is_op(node, "MatMul") or is_op(node, "Gemm"):
        return node.inputs[0] if node.inputs else None
    if is_op(node, "Add"):
        return next((s for s in (projected_from(i, depth + 1) for i in node.inputs) if s is not None), None)
    return projected_from(node.inputs[0], depth + 1) if is_op(node, "Split") or is_op(node, "Slice") else None


def projects(t: gs.Tensor, x: gs.Tensor) -> bool:
    """``t`` is a projection of ``x`` or of a reversal of ``x``."""
    source = projected_from(t)
    return source is not None and (source is x or is_reversal_of(source, x))


def flipped(scan: gs.Node, x: gs.Tensor) -> bool:
    """``scan`` reads a reversal of ``x`` (directly or through a projection)."""
    last = scan.inputs[-1]
    source = projected_from(last)
    return is_reversal_of(last if source is None else source, x)


def is_reversal_of(t: gs.Tensor, x: gs.Tensor) -> bool:
    """``t`` is a Slice or ReverseSequence output of ``x`` (whether it reverses is decided elsewhere)."""
    return any(p.inputs and p.inputs[0] is x and (is_op(p, "Slice") or is_op(p, "ReverseSequence")) for p in t.inputs)


def projection_readers(x: gs.Tensor) -> list[gs.Node]:
    """Scans reading ``x`` (or a reversal of it) through a projection chain (MatMul/Gemm, then
    Add and last-axis cuts, at most four ops): candidates only, the direction analysis decides."""
    starts = [x] + [o for r in x.outputs if is_op(r, "Slice") or is_op(r, "ReverseSequence") for o in r.outputs]
    found, frontier = [], [r for t in starts for r in t.outputs
                           if (is_op(r, "MatMul") or is_op(r, "Gemm")) and r.inputs and r.inputs[0] is t]
    for _ in range(4):
        readers = [reader for node in frontier for out in node.outputs for reader in out.outputs]
        found += [r for r in readers if is_op(r, "Scan")]
        frontier = [r for r in readers if any(is_op(r, op) for op in ("Add", "Split", "Slice"))]
    return list({id(n): n for n in found}.values())
