"""Full-spec Scan (versions 8 to 25) for onnx.reference's ReferenceEvaluator.

onnx.reference's own Scan runs only forward, axis-0, non-empty, opset-9+ scans; scanopt
must check rewrites of every Scan, so this one implements every attribute, Scan-8 batching
with ``sequence_lens`` and zero-length sequences, with the semantics of DESIGN.md:
- Scan-8 reverse inputs start at ``len[b] - 1``; scan outputs are zero past ``len[b]``;
  each final state is the state after the item's own ``len[b]`` steps.
- A zero-length scan returns the initial states and empty scan outputs whose element
  shape comes from the body's declared outputs, or from onnx shape inference run on the
  body with the actual input shapes when the declaration is incomplete.

It reads the node's attributes itself rather than through ``scanopt.scan_view``: the
reference executor is the oracle that rewrites built on ScanView are checked against,
so it must not share their attribute handling.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import onnx
from onnx.reference.op_run import OpRun

from scanopt.errors import InvalidModelError
from scanopt.inference import bounded_inference
from scanopt.protos import walk_proto_graphs
from scanopt.scan_view import scan_version


def _given(bindings) -> tuple:
    """The optional ``bindings`` argument of OpRun._evaluate_subgraph (onnx 1.23+; older
    releases take none and pass none)."""
    return () if bindings is None else (bindings,)

ElementType = tuple[np.dtype, tuple[int, ...]]


class Scan(OpRun):
    """Scan of the default domain; the version comes from the graph's opset import."""

    op_domain = ""

    def __init__(self, onnx_node: onnx.NodeProto, run_params: dict[str, Any]):
        # run_params["opsets"] is the opset import of the model (or of the function)
        # the node belongs to; onnx.reference hands the same dict to every subgraph.
        self.version = scan_version(run_params["opsets"][""])
        schema = onnx.defs.get_schema("Scan", self.version, "")
        OpRun.__init__(self, onnx_node, run_params, schema=schema)
        unknown = sorted({a.name for a in onnx_node.attribute} - set(schema.attributes))
        if unknown:
            raise InvalidModelError(f"Scan-{self.version} has no attribute {', '.join(unknown)}")
        self.body_proto = next(a.g for a in onnx_node.attribute if a.name == "body")

    def need_context(self) -> bool:
        """The body may read any value of an enclosing graph by name."""
        return True

    def _run(self, *args, context=None, attributes=None, bindings=None, **atts):
        body = _Body(self, atts["body"], context, attributes, bindings)
        m = atts["num_scan_inputs"]
        if self.version == 8:
            return tuple(_run_batched(body, args[0], args[1:], m, atts))
        return tuple(_run_unbatched(body, args, m, self.version, atts))


class _Body:
    """One Scan node's body bound to its outer scope: runs steps, infers element types."""

    def __init__(self, op: Scan, evaluator, context, attributes, bindings):
        self.op = op
        self.evaluator = evaluator
        self.context = {} if context is None else context
        self.attributes = attributes
        self.bindings = bindings

    def check_arity(self, n: int, m: int) -> int:
        """Validate the body's input/output counts against the node's; return K."""
        n_in, n_out = len(self.evaluator.input_names), len(self.evaluator.output_names)
        if n_in != n + m:
            raise InvalidModelError(f"Scan body has {n_in} inputs; expected N+M = {n}+{m}")
        k = n_out - n
        if k < 0 or len(self.op.onnx_node.output) != n + k:
            raise InvalidModelError(
                f"Scan body has {n_out} outputs and the node {len(self.op.onnx_node.output)}; "
                f"both must be N+K with N = {n}"
            )
        return k

    def loop(self, states: list, elements_at: Callable[[int], list], steps: int):
        """Run ``steps`` iterations; return the final states and each step's scan elements."""
        n = len(states)
        per_step = []
        for t in range(steps):
            feeds = dict(self.context)
            feeds.update(zip(self.evaluator.input_names, [*states, *elements_at(t)]))
            outputs = OpRun._evaluate_subgraph(feeds, self.evaluator, self.attributes, *_given(self.bindings))
            for i, (old, new) in enumerate(zip(states, outputs[:n])):
                if np.shape(old) != np.shape(new):
                    raise ValueError(
                        f"Scan state {i} changed shape from {np.shape(old)} to {np.shape(new)} at step {t}"
                    )
            states = list(outputs[:n])
            per_step.append([np.asarray(o) for o in outputs[n:]])
        return states, per_step

    def element_types(self, inputs: list[ElementType], k: int) -> list[ElementType]:
        """Element dtype and shape of each scan output, without running the body.

        Needed only when no step runs. The body's declaration is used when it is fully
        concrete; otherwise onnx shape inference runs on a copy of the body whose inputs
        get the actual shapes and whose outer-scope reads become initializers.
        """
        n = len(self.body_proto.output) - k
        outputs = self.body_proto.output[n:]
        declared = [_concrete(v.type) for v in outputs]
        if all(declared):
            return declared
        known = self._infer(inputs)
        result = []
        for i, (value, element) in enumerate(zip(outputs, declared)):
            element = element or known.get(value.name)
            if element is None:
                raise ValueError(
                    f"zero-length Scan: the shape of scan output {i} ('{value.name}') is neither "
                    "declared in the body nor inferable; declare it"
                )
            result.append(element)
        return result

    @property
    def body_proto(self) -> onnx.GraphProto:
        return self.op.body_proto

    def _infer(self, inputs: list[ElementType]) -> dict[str, ElementType]:
        """Concrete types of the body's values, by name, given its actual input types."""
        graph = onnx.GraphProto()
        graph.CopyFrom(self.body_proto)
        for value, (dtype, shape) in zip(graph.input, inputs):
            value.type.CopyFrom(
                onnx.helper.make_tensor_type_proto(onnx.helper.np_dtype_to_tensor_dtype(dtype), shape)
            )
        for name in sorted(_outer_reads(self.body_proto)):
            value = self.context.get(name)
            if isinstance(value, np.ndarray):
                graph.initializer.append(onnx.numpy_helper.from_array(value, name))
        # shape inference gives up on a graph whose output is one of its inputs; outputs
        # passed straight through get their types from the inputs and initializers below
        produced = {name for node in graph.node for name in node.output}
        kept = [v for v in graph.output if v.name in produced]
        del graph.output[:]
        graph.output.extend(kept)
        opsets = [onnx.helper.make_opsetid(d, v) for d, v in self.op.run_params["opsets"].items()]
        model = onnx.helper.make_model(graph, opset_imports=opsets)
        inferred = bounded_inference(model).graph  # a body may declare huge numbers: see scanopt.inference
        known = {t.name: (onnx.helper.tensor_dtype_to_np_dtype(t.data_type), tuple(t.dims))
                 for t in graph.initializer}
        for value in [*inferred.input, *inferred.value_info, *inferred.output]:
            element = _concrete(value.type)
            if element is not None:
                known.setdefault(value.name, element)
        return known


def _run_unbatched(body: _Body, args: tuple, m: int, version: int, atts: dict) -> list:
    """Scan-9 and later: one sequence, axes and directions per input and output."""
    n = len(args) - m
    if m < 1 or n < 0:
        raise InvalidModelError(f"Scan has {len(args)} inputs; num_scan_inputs={m} needs 1 to {len(args)}")
    k = body.check_arity(n, m)
    states, scans = list(args[:n]), list(args[n:])
    negative_ok = version >= 11
    in_axes = _axes(atts.get("scan_input_axes"), [s.ndim for s in scans], "scan_input_axes", negative_ok)
    in_dirs = _flags(atts.get("scan_input_directions"), m, "scan_input_directions")
    out_dirs = _flags(atts.get("scan_output_directions"), k, "scan_output_directions")
    length = _common_length([s.shape[a] for s, a in zip(scans, in_axes)])

    def elements_at(t: int) -> list:
        return [_at(s, a, length - 1 - t if d else t) for s, d, a in zip(scans, in_dirs, in_axes)]

    finals, per_step = body.loop(states, elements_at, length)
    if per_step:
        types = [(e.dtype, e.shape) for e in per_step[0]]
    else:
        inputs = [(s.dtype, s.shape) for s in states]
        inputs += [(s.dtype, _drop(s.shape, a)) for s, a in zip(scans, in_axes)]
        types = body.element_types(inputs, k)
    out_axes = _axes(atts.get("scan_output_axes"), [len(s) + 1 for _, s in types], "scan_output_axes", negative_ok)
    outputs = []
    for i, ((dtype, shape), axis, prepend) in enumerate(zip(types, out_axes, out_dirs)):
        column = [step[i] for step in per_step]
        _check_same_shapes(column, shape, i)
        if prepend:
            column.reverse()
        if column:
            outputs.append(np.stack(column, axis=axis))
        else:
            outputs.append(np.empty(shape[:axis] + (0,) + shape[axis:], dtype=dtype))
    return finals + outputs


def _run_batched(body: _Body, sequence_lens, rest: tuple, m: int, atts: dict) -> list:
    """Scan-8: batch axis 0, sequence axis 1, per-item lengths, zero padding."""
    n = len(rest) - m
    if m < 1 or n < 0:
        raise InvalidModelError(f"Scan has {len(rest)} state/scan inputs; num_scan_inputs={m} needs 1 to {len(rest)}")
    k = body.check_arity(n, m)
    inits, scans = list(rest[:n]), list(rest[n:])
    dirs = _flags(atts.get("directions"), m, "directions")
    for i, s in enumerate(scans):
        if s.ndim < 2:
            raise ValueError(f"Scan-8 scan input {i} has shape {s.shape}; it needs [batch, sequence, ...]")
    for i, x in enumerate(inits):
        if x.ndim < 1:
            raise ValueError(f"Scan-8 initial state {i} is a scalar; it needs a leading batch axis")
    batch = _common_length([s.shape[0] for s in scans + inits], what="batch size")
    length = _common_length([s.shape[1] for s in scans])
    lens = _sequence_lens(sequence_lens, batch, length)

    finals, runs = [], []
    for b in range(batch):
        steps = int(lens[b])

        def elements_at(t: int, b=b, steps=steps) -> list:
            return [s[b, steps - 1 - t if d else t, ...] for s, d in zip(scans, dirs)]

        item_finals, per_step = body.loop([x[b, ...] for x in inits], elements_at, steps)
        finals.append(item_finals)
        runs.append(per_step)

    first = next((r[0] for r in runs if r), None)
    if first is not None:
        types = [(e.dtype, e.shape) for e in first]
    else:
        inputs = [(x.dtype, x.shape[1:]) for x in inits] + [(s.dtype, s.shape[2:]) for s in scans]
        types = body.element_types(inputs, k)
    outputs = []
    for i, (dtype, shape) in enumerate(types):
        out = _zeros((batch, length) + tuple(shape), dtype)
        for b, per_step in enumerate(runs):
            column = [step[i] for step in per_step]
            _check_same_shapes(column, shape, i)
            for t, element in enumerate(column):
                out[b, t] = element
        outputs.append(out)
    if batch:
        states = [np.stack([item[j] for item in finals]) for j in range(n)]
    else:
        states = list(inits)
    return states + outputs


def _sequence_lens(value, batch: int, length: int) -> np.ndarray:
    """Per-item step counts; an absent input means every item runs the full length."""
    if value is None:
        return np.full(batch, length, dtype=np.int64)
    lens = np.asarray(value)
    if lens.shape != (batch,) or not np.issubdtype(lens.dtype, np.integer):
        raise ValueError(
            f"sequence_lens must be an integer tensor of shape [{batch}], got {lens.dtype}{list(lens.shape)}"
        )
    if lens.size and (lens.min() < 0 or lens.max() > length):
        raise ValueError(f"sequence_lens {lens.tolist()} must lie in [0, {length}]")
    return lens


def _flags(values, count: int, name: str) -> list[int]:
    if values is None:
        return [0] * count
    values = list(values)
    if len(values) != count:
        raise InvalidModelError(f"'{name}' has {len(values)} entries; expected {count}")
    if any(v not in (0, 1) for v in values):
        raise InvalidModelError(f"'{name}' must hold only 0 and 1, got {values}")
    return values


def _axes(values, ranks: list[int], name: str, negative_ok: bool) -> list[int]:
    if values is None:
        return [0] * len(ranks)
    values = list(values)
    if len(values) != len(ranks):
        raise InvalidModelError(f"'{name}' has {len(values)} entries; expected {len(ranks)}")
    resolved = []
    for i, (axis, rank) in enumerate(zip(values, ranks)):
        if axis < 0 and not negative_ok:
            raise InvalidModelError(f"'{name}'[{i}] = {axis}: negative axes need Scan-11 or later")
        if not -rank <= axis < rank:
            raise InvalidModelError(f"'{name}'[{i}] = {axis} is out of range for rank {rank}")
        resolved.append(axis % rank)
    return resolved


def _common_length(dims: list[int], what: str = "sequence length") -> int:
    if len(set(dims)) > 1:
        raise ValueError(f"Scan inputs disagree on the {what}: {dims}")
    return dims[0]


def _check_same_shapes(column: list, shape: tuple, index: int) -> None:
    for t, element in enumerate(column):
        if element.shape != tuple(shape):
            raise ValueError(f"Scan output {index} changed shape from {tuple(shape)} to {element.shape} at step {t}")


def _at(x: np.ndarray, axis: int, index: int) -> np.ndarray:
    """``x`` at ``index`` along ``axis``; a 0-d array (not a numpy scalar) for rank 1."""
    return x[(slice(None),) * axis + (index, Ellipsis)]


def _drop(shape: tuple, axis: int) -> tuple:
    return shape[:axis] + shape[axis + 1:]


def _zeros(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """Padding for Scan-8 outputs: zeros, or empty strings for string tensors."""
    if dtype == np.dtype(object) or dtype.kind in "US":
        return np.full(shape, "", dtype=object)
    return np.zeros(shape, dtype=dtype)


def _concrete(type_proto: onnx.TypeProto) -> ElementType | None:
    """(dtype, shape) of a tensor type whose element type and every dim are known."""
    tensor = type_proto.tensor_type
    if not tensor.elem_type or not tensor.HasField("shape"):
        return None
    dims = tensor.shape.dim
    if not all(d.HasField("dim_value") for d in dims):
        return None
    return onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type), tuple(d.dim_value for d in dims)


def _outer_reads(body: onnx.GraphProto) -> set[str]:
    """Names read anywhere in ``body`` (nested graphs included) that it does not define."""
    defined, read = set(), set()
    for graph in walk_proto_graphs(body):
        defined.update(v.name for v in graph.input)
        defined.update(t.name for t in graph.initializer)
        defined.update(t.values.name for t in graph.sparse_initializer)
        for node in graph.node:
            defined.update(node.output)
            read.update(node.input)
        read.update(v.name for v in graph.output)
    return read - defined - {""}
