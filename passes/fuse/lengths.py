"""Per-item lengths written as a step mask in the body (TF1 ``dynamic_rnn`` with
``sequence_length`` through tf2onnx): the body carries a step counter ``c`` (0, 1, 2, ...)
and selects per batch item with ``valid = c < len``::

    h' = valid ? new : h        y = valid ? new : 0

That is the native op's ``sequence_lens`` with ``len`` clipped to [0, T]: Y zero past each
length, the final state the last valid step's (and the initial state for a length-0 item).
:func:`read_lengths` proves each part (the counter's start and step, the comparison against an
outer per-item vector, both selects) or says why not; the fuse pass then recognizes the cell
on the unmasked values and the counter state becomes dead.

Selects are read as ``Where(valid, a, b)``, as tf2onnx writes TF's Select on floats,
``Cast(valid)·a + Cast(!valid)·b``, as hand-authors write it, ``m·a + (1-m)·b`` with
``m = Cast(valid)``, and an output ``m·a`` (b zero); the products are exact for finite
values: a masked-out finite value times 0 adds a zero."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.graph import dtype_of, has_node, is_op
from scanopt.passes.fuse.algebra import producer, resolve

_COMPARE = {  # op -> (counter operand index, valid when the comparison is true)
    "Less": (0, True), "Greater": (1, True), "GreaterOrEqual": (0, False), "LessOrEqual": (1, False),
}


@dataclass
class Lengths:
    """What the mask stands for: the outer per-item lengths, the counter state, and each
    masked body output's unmasked value."""

    lens: gs.Tensor  # outer int vector [B]
    counter: int  # state index of the step counter
    unmasked: dict[int, gs.Tensor]  # body output index -> the value before the select


class NotLengths(Exception):
    """The body masks its steps but not provably as per-item lengths (the reason)."""


def read_lengths(node: gs.Node, n_states: int, folder, rank) -> Lengths | None:
    """The length mask of a Scan-9+ body with one scan input, None when the body has no
    counter compared against an outer vector, or NotLengths(reason) raised when it has one
    that cannot be proven to be the native op's ``sequence_lens``."""
    body = node.attrs["body"]
    ins, outs = body.inputs[:n_states], body.outputs[:n_states]
    found = None
    for k in range(n_states):
        for reader in ins[k].outputs:
            compare = _comparison(reader, ins[k], body)
            if compare is not None:
                found = (k, compare)
                break
        if found:
            break
    if found is None:
        return None
    k, (lens, compare) = found
    dtype = dtype_of(lens)
    if dtype is None or dtype.kind not in "iu":
        raise NotLengths(f"the lengths '{lens.name}' are {dtype}, not integers (a fractional length masks "
                         "up to its ceiling)")
    start = folder.value(node.inputs[k])
    if start is None or start.size != 1 or start.ndim > 1 or int(start.reshape(-1)[0]) != 0:
        raise NotLengths(f"the step counter '{ins[k].name}' compared with '{lens.name}' does not provably start at 0")
    step = producer(resolve(outs[k]))
    if step is None or not is_op(step, "Add") or not _adds_one(step, ins[k], folder):
        raise NotLengths(f"the step counter '{ins[k].name}' does not provably count by 1 per step")
    if any(not is_op(t, "Identity") or any(o.outputs for o in t.outputs) for t in step.outputs[0].outputs):
        raise NotLengths(f"the step counter's next value '{step.outputs[0].name}' is read in the body")
    lens_rank = rank(lens)
    if lens_rank != 1 and not (lens_rank == 2 and lens.shape is not None and lens.shape[1] == 1):
        raise NotLengths(f"the lengths '{lens.name}' are not a vector [B] or a column [B, 1] (rank {lens_rank})")
    lifts = 2 - lens_rank  # the mask reaches [B, 1] by one lift of a [B] comparison, or by none
    unmasked: dict[int, gs.Tensor] = {}
    for i, out in enumerate(body.outputs):
        if i == k:
            continue
        sel = _select(resolve(out), compare, folder, lifts)
        if sel is None:
            if _reads(resolve(out), ins[k]):
                raise NotLengths(f"{'state' if i < n_states else 'scan output'} {i if i < n_states else i - n_states} "
                                 "reads the step counter other than as a select by the mask")
            continue
        new, old = sel
        if _reads(new, ins[k]):
            raise NotLengths(f"'{new.name}' reads the step counter besides the mask")
        if i < n_states and resolve(old) is not ins[i]:
            raise NotLengths(f"state {i} keeps '{old.name}' past the length, not its own value: "
                             "the native op keeps the last valid step's state")
        if i >= n_states and not _zero(old, node, folder):
            raise NotLengths(f"scan output {i - n_states} is '{old.name}' past the length, not zeros as the native op's Y")
        unmasked[i] = new
    for t in ins[k].outputs:
        if not (t is step or _comparison(t, ins[k], body)):
            raise NotLengths(f"the step counter '{ins[k].name}' is read by {t.op}, not only by the mask")
    if not unmasked:
        raise NotLengths("the step mask selects no state or output")
    return Lengths(lens, k, unmasked)


def _comparison(node: gs.Node, counter: gs.Tensor, body: gs.Graph):
    """(lens, compare node) when ``node`` compares ``counter`` with a value from outside the
    body (the per-item lengths)."""
    if node.op not in _COMPARE or not is_op(node, node.op) or len(node.inputs) != 2:
        return None
    side, _ = _COMPARE[node.op]
    if node.inputs[side] is not counter:
        return None
    lens = node.inputs[1 - side]
    made = producer(lens)
    if (made is not None and has_node(body, made)) or any(lens is t for t in body.inputs):
        return None  # computed per step: not the per-item lengths
    return lens, node


def _adds_one(node: gs.Node, counter: gs.Tensor, folder) -> bool:
    others = [t for t in node.inputs if t is not counter]
    return len(others) == 1 and len(node.inputs) == 2 and folder.scalar(others[0]) == 1


def _mask(tensor: gs.Tensor, compare: gs.Node, folder, need: int) -> bool | None:
    """True if ``tensor`` is the per-item ``c < len`` mask lifted to [B, 1], False if its
    negation, None if neither. On the way from the comparison: Not, Cast (to 0/1 numbers
    or back), ``1 - m`` of a 0/1 number m (a negation), Identity, and ``need`` lifts (a
    Reshape to [-1, 1] or an Unsqueeze at 1): one from a [B] comparison, none from a
    [B, 1] one (a [B] mask would broadcast along H instead)."""
    polarity, lifts = True, 0
    while True:
        node = producer(tensor)
        if node is None:
            return None
        if node is compare:
            return polarity == _COMPARE[compare.op][1] if lifts == need else None
        if is_op(node, "Not"):
            polarity = not polarity
        elif is_op(node, "Sub") and len(node.inputs) == 2 and folder.scalar(node.inputs[0]) == 1:
            polarity = not polarity
            tensor = node.inputs[1]
            continue
        elif is_op(node, "Reshape"):
            shape = folder.value(node.inputs[1])
            if shape is None or list(shape.reshape(-1)) != [-1, 1]:
                return None
            lifts += 1
        elif is_op(node, "Unsqueeze"):
            axes = node.attrs.get("axes") if len(node.inputs) < 2 else folder.value(node.inputs[1])
            if axes is None or [int(a) for a in np.reshape(axes, -1)] not in ([1], [-1]):
                return None
            lifts += 1
        elif not (is_op(node, "Cast") or is_op(node, "Identity")):
            return None
        tensor = node.inputs[0]


def _select(tensor: gs.Tensor, compare: gs.Node, folder, need: int):
    """(new, old) if ``tensor`` is ``valid ? new : old``: ``Where(valid, new, old)``,
    ``m·new + (1-m)·old`` for a 0/1 mask m (tf2onnx writes ``(1-m)`` as ``Cast(!valid)``),
    or ``m·new`` (old a zero)."""
    node = producer(tensor)
    if node is None:
        return None
    if is_op(node, "Where"):
        polarity = _mask(node.inputs[0], compare, folder, need)
        if polarity is None:
            return None
        a, b = node.inputs[1], node.inputs[2]
        return (a, b) if polarity else (b, a)
    if is_op(node, "Mul"):
        term = _masked_term(tensor, compare, folder, need)
        if term is None:
            return None
        zero = gs.Constant(f"{tensor.name}_masked_zero", np.zeros((), dtype_of(tensor) or np.float32))
        return (term[1], zero) if term[0] else (zero, term[1])
    if not is_op(node, "Add"):
        return None
    terms = [_masked_term(t, compare, folder, need) for t in node.inputs]
    if None in terms or len(terms) != 2 or terms[0][0] == terms[1][0]:
        return None
    (pa, a), (_, b) = terms
    return (a, b) if pa else (b, a)


def _masked_term(tensor: gs.Tensor, compare: gs.Node, folder, need: int):
    """(polarity, value) for ``m·value`` with m the 0/1 mask or its negation (a Mul reads
    numbers: the mask was Cast on its way)."""
    node = producer(tensor)
    if node is None or not is_op(node, "Mul"):
        return None
    for side in (0, 1):
        polarity = _mask(node.inputs[side], compare, folder, need)
        if polarity is not None:
            return polarity, node.inputs[1 - side]
    return None


def _reads(tensor: gs.Tensor, counter: gs.Tensor) -> bool:
    """``tensor`` depends on the step counter (within the body)."""
    seen, todo = set(), [tensor]
    while todo:
        t = todo.pop()
        if t is counter:
            return True
        node = producer(t)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        todo.extend(node.inputs)
    return False


def _zero(tensor: gs.Tensor, node: gs.Node, folder) -> bool:
    """``tensor`` is zeros whose shape adds nothing to the output's: a constant zero of at
    most [1, H] elements, or an outer value that is one of the Scan's initial states and is
    built as zeros (Expand/ConstantOfShape of 0), so it has the state's batch."""
    value = folder.value(tensor)
    if value is not None:
        return not np.any(value) and (value.ndim <= 1 or all(d == 1 for d in value.shape[:-1]))
    if not any(tensor is t for t in node.inputs[:-1]):
        return False
    source = producer(tensor)
    if source is None:
        return False
    if is_op(source, "ConstantOfShape"):
        fill = source.attrs.get("value")
        return fill is None or not np.any(fill.values if hasattr(fill, "values") else fill)
    if is_op(source, "Expand"):
        return folder.scalar(source.inputs[0]) == 0
    return False
