"""Opset-dependent op emission: ops whose signature changed across opsets (Squeeze/Unsqueeze
axes, Slice bounds, Range) are emitted through :class:`Emitter`, the one place that knows each
form. Passes emit through it; it knows nothing of migration or verification."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.rewrite import Builder

HOLD_DOMAIN = "ai.scanopt.hold"
MIN_TARGET = 9  # the first opset with an unbatched Scan
# The newest default-domain opset the installed onnx knows: a ceiling for emission.
# scanopt.migrate.newest_target() narrows it to what the installed onnxruntime loads.
NEWEST_TARGET = onnx.defs.onnx_opset_version()
INT64_MAX = np.iinfo(np.int64).max


class Emitter:
    """Appends ops valid at ``opset`` to one graph, each in ``domain`` (the upgrade pass
    passes :data:`HOLD_DOMAIN`: its nodes wait there while the model is at its source opset)."""

    def __init__(self, builder: Builder, opset: int, domain: str | None = None):
        self.b = builder
        self.opset = opset
        self.domain = domain

    def op(self, op: str, inputs: Sequence[gs.Tensor], **kwargs):
        return self.b.op(op, inputs, domain=self.domain, **kwargs)

    def const(self, hint: str, value) -> gs.Constant:
        return self.b.constant(hint, value)

    def ints(self, hint: str, values: Sequence[int]) -> gs.Constant:
        return self.const(hint, np.asarray(values, dtype=np.int64))

    def unsqueeze(self, x: gs.Tensor, axes: Sequence[int], **kwargs):
        """Unsqueeze: axes an attribute before opset 13, an input from 13."""
        if self.opset < 13:
            return self.op("Unsqueeze", [x], axes=list(axes), **kwargs)
        return self.op("Unsqueeze", [x, self.ints("axes", axes)], **kwargs)

    def squeeze(self, x: gs.Tensor, axes: Sequence[int], **kwargs):
        """Squeeze: axes an attribute before opset 13, an input from 13."""
        if self.opset < 13:
            return self.op("Squeeze", [x], axes=list(axes), **kwargs)
        return self.op("Squeeze", [x, self.ints("axes", axes)], **kwargs)

    def stack(self, values: Sequence[gs.Tensor], axis: int):
        """``values`` stacked along a new ``axis`` (negative counts from the stacked rank):
        Unsqueeze each, then one Concat; keeps dtype and, for axis >= 0, the shape."""
        parts = []
        for value in values:
            shape = None
            if value.shape is not None and axis >= 0:
                shape = list(value.shape)
                shape.insert(axis, 1)
            parts.append(self.unsqueeze(value, [axis], dtype=value.dtype, shape=shape))
        if len(parts) == 1:
            return parts[0]
        return self.op("Concat", parts, axis=axis, dtype=values[0].dtype)

    def slice(self, x: gs.Tensor, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int], **kwargs):
        """Slice with constant bounds: attributes before opset 10, inputs from 10."""
        if self.opset < 10:
            return self.op("Slice", [x], starts=list(starts), ends=list(ends), axes=list(axes), **kwargs)
        bounds = [self.ints("starts", starts), self.ints("ends", ends), self.ints("axes", axes)]
        return self.op("Slice", [x, *bounds], **kwargs)

    def arange(self, length: gs.Tensor, **kwargs):
        """0, 1, ..., length-1 (int64) for ``length`` int64 [1].

        Range exists from opset 11; before, the indices come from NonZero over
        ``length`` ones.
        """
        if self.opset >= 11:
            limit = self.op("Reshape", [length, self.ints("scalar", [])])
            return self.op("Range", [self.const("zero", np.int64(0)), limit, self.const("one", np.int64(1))], **kwargs)
        one = gs.Constant(self.b.names.fresh("one"), np.ones([1], np.int64))
        ones = self.op("ConstantOfShape", [length], value=one)
        return self.squeeze(self.op("NonZero", [ones]), [0], **kwargs)

    def prefix(self, x: gs.Tensor, length: gs.Tensor, **kwargs):
        """The first ``length`` (int64 [1]) entries of ``x`` along axis 0: Slice with
        run-time bounds from opset 10, a Gather of arange(length) at 9."""
        if self.opset >= 10:
            return self.op("Slice", [x, self.ints("zero", [0]), length, self.ints("axes", [0])], **kwargs)
        return self.op("Gather", [x, self.arange(length)], axis=0, **kwargs)

    def zeros_like_tail(self, x: gs.Tensor, rows: gs.Tensor, dtype: np.dtype):
        """Zeros of shape [rows, *x.shape[1:]] (``rows`` int64 [1]) in ``dtype``."""
        tail = self.slice(self.op("Shape", [x]), [1], [INT64_MAX], [0])
        shape = self.op("Concat", [rows, tail], axis=0)
        zero = gs.Constant(self.b.names.fresh("zero_value"), np.zeros([1], dtype))
        return self.op("ConstantOfShape", [shape], value=zero)

    def reverse(self, x: gs.Tensor, axis: int, **kwargs):
        """``x`` reversed along ``axis``: Slice with step -1, which needs opset 10+
        (callers check ``opset >= 10`` and decline before)."""
        if self.opset < 10:
            raise ValueError(f"reversing along an axis needs Slice steps (opset 10+), not opset {self.opset}")
        bounds = [self.ints("starts", [-1]), self.ints("ends", [np.iinfo(np.int64).min]), self.ints("axes", [axis]),
                  self.ints("steps", [-1])]
        return self.op("Slice", [x, *bounds], **kwargs)


def supports(op: str, opset: int, dtype: np.dtype) -> bool:
    """True if ``op`` (default domain) at ``opset`` can produce tensors of ``dtype``."""
    try:
        schema = onnx.defs.get_schema(op, opset)
        elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except Exception:  # noqa: BLE001 - unknown op or dtype: not supported
        return False
    wanted = f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})"
    param = schema.outputs[0].type_str
    allowed = next((c.allowed_type_strs for c in schema.type_constraints if c.type_param_str == param), [param])
    return wanted in allowed
