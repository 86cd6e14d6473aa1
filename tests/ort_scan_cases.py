"""Models of onnxruntime's own Scan unit tests (onnxruntime/test/providers/cpu/controlflow/
scan_test.cc), re-created as ONNX models: shared by the reference-executor tests
(test_reference_scan_ort_cases.py) and the real-model corpus (models/generate_real.py).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper as oh

from builders import vi
from reference_helpers import FLOAT, INT64, const, make_model, scan_node

OUTER_VALUE = 42.0
SCAN_OUTPUTS = [f"scan_output_{i}" for i in range(4)]


# -- the model shared by most cases ---------------------------------------------------
# Body: state + 1 -> state; Concat(two scan elements of [2]) -> [4] (+ an outer-scope
# value) -> Split into four [1] scan outputs.


def state_output(shape, *, required: bool, dims: bool, typed: bool) -> onnx.ValueInfoProto:
    """The body's state output as onnxruntime's RunOptions declare it: with its shape when
    the subgraph carries dims or the main graph has none, typed only, or not typed at all."""
    if dims or required:
        return vi("loop_state_out_1", shape)
    if typed:
        return vi("loop_state_out_1", None)
    return onnx.ValueInfoProto(name="loop_state_out_1")


def counting_concat_split_body(opset, *, dims_in_main=False, dims_in_sub=True, types_in_sub=True,
                               outer_scope_add=False, scalar_state=False, bad_shape=False):
    """The body of most cases; the keywords are onnxruntime's RunOptions."""
    state_shape = [] if scalar_state else ([1] if dims_in_sub else [None])
    concat_in = ([2, 99] if bad_shape else [2]) if dims_in_sub else [None]
    nodes = [
        const("one", np.ones(() if scalar_state else (1,), np.float32)),
        oh.make_node("Add", ["one", "loop_state_in_1"], ["loop_state_out_1"]),
        oh.make_node("Concat", ["concat_in_0", "concat_in_1"], ["concat_out_1"], axis=0),
    ]
    to_split = "concat_out_1"
    if outer_scope_add:
        nodes.append(oh.make_node("Add", ["concat_out_1", "outer_scope_0"], ["add_out_1"]))
        to_split = "add_out_1"
    if opset >= 13:
        nodes += [const("split_sizes", np.ones(4, np.int64)),
                  oh.make_node("Split", [to_split, "split_sizes"], [f"split_out_{i}" for i in range(4)], axis=0)]
    else:
        nodes.append(oh.make_node("Split", [to_split], [f"split_out_{i}" for i in range(4)], axis=0, split=[1] * 4))
    state_out = state_output([] if scalar_state else [1], required=not dims_in_main, dims=dims_in_sub,
                             typed=types_in_sub)
    value_info = [vi("concat_out_1", [4] if dims_in_sub else None)] if types_in_sub else []
    return oh.make_graph(
        nodes, "body",
        [vi("loop_state_in_1", state_shape), vi("concat_in_0", concat_in), vi("concat_in_1", concat_in)],
        [state_out] + [vi(f"split_out_{i}", [1]) for i in range(4)],
        value_info=value_info,
    )


def counting_concat_split_model(opset, body, *, batch=1, length=2, dims_in_main=False, scalar_state=False,
                                with_lens=False, **attrs):
    """Main graph: outer_scope_0 = Identity(Constant 42), then the Scan of ``body``."""
    v8 = opset == 8
    lead = [batch] if v8 else []
    state_shape = lead + ([] if scalar_state else [1])
    output_shapes = [lead + [length, 1]] * 4

    def io(name, shape, elem=FLOAT):
        return vi(name, shape if dims_in_main else None, elem)

    inputs = [io("scan_loop_state_in_0", state_shape)]
    inputs += [io(f"scan_input_{i}", lead + [length, 2]) for i in range(2)]
    node_inputs = [i.name for i in inputs]
    if v8:
        node_inputs.insert(0, "sequence_lens" if with_lens else "")
        if with_lens:
            inputs.insert(0, io("sequence_lens", [batch], INT64))
    outputs = [io("scan_loop_state_out_0", state_shape)] + [io(n, s) for n, s in zip(SCAN_OUTPUTS, output_shapes)]
    nodes = [
        const("outer_scope_constant", np.array([OUTER_VALUE], np.float32)),
        oh.make_node("Identity", ["outer_scope_constant"], ["outer_scope_0"]),
        scan_node(node_inputs, [o.name for o in outputs], body, 2, **attrs),
    ]
    return make_model(opset, nodes, inputs, outputs)


def scan8_model(batch, length, with_lens=False, **attrs):
    return counting_concat_split_model(8, counting_concat_split_body(8), batch=batch, length=length,
                                       with_lens=with_lens, **attrs)


def scan9_model(opset, **attrs):
    return counting_concat_split_model(opset, counting_concat_split_body(opset), **attrs)


def crossing_model(opset, elem_types, state_dims, dim_param=None):
    """States and scan inputs cross over: state_i -> scan_out_i, scan_in_i -> state_out_i."""
    k = len(elem_types)
    shape = [dim_param or 1]
    body = oh.make_graph(
        [oh.make_node("Identity", [f"state_in_{i}"], [f"scan_out_{i}"]) for i in range(k)]
        + [oh.make_node("Identity", [f"scan_in_{i}"], [f"state_out_{i}"]) for i in range(k)],
        "body",
        [vi(f"state_in_{i}", shape, t) for i, t in enumerate(elem_types)]
        + [vi(f"scan_in_{i}", shape, t) for i, t in enumerate(elem_types)],
        [vi(f"state_out_{i}", shape, t) for i, t in enumerate(elem_types)]
        + [vi(f"scan_out_{i}", shape, t) for i, t in enumerate(elem_types)],
    )
    lead = [] if opset > 8 else ["batch"]
    inputs = [vi(f"initial_state_{i}", lead + state_dims, t) for i, t in enumerate(elem_types)]
    inputs += [vi(f"scan_input_{i}", lead + ["seq", 1], t) for i, t in enumerate(elem_types)]
    outputs = [vi(f"final_state_{i}", None, t) for i, t in enumerate(elem_types)]
    outputs += [vi(f"scan_output_{i}", None, t) for i, t in enumerate(elem_types)]
    node_inputs = ([""] if opset == 8 else []) + [i.name for i in inputs]
    node = scan_node(node_inputs, [o.name for o in outputs], body, k)
    return make_model(opset, [node], inputs, outputs)
