"""When a Slice from the counter c takes exactly row c: its end lies in [c + 1, c + S] for
its step S ≥ 1 (rows c, c + S, ... below the end: only c).

tf2onnx writes TF's ``x[i]`` (a strided slice that shrinks the axis) as ``Slice(x, [i],
end, [0], [10**9])`` with ``end = Where(And(Equal(e, 10**9), Less(1, 0)), -10**9, e)``
and ``e = Cast(Max(Cast(i + 1, float), 10**9), int32)``: the Where's condition is false
(``Less(1, 0)``), so the end is ``max(i + 1, 10**9)``, in [i + 1, i + 10**9]. The proof
here bounds a value by ``c + lo <= v <= c + hi`` for every counter value c ≥ 0, through
the ops such ends are built from. Casts between integers and float32 are taken as exact:
below 2**24, the range the float comparisons of those loops are already read in.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.graph import has_node, is_op

# int32, int64, float32 (exact below 2**24), float64
_EXACT = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.INT32, onnx.TensorProto.INT64)
_SAME_VALUE = ("Identity", "Unsqueeze", "Squeeze")

Bounds = tuple  # (lo | None, hi | None): c + lo <= v <= c + hi; None is unbounded


def one_row_end(node: gs.Node, counter: gs.Tensor, body: gs.Graph, folder) -> list[gs.Node] | None:
    """The body nodes computing the end of Slice ``node`` when that end provably lies in
    [c + 1, c + S] for the counter value c (≥ 0) and the Slice's constant step S ≥ 1, and
    nothing else reads them; else None."""
    if len(node.inputs) < 3:
        return None
    steps = folder.value(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4].name else np.ones(1, np.int64)
    if steps is None or steps.size != 1 or steps.reshape(-1)[0] < 1:
        return None
    nodes: list[gs.Node] = []
    lo, hi = _bounds(node.inputs[2], counter, body, folder, nodes) or (None, None)
    if lo is None or hi is None or lo < 1 or hi > steps.reshape(-1)[0]:
        return None
    ids = {id(n) for n in nodes}
    outputs = {id(o) for o in body.outputs}
    for n in nodes:
        for o in n.outputs:
            if id(o) in outputs or any(r is not node and id(r) not in ids for r in o.outputs):
                return None
    return nodes


def _bounds(t: gs.Tensor, counter: gs.Tensor, body: gs.Graph, folder, nodes: list[gs.Node]) -> Bounds | None:
    if t is counter:
        return 0, 0
    value = folder.value(t)
    if value is not None:  # K <= c + K for c >= 0
        if value.size != 1 or value.dtype.kind not in "iuf" or value.reshape(-1)[0] != np.floor(value.reshape(-1)[0]):
            return None
        return None, float(value.reshape(-1)[0])
    node = t.inputs[0] if len(t.inputs) == 1 else None
    if node is None or not has_node(body, node):
        return None
    _add(node, nodes)
    first = node.inputs[0] if node.inputs else None
    if node.op in _SAME_VALUE or (node.op == "Concat" and len(node.inputs) == 1):
        return _bounds(first, counter, body, folder, nodes)
    if node.op == "Cast":
        return _bounds(first, counter, body, folder, nodes) if node.attrs.get("to") in _EXACT else None
    if node.op == "Add" and len(node.inputs) == 2:
        for a, b in (node.inputs, node.inputs[::-1]):
            k = folder.scalar(b)
            if k is not None and float(k) == np.floor(k):
                inner = _bounds(a, counter, body, folder, nodes)
                return None if inner is None else tuple(None if x is None else x + k for x in inner)
        return None
    if node.op in ("Max", "Min") and len(node.inputs) == 2:
        a, b = (_bounds(x, counter, body, folder, nodes) for x in node.inputs)
        return None if a is None or b is None else _combine(node.op, a, b)
    if node.op == "Where" and len(node.inputs) == 3:
        _add_ancestors(node.inputs[0], body, nodes)
        picked = _fold_bool(node.inputs[0], folder)
        if picked is not None:
            return _bounds(node.inputs[1 if picked else 2], counter, body, folder, nodes)
        a, b = (_bounds(x, counter, body, folder, nodes) for x in node.inputs[1:])
        if a is None or b is None:
            return None
        return (None if None in (a[0], b[0]) else min(a[0], b[0]), None if None in (a[1], b[1]) else max(a[1], b[1]))
    return None


def _combine(op: str, a: Bounds, b: Bounds) -> Bounds:
    """Max: at least either's low, at most the larger high; Min: the other way round."""
    lows, highs = [x for x in (a[0], b[0]) if x is not None], [x for x in (a[1], b[1]) if x is not None]
    if op == "Max":
        return (max(lows) if lows else None), (max(highs) if len(highs) == 2 else None)
    return (min(lows) if len(lows) == 2 else None), (min(highs) if highs else None)


def _fold_bool(t: gs.Tensor, folder) -> bool | None:
    """A condition's value where it is constant, or an And with a constant false input
    (an Or with a constant true one): tf2onnx's ``And(..., Less(1, 0))``."""
    value = folder.value(t)
    if value is not None:
        return bool(value.all()) if value.all() or not value.any() else None
    node = t.inputs[0] if len(t.inputs) == 1 else None
    if node is None:
        return None
    if is_op(node, "Not"):
        inner = _fold_bool(node.inputs[0], folder)
        return None if inner is None else not inner
    if node.op in ("And", "Or"):
        settled = node.op == "Or"  # the value one input decides alone
        if any(_fold_bool(x, folder) is settled for x in node.inputs):
            return settled
    return None


def _add(node: gs.Node, nodes: list[gs.Node]) -> None:
    if not any(node is n for n in nodes):
        nodes.append(node)


def _add_ancestors(t: gs.Tensor, body: gs.Graph, nodes: list[gs.Node]) -> None:
    """Every body node ``t`` is computed from (a folded condition is dropped with the end)."""
    stack = [t]
    while stack:
        value = stack.pop()
        node = value.inputs[0] if len(value.inputs) == 1 else None
        if node is None or not has_node(body, node) or any(node is n for n in nodes):
            continue
        nodes.append(node)
        stack.extend(node.inputs)
