"""Last-axis cuts: which columns a Split, a Slice or a SequenceAt of a SplitToSequence (the
unoptimized PyTorch exporter's chunk) takes of the value it cuts."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.graph import is_op
from scanopt.passes.fuse.poly import INT64_MAX, NoMatch


def producer(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.inputs[0] if len(tensor.inputs) == 1 else None


def column_range(alg, node: gs.Node, out: gs.Tensor, width: int | None) -> tuple[int, int]:
    """The [start, stop) that a last-axis Split/Slice ``node`` gives output ``out`` (or
    SequenceAt of a SplitToSequence, the unoptimized PyTorch exporter's chunk)."""
    data = cut_source(node)
    if is_op(node, "SequenceAt"):
        return _sequence_range(alg, node, data, width)
    if is_op(node, "Split"):
        if not alg.is_last_axis(data, node.attrs.get("axis", 0)):
            raise NoMatch(f"Split '{node.name}' does not cut the last axis")
        sizes = _split_sizes(alg, node, width)
        index = next(i for i, t in enumerate(node.outputs) if t is out)
        start = sum(sizes[:index])
        return start, start + sizes[index]
    starts, ends, axes, steps = _without_whole_axes(alg, data, *_slice_args(alg, node))
    if len(starts) != 1 or not alg.is_last_axis(data, axes[0] if axes else 0):
        raise NoMatch(f"Slice '{node.name}' does not cut the last axis alone")
    if steps and steps[0] != 1:
        raise NoMatch(f"Slice '{node.name}' has step {steps[0]}")
    if width is None:
        raise NoMatch(f"the size cut by Slice '{node.name}' is unknown")
    start, stop, _ = slice(int(starts[0]), int(min(ends[0], INT64_MAX))).indices(width)
    return start, max(start, stop)


def _sequence_range(alg, node: gs.Node, data: gs.Tensor, width: int | None) -> tuple[int, int]:
    splitter = producer(node.inputs[0])
    if not alg.is_last_axis(data, splitter.attrs.get("axis", 0)):
        raise NoMatch(f"SplitToSequence '{splitter.name}' does not cut the last axis")
    split = alg.const(splitter.inputs[1]) if len(splitter.inputs) > 1 and splitter.inputs[1].name else None
    index = alg.const(node.inputs[1])
    if split is None or index is None or width is None:
        raise NoMatch(f"SplitToSequence '{splitter.name}' has no constant split, index or known width")
    if index.size != 1:
        raise NoMatch(f"SequenceAt '{node.name}' index has {index.size} values, not one")
    if split.ndim == 0:
        size = int(split)
        sizes = [min(size, width - k) for k in range(0, width, size)]
    else:
        sizes = [int(v) for v in split.reshape(-1)]
    k = int(index.reshape(-1)[0])
    if not -len(sizes) <= k < len(sizes):
        raise NoMatch(f"SequenceAt '{node.name}' index {k} is out of range")
    k %= len(sizes)
    start = sum(sizes[:k])
    return start, start + sizes[k]


def cut_source(node: gs.Node) -> gs.Tensor | None:
    """The value a last-axis cut reads: a Split's or Slice's data; for SequenceAt the data of
    the SplitToSequence it indexes (None for any other SequenceAt)."""
    if is_op(node, "SequenceAt"):
        seq = producer(node.inputs[0])
        return seq.inputs[0] if seq is not None and is_op(seq, "SplitToSequence") else None
    return node.inputs[0]


def is_cut(node: gs.Node | None) -> bool:
    return node is not None and (is_op(node, "Split") or is_op(node, "Slice")
                                 or (is_op(node, "SequenceAt") and cut_source(node) is not None))


def _split_sizes(alg, node: gs.Node, width: int | None) -> list[int]:
    sizes = node.attrs.get("split")
    if sizes is None and len(node.inputs) > 1 and node.inputs[1].name:
        sizes = alg.const(node.inputs[1])
        if sizes is None:
            raise NoMatch(f"Split '{node.name}' sizes are not constant")
    if sizes is not None:
        sizes = [int(s) for s in np.asarray(sizes).reshape(-1)]
        if len(sizes) != len(node.outputs):  # an invalid model: the node fails where it runs
            raise NoMatch(f"Split '{node.name}' has {len(sizes)} sizes for {len(node.outputs)} outputs")
        return sizes
    n = len(node.outputs)
    if width is None:
        raise NoMatch(f"the size cut by Split '{node.name}' is unknown")
    chunk = -(-width // n)  # opset 18 num_outputs: equal chunks, the last one smaller
    if n * chunk != width and "num_outputs" not in node.attrs:
        raise NoMatch(f"Split '{node.name}' cannot cut {width} into {n} equal parts")
    return [min(chunk, width - i * chunk) for i in range(n)]


INT32_MAX = 2**31 - 1


def _without_whole_axes(alg, data, starts, ends, axes, steps):
    """The Slice's entries minus those that keep a leading axis whole: start 0, step 1, end at
    least INT32_MAX (tf2onnx writes TF's ``strided_slice`` ``h[:, a:b]`` as Slice over axes [0, 1]
    with ends [INT32_MAX, b]; whole for every axis shorter than 2**31 - 1, which a float
    tensor [B, 3H] stays below by 8 GiB per column)."""
    axes = list(range(len(starts))) if axes is None else list(axes)
    keep = [k for k, axis in enumerate(axes)
            if alg.is_last_axis(data, axis) or not (starts[k] == 0 and ends[k] >= INT32_MAX
                                                    and (steps is None or steps[k] == 1))]
    if len(keep) == len(axes):
        return starts, ends, axes, steps
    return ([starts[k] for k in keep], [ends[k] for k in keep], [axes[k] for k in keep],
            None if steps is None else [steps[k] for k in keep])


def _slice_args(alg, node: gs.Node):
    if "starts" in node.attrs:  # Slice-1
        return node.attrs["starts"], node.attrs["ends"], node.attrs.get("axes"), None
    args = []
    for i in range(1, 5):
        t = node.inputs[i] if i < len(node.inputs) and node.inputs[i].name else None
        value = None if t is None else alg.const(t)
        if t is not None and value is None:
            raise NoMatch(f"Slice '{node.name}' bounds are not constant")
        args.append(None if value is None else [int(v) for v in np.asarray(value).reshape(-1)])
    return tuple(args)
