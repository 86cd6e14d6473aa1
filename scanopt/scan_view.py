"""A normalized, read-only view of one Scan node, for every Scan version (8 to 25).

Passes and reports never read Scan attributes directly: they read a ScanView, where
defaults are applied, negative axes are resolved wherever the rank is known, and the
opset-8 batch layout is explicit. Building a view validates the node, so a malformed
Scan becomes one clear InvalidModelError instead of a crash deep inside a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import onnx

from scanopt.errors import InvalidModelError

# Versions of Scan in the default domain; later ones only widen the type list.
SCAN_VERSIONS = (8, 9, 11, 16, 19, 21, 23, 24, 25)


def scan_version(opset: int) -> int:
    """The Scan schema version in force at a default-domain opset."""
    if opset < 8:
        raise InvalidModelError(f"Scan does not exist before opset 8 (model uses opset {opset})")
    return max(v for v in SCAN_VERSIONS if v <= opset)


@dataclass(frozen=True)
class ScanView:
    """What a Scan node computes, with every attribute resolved.

    Per-input and per-output tuples are in the node's order. ``input_axes`` and
    ``output_axes`` are resolved to non-negative values where the rank is known and
    are kept as given (possibly negative) where it is not. For opset 8 the batch axis
    is 0 and the sequence axis is 1 for every scan input and output.
    """

    name: str
    version: int
    num_states: int  # N
    num_scan_inputs: int  # M
    num_scan_outputs: int  # K
    sequence_lens: str | None  # v8 only; None when absent
    initial_states: tuple[str, ...]
    scan_inputs: tuple[str, ...]
    final_states: tuple[str, ...]
    scan_outputs: tuple[str, ...]
    input_axes: tuple[int, ...]
    output_axes: tuple[int, ...]
    input_directions: tuple[int, ...]
    output_directions: tuple[int, ...]
    input_ranks: tuple[int | None, ...]  # ranks of the scan inputs (outer tensors)
    trip_count: int | None  # static sequence length, when every scan input's shape gives it

    @property
    def batched(self) -> bool:
        """Opset-8 form: batch axis 0, sequence axis 1, optional sequence_lens."""
        return self.version == 8

    @property
    def is_canonical_layout(self) -> bool:
        """Every scan axis 0 and every direction forward/append (v9+)."""
        return (
            not self.batched
            and all(a == 0 for a in self.input_axes + self.output_axes)
            and not any(self.input_directions + self.output_directions)
        )

    # -- construction -----------------------------------------------------------------

    @classmethod
    def from_gs(cls, node: Any, opset: int, shapes: Any = None) -> "ScanView":
        """View of an onnx-graphsurgeon Scan node; ``shapes`` (a ShapeTable) fills in
        shapes the graph does not declare."""
        body = node.attrs.get("body")

        def shape(t):
            return shapes.shape(t) if shapes is not None else t.shape

        return cls._build(
            name=node.name,
            opset=opset,
            attrs=node.attrs,
            inputs=[t.name for t in node.inputs],
            input_shapes=[shape(t) for t in node.inputs],
            outputs=[t.name for t in node.outputs],
            body_inputs=None if body is None else len(body.inputs),
            body_output_ranks=None if body is None else [_rank(shape(t)) for t in body.outputs],
        )

    @classmethod
    def from_proto(
        cls, node: onnx.NodeProto, opset: int, shape_of: Callable[[str], Sequence | None]
    ) -> "ScanView":
        """View of a NodeProto; ``shape_of(name)`` gives a value's shape or None."""
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        body = attrs.get("body")
        has_body = isinstance(body, onnx.GraphProto)
        return cls._build(
            name=node.name,
            opset=opset,
            attrs=attrs,
            inputs=list(node.input),
            input_shapes=[shape_of(n) if n else None for n in node.input],
            outputs=list(node.output),
            body_inputs=len(body.input) if has_body else None,
            body_output_ranks=[_proto_rank(v) for v in body.output] if has_body else None,
        )

    @classmethod
    def _build(cls, *, name, opset, attrs, inputs, input_shapes, outputs, body_inputs, body_output_ranks):
        version = scan_version(opset)
        label = f"Scan node '{name or '<unnamed>'}'"

        def bad(problem: str) -> InvalidModelError:
            return InvalidModelError(f"{label}: {problem}")

        if body_inputs is None:
            raise bad("has no 'body' graph attribute")
        m = attrs.get("num_scan_inputs")
        if not isinstance(m, int):
            raise bad("has no integer 'num_scan_inputs' attribute")
        batched = version == 8
        first = 1 if batched else 0  # opset 8 leads with sequence_lens
        if len(inputs) < first + 1:
            raise bad(f"has {len(inputs)} inputs, too few for Scan-{version}")
        available = len(inputs) - first
        if not 1 <= m <= available:
            raise bad(f"num_scan_inputs={m} is out of range: the node has {available} state and scan inputs")
        n = available - m
        k = len(outputs) - n
        if k < 0:
            raise bad(f"has {len(outputs)} outputs but {n} loop states (needs at least one output per state)")
        if body_inputs != n + m:
            raise bad(f"body has {body_inputs} inputs; expected N+M = {n}+{m} = {n + m}")
        if len(body_output_ranks) != n + k:
            raise bad(f"body has {len(body_output_ranks)} outputs; expected N+K = {n}+{k} = {n + k}")

        scan_shapes = input_shapes[first + n:]
        input_ranks = tuple(_rank(s) for s in scan_shapes)
        output_ranks = tuple(None if r is None else r + 1 + batched for r in body_output_ranks[n:])

        if batched:
            for key in ("scan_input_axes", "scan_output_axes", "scan_input_directions", "scan_output_directions"):
                if key in attrs:
                    raise bad(f"attribute '{key}' does not exist in Scan-8")
            in_dirs = _flags(attrs, "directions", m, bad)
            out_dirs = (0,) * k
            in_axes, out_axes = (1,) * m, (1,) * k
            for i, rank in enumerate(input_ranks):
                if rank is not None and rank < 2:
                    raise bad(f"scan input {i} has rank {rank}; Scan-8 needs [batch, sequence, ...]")
        else:
            if "directions" in attrs:
                raise bad("attribute 'directions' exists only in Scan-8; use scan_input_directions")
            in_dirs = _flags(attrs, "scan_input_directions", m, bad)
            out_dirs = _flags(attrs, "scan_output_directions", k, bad)
            allow_negative = version >= 11
            in_axes = _axes(attrs, "scan_input_axes", input_ranks, allow_negative, bad)
            out_axes = _axes(attrs, "scan_output_axes", output_ranks, allow_negative, bad)
            for i, rank in enumerate(input_ranks):
                if rank == 0:
                    raise bad(f"scan input {i} is a scalar; it has no axis to scan")

        seq_axis_dims = [
            s[a] if s is not None and a >= 0 and a < len(s) else None for s, a in zip(scan_shapes, in_axes)
        ]
        trip = seq_axis_dims[0] if seq_axis_dims else None
        static = isinstance(trip, int) and all(d == trip for d in seq_axis_dims)
        return cls(
            name=name,
            version=version,
            num_states=n,
            num_scan_inputs=m,
            num_scan_outputs=k,
            sequence_lens=(inputs[0] or None) if batched else None,
            initial_states=tuple(inputs[first:first + n]),
            scan_inputs=tuple(inputs[first + n:]),
            final_states=tuple(outputs[:n]),
            scan_outputs=tuple(outputs[n:]),
            input_axes=in_axes,
            output_axes=out_axes,
            input_directions=in_dirs,
            output_directions=out_dirs,
            input_ranks=input_ranks,
            trip_count=trip if static else None,
        )


def _rank(shape) -> int | None:
    return None if shape is None else len(shape)


def _proto_rank(value: onnx.ValueInfoProto) -> int | None:
    tensor_type = value.type.tensor_type
    return len(tensor_type.shape.dim) if tensor_type.HasField("shape") else None


def _flags(attrs, key, count, bad) -> tuple[int, ...]:
    values = tuple(attrs.get(key, (0,) * count))
    if len(values) != count:
        raise bad(f"'{key}' has {len(values)} entries; expected {count}")
    if any(v not in (0, 1) for v in values):
        raise bad(f"'{key}' must hold only 0 (forward) and 1 (reverse), got {list(values)}")
    return values


def _axes(attrs, key, ranks, allow_negative, bad) -> tuple[int, ...]:
    values = tuple(attrs.get(key, (0,) * len(ranks)))
    if len(values) != len(ranks):
        raise bad(f"'{key}' has {len(values)} entries; expected {len(ranks)}")
    resolved = []
    for i, (axis, rank) in enumerate(zip(values, ranks)):
        if axis < 0 and not allow_negative:
            raise bad(f"'{key}'[{i}] = {axis}: negative axes need opset 11 or later")
        if rank is not None:
            if not -rank <= axis < rank:
                raise bad(f"'{key}'[{i}] = {axis} is out of range for rank {rank}")
            axis = axis + rank if axis < 0 else axis
        resolved.append(axis)
    return tuple(resolved)


def top_scan_inputs(model: onnx.ModelProto):
    """(tensor name, scanned axis) of each scan input of each default-domain Scan in the main
    graph, read through :class:`ScanView` (Scan-8's axis 1, defaults, negative axes where the
    declared rank resolves them); a malformed Scan is skipped. What verification's weak-spot
    and edge inputs probe."""
    from scanopt.validate import default_opset

    opset = default_opset(model) or 0
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in model.graph.input
             if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}
    for node in model.graph.node:
        if node.op_type != "Scan" or node.domain not in ("", "ai.onnx") or opset < 8:
            continue
        try:
            view = ScanView.from_proto(node, opset, lambda name: [None] * ranks[name] if name in ranks else None)
        except InvalidModelError:
            continue
        for name, axis in zip(view.scan_inputs, view.input_axes):
            if axis >= 0:
                yield name, axis


def top_scanned_inputs(model: onnx.ModelProto, loop_reads=()) -> list[tuple[str, int]]:
    """(graph input, axis) of each sequence the top graph scans, read on the fed graph input
    itself or on the input of the one Transpose that feeds it (the batch-first ``x`` of
    ``x.transpose(0, 1)``), each once in first-seen order: every top-level Scan's scan inputs
    (:func:`top_scan_inputs`), then ``loop_reads``, (tensor, axis) pairs of the top graph's
    tensors that a top-level Loop reads one slice of per iteration (those loop_to_scan made
    Scans: ``PassContext.loop_reads``). What verification's weak-spot and edge inputs
    probe (scanopt.weak_spots, scanopt.edge_inputs)."""
    from scanopt.protos import fed_inputs

    fed = {v.name for v in fed_inputs(model.graph)}
    transposes = {n.output[0]: n for n in model.graph.node if n.op_type == "Transpose" and n.input and n.output}
    found: list[tuple[str, int]] = []
    for name, axis in [*top_scan_inputs(model), *loop_reads]:
        if name in transposes and name not in fed:
            perm = [list(a.ints) for a in transposes[name].attribute if a.name == "perm"]
            if not perm or not 0 <= axis < len(perm[0]):
                continue
            name, axis = transposes[name].input[0], perm[0][axis]
        if name in fed and axis >= 0 and (name, axis) not in found:
            found.append((name, axis))
    return found
