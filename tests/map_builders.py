"""Map-Scan models for the vectorize and hoist tests: a body of given nodes over given
per-step elements, every other value an outer initializer or body constant."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper as h

import builders as b


def map_scan(
    nodes,
    elements,  # [(body input name, per-step shape)]
    outputs,  # [body output names]
    *,
    steps=3,
    opset=17,
    inits=None,  # outer initializers {name: array}
    states=(),  # pass-through states [(name, shape)]: body reads them, outputs them unchanged
    input_axes=None,
    input_dirs=None,
    output_axes=None,
    output_dirs=None,
    out_shapes=None,  # declared per-step shapes of the outputs (None: unknown rank)
    elem_types=None,  # {body value: onnx elem type} for non-float values
) -> onnx.ModelProto:
    elem_types = elem_types or {}
    m = len(elements)
    body_in = [b.vi(n, s) for n, s in states] + [b.vi(n, s, elem_types.get(n, b.F)) for n, s in elements]
    body_nodes = list(nodes) + [h.make_node("Identity", [n], [f"{n}_out"]) for n, _ in states]
    shapes = out_shapes or [None] * len(outputs)
    body_out = [b.vi(f"{n}_out", s) for n, s in states] + [
        h.make_tensor_value_info(o, elem_types.get(o, b.F), s) for o, s in zip(outputs, shapes)
    ]
    body = h.make_graph(body_nodes, "body", body_in, body_out)
    attrs = {}
    for key, value in (("scan_input_axes", input_axes), ("scan_input_directions", input_dirs),
                       ("scan_output_axes", output_axes), ("scan_output_directions", output_dirs)):
        if value is not None:
            attrs[key] = list(value)
    in_axes = input_axes or [0] * m
    graph_inputs = [b.vi(f"S{i}", s) for i, (_, s) in enumerate(states)]
    for j, (name, shape) in enumerate(elements):
        full = list(shape)
        axis = in_axes[j] if in_axes[j] >= 0 else in_axes[j] + len(shape) + 1
        full.insert(axis, steps)
        graph_inputs.append(b.vi(f"X{j}", full, elem_types.get(name, b.F)))
    scan = h.make_node(
        "Scan",
        [f"S{i}" for i in range(len(states))] + [f"X{j}" for j in range(m)],
        [f"S{i}_final" for i in range(len(states))] + [f"Y{k}" for k in range(len(outputs))],
        name="scan_map", body=body, num_scan_inputs=m, **attrs,
    )
    graph_outputs = [b.vi(f"S{i}_final", s) for i, (_, s) in enumerate(states)]
    graph_outputs += [h.make_tensor_value_info(f"Y{k}", elem_types.get(o, b.F), None) for k, o in enumerate(outputs)]
    graph = h.make_graph([scan], "main", graph_inputs, graph_outputs,
                         initializer=[b.init(k, v) for k, v in (inits or {}).items()])
    return b.model(graph, opset)


def rand(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)
