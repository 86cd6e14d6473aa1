"""vectorize on hypothesis-generated map Scans: random chains of liftable ops over a per-step
element of rank 2 (broadcasts against invariant and per-step operands of lower rank, reductions,
softmax, transposes, MatMul), random lengths 0..4, input and output axes and directions, and an
optional pass-through state. Original and vectorized models must agree on onnxruntime and on
the reference executor (the reference executor alone for zero steps, which onnxruntime cannot run)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper as h

from equivalence import assert_equivalent, ops
from map_builders import map_scan, rand
from scanopt.pipeline import optimize


@st.composite
def chains(draw):
    steps = draw(st.integers(0, 4))
    count = draw(st.integers(1, 4))
    nodes, inits, value = [], {}, "x"  # x: per-step [2, 3]
    shape = [2, 3]
    for i in range(count):
        kind = draw(st.sampled_from(["unary", "invariant", "per_step", "reduce", "softmax", "transpose", "matmul"]))
        out = f"v{i}"
        if kind == "unary":
            nodes.append(h.make_node(draw(st.sampled_from(["Tanh", "Abs", "Neg", "Sigmoid"])), [value], [out]))
        elif kind == "invariant":
            r = draw(st.integers(0, len(shape)))
            inits[f"c{i}"] = rand(*shape[len(shape) - r:], seed=i)
            nodes.append(h.make_node(draw(st.sampled_from(["Add", "Mul", "Sub", "Max"])), [value, f"c{i}"], [out]))
        elif kind == "per_step" and shape[-1] == 3:  # u: per-step [3] broadcasts against value
            nodes.append(h.make_node("Mul", ["u", value] if draw(st.booleans()) else [value, "u"], [out]))
        elif kind == "reduce" and len(shape) > 1:
            axis = draw(st.integers(-len(shape), len(shape) - 1))
            nodes.append(h.make_node("ReduceMax", [value], [out], axes=[axis], keepdims=1))
            shape = list(shape)
            shape[axis] = 1
        elif kind == "softmax":
            nodes.append(h.make_node("Softmax", [value], [out], axis=draw(st.integers(-len(shape), len(shape) - 1))))
        elif kind == "transpose" and len(shape) == 2:
            nodes.append(h.make_node("Transpose", [value], [out], perm=[1, 0]))
            shape = shape[::-1]
        else:
            inits[f"w{i}"] = rand(shape[-1], 3, seed=10 + i)
            nodes.append(h.make_node("MatMul", [value, f"w{i}"], [out]))
            shape = shape[:-1] + [3]
        value = out
    return steps, nodes, inits, value, draw(st.integers(-3, 2)), draw(st.integers(0, 1)), \
        draw(st.integers(-3, 2)), draw(st.integers(0, 1)), draw(st.booleans())


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(chains())
def test_random_maps_vectorize_to_the_same_numbers(spec):
    steps, nodes, inits, value, in_axis, in_dir, out_axis, out_dir, with_state = spec
    m = map_scan(nodes, [("x", [2, 3]), ("u", [3])], [value], steps=steps, inits=inits,
                 states=[("q", [2])] if with_state else (), input_axes=[in_axis, 0], input_dirs=[in_dir, 0],
                 output_axes=[out_axis], output_dirs=[out_dir])
    out, report = optimize(m, passes=["vectorize"], verify=False)
    assert report.modified, [o.detail for o in report.outcomes]
    assert "Scan" not in ops(out)
    assert_equivalent(m, out, engine="reference" if steps == 0 else "both")
