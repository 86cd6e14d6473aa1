"""Full-spec Loop for onnx.reference's ReferenceEvaluator.

onnx.reference's own Loop concatenates scan outputs with ``np.vstack`` (so a rank-1
element per iteration gives a [T*d] result instead of [T, d] only by luck, and rank >= 2
elements are merged along their first axis), treats an omitted ``cond`` input as false
(the loop never runs), and crashes on a zero-iteration loop with scan outputs. This one
follows ``onnx.defs.get_schema("Loop", 21).doc``:
- inputs ``M`` (optional int64 scalar trip count), ``cond`` (optional bool scalar),
  ``v_initial...``; body inputs (iteration_num, condition, loop-carried...), body outputs
  (condition, loop-carried..., scan_outputs...).
- ``(M, cond)``: ``for (i = 0; i < M && cond; ++i) cond = body(...)``.
- ``(M, "")``: exactly ``M`` iterations; the body's condition output is ignored, as the
  spec's table says. (onnxruntime 1.31 stops early when it turns false; the spec does not.)
- ``("", cond)``: a while loop on the body's condition.
- ``("", "")``: the spec's infinite loop; here it stops when the body's condition turns
  false, the only way such a loop can end.
- Scan outputs are stacked along a new axis 0. With zero iterations the loop-carried
  values are returned unchanged and each scan output is empty with a leading 0 dim and the
  element shape the body declares, or the one onnx shape inference gives for the body with
  the actual input types (the same helper as the zero-length Scan, scan.py's ``_Body``).

The body reads the enclosing scopes through the evaluator's context, exactly like
scanopt's Scan; nested Loop/Scan/If bodies get scanopt's ops because ScanoptEvaluator
passes ``new_ops`` down to every subgraph evaluator.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx.reference.op_run import OpRun

from scanopt.errors import InvalidModelError
from scanopt.reference.scan import _Body, _given


class Loop(OpRun):
    """Loop of the default domain; the version comes from the graph's opset import."""

    op_domain = ""

    def __init__(self, onnx_node: onnx.NodeProto, run_params: dict[str, Any]):
        schema = onnx.defs.get_schema("Loop", run_params["opsets"][""], "")
        OpRun.__init__(self, onnx_node, run_params, schema=schema)
        self.version = schema.since_version
        unknown = sorted({a.name for a in onnx_node.attribute} - set(schema.attributes))
        if unknown:
            raise InvalidModelError(f"Loop-{self.version} has no attribute {', '.join(unknown)}")
        # _Body (shared with Scan) reads the body's GraphProto from here
        self.body_proto = next(a.g for a in onnx_node.attribute if a.name == "body")

    def need_context(self) -> bool:
        """The body may read any value of an enclosing graph by name."""
        return True

    def _run(self, *args, context=None, attributes=None, bindings=None, **atts):
        body = _Body(self, atts["body"], context, attributes, bindings)
        trip_count, cond, carried = _split_inputs(self.onnx_node, args)
        n = len(carried)
        k = _check_arity(body, self.onnx_node, n)
        keep_going = True if cond is None else cond
        # with M given and cond omitted the body's condition is ignored (a for loop)
        honor_cond = trip_count is None or cond is not None

        names = body.evaluator.input_names
        states = list(carried)
        per_step: list[list[np.ndarray]] = []
        it = 0
        while keep_going and (trip_count is None or it < trip_count):
            feeds = dict(body.context)
            feeds.update(zip(names, [np.array(it, dtype=np.int64), np.array(keep_going, dtype=np.bool_), *states]))
            outputs = OpRun._evaluate_subgraph(feeds, body.evaluator, body.attributes, *_given(body.bindings))
            if honor_cond:
                keep_going = _as_bool(outputs[0], f"the body's condition output at iteration {it}")
            states = list(outputs[1:1 + n])
            per_step.append([np.asarray(o) for o in outputs[1 + n:]])
            it += 1

        if per_step:
            types = [(e.dtype, e.shape) for e in per_step[0]]
        else:
            inputs = [(np.dtype(np.int64), ()), (np.dtype(np.bool_), ())]
            inputs += [(np.asarray(s).dtype, np.shape(s)) for s in carried]
            types = body.element_types(inputs, k) if k else []
        scans = []
        for i, (dtype, shape) in enumerate(types):
            column = [step[i] for step in per_step]
            for t, element in enumerate(column):
                if element.shape != tuple(shape):
                    raise ValueError(
                        f"Loop scan output {i} changed shape from {tuple(shape)} to {element.shape} at iteration {t}"
                    )
            if column:
                scans.append(np.stack(column, axis=0))
            else:
                scans.append(np.empty((0, *shape), dtype=dtype))
        # trailing outputs of the node may be omitted
        return tuple((states + scans)[:len(self.onnx_node.output)])


def _split_inputs(node: onnx.NodeProto, args: tuple) -> tuple[int | None, bool | None, list]:
    """(trip count or None, initial condition or None, initial loop-carried values)."""
    if len(args) < 2:
        raise InvalidModelError(f"Loop has {len(args)} inputs; it needs M and cond (either may be '')")
    m, cond, carried = args[0], args[1], list(args[2:])
    trip_count = None
    if m is not None:
        value = np.asarray(m)
        if value.size != 1 or not np.issubdtype(value.dtype, np.integer):
            raise ValueError(f"Loop's M must be an integer scalar, got {value.dtype}{list(value.shape)}")
        trip_count = int(value.reshape(-1)[0])
    condition = None if cond is None else _as_bool(cond, "Loop's cond input")
    return trip_count, condition, carried


def _as_bool(value, what: str) -> bool:
    if value is None:
        raise ValueError(f"{what} is missing")
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(f"{what} must be a boolean scalar, got shape {list(array.shape)}")
    return bool(array.reshape(-1)[0])


def _check_arity(body: _Body, node: onnx.NodeProto, n: int) -> int:
    """Validate the body's input/output counts against the node's; return K."""
    n_in, n_out = len(body.evaluator.input_names), len(body.evaluator.output_names)
    if n_in != 2 + n:
        raise InvalidModelError(f"Loop body has {n_in} inputs; expected 2+N = 2+{n}")
    k = n_out - 1 - n
    if k < 0 or len(node.output) > n + k:
        raise InvalidModelError(
            f"Loop body has {n_out} outputs and the node {len(node.output)}; "
            f"they must be 1+N+K and at most N+K with N = {n}"
        )
    return k
