"""Constant expressions: the tensor a subgraph computes when every leaf is an initializer or a
Constant node, read through outer scope at any nesting depth.

Matchers ask :meth:`ConstantFolder.value` and see the weight behind ``Transpose(W)``,
``Cast(W16)``, a ``Slice``/``Split`` of a packed matrix, a ``Concat`` of per-gate blocks, a
``Reshape``/``Unsqueeze``, an ``Identity`` chain or a ``Constant`` node, wherever those nodes sit
(gs shares an enclosing graph's tensor object with the bodies that read it, so a producer in an
outer graph is followed like a local one). Nothing is written back: the graph is never changed
here; a rewrite that uses a value emits it itself (as a new initializer, in its own layout).

Common shape ops are evaluated with numpy; any other deterministic default-domain op is run
alone through onnx's reference evaluator. Walks are iterative (no recursion limit) and memoized
for the folder's lifetime, so folding every weight of a model costs one visit per node.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.graph import constant_value, is_op, subgraphs_of

# An evaluated value larger than this is not folded (a matcher then sees no constant).
MAX_ELEMENTS = 1 << 27
_NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                     "Bernoulli", "Dropout"}


class ConstantFolder:
    """Evaluates constant subgraphs on demand; one instance per pass run shares the work."""

    def __init__(self, opset: int | None = None):
        self.opset = opset or onnx.defs.onnx_opset_version()
        self._memo: dict[int, tuple[gs.Tensor, np.ndarray | None]] = {}  # keeps the tensor alive: ids stay unique

    def scalar(self, tensor: gs.Tensor):
        """The element of ``tensor`` if a constant subgraph computes it with exactly one
        element (of any rank), else None: the steps, bounds and flags matchers compare."""
        value = self.value(tensor)
        return value.reshape(-1)[0].item() if value is not None and value.size == 1 else None

    def value(self, tensor: gs.Tensor) -> np.ndarray | None:
        """The value of ``tensor`` if a constant subgraph computes it, else None."""
        found = self._memo.get(id(tensor))
        if found is not None:
            return found[1]
        if not tensor.name and not isinstance(tensor, gs.Constant):
            return None
        stack = [tensor]
        while stack:
            t = stack[-1]
            if id(t) in self._memo:
                stack.pop()
                continue
            direct = constant_value(t)
            node = t.inputs[0] if len(t.inputs) == 1 else None
            if direct is not None or node is None or not _foldable(node):
                self._memo[id(t)] = (t, direct)
                stack.pop()
                continue
            pending = [i for i in node.inputs if i.name and id(i) not in self._memo]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            args = [self._memo[id(i)][1] if i.name else None for i in node.inputs]
            values = None
            if all(a is not None for a, i in zip(args, node.inputs) if i.name):
                values = _evaluate(node, args, self.opset)
            for k, out in enumerate(node.outputs):
                v = None if values is None or k >= len(values) else values[k]
                if v is not None and (v.size > MAX_ELEMENTS or v.dtype == object):
                    v = None
                self._memo[id(out)] = (out, v)
            if id(t) not in self._memo:
                self._memo[id(t)] = (t, None)
        return self._memo[id(tensor)][1]


def _foldable(node: gs.Node) -> bool:
    if not is_op(node, node.op) or node.op in _NONDETERMINISTIC:
        return False
    return next(subgraphs_of(node), None) is None  # a body (GRAPH or GRAPHS attribute) is not folded


def _ints(value) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _axes(node: gs.Node, args: list, index: int = 1):
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    return _ints(args[index]) if len(args) > index and args[index] is not None else None


def _slice(node, args):
    data = args[0]
    if "starts" in node.attrs:  # Slice-1
        starts, ends, axes, steps = node.attrs["starts"], node.attrs["ends"], node.attrs.get("axes"), None
    else:
        starts, ends = _ints(args[1]), _ints(args[2])
        axes = _ints(args[3]) if len(args) > 3 and args[3] is not None else None
        steps = _ints(args[4]) if len(args) > 4 and args[4] is not None else None
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        a %= data.ndim
        n = data.shape[a]
        if st > 0:
            s = min(max(s + n if s < 0 else s, 0), n)
            e = min(max(e + n if e < 0 else e, 0), n)
        else:
            s = min(max(s + n if s < 0 else s, -1), n - 1)
            e = min(max(e + n if e < 0 else e, -1), n - 1)
        index[a] = slice(s, e if e >= 0 or st > 0 else None, st)
    return [data[tuple(index)]]


def _split(node, args):
    data, axis = args[0], node.attrs.get("axis", 0)
    sizes = node.attrs.get("split")
    if sizes is None and len(args) > 1 and args[1] is not None:
        sizes = _ints(args[1])
    n = len(node.outputs)
    if sizes is None:
        width = data.shape[axis]
        chunk = -(-width // n)
        sizes = [min(chunk, width - i * chunk) for i in range(n)]
    return np.split(data, np.cumsum(sizes)[:-1], axis=axis)


def _reshape(node, args):
    shape = _ints(args[1]) if len(args) > 1 else list(node.attrs["shape"])
    if not node.attrs.get("allowzero", 0):
        shape = [args[0].shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [args[0].reshape(shape)]


def _cast(node, args):
    return [args[0].astype(onnx.helper.tensor_dtype_to_np_dtype(node.attrs["to"]))]


def _unsqueeze(node, args):
    out, rank = args[0], args[0].ndim + len(_axes(node, args))
    for a in sorted(a % rank for a in _axes(node, args)):
        out = np.expand_dims(out, a)
    return [out]


def _squeeze(node, args):
    axes = _axes(node, args)
    if axes is None:
        return [np.squeeze(args[0])]
    return [np.squeeze(args[0], axis=tuple(a % args[0].ndim for a in axes))]


_NUMPY = {
    "Identity": lambda node, args: [args[0]],
    "Cast": _cast,
    "Transpose": lambda node, args: [np.transpose(args[0], node.attrs.get("perm"))],
    "Reshape": _reshape,
    "Flatten": lambda node, args: [args[0].reshape(
        int(np.prod(args[0].shape[:node.attrs.get("axis", 1) % max(args[0].ndim, 1)])), -1)],
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Slice": _slice,
    "Split": _split,
    "Concat": lambda node, args: [np.concatenate([a for a in args if a is not None], axis=node.attrs["axis"])],
    "Neg": lambda node, args: [-args[0]],
    "Gather": lambda node, args: [np.take(args[0], args[1], axis=node.attrs.get("axis", 0))],
    "Add": lambda node, args: [args[0] + args[1]],
    "Sub": lambda node, args: [args[0] - args[1]],
    "Mul": lambda node, args: [args[0] * args[1]],
}


def _evaluate(node: gs.Node, args: list, opset: int) -> list[np.ndarray] | None:
    # Quietly: a constant that overflows (Exp of a large weight) folds to inf as onnxruntime
    # computes it; numpy's RuntimeWarning on stderr was a second line beside a refusal's one.
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if node.op in _NUMPY:
                return [np.asarray(v) for v in _NUMPY[node.op](node, args)]
            return _reference(node, args, opset)
    except Exception:  # noqa: BLE001 - a node we cannot evaluate is simply not a constant
        return None


def _reference(node: gs.Node, args: list, opset: int) -> list[np.ndarray] | None:
    """Run one node through onnx's reference evaluator on its constant inputs."""
    from onnx.reference import ReferenceEvaluator

    in_names = [f"in{i}" if t.name else "" for i, t in enumerate(node.inputs)]
    out_names = [f"out{i}" for i in range(len(node.outputs))]
    attrs = {k: (v.values if isinstance(v, gs.Constant) else v) for k, v in node.attrs.items()}
    if any(isinstance(v, np.ndarray) for v in attrs.values()):
        attrs = {k: (onnx.numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v) for k, v in attrs.items()}
    proto = onnx.helper.make_node(node.op, in_names, out_names, **attrs)
    feeds = {n: a for n, a in zip(in_names, args) if n}
    inputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in feeds.items()]
    outputs = [onnx.helper.make_empty_tensor_value_info(n) for n in out_names]
    graph = onnx.helper.make_graph([proto], "fold", inputs, outputs)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]

