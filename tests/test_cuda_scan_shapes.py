"""Scans written for onnxruntime's CUDA EP with memory-pattern reuse on (onnxruntime issue
27887; scanopt/cuda_shapes.py): under a CUDA target, functions holding a Scan are inlined
by scanopt (value_info renamed with the values) and Scan bodies get the dims static shapes
prove. No GPU runs here: the tests check the structure the CUDA planner reads, and that
onnxruntime's CPU EP (and the reference executor where onnxruntime refuses) computes
exactly what the original does, empty batch and zero-length sequence included."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import helper as oh

import scanopt
from builders import vi
from equivalence import assert_equivalent
from scanopt.cuda_shapes import scan_bodies, scan_functions
from scanopt.engines import run
from scanopt.functions import inline_functions

CUDA = {"execution_providers": ["cuda"]}
SAMPLE = os.path.join(os.path.dirname(__file__), "..", "models", "functions", "fn_scan_symbolic_carry.onnx")
H, D = 16, 8  # the carry's static dims; B (batch) and T (steps) vary per test
rng = np.random.default_rng(0)


def gated_body(prefix: str = "", stale: bool = True) -> onnx.GraphProto:
    """h, x -> tanh(h * x) twice (new state, scan output), typed as the issue's exporter
    types it: symbolic [B, H, d_k] everywhere, a value_info for the product, and (``stale``)
    one value_info naming nothing in the body. No form of scanopt's takes this Scan."""
    p = prefix
    dims = ["B", "H", "d_k"]
    nodes = [oh.make_node("Mul", [f"{p}h", f"{p}x"], [f"{p}m"]), oh.make_node("Tanh", [f"{p}m"], [f"{p}h2"]),
             oh.make_node("Identity", [f"{p}h2"], [f"{p}y"])]
    info = [vi(f"{p}m", dims)] + ([vi(f"{p}gone", dims)] if stale else [])
    return oh.make_graph(nodes, f"{p}body", [vi(f"{p}h", dims), vi(f"{p}x", dims)],
                         [vi(f"{p}h2", dims), vi(f"{p}y", dims)], value_info=info)


def run_scan_function(name: str = "RunScan") -> onnx.FunctionProto:
    scan = oh.make_node("Scan", ["init", "seq"], ["final", "ys"], body=gated_body(), num_scan_inputs=1)
    return oh.make_function("local", name, ["init", "seq"], ["final", "ys"], [scan], [oh.make_opsetid("", 17)])


def issue_model(b=1, t=5, calls: int = 2) -> onnx.ModelProto:
    """onnxruntime issue 27887's shape: a local function with a Scan whose carry is typed
    symbolically, called ``calls`` times from a graph whose shapes are ``b``, ``t`` (ints:
    static)."""
    nodes = [oh.make_node("RunScan", ["x0", "xs"], ["f0", "y0"], domain="local")]
    if calls == 2:
        nodes += [oh.make_node("Neg", ["xs"], ["xn"]), oh.make_node("RunScan", ["x0", "xn"], ["f1", "y1"], domain="local"),
                  oh.make_node("Add", ["y0", "y1"], ["out"]), oh.make_node("Add", ["f0", "f1"], ["f"])]
    else:
        nodes += [oh.make_node("Identity", ["y0"], ["out"]), oh.make_node("Identity", ["f0"], ["f"])]
    graph = oh.make_graph(nodes, "main", [vi("x0", [b, H, D]), vi("xs", [t, b, H, D])],
                          [vi("f", [b, H, D]), vi("out", [t, b, H, D])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("local", 1)],
                         functions=[run_scan_function()], ir_version=8)


def feeds(b: int, t: int) -> dict:
    return {"x0": rng.uniform(-1, 1, (b, H, D)).astype(np.float32),
            "xs": rng.uniform(-2, 2, (t, b, H, D)).astype(np.float32)}


def assert_same_outputs(original, candidate, data, engine="ort") -> dict:
    """Every output of ``candidate`` on ``data`` equals the original's, bit for bit."""
    expected, got = run(original, data, engine=engine), run(candidate, data, engine=engine)
    assert list(got) == list(expected)
    for name in expected:
        assert expected[name].shape == got[name].shape and np.array_equal(expected[name], got[name]), name
    return got


def dims(value: onnx.ValueInfoProto) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]


def body_values(body: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    return list(body.input) + list(body.output) + list(body.value_info)


def assert_no_orphans(model: onnx.ModelProto) -> None:
    for body in scan_bodies(model):
        made = {v.name for v in body.input} | {o for n in body.node for o in n.output}
        assert all(v.name in made for v in body.value_info), [v.name for v in body.value_info]


def test_the_issue_model_is_inlined_and_its_carry_written_concrete():
    model = issue_model()
    optimized, report = scanopt.optimize(model, options=CUDA)
    assert not optimized.functions  # onnxruntime has nothing left to inline
    bodies = list(scan_bodies(optimized))
    assert len(bodies) == 2
    for body in bodies:
        values = body_values(body)
        assert len(values) == 5  # 2 inputs, 2 outputs, the product's value_info; the stale entry is gone
        assert all(dims(v) == [1, H, D] for v in values), [(v.name, dims(v)) for v in values]
    assert_no_orphans(optimized)
    # the product's value_info now names the product of each inlined copy
    for body in bodies:
        mul = next(n for n in body.node if n.op_type == "Mul")
        assert [v.name for v in body.value_info] == [mul.output[0]]
    # 2 Scans x (2 inputs + 2 outputs + 1 value_info) x 3 dims
    assert "carry and slice shapes written concrete (30 dims, 2 Scans)" in report.target, report.target
    assert "1 function holding a Scan inlined (local.RunScan)" in report.target, report.target
    assert "1 orphaned value_info entry dropped" in report.target, report.target  # the function's one
    assert "onnxruntime issue 27887" in report.target
    assert report.verification["passed"] is True
    assert "Scan bodies for CUDA: equivalent" in report.verification["summary"]
    assert_same_outputs(model, optimized, feeds(1, 5))


def test_a_cpu_target_keeps_the_function_and_its_symbolic_body():
    model = issue_model()
    optimized, report = scanopt.optimize(model)
    assert [f.name for f in optimized.functions] == ["RunScan"]
    body = next(a.g for a in optimized.functions[0].node[0].attribute if a.name == "body")
    assert dims(body.input[0]) == ["B", "H", "d_k"]
    assert "Scan bodies" not in report.target


def test_a_function_called_once_is_inlined_for_every_target_with_its_body_value_info_renamed():
    """scanopt.functions inlines a function called once on the CPU too: its body's value_info
    follows the renamed product, as onnx's inliner alone does not."""
    model = issue_model(calls=1)
    optimized, report = scanopt.optimize(model)
    assert not optimized.functions
    body = next(scan_bodies(optimized))
    mul = next(n for n in body.node if n.op_type == "Mul")
    assert [(v.name, dims(v)) for v in body.value_info] == [(mul.output[0], ["B", "H", "d_k"])]
    assert "Scan bodies" not in report.target
    assert_same_outputs(model, optimized, feeds(1, 5))


def test_dims_no_static_shape_fixes_stay_symbolic_and_every_size_still_runs():
    model = issue_model(b="N", t="T")
    optimized, report = scanopt.optimize(model, options=CUDA)
    for body in scan_bodies(optimized):
        for v in body.input:
            assert dims(v) == ["B", H, D], (v.name, dims(v))
    # B in each Scan's 2 inputs and 2 outputs
    assert "8 dims of 2 Scans left symbolic (no static shape fixes them)" in report.target, report.target
    for b, t in ((3, 4), (0, 3), (1, 1)):  # the empty batch too
        got = assert_same_outputs(model, optimized, feeds(b, t))
        assert got["out"].shape == (t, b, H, D)


def test_a_zero_length_sequence_fails_alike_in_onnxruntime_and_matches_in_the_reference():
    model = issue_model(b="N", t="T")
    optimized, _ = scanopt.optimize(model, options=CUDA)
    data = feeds(2, 0)
    with pytest.raises(Exception, match="Scan"):
        run(model, data)  # onnxruntime 1.32 refuses a zero-length Scan-9 sequence ...
    with pytest.raises(Exception, match="Scan"):
        run(optimized, data)  # ... and so it does the written model
    got = assert_same_outputs(model, optimized, data, engine="reference")
    assert got["out"].shape == (0, 2, H, D)
    assert np.array_equal(got["f"], 2 * data["x0"])  # no step: each call's final state is the initial one


def test_a_dim_only_input_shape_fixes_is_not_written():
    """Writing it would make the body refuse every other size: the control below shows
    onnxruntime's CPU EP failing on such a body."""
    model = issue_model(b="N", t="T")
    declared = {"x0": [2, H, D], "xs": [5, 2, H, D]}
    optimized, report = scanopt.optimize(model, options=dict(CUDA, input_shapes=declared))
    assert "8 fixed only by --input-shape" in report.target, report.target
    assert all(dims(v)[0] == "B" for body in scan_bodies(optimized) for v in body.input)
    data = feeds(3, 4)
    assert_same_outputs(model, optimized, data)
    specialized = onnx.ModelProto()
    specialized.CopyFrom(optimized)
    for body in scan_bodies(specialized):
        for v in body_values(body):
            v.type.tensor_type.shape.dim[0].dim_value = 2
    with pytest.raises(Exception):
        run(specialized, data)


def _main_graph_scan(stale: bool) -> onnx.ModelProto:
    scan = oh.make_node("Scan", ["x0", "xs"], ["f", "out"], body=gated_body(stale=stale), num_scan_inputs=1)
    graph = oh.make_graph([scan], "main", [vi("x0", ["N", H, D]), vi("xs", [3, "N", H, D])],
                          [vi("f", ["N", H, D]), vi("out", [3, "N", H, D])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def test_an_orphaned_value_info_in_a_main_graph_scan_is_dropped():
    model = _main_graph_scan(stale=True)
    optimized, report = scanopt.optimize(model, options=CUDA)
    body = next(scan_bodies(optimized))
    assert [(v.name, dims(v)) for v in body.value_info] == [("m", ["B", H, D])]
    assert "1 orphaned value_info entry dropped" in report.target, report.target
    assert_equivalent(model, optimized, engine="ort")


def test_a_scan_whose_body_is_already_settled_changes_nothing():
    model = _main_graph_scan(stale=False)
    for body in scan_bodies(model):
        for v in body_values(body):
            for d in v.type.tensor_type.shape.dim[1:]:
                d.dim_value = {"H": H, "d_k": D}[d.dim_param]
    optimized, report = scanopt.optimize(model, options=CUDA)
    assert optimized is model
    assert "carry and slice shapes written" not in report.target
    assert "4 dims of 1 Scan left symbolic" in report.target, report.target


def test_sibling_bodies_sharing_value_names_lend_each_other_no_size():
    """Two Scans whose bodies both call their values h, x, m...: the first's outer carry is
    static [1, H, D], the second's [N, H, D]. Value names key the proofs, so neither body's
    shared names are written, and the second still runs at N = 3."""
    scans = [oh.make_node("Scan", ["a0", "as"], ["fa", "ya"], body=gated_body(stale=False), num_scan_inputs=1),
             oh.make_node("Scan", ["b0", "bs"], ["fb", "yb"], body=gated_body(stale=False), num_scan_inputs=1)]
    graph = oh.make_graph(scans, "main", [vi("a0", [1, H, D]), vi("as", [3, 1, H, D]), vi("b0", ["N", H, D]),
                                         vi("bs", [3, "N", H, D])],
                          [vi("fa", [1, H, D]), vi("ya", [3, 1, H, D]), vi("fb", ["N", H, D]), vi("yb", [3, "N", H, D])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    optimized, report = scanopt.optimize(model, options=CUDA)
    assert all(dims(v)[0] == "B" for body in scan_bodies(optimized) for v in body_values(body))
    assert "left symbolic (value names repeat across graphs (h, h2, m, ...)" in report.target, report.target
    data = {"a0": rng.uniform(-1, 1, (1, H, D)).astype(np.float32), "as": rng.uniform(-1, 1, (3, 1, H, D)).astype(np.float32),
            "b0": rng.uniform(-1, 1, (3, H, D)).astype(np.float32), "bs": rng.uniform(-1, 1, (3, 3, H, D)).astype(np.float32)}
    assert_same_outputs(model, optimized, data)


def test_a_body_value_named_like_an_outer_one_writes_no_dim():
    """The body's scan output is called y, and so is the graph's output: its sizes are the
    outer y's [3, N, ...] under one name. Nothing is written; the model runs at N = 8."""
    model = _main_graph_scan(stale=False)
    model.graph.node[0].output[1] = "y"
    model.graph.output[1].name = "y"
    optimized, report = scanopt.optimize(model, options=CUDA)
    assert optimized is model
    assert "value names repeat across graphs (y)" in report.target, report.target
    data = {"x0": rng.uniform(-1, 1, (8, H, D)).astype(np.float32), "xs": rng.uniform(-1, 1, (3, 8, H, D)).astype(np.float32)}
    assert_same_outputs(model, optimized, data)


def _if_holding_a_scan() -> onnx.ModelProto:
    """A function Branchy whose If holds the Scan in one branch, called through a function
    Wrap that holds no Scan itself: both are inlined."""
    scan = oh.make_node("Scan", ["init", "seq"], ["final", "ys"], body=gated_body(), num_scan_inputs=1)
    then = oh.make_graph([scan, oh.make_node("Identity", ["ys"], ["out"])], "then", [], [vi("out", None)])
    other = oh.make_graph([oh.make_node("Identity", ["seq"], ["out2"])], "else", [], [vi("out2", None)])
    branchy = oh.make_function("local", "Branchy", ["flag", "init", "seq"], ["r"],
                               [oh.make_node("If", ["flag"], ["r"], then_branch=then, else_branch=other)],
                               [oh.make_opsetid("", 17)])
    wrap = oh.make_function("local", "Wrap", ["flag", "init", "seq"], ["r"],
                            [oh.make_node("Branchy", ["flag", "init", "seq"], ["r"], domain="local")],
                            [oh.make_opsetid("", 17), oh.make_opsetid("local", 1)])
    graph = oh.make_graph([oh.make_node("Wrap", ["flag", "x0", "xs"], ["out"], domain="local")], "main",
                          [vi("flag", [], onnx.TensorProto.BOOL), vi("x0", [2, H, D]), vi("xs", [4, 2, H, D])],
                          [vi("out", [4, 2, H, D])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("local", 1)],
                         functions=[branchy, wrap], ir_version=8)


def test_a_function_holding_a_scan_in_an_if_or_through_a_call_is_inlined():
    model = _if_holding_a_scan()
    assert scan_functions(model) == [("local", "Branchy"), ("local", "Wrap")]
    optimized, report = scanopt.optimize(model, options=CUDA)
    assert not optimized.functions
    body = next(scan_bodies(optimized))
    assert all(dims(v) == [2, H, D] for v in body_values(body))
    assert "2 functions holding a Scan inlined (local.Branchy, local.Wrap)" in report.target, report.target
    for flag in (True, False):
        assert_same_outputs(model, optimized, dict(feeds(2, 4), flag=np.array(flag)))


def test_inlining_renames_body_value_info_and_leaves_the_input_untouched():
    model = issue_model()
    model.functions[0].node[0].attribute[0].g.doc_string = "the exporter's words"
    before = model.SerializeToString()
    inlined = inline_functions(model, [("local", "RunScan")])
    assert model.SerializeToString() == before
    for body in scan_bodies(inlined):
        assert body.doc_string == "the exporter's words"
        mul = next(n for n in body.node if n.op_type == "Mul")
        assert mul.output[0] != "m"  # the inliner renamed it ...
        assert [v.name for v in body.value_info] == [mul.output[0]]  # ... and its value_info with it
        assert dims(body.value_info[0]) == ["B", "H", "d_k"]  # declarations unchanged: no dim written here
    reference = onnx.inliner.inline_selected_functions(model, [("local", "RunScan")])
    assert {v.name for b in scan_bodies(reference) for v in b.value_info} == {"m", "gone"}  # onnx's own: orphans


def test_a_rewrite_that_fails_verification_is_left_out(monkeypatch):
    import scanopt.cuda_shapes as cuda_shapes

    monkeypatch.setattr(cuda_shapes, "_verified", lambda *a: (False, "outputs differ (planted)"))
    model = _main_graph_scan(stale=True)
    optimized, report = scanopt.optimize(model, options=CUDA)
    assert optimized is model
    assert "Scan bodies left as they were: the model written for onnxruntime issue 27887 failed verification " \
           "(outputs differ (planted))" in report.target, report.target


def test_the_output_is_the_same_bytes_every_run():
    model = issue_model()
    first, _ = scanopt.optimize(model, options=CUDA)
    again, _ = scanopt.optimize(issue_model(), options=CUDA)
    assert first.SerializeToString() == again.SerializeToString()


def test_a_scan8_body_gets_its_per_item_dims_not_the_batch():
    body = oh.make_graph([oh.make_node("Add", ["s", "x"], ["s2"]), oh.make_node("Identity", ["s2"], ["y"])], "body",
                         [vi("s", ["W"]), vi("x", ["W"])], [vi("s2", ["W"]), vi("y", ["W"])])
    scan = oh.make_node("Scan", ["", "s0", "xs"], ["sf", "ys"], body=body, num_scan_inputs=1)
    graph = oh.make_graph([scan], "main", [vi("s0", [3, 2]), vi("xs", [3, 4, 2])], [vi("sf", [3, 2]), vi("ys", [3, 4, 2])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 8)], ir_version=8)
    optimized, report = scanopt.optimize(model, passes=["cleanup"], options=CUDA)
    body = next(scan_bodies(optimized))
    assert [dims(v) for v in body_values(body)] == [[2]] * 4, report.target
    assert_equivalent(model, optimized, engine="ort")


def test_the_onnxscript_sample_runs_inlined_with_a_concrete_carry():
    model = scanopt.load_model(SAMPLE)
    optimized, report = scanopt.optimize(model, options=CUDA)
    assert not optimized.functions
    bodies = list(scan_bodies(optimized))
    assert len(bodies) == 2
    assert all(dims(v) == [2, 16] for body in bodies for v in body.input)  # typed [B, 16] by the script
    assert "1 function holding a Scan inlined (layers.gated_state)" in report.target, report.target
    data = {"x": rng.uniform(-2, 2, (6, 2, 16)).astype(np.float32), "h0": rng.uniform(-1, 1, (2, 16)).astype(np.float32)}
    assert_same_outputs(model, optimized, data)


def test_the_capture_note_counts_control_flow_inside_functions():
    """onnxruntime inlines functions, so an If inside one is as uncapturable as one outside."""
    from scanopt.providers import capture_note

    model = _if_holding_a_scan()
    assert capture_note(model) == "not capturable in a CUDA graph: 1 If, 1 Scan (an If: an empty-input guard or a " \
                                  "run-time dispatch; inputs of static non-empty shape need no guard) (onnxruntime issue 9978)"
    del model.functions[:]
    assert capture_note(model) == "no If, Loop or Scan left: capturable in a CUDA graph"


def test_without_verification_the_bodies_are_still_written_and_the_report_says_unverified():
    model = issue_model()
    optimized, report = scanopt.optimize(model, verify=False, options=CUDA)
    assert not optimized.functions
    assert all(dims(v) == [1, H, D] for body in scan_bodies(optimized) for v in body.input)
    assert report.verification["passed"] is None
    assert_same_outputs(model, optimized, feeds(1, 5))
