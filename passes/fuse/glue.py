"""The ops around the native op: weights (constant or computed at run time), direction
picks, axis moves, the zero-length and length-0 guards. Opset-dependent forms come from
:class:`scanopt.emit.Emitter`."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.emit import INT64_MAX, Emitter
from scanopt.passes.fuse.cell import Sum
from scanopt.rewrite import Builder, Guard


class FuseEmitter(Emitter):
    """The glue around the native op; opset-dependent forms come from :class:`Emitter`."""

    def __init__(self, b: Builder, opset: int, shared: dict | None = None):
        super().__init__(b, opset, domain=None)
        self._shared = {} if shared is None else shared  # weights already emitted, by content
        self._steps: dict = {}  # (id(X), axis) -> "X has steps" (opset 8: "X is empty" as 0/1)
        self._masks: dict = {}  # id(sequence_lens) -> [B, 1] bool: the length-0 items
        self.portable = False  # --target portable's output: the forms OpenVINO's CPU runtime runs right too

    def _const(self, hint, value):
        return self.const(hint, np.asarray(value))

    def weight(self, name, per_dir):
        """One weight input [D, ...] from each direction's (value, outer) where value is an
        array or a tuple of blocks (see :class:`scanopt.passes.fuse.cell.Cell`)."""
        if all(isinstance(v, np.ndarray) for v, _ in per_dir):
            return self.const(name, np.stack([v for v, _ in per_dir]).astype(np.float32))
        dirs = []
        for value, outer in per_dir:
            blocks = [self.block(p, outer) for p in ((value,) if isinstance(value, np.ndarray) else value)]
            joined = blocks[0] if len(blocks) == 1 else self.op("Concat", blocks, axis=0)
            dirs.append(self.unsqueeze(joined, [0]))
        return dirs[0] if len(dirs) == 1 else self.op("Concat", dirs, axis=0)

    def const(self, hint, value):
        """A new initializer for ``value``, or the one already emitted into this graph with the
        same content: Scans that share a weight keep sharing it after fusion (and the glue's
        small constants are not repeated per Scan)."""
        value = np.asarray(value)
        key = (id(self.b.graph), value.dtype.str, value.shape, hashlib.sha256(value.tobytes()).hexdigest())
        found = self._shared.get(key)
        if found is None or found[0] is not self.b.graph:
            found = (self.b.graph, super().const(hint, value))
            self._shared[key] = found
        return found[1]

    def block(self, piece, outer):
        if isinstance(piece, np.ndarray):
            return self.const("block", piece.astype(np.float32))
        if isinstance(piece, Sum):
            parts = [self.block(r, outer) for r in piece.runtimes]
            if np.any(piece.const):
                parts.insert(0, self.const("bias", piece.const.astype(np.float32)))
            total = parts[0]
            for part in parts[1:]:
                total = self.op("Add", [total, part])
            return total
        # A Runtime in x·W orientation: cut its columns, bring it to ONNX layout [out, in].
        t = outer(piece.tensor)
        axis = 0 if piece.vector or piece.transposed else 1
        if piece.start or piece.stop is not None:
            t = self.slice(t, [piece.start], [INT64_MAX if piece.stop is None else piece.stop], [axis])
        if not piece.vector and not piece.transposed:
            t = self.op("Transpose", [t], perm=[1, 0])
        if piece.scale != 1.0:
            t = self.op("Mul", [t, self.const("scale", np.float32(piece.scale))])
        return t

    def pick(self, x, index, count, axis):
        """Direction ``index`` of ``count`` along ``axis``, that axis removed."""
        if count == 1:
            return self.squeeze(x, [axis])
        return self.op("Gather", [x, self._const("direction", np.int64(index))], axis=axis)

    def cast_int32(self, x):
        return self.op("Cast", [x], to=onnx.TensorProto.INT32)

    def move_axis(self, x, source, target, rank):
        if source == target:
            return x
        order = [a for a in range(rank) if a != source]
        order.insert(target, source)
        return self.op("Transpose", [x], perm=order)

    def keep_initial_where_length_0(self, final, initial, lens):
        """``initial`` for the length-0 items, ``final`` elsewhere: ``Where(len == 0, initial,
        final)``. Opset 8 has no Where, and the select is kept out of what --target portable
        writes (OpenVINO misran a select of an If's output, scanopt.portable): there
        ``final + initial ⊙ (len == 0)``, exact where the initial states are finite (the
        native op leaves exact zeros for length-0 items; an inf in one gives NaN, inf·0, where
        the Scan's state is finite)."""
        if id(lens) not in self._masks:
            self._masks[id(lens)] = self.unsqueeze(self.op("Equal", [lens, self._const("zero", np.int64(0))]), [1])
        empty = self._masks[id(lens)]
        if self.opset >= 9 and not self.portable:
            return self.op("Where", [empty, initial, final])
        return self.op("Add", [final, self.op("Mul", [initial, self.op("Cast", [empty], to=onnx.TensorProto.FLOAT)])])

    def keep_initial_if_empty(self, final, initial, x, axis):
        """``final`` unless X has no steps along ``axis``, then ``initial`` (a Scan's result)."""
        key = (id(x), axis)
        if key not in self._steps:
            if self.opset >= 15:  # Shape(start, end) gives the length as [1] in one op
                steps = self.op("Shape", [x], start=axis, end=axis + 1)
            else:
                steps = self.op("Gather", [self.op("Shape", [x]), self._const("seq_axis", np.int64(axis))], axis=0)
            if self.opset >= 9:
                self._steps[key] = self.op("Greater", [steps, self._const("zero", np.int64(0))])
            else:
                equal = self.op("Equal", [steps, self._const("zero", np.int64(0))])
                self._steps[key] = self.op("Cast", [equal], to=onnx.TensorProto.INT64)
        if self.opset >= 9:
            return self.op("Where", [self._steps[key], final, initial])
        # Opset 8 has no Where: Gather picks [final, initial][steps == 0], exactly.
        both = self.op("Concat", [self.unsqueeze(final, [0]), self.unsqueeze(initial, [0])], axis=0)
        return self.op("Gather", [both, self._steps[key]], axis=0)

    def common_batch(self, x, states, x_axis, state_axis):
        """``x`` and ``states`` expanded along their batch axes to the batch they broadcast to
        (each by the others' sizes): exactly the values a Scan broadcasting a size-1 batch
        computes with, and copies when the sizes are equal."""
        for s in states:
            x = self.expand_batch(x, x_axis, 3, self.batch_size(s, state_axis))
        batch = self.batch_size(x, x_axis)
        return x, [self.expand_batch(s, state_axis, 3, batch) for s in states]

    def batch_size(self, t, axis):
        """``t``'s size along ``axis`` as int64 [1]."""
        return self.op("Gather", [self.op("Shape", [t]), self._const("batch_axis", np.array([axis], np.int64))], axis=0)

    def expand_batch(self, t, axis, rank, by):
        """``t`` (of ``rank``) expanded along ``axis`` by the size ``by`` (int64 [1])."""
        ones = self._const("ones", np.ones(axis, np.int64)) if axis else None
        tail = self._const("ones", np.ones(rank - axis - 1, np.int64))
        shape = self.op("Concat", ([ones] if ones is not None else []) + [by, tail], axis=0)
        return self.op("Expand", [t, shape])

    def clipped_lengths(self, lens, x, time_axis):
        """Per-item lengths ([B] or [B, 1]) as an int64 [B] clipped to [0, T] (T: ``x``'s size on ``time_axis``): a body
        mask ``step < len`` keeps every step of a longer item and none of a negative one, while
        the native ops take lengths inside [0, T] (integer Min/Max: opset 12)."""
        column = lens.shape is not None and len(lens.shape) == 2
        lens = self.op("Cast", [lens], to=onnx.TensorProto.INT64)
        if column:  # [B, 1]
            lens = self.op("Reshape", [lens, self._const("flat", np.array([-1], np.int64))])
        lens = self.op("Min", [lens, self.batch_size(x, time_axis)])
        return self.op("Max", [lens, self._const("zero", np.array([0], np.int64))])

    def initial_batch_if_empty(self, final, initial, x, axis):
        """``final`` (a state selected by :meth:`keep_initial_if_empty` after the batches were
        broadcast) cut back to ``initial``'s batch when X has no steps: a Scan over zero
        steps returns its initial state as it is. Opset 10+ (Slice with run-time ends)."""
        rows = self.op("Where", [self._steps[(id(x), axis)],
                                 self.op("Gather", [self.op("Shape", [final]), self._const("batch_axis", np.array([0], np.int64))], axis=0),
                                 self.op("Gather", [self.op("Shape", [initial]), self._const("batch_axis", np.array([0], np.int64))], axis=0)])
        return self.op("Slice", [final, self._const("zero", np.array([0], np.int64)), rows,
                                 self._const("batch_axis", np.array([0], np.int64))])

    def zeros(self, shape):
        """float32 zeros of ``shape`` (int64 [rank]): ConstantOfShape from opset 9, Expand at 8."""
        if self.opset >= 9:
            value = gs.Constant(self.b.names.fresh("zero_value"), np.zeros([1], np.float32))
            return self.op("ConstantOfShape", [shape], value=value, dtype=np.float32)
        return self.op("Expand", [self._const("zero_value", np.float32(0)), shape], dtype=np.float32)

    def native(self, kind, inputs, outs, attrs, *, layout, static_nonempty, initial_states=False):
        """The native op, behind ``If(Size(X) == 0)`` unless X is statically non-empty:
        onnxruntime's GRU aborts the process (SIGABRT) on an empty batch or a zero-length
        sequence and its LSTM on an empty batch, where a Scan returns empty outputs (or
        errors cleanly). The empty branch gives zeros of the native op's output shapes
        (Y [T, D, B, H], Y_h/Y_c [D, B, H]; layout 1: [B, T, D, H], [B, D, H]); the glue
        after it selects the initial states as for any zero-length sequence. With
        ``initial_states`` it gives the op's initial states as Y_h/Y_c instead (what an
        empty X ends in), and ``self.initial_in_guard`` tells the glue no select is needed:
        OpenVINO's CPU runtime returned garbage for the select of an If's output beside
        other loops (scanopt.portable)."""
        wanted = [t for t in outs if t.name]
        self.initial_in_guard = False
        if static_nonempty or not wanted:
            return self.b.op(kind, inputs, outputs=outs, **attrs)
        x, dirs = inputs[0], 2 if attrs.get("direction") == "bidirectional" else 1
        empty = self.op("Equal", [self.op("Size", [x]), self._const("zero", np.int64(0))])
        guard = Guard(self.b.names, f"{kind}_empty", f"{kind}_native")
        results = guard.orelse.values(outs, f"{kind}_{{}}")
        guard.orelse.b.op(kind, inputs, outputs=results, **attrs)
        zero = FuseEmitter(guard.then.b, self.opset, self._shared)
        hidden = self._const("hidden", np.array([attrs["hidden_size"]], np.int64))
        d = self._const("dirs", np.array([dirs], np.int64))
        x_shape = zero.op("Shape", [x])

        def dims(*axes):
            return zero.op("Gather", [x_shape, self._const("axes", np.array(axes, np.int64))], axis=0)

        shapes = ([dims(0, 1), d, hidden], [dims(0), d, hidden]) if layout else \
            ([dims(0), d, dims(1), hidden], [d, dims(1), hidden])
        shapes = [zero.op("Concat", parts, axis=0) for parts in shapes]
        starts = inputs[5:7] if initial_states else []
        self.initial_in_guard = bool(initial_states)

        def empty_value(k):
            if 1 <= k <= len(starts) and starts[k - 1].name:
                return zero.op("Identity", [starts[k - 1]])
            return zero.zeros(shapes[min(k, 1)])

        zeros = [empty_value(k) for k, t in enumerate(outs) if t.name]
        guard.close(self.b, empty, wanted, zeros, [r for r in results if r.name], outer_weights=True)
        return wanted
