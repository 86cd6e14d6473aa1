"""Regression tests for the defects review-12 found in the newest modules (chooser, placement,
cuda_shapes, functions, portable, timing, fuse's guards)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper as oh
from onnx import numpy_helper as nh

import scanopt
from builders import vi
from scanopt.cuda_shapes import scan_bodies, settle
from test_cuda_scan_shapes import CUDA, D, H, assert_same_outputs, dims, feeds, gated_body, issue_model, run_scan_function


def with_default_input(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (issue_model) with a weight that is an initializer and a graph input too, as
    keep_initializers_as_inputs and IR 3 write every weight: x0 is scaled by it."""
    b = model.graph.input[0].type.tensor_type.shape.dim[0].dim_value
    model.graph.initializer.append(nh.from_array(np.full((b, H, D), 0.5, np.float32), "w"))
    model.graph.input.append(vi("w", [b, H, D]))
    first = model.graph.node[0]
    model.graph.node.insert(0, oh.make_node("Mul", [first.input[0], "w"], ["x0w"]))
    first.input[0] = "x0w"
    onnx.checker.check_model(model)
    return model


def test_cuda_dims_are_written_when_an_initializer_is_also_a_graph_input():
    # was: the name counted twice (input and initializer of one graph) read as "value names
    # repeat across graphs", and no dim of any Scan body was written
    model = with_default_input(issue_model(b=2, t=5))
    done = settle(model)
    assert done.dims == settle(issue_model(b=2, t=5)).dims > 0
    assert "repeat" not in done.note()
    optimized, report = scanopt.optimize(model, options=CUDA)
    assert "repeat" not in report.target
    for body in scan_bodies(optimized):
        assert dims(body.input[0]) == [2, H, D]
    assert_same_outputs(model, optimized, feeds(2, 5))


def test_cuda_dims_are_not_proven_from_a_default_a_caller_may_feed():
    # an initializer that is a graph input is a default: a caller may feed another shape, which
    # the original runs; a dim proven from the default's shape would make the body refuse it
    scan = oh.make_node("Scan", ["w", "xs"], ["f", "out"], body=gated_body(), num_scan_inputs=1)
    graph = oh.make_graph([scan], "main", [vi("w", ["a", H, D]), vi("xs", ["T", "a", H, D])],
                          [vi("f", ["a", H, D]), vi("out", ["T", "a", H, D])],
                          initializer=[nh.from_array(np.full((2, H, D), 0.5, np.float32), "w")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    done = settle(model)
    assert all(dims(body.input[0])[0] == "B" for body in scan_bodies(done.model))
    data = {"w": np.full((3, H, D), 0.25, np.float32), "xs": np.ones((4, 3, H, D), np.float32)}
    assert_same_outputs(model, done.model, data)


def uncalled_function_model() -> onnx.ModelProto:
    """A main-graph Scan beside a local function holding a Scan that nothing calls (a layer
    library exported with the model)."""
    scan = oh.make_node("Scan", ["x0", "xs"], ["f", "out"], body=gated_body("m_"), num_scan_inputs=1)
    graph = oh.make_graph([scan], "main", [vi("x0", [2, H, D]), vi("xs", [5, 2, H, D])],
                          [vi("f", [2, H, D]), vi("out", [5, 2, H, D])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("local", 1)],
                         functions=[run_scan_function()], ir_version=8)


def test_cuda_keeps_a_function_nothing_calls_and_does_not_report_it_inlined():
    # was: inlined "at every call site" (none), so dropped from the written model, and
    # reported both "never called" and "inlined at every call site for the CUDA EP"
    model = uncalled_function_model()
    done = settle(model)
    assert [f.name for f in done.model.functions] == ["RunScan"] and not done.inlined
    assert done.dims > 0  # the main graph's Scan is still written for CUDA
    optimized, report = scanopt.optimize(model, options=CUDA)
    assert [f.name for f in optimized.functions] == ["RunScan"]
    assert "inlined" not in report.target
    assert not [o for o in report.outcomes if o.pass_name == "functions" and o.applied]
    assert_same_outputs(model, optimized, feeds(2, 5))


def test_cuda_inlines_a_scan_function_into_an_uncalled_caller_and_keeps_the_caller():
    # an uncalled function calling one that holds a Scan: the callee is inlined at its call
    # site (in the caller), the caller stays
    model = uncalled_function_model()
    caller = oh.make_function("local", "Caller", ["a", "b"], ["c", "d"],
                              [oh.make_node("RunScan", ["a", "b"], ["c", "d"], domain="local")],
                              [oh.make_opsetid("", 17), oh.make_opsetid("local", 1)])
    model.functions.append(caller)
    done = settle(model)
    assert [f.name for f in done.model.functions] == ["Caller"]
    assert done.inlined == ["local.RunScan"]
    assert [n.op_type for n in done.model.functions[0].node] == ["Scan"]


def wrong_fuse(monkeypatch) -> None:
    """Make fuse's rewrite wrong (its native op's Y scaled by 1.5): verification rolls it back."""
    import onnx_graphsurgeon as gs

    import scanopt.passes.fuse.fuse_pass as fuse_pass

    rewrite = fuse_pass.Fuse._rewrite

    def scaled(self, node, plan, level, ctx):
        detail = rewrite(self, node, plan, level, ctx)
        graph = level.graph
        for native in [n for n in graph.nodes if n.op in ("RNN", "GRU", "LSTM")]:
            y = native.outputs[0]
            bad = gs.Variable(ctx.names.fresh("scaled"), dtype=y.dtype)
            for reader in list(y.outputs):
                reader.inputs[reader.inputs.index(y)] = bad
            k = gs.Constant(ctx.names.fresh("k"), np.array(1.5, np.float32))
            graph.nodes.append(gs.Node("Mul", inputs=[y, k], outputs=[bad]))
        graph.toposort()
        return detail

    monkeypatch.setattr(fuse_pass.Fuse, "_rewrite", scaled)


def test_a_rollback_keeps_the_reports_target_line(monkeypatch):
    # was: the report of the re-run after a rollback replaced the first run's, and only its
    # warnings were carried over: the target line lost "modelled for CUDA, not measured"
    # (and --tune's measurements, report.tuning, were dropped the same way)
    import cell_builders as cb

    model = cb.rnn_model(hidden=16, inputs=8, seq=12, batch=2)
    _, clean = scanopt.optimize(model, options=CUDA)
    assert clean.target.startswith("cuda")
    wrong_fuse(monkeypatch)
    optimized, report = scanopt.optimize(model, options=CUDA)
    assert report.verification["rolled_back"] == ["fuse on cell_scan"]
    assert report.target.startswith("cuda") and report.target.split("; ")[:2] == clean.target.split("; ")[:2]


def test_a_rollback_keeps_the_measurements_in_the_report(monkeypatch, tmp_path):
    import cell_builders as cb

    model = cb.rnn_model(hidden=16, inputs=8, seq=12, batch=2)
    wrong_fuse(monkeypatch)
    options = {"tune": True, "tune_seconds": 0.3, "tune_cache": str(tmp_path / "cache.json")}
    _, report = scanopt.optimize(model, options=options)
    assert report.verification["rolled_back"] == ["fuse on cell_scan"]
    assert len(report.tuning) == 1 and report.tuning[0].startswith("cell_scan: loop ")


def test_a_rewrite_in_the_loop_branch_of_the_batch_dispatch_is_verified(monkeypatch):
    # fuse writes a Scan of unknown batch behind If(B >= k), the Scan kept where B >= k (k up
    # to 32), and later forms rewrite that Scan (here unroll, as --unroll-max asks); the seeds'
    # batches (8, 1) never ran that branch, so a wrong rewrite there was written unverified
    import onnx_graphsurgeon as gs

    import cell_builders as cb
    import scanopt.passes.unroll.unroll_pass as unroll_pass
    from scanopt.cost import DISPATCH_BATCHES
    from scanopt.weak_spots import WIDE_BATCH

    assert WIDE_BATCH >= max(DISPATCH_BATCHES)
    # the dispatch's threshold is the cost model's: pinned to its largest (the case the seeds miss)
    import scanopt.cost

    monkeypatch.setattr(scanopt.cost, "batch_dispatch", lambda ratios: (max(DISPATCH_BATCHES), 0.5))
    model = cb.rnn_model(hidden=8, inputs=256, seq=12)
    rewrite = unroll_pass.Unroll.rewrite

    def wrong(self, node, match, level, ctx):
        out = next(t for t in node.outputs if t.name)
        detail = rewrite(self, node, match, level, ctx)
        producer = out.inputs[0]
        early = gs.Variable(ctx.names.fresh("early"), dtype=out.dtype)
        producer.outputs[producer.outputs.index(out)] = early
        k = gs.Constant(ctx.names.fresh("k"), np.array(1.5, np.float32))
        level.graph.nodes.append(gs.Node("Mul", inputs=[early, k], outputs=[out]))
        return detail

    monkeypatch.setattr(unroll_pass.Unroll, "rewrite", wrong)
    optimized, report = scanopt.optimize(model, options={"unroll_max": 16})
    applied = [o for o in report.outcomes if o.applied]
    assert any(o.pass_name == "fuse" and f"behind If(B >= {max(DISPATCH_BATCHES)})" in o.detail for o in applied), applied
    assert report.verification["rolled_back"] == ["unroll on cell_scan"], report.verification["summary"]
    assert not any(o.pass_name == "unroll" for o in applied)


def test_fused_per_item_lengths_keep_a_finite_final_state_beside_an_infinite_initial_one():
    # the final states of items with steps were written final + initial * (len == 0): an inf in
    # the initial state gave inf * 0 = NaN there, where the Scan's state is tanh's finite value
    import onnxruntime as ort

    from equivalence import top_ops
    from test_tf2onnx import _where_masked_rnn

    model = _where_masked_rnn()
    optimized, report = scanopt.optimize(model)
    assert any(o.pass_name == "fuse" and o.applied for o in report.outcomes)
    assert top_ops(optimized).get("Scan", 0) == 0
    rng = np.random.default_rng(1)
    # lengths of 1..T: onnxruntime 1.31 refuses a sequence_lens entry of 0 (docs: DESIGN)
    data = {"X": rng.normal(size=(5, 3, 3)).astype(np.float32), "lens": np.array([5, 3, 2], np.int64),
            "h0": rng.normal(size=(3, 4)).astype(np.float32)}
    data["h0"][1, 2] = np.inf
    runs = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, data)
            for m in (model, optimized)]
    (h_want, y_want), (h_got, y_got) = runs
    assert np.isfinite(h_want).all()
    np.testing.assert_allclose(h_got, h_want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y_got, y_want, rtol=1e-5, atol=1e-6)


def counter_scan(y_shape) -> onnx.ModelProto:
    """A Scan whose body reads none of its scan elements (c = sin(c + w) per step), its scan output
    Expand(c, [2, 3]) (rank 2; ``y_shape``: the body output's declared shape, None: none)
    stacked on axis -2."""
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, y_shape or [])
    if y_shape is None:
        y.type.tensor_type.ClearField("shape")
    body = oh.make_graph([oh.make_node("Add", ["c", "w"], ["a"]), oh.make_node("Sin", ["a"], ["c2"]),
                          oh.make_node("Expand", ["c2", "shp"], ["y"])],
                         "b", [vi("c", [3]), vi("x", [3])], [vi("c2", [3]), y],
                         initializer=[nh.from_array(np.array([2, 3], np.int64), "shp")])
    graph = oh.make_graph([oh.make_node("Scan", ["c0", "X"], ["cf", "Y"], body=body, num_scan_inputs=1,
                                        scan_output_axes=[-2])], "g", [vi("c0", [3]), vi("X", ["T", 3])],
                          [vi("cf", [3]), vi("Y", ["a", "b", "c"])],
                          initializer=[nh.from_array(np.ones(3, np.float32), "w")])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def test_portable_does_not_take_a_negative_scan_output_axis_of_unknown_rank_for_axis_0():
    # was: a body output of unknown rank counted as rank 1, so axis -2 read as axis 0 and the
    # Loop stacked [T, 2, 3] where the Scan writes [2, T, 3] (verification rolled it back;
    # without verification it was written)
    from equivalence import top_ops

    from scanopt.engines import run

    data = {"c0": np.zeros(3, np.float32), "X": np.ones((4, 3), np.float32)}
    model = counter_scan(None)
    optimized, _ = scanopt.optimize(model, verify=False, skip="canonicalize", options={"target": "portable"})
    assert top_ops(optimized)["Loop"] == 0 and top_ops(optimized)["Scan"] == 1
    assert run(optimized, data)["Y"].shape == run(model, data)["Y"].shape == (2, 4, 3)
    # a declared rank 2 makes axis -2 the middle axis: no Loop either
    optimized, _ = scanopt.optimize(counter_scan([2, 3]), verify=False, skip="canonicalize", options={"target": "portable"})
    assert top_ops(optimized)["Loop"] == 0
    # rank 1 (y = c2): axis -2 is axis 0, and the Scan becomes the Loop
    model = counter_scan(None)
    model.graph.node[0].attribute[0].g.node[2].CopyFrom(oh.make_node("Identity", ["c2"], ["y"]))
    model.graph.node[0].attribute[0].g.output[1].CopyFrom(vi("y", [3]))
    model.graph.output[1].CopyFrom(vi("Y", ["T", 3]))
    optimized, _ = scanopt.optimize(model, verify=False, skip="canonicalize", options={"target": "portable"})
    assert top_ops(optimized)["Loop"] == 1
    np.testing.assert_array_equal(run(optimized, data)["Y"], run(model, data)["Y"])
