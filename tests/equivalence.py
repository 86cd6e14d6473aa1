"""What every rewrite test asserts: the result is valid ONNX and computes the same
numbers as the original, in onnxruntime and in the reference executor."""

from __future__ import annotations

from collections import Counter

import onnx

from scanopt.protos import walk_proto_graphs
from scanopt.report import count_ops
from scanopt.validate import validate_model


def assert_valid(model: onnx.ModelProto) -> None:
    """scanopt's own validation (onnx.checker, lenient only on missing shapes) plus
    strict shape inference, which catches rank and type mismatches a rewrite made."""
    validate_model(model, name="rewritten model")
    onnx.shape_inference.infer_shapes(model, strict_mode=True)


def assert_equivalent(original, candidate, *, inputs=None, engine: str = "both", seeds: int = 2):
    """Compare on synthesized (or given) inputs; fail with the verifier's table."""
    from scanopt.verify import compare_models

    assert_valid(candidate)
    result = compare_models(original, candidate, inputs=inputs, engine=engine, seeds=seeds)
    assert result.passed, result.format()
    return result


def ops(model: onnx.ModelProto) -> Counter:
    """Op-type counts over every graph level (for structure assertions)."""
    return count_ops(model)



def form_ops(model: onnx.ModelProto) -> Counter:
    """Op-type counts over every graph level but the fallback branches rewrites keep the loop in
    (linrec's two-pass form: If(a chunk start is not finite) runs the original Scan)."""
    counted = ops(model)
    for graph in walk_proto_graphs(model.graph):
        for node in graph.node:
            for attribute in node.attribute:
                if node.op_type == "If" and attribute.name == "then_branch" \
                        and attribute.g.name.startswith("linrec_overflowed"):
                    counted.subtract(n.op_type for g in walk_proto_graphs(attribute.g) for n in g.node)
    return +counted
