"""A Loop that may run zero steps keeps its zero-step outputs after it becomes a Scan (issue 33, S4).

A Loop whose trip count is data (``M``, TorchScript's ``range(n)``) or the length of an input
runs zero steps where that is 0: it returns its initial values, and each of its scan outputs
is empty. onnxruntime's Scan refuses to run zero steps (``Invalid dim0_offset of 0``), so the
Scan goes into the else branch of ``If(length of its first scan input == 0)``, whose then
branch gives what the Loop gives:

- a state: its initial value;
- a stack grown by Concat: its initial value (the empty start, ``torch.zeros(0, B, H)``);
- one of the Loop's own scan outputs: zeros of shape [0, *the step's shape] (the spec's and
  the reference executor's answer), each dim of the step's shape static or read at run time
  from an input of the Loop the model's ops show it equal to (scanopt.dims); where a dim is
  neither, no guard (the Scan as before: verification tries a trip count of 0). onnxruntime's
  own Loop writes 0 for every dim that is not static (verification judges against the spec
  where the two differ);
- a stack from SequenceInsert: its ConcatFromSequence fails on the empty sequence in the
  original, so any value serves; zeros with the step's shape and 0 at the stacking axis (the
  step's shape unknown: zeros of the stacked result's rank, all dims 0, so that the If's
  branches agree in rank as OpenVINO's CPU plugin requires).

:func:`plan` (in match) says what each output is, or why the Loop cannot be guarded (an
output whose rank or element type is unknown), or None for no guard; :func:`guard` (in
rewrite) builds the If.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.constexpr import ConstantFolder
from scanopt.emit import Emitter
from scanopt.pass_api import PassContext
from scanopt.rewrite import Builder, Guard


@dataclass(frozen=True)
class ZeroStepOutput:
    """One Scan output at zero steps: the ``initial`` outer value, else zeros of ``shape``."""

    initial: gs.Tensor | None = None
    dtype: np.dtype | None = None
    shape: tuple = ()  # each dim an int, or (outer tensor, axis) it is read from at run time
    run_once: bool = False  # the step's shape is not known here: run the body on one zero step, keep 0 of it


def may_run_zero_steps(match, folder: ConstantFolder, proven) -> bool:
    """True where the Loop may run zero steps: a trip count (M, ``range(n)``, ``x.size(0)``, a
    counter test's bound) that is not a constant of at least 1. A Loop over ``x.size(0)`` runs
    zero steps on an empty x, where the Loop returns its initial values and onnxruntime's Scan
    refuses to run (``proven`` is kept for callers that ask about the reads)."""
    trip = match.count.bound if match.count is not None else match.trip
    value = folder.scalar(trip) if trip is not None and trip.name else None
    return not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1)


def plan(node: gs.Node, match, ctx: PassContext) -> list[ZeroStepOutput] | None:
    """The zero-step value of each output of the Scan the Loop becomes, in its order: states,
    the Loop's scan outputs, stacks; None where one is not known."""
    body = node.attrs["body"]
    n_carried = len(node.inputs) - 2
    outer = [t for t in node.inputs[2:] if t.name] + [r.source for r in match.reads]
    found = [ZeroStepOutput(initial=node.inputs[2 + k]) for k in match.states]
    for t in body.outputs[1 + n_carried:]:
        zeros = _zeros(t, None, ctx, outer)
        if zeros is None and ctx.opset < 11:  # the one-step shape is made with ScatterElements
            return None
        found.append(zeros or ZeroStepOutput(run_once=True))
    for stack in match.stacks:
        if stack.finisher is None:
            found.append(ZeroStepOutput(initial=node.inputs[2 + stack.slot]))
            continue
        zeros = _zeros(stack.value, stack.axis, ctx, [])  # any value: the original fails
        found.append(zeros or _empty_of_stack_rank(stack, ctx))
    if any(z.initial is None and not z.run_once and z.dtype.kind not in "biuf" for z in found):
        return None
    return found


def _empty_of_stack_rank(stack, ctx: PassContext) -> ZeroStepOutput:
    """Zeros for a SequenceInsert stack whose step shape is not known (the original fails on
    zero steps, so any value serves): of the Scan output's rank where the stacked result's is
    known (the If's branches then agree in rank, which OpenVINO's CPU plugin requires), else [0]."""
    dtype = _dtype(stack.value, ctx) or np.dtype(np.float32)
    rank = ctx.shapes.rank(stack.result)
    return ZeroStepOutput(dtype=dtype, shape=(0,) * (rank + int(stack.merge)) if rank else (0,))


def _dtype(t: gs.Tensor, ctx: PassContext) -> np.dtype | None:
    elem, _ = ctx.shapes.type_of(t.name)
    if elem:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
    return np.dtype(t.dtype) if t.dtype is not None else None


def _zeros(t: gs.Tensor, axis: int | None, ctx: PassContext, outer: list[gs.Tensor]) -> ZeroStepOutput | None:
    """Zeros of the step value ``t``'s shape with an axis of 0 in front (at ``axis``), each
    dim static or read from an ``outer`` tensor's axis proven (else likely) equal; with no
    ``outer`` a dim not static is 0. None where that is not known."""
    dtype = _dtype(t, ctx)
    shape = ctx.shapes.shape(t)
    if dtype is None or shape is None:
        return None
    dims = []
    for a, d in enumerate(shape):
        if isinstance(d, (int, np.integer)) and d >= 0:
            dims.append(int(d))
        elif not outer:
            dims.append(0)
        else:
            found = _equal_dim(t, a, ctx, outer)
            if found is None:
                return None
            dims.append(found)
    at = 0 if axis is None else (axis if axis >= 0 else axis + len(dims) + 1)
    if not 0 <= at <= len(dims):
        return None
    return ZeroStepOutput(dtype=dtype, shape=tuple(dims[:at] + [0] + dims[at:]))


def _equal_dim(t: gs.Tensor, axis: int, ctx: PassContext, outer: list[gs.Tensor]):
    """(tensor, axis) of an ``outer`` tensor whose dim the model's ops prove equal to ``t``'s
    ``axis`` (a Loop-carried value's are only likely equal: verification checks the guess at
    a trip count of 0), or None."""
    dims = ctx.shapes.dims
    for likely in (False, True):
        for candidate in outer:
            rank = ctx.shapes.rank(candidate)
            for k in range(rank or 0):
                if dims.same((t.name, axis), (candidate.name, k), likely=likely):
                    return candidate, k
    return None


def guard(scan: gs.Node, outputs: list[gs.Tensor], empty: list[ZeroStepOutput], first: gs.Tensor, axis: int,
          outer: Builder, emit: Emitter, label: str, later: tuple = ()) -> None:
    """Append ``If(first's length along axis == 0)`` to ``outer``'s graph, writing those of
    ``outputs`` that are read (or in ``later``: read by nodes still to come): the ``empty``
    values, else ``scan``'s (whose outputs are made the else branch's own; one nobody reads
    stays unread there, for canonicalize to drop)."""
    names, graph = outer.names, outer.graph
    read = [bool(t.outputs) or any(o is t for o in list(graph.outputs) + list(later)) for t in outputs]
    if not any(read):
        graph.nodes.append(scan)
        return
    branches = Guard(names, f"{label}_zero_steps", f"{label}_steps")
    results = branches.orelse.take(scan, "{}_scanned")
    zero = branches.then.b
    once = _run_once(zero, scan, outputs, empty) if any(v.run_once for v in empty) else {}
    zero_values = [once[id(t)] if value.run_once else _zero_step_value(zero, t, value)
                   for t, value, wanted in zip(outputs, empty, read) if wanted]
    length = emit.op("Gather", [emit.op("Shape", [first], dtype=np.int64), emit.const("axis", np.int64(axis))],
                     axis=0, dtype=np.int64)
    flag = emit.op("Equal", [length, emit.const("zero", np.int64(0))], dtype=np.bool_)
    branches.close(outer, flag, [t for t, wanted in zip(outputs, read) if wanted], zero_values,
                   [r for r, wanted in zip(results, read) if wanted])


def _run_once(b: Builder, scan: gs.Node, outputs: list[gs.Tensor], empty: list[ZeroStepOutput]) -> dict:
    """{id(output): its zero-step value} for the outputs whose step shape is not known: a copy
    of the Scan runs its body once on one step of zeros (each scan input's length, 0 in this
    branch, made 1), and each scan output keeps 0 of that step along its axis: the shape the
    Loop's empty stack has, whatever the body computes."""
    attrs = dict(scan.attrs, body=scan.attrs["body"].copy())
    m = attrs["num_scan_inputs"]
    n = len(scan.inputs) - m
    in_axes = list(attrs.get("scan_input_axes", [0] * m))
    out_axes = list(attrs.get("scan_output_axes", [0] * (len(scan.outputs) - n)))
    padded = []
    for x, axis in zip(scan.inputs[n:], in_axes):
        shape = b.op("Shape", [x], dtype=np.int64)
        one_step = b.op("ScatterElements", [shape, b.constant("axis", np.array([axis], np.int64)),
                                            b.constant("one", np.array([1], np.int64))], axis=0, dtype=np.int64)
        fill = gs.Constant(b.names.fresh("zero_fill"), np.zeros([1], np.dtype(x.dtype or np.float32)))
        padded.append(b.op("ConstantOfShape", [one_step], value=fill, dtype=x.dtype))
    results = [b.variable(f"{t.name}_once", dtype=t.dtype) for t in outputs]
    b.op("Scan", list(scan.inputs[:n]) + padded, outputs=results, **attrs)
    found = {}
    for k, (t, value) in enumerate(zip(outputs, empty)):
        if value.run_once and k >= n:
            axis = out_axes[k - n]
            found[id(t)] = b.op("Slice", [results[k], b.constant("start", np.array([0], np.int64)),
                                          b.constant("end", np.array([0], np.int64)),
                                          b.constant("axis", np.array([axis], np.int64))], dtype=t.dtype)
    return found


def _zero_step_value(b: Builder, t: gs.Tensor, value: ZeroStepOutput) -> gs.Tensor:
    if value.initial is not None:
        return b.op("Identity", [value.initial], dtype=t.dtype, shape=t.shape)
    fill = gs.Constant(b.names.fresh("zero_fill"), np.zeros([1], value.dtype))
    if all(isinstance(d, int) for d in value.shape):
        shape = b.constant("zero_step_shape", np.array(value.shape, np.int64))
    else:
        parts = [b.constant("dim", np.array([d], np.int64)) if isinstance(d, int) else
                 b.op("Gather", [b.op("Shape", [d[0]], dtype=np.int64), b.constant("axis", np.array([d[1]], np.int64))],
                      axis=0, dtype=np.int64) for d in value.shape]
        shape = b.op("Concat", parts, axis=0, dtype=np.int64)
    return b.op("ConstantOfShape", [shape], value=fill, dtype=value.dtype,
                shape=[d if isinstance(d, int) else None for d in value.shape])
