"""What every rewrite test asserts: the result is valid ONNX and computes the same
numbers as the original, in onnxruntime and in the reference executor."""

from __future__ import annotations

from collections import Counter

import onnx

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


def top_ops(model: onnx.ModelProto) -> Counter:
    """Op-type counts of the main graph, with the branches of its Ifs in place of the If (the
    empty-input guards a fused op, a converted Loop or an upgraded Scan-8 sits behind); loop
    bodies are not entered."""
    found = Counter()

    def visit(nodes):
        for node in nodes:
            if node.op_type == "If":
                for attribute in node.attribute:
                    if attribute.name == "else_branch":  # the work; then_branch is the empty case
                        visit(attribute.g.node)
            else:
                found[node.op_type] += 1

    visit(model.graph.node)
    return found


def outer_initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """The initializers of the main graph and of the If branches in it, at any depth (a weight
    only a guarded op reads sits in that branch: scanopt.placement); loop bodies are not entered."""
    found = {}

    def visit(graph):
        found.update((t.name, t) for t in graph.initializer)
        for node in graph.node:
            if node.op_type == "If":
                for attribute in node.attribute:
                    visit(attribute.g)

    visit(model.graph)
    return found


def work_ops(model: onnx.ModelProto) -> Counter:
    """Op-type counts over every graph level except the then branches of Ifs (the empty-input
    cases of the guards, which may run a copy of a Scan once): the ops that do the work."""
    found = Counter()

    def visit(graph):
        for node in graph.node:
            found[node.op_type] += 1
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH and not (node.op_type == "If" and attribute.name == "then_branch"):
                    visit(attribute.g)

    visit(model.graph)
    return found


def loop_scans(model: onnx.ModelProto) -> int:
    """Scans doing work (at :func:`work_ops`' levels), other than the chunk Scans linrec's
    symbolic-length forms emit (over the chunk ends and the positions; bodies named
    'chunk_steps...', passes/loopfree/prefix_scan.state_scan): the loops a rewrite left."""
    found = 0

    def visit(graph):
        nonlocal found
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type != onnx.AttributeProto.GRAPH or (node.op_type == "If" and attribute.name == "then_branch"):
                    continue
                if node.op_type == "Scan" and attribute.g.name.startswith("chunk_steps"):
                    continue
                found += node.op_type == "Scan"
                visit(attribute.g)

    visit(model.graph)
    return found


def the_scan(model: onnx.ModelProto) -> onnx.NodeProto:
    """The main graph's Scan, or the one behind a guard If (its else branch)."""
    for node in model.graph.node:
        if node.op_type == "Scan":
            return node
        if node.op_type == "If":
            branch = next(a.g for a in node.attribute if a.name == "else_branch")
            for inner in branch.node:
                if inner.op_type == "Scan":
                    return inner
    raise AssertionError("no Scan in the main graph or behind a guard")

