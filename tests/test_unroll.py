"""unroll: short static Scans become straight-line graphs with the same numbers.

Every rewrite is checked for structure (which ops remain) and numbers (onnxruntime and the
reference executor); every decline for its reason. The fuse pass is kept out of the way
(``no_fuse``) except where the deferral to it is the subject.
"""

from __future__ import annotations

from pathlib import Path

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import builders as b
from equivalence import assert_equivalent, assert_valid, ops
from scanopt.engines import run
from scanopt.graph import NameAllocator
from scanopt.ir import export_model, import_model
from scanopt.pass_api import Match, PassContext, ScanPass, Skip
from scanopt import chooser as chooser_module
from scanopt import pass_api
from scanopt.passes.unroll import unroll_pass as unroll_module
from scanopt.pipeline import optimize
from scanopt.protos import walk_proto_graphs
from scanopt.shapes import ShapeTable

MODELS = Path(__file__).resolve().parent.parent / "models"


@pytest.fixture(autouse=True)
def no_fuse(monkeypatch):
    """Unroll defers to fuse where fuse takes the Scan (the chooser asks the registry's fuse
    pass); these tests decide whether there is one."""
    monkeypatch.setattr(chooser_module, "registered_passes",
                        lambda: {k: v for k, v in pass_api.registered_passes().items() if k != "fuse"})


def unroll(model, **options):
    """Run the unroll pass alone; return the model and its outcomes as (node, applied, detail)."""
    out, report = optimize(model, passes=["unroll"], verify=False, options={"target": "portable", **options})
    return out, [(o.node, o.applied, o.detail) for o in report.outcomes if o.pass_name == "unroll"]


def sample(name: str, **dims) -> onnx.ModelProto:
    """A committed sample with some symbolic dims made static (signature and value_info)."""
    m = onnx.load(MODELS / f"{name}.onnx")
    values = [v for g in walk_proto_graphs(m.graph) for v in list(g.input) + list(g.output) + list(g.value_info)]
    for value in values:
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param in dims:
                d.dim_value = dims[d.dim_param]
    return m


def names_defined(model) -> list[str]:
    return [o for g in walk_proto_graphs(model.graph) for n in g.node for o in n.output if o]


# ---------------------------------------------------------------- rewrites
def test_short_static_sample_is_unrolled_at_the_default_threshold():
    m = sample("scan_short_static")
    out, outcomes = unroll(m)
    # 4 steps: a Gather per step, the 4-node body per step, an Unsqueeze per step, one Concat
    assert outcomes == [("scan_short", True, "unrolled 4 steps: 25 nodes added (body of 4 nodes copied 4 times)")]
    assert ops(out) == {"Gather": 4, "MatMul": 4, "Add": 4, "Tanh": 4, "Identity": 4, "Unsqueeze": 4, "Concat": 1}
    # the body's weight is hoisted once, not copied per step
    assert [list(i.dims) for i in out.graph.initializer].count([3, 3]) == 1
    assert_equivalent(m, out)


def test_outputs_and_copied_values_keep_their_declared_types():
    m = sample("scan_short_static")
    out, _ = unroll(m)
    assert [(o.name, [d.dim_value for d in o.type.tensor_type.shape.dim]) for o in out.graph.output] == [
        ("y", [4, 2, 3]),
        ("h_final", [2, 3]),
    ]
    declared = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in out.graph.value_info}
    assert declared["h_out_t0"] == [2, 3]  # the body's h_out declaration, on each copy
    assert declared["y_t_t3"] == [2, 3]


def test_reverse_input_prepend_output_and_axes_of_the_sample():
    """scan_axes_directions: input axes [1, -1], input directions [0, 1], output axes
    [-1, 1], output directions [1, 0], with the length made static."""
    m = sample("scan_axes_directions", seq=3)
    out, outcomes = unroll(m)
    assert outcomes[0][1] is True and "Scan" not in ops(out)
    gathers = [n for n in out.graph.node if n.op_type == "Gather"]
    assert sorted(onnx.helper.get_attribute_value(n.attribute[0]) for n in gathers) == [1, 1, 1, 2, 2, 2]
    assert_equivalent(m, out)


@pytest.mark.parametrize(
    "name, dims",
    [
        ("scan9_sum", {"seq": 3}),  # opset 9: Unsqueeze takes axes as an attribute
        ("scan_rnn", {"seq": 3}),  # outer-scope weights, symbolic batch left symbolic
        ("scan_gru", {"seq": 2}),  # body initializers and Split
        ("scan_gru_lbr1", {"seq": 2}),
        ("scan_lstm", {"seq": 3}),
        ("torch_scan_rnn", {"seq": 3}),
        ("torch_scan_rnn_rev_dim1", {"seq": 4}),
        ("scan_nested", {"seq": 2}),  # both levels unroll
    ],
)
def test_samples_with_a_static_length(name, dims):
    m = sample(name, **dims)
    out, outcomes = unroll(m)
    assert outcomes and all(applied for _, applied, _ in outcomes), outcomes
    assert "Scan" not in ops(out)
    assert_equivalent(m, out)


def test_torch_export_unrolled_matches_torch():
    """The PyTorch sample at its exported length (5) against torch's own outputs."""
    m = sample("torch_scan_rnn", seq=5)
    out, outcomes = unroll(m, unroll_max=5)
    assert outcomes[0][1] is True and "Scan" not in ops(out)
    expected = dict(np.load(MODELS / "torch_scan_rnn.expected.npz"))
    feeds = {"x": expected["x"], "h0": expected["h0"]}
    for engine in ("ort", "reference"):
        got = run(out, feeds, engine)
        np.testing.assert_allclose(got["y"], expected["y"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["h_n"], expected["h_n"], rtol=1e-5, atol=1e-6)


def test_one_step_needs_no_concat():
    m = b.scan9_sum(opset=16, steps=1)
    out, outcomes = unroll(m)
    assert outcomes[0][1] is True
    assert ops(out) == {"Gather": 1, "Add": 1, "Identity": 1, "Unsqueeze": 1}
    assert_equivalent(m, out)


def test_zero_steps_pass_states_through_and_give_empty_outputs():
    m = b.scan9_sum(opset=16, steps=0)
    out, outcomes = unroll(m)
    assert outcomes[0][:2] == ("scan_sum", True) and "0 steps" in outcomes[0][2]
    assert ops(out) == {"Identity": 2}
    assert_valid(out)
    # onnxruntime fails on a zero-length Scan, so the original runs on the reference executor only
    assert_equivalent(m, out, engine="reference")
    feeds = {"s0": np.array([1.5, -2.0], np.float32), "X": np.zeros((0, 2), np.float32)}
    got = run(out, feeds, "ort")
    np.testing.assert_array_equal(got["s_final"], feeds["s0"])
    assert got["Y"].shape == (0, 2) and got["Y"].dtype == np.float32


def test_zero_steps_with_a_symbolic_element_shape_is_skipped():
    body = h.make_graph(
        [h.make_node("Add", ["s", "x"], ["s2"]), h.make_node("Identity", ["s2"], ["y"])],
        "body", [b.vi("s", ["n"]), b.vi("x", ["n"])], [b.vi("s2", ["n"]), b.vi("y", ["n"])],
    )
    scan = h.make_node("Scan", ["s0", "X"], ["sf", "Y"], name="scan_n", body=body, num_scan_inputs=1)
    m = b.model(h.make_graph([scan], "main", [b.vi("s0", ["n"]), b.vi("X", [0, "n"])],
                             [b.vi("sf", ["n"]), b.vi("Y", [0, "n"])]), 16)
    out, outcomes = unroll(m)
    assert out is m
    assert outcomes == [("scan_n", False, "zero steps and the element shape or type of scan output 'Y' is not "
                                          "static (['n']), so its empty value cannot be built")]


def test_opset_decides_how_unsqueeze_takes_its_axes():
    for opset, inputs in ((11, 1), (13, 2)):
        m = b.scan9_sum(opset=opset, steps=3, scan_output_axes=[-1], scan_output_directions=[1])
        m.graph.output[1].CopyFrom(b.vi("Y", [2, 3]))  # stacked on the last axis
        out, _ = unroll(m)
        unsqueezes = [n for n in out.graph.node if n.op_type == "Unsqueeze"]
        assert len(unsqueezes) == 3 and all(len(n.input) == inputs for n in unsqueezes)
        assert_equivalent(m, out)


def test_outer_capture_is_read_not_copied():
    m = b.scan9_sum(opset=16, steps=3, weight=np.array([2.0, -0.5]))
    out, _ = unroll(m)
    assert [i.name for i in out.graph.initializer if i.data_type == TP.FLOAT] == ["W"]
    assert [n.input[1] for n in out.graph.node if n.op_type == "Mul"] == ["W", "W", "W"]
    assert_equivalent(m, out)


def _body_with_if_and_constant(steps: int) -> onnx.ModelProto:
    """s' = s + (x * W if flag else x - k) + c, y = s'; c a Constant node, k a branch
    initializer, W an outer initializer, flag an outer input read inside the If."""
    then_g = h.make_graph([h.make_node("Mul", ["x", "W"], ["t"])], "then", [], [b.vi("t", [2])])
    else_g = h.make_graph([h.make_node("Sub", ["x", "k"], ["e"])], "else", [], [b.vi("e", [2])],
                          initializer=[b.init("k", np.array([1.0, 4.0], np.float32))])
    body = h.make_graph(
        [
            h.make_node("Constant", [], ["c"], value=b.init("c_value", np.array([0.25, -0.25], np.float32))),
            h.make_node("If", ["flag"], ["branch"], name="choose", then_branch=then_g, else_branch=else_g),
            h.make_node("Add", ["s", "branch"], ["s1"]),
            h.make_node("Add", ["s1", "c"], ["s_next"]),
            h.make_node("Identity", ["s_next"], ["y"]),
        ],
        "body", [b.vi("s", [2]), b.vi("x", [2])], [b.vi("s_next", [2]), b.vi("y", [2])],
    )
    scan = h.make_node("Scan", ["s0", "X"], ["sf", "Y"], name="scan_if", body=body, num_scan_inputs=1,
                       scan_input_directions=[1])
    graph = h.make_graph([scan], "main", [b.vi("flag", [], TP.BOOL), b.vi("s0", [2]), b.vi("X", [steps, 2])],
                         [b.vi("sf", [2]), b.vi("Y", [steps, 2])],
                         initializer=[b.init("W", np.array([3.0, 0.5], np.float32))])
    return b.model(graph, 16)


def test_nested_if_is_copied_per_step_with_fresh_names_and_the_constant_hoisted():
    m = _body_with_if_and_constant(3)
    out, outcomes = unroll(m)
    assert outcomes[0][1] is True
    counts = ops(out)
    assert counts["If"] == 3 and counts["Constant"] == 1 and "Scan" not in counts
    names = names_defined(out)
    assert len(names) == len(set(names))
    branch_inits = [i.name for g in walk_proto_graphs(out.graph) for i in g.initializer if i.name.startswith("k")]
    assert len(set(branch_inits)) == 3
    for flag in (True, False):
        feeds = {"flag": np.array(flag), "s0": np.array([1.0, 2.0], np.float32),
                 "X": np.arange(6, dtype=np.float32).reshape(3, 2)}
        assert_equivalent(m, out, inputs=[feeds])


def test_scan_in_a_loop_unrolls_inside_the_loop_body():
    """Loop carrying s; its body runs a 3-step Scan over X (captured from the top graph)."""
    scan_body = b.sum_body("b_", weight="W")
    loop_body = h.make_graph(
        [
            h.make_node("Identity", ["cond_in"], ["cond_out"]),
            h.make_node("Scan", ["l_s", "X"], ["l_s_next", "l_y"], name="scan_in_loop", body=scan_body,
                        num_scan_inputs=1, scan_output_directions=[1]),
            h.make_node("Constant", [], ["axis0"], value_ints=[0]),
            h.make_node("ReduceSum", ["l_y", "axis0"], ["l_total"], keepdims=0),
        ],
        "loop_body", [b.vi("i", [], TP.INT64), b.vi("cond_in", [], TP.BOOL), b.vi("l_s", [2])],
        [b.vi("cond_out", [], TP.BOOL), b.vi("l_s_next", [2]), b.vi("l_total", [2])],
    )
    loop = h.make_node("Loop", ["trips", "cond", "s0"], ["s_final", "totals"], name="loop", body=loop_body)
    m = b.model(h.make_graph([loop], "main", [b.vi("trips", [], TP.INT64), b.vi("cond", [], TP.BOOL),
                                              b.vi("s0", [2]), b.vi("X", [3, 2])],
                             [b.vi("s_final", [2]), b.vi("totals", ["n", 2])],
                             initializer=[b.init("W", np.array([0.5, 2.0], np.float32))]), 16)
    out, outcomes = unroll(m)
    assert outcomes == [("scan_in_loop", True, "unrolled 3 steps: 16 nodes added (body of 3 nodes copied 3 times)")]
    assert ops(out) == {"Loop": 1, "Identity": 4, "Constant": 1, "ReduceSum": 1, "Gather": 3, "Mul": 3, "Add": 3,
                        "Unsqueeze": 3, "Concat": 1}
    feeds = {"trips": np.array(3, np.int64), "cond": np.array(True), "s0": np.array([1.0, -1.0], np.float32),
             "X": np.array([[1, 2], [3, 4], [5, 6]], np.float32)}
    assert_equivalent(m, out, inputs=[feeds])


def test_scan_in_a_scan_in_a_loop():
    """The engine's nested sample: both Scans unroll (inner first, then the outer copies it).
    Numbers on onnxruntime only: onnx.reference's Loop concatenates (np.vstack) the
    per-iteration scan outputs of rank > 1 instead of stacking them, for either model."""
    m = b.scan_in_loop()
    out, outcomes = unroll(m)
    assert [(node, applied) for node, applied, _ in outcomes] == [("inner_scan", True), ("outer_scan", True)]
    assert ops(out)["Loop"] == 1 and "Scan" not in ops(out)
    feeds = {"trips": np.array(2, np.int64), "cond": np.array(True), "s0": np.array([1.0, -1.0], np.float32),
             "X": np.arange(24, dtype=np.float32).reshape(4, 3, 2) / 7}
    assert_equivalent(m, out, inputs=[feeds], engine="ort")


def test_inner_scan_over_threshold_is_copied_with_fresh_names():
    m = sample("scan_nested", seq=2)  # outer 2 steps, inner 3 steps
    out, outcomes = unroll(m, unroll_max=2)
    assert outcomes == [
        ("scan_inner", False, "over threshold (3 steps > unroll_max 2); raise it with --unroll-max"),
        ("scan_outer", True, "unrolled 2 steps: 7 nodes added (body of 1 nodes copied 2 times)"),
        # the next round sees the two copies of the inner Scan
        ("scan_inner_t0", False, "over threshold (3 steps > unroll_max 2); raise it with --unroll-max"),
        ("scan_inner_t1", False, "over threshold (3 steps > unroll_max 2); raise it with --unroll-max"),
    ]
    scans = [n for n in out.graph.node if n.op_type == "Scan"]
    assert len(scans) == 2 and scans[0].name != scans[1].name
    names = names_defined(out)
    assert len(names) == len(set(names))
    assert_equivalent(m, out)


def test_fresh_names_avoid_every_existing_name():
    m = b.scan9_sum(opset=16, steps=2)
    m.graph.node.append(h.make_node("Neg", ["s0"], ["s_next_t0"], name="taken"))
    m.graph.output.append(b.vi("s_next_t0", [2]))
    out, _ = unroll(m)
    names = names_defined(out)
    assert len(names) == len(set(names)) and "s_next_t0_1" in names
    assert_equivalent(m, out)


# ---------------------------------------------------------------- declines
def test_over_the_default_threshold_is_skipped_untouched():
    m = b.scan9_sum(opset=16, steps=unroll_module.DEFAULT_UNROLL_MAX + 1)
    out, outcomes = unroll(m)
    assert out is m
    limit = unroll_module.DEFAULT_UNROLL_MAX
    assert outcomes == [("scan_sum", False, f"over threshold ({limit + 1} steps > unroll_max {limit}); raise it with --unroll-max")]


def test_unroll_max_option_lowers_and_raises_the_threshold():
    m = b.scan9_sum(opset=16, steps=6)
    assert unroll(m, unroll_max=6)[1][0][1] is True
    assert unroll(b.scan9_sum(opset=16, steps=1), unroll_max=0)[1] == [
        ("scan_sum", False, "over threshold (1 steps > unroll_max 0); raise it with --unroll-max")
    ]


def test_dynamic_length_is_skipped():
    out, outcomes = unroll(onnx.load(MODELS / "scan9_sum.onnx"))
    assert outcomes == [("scan_sum", False, "dynamic length: scan input 'x' has size seq on its scan axis 0")]


@pytest.mark.parametrize("name", ["scan8_sum", "scan8_sum_seqlens", "scan8_reverse_seqlens"])
def test_opset8_scan_unrolls_in_place_per_item(name):
    m = sample(name, seq=3, batch=2)
    out, outcomes = unroll(m, unroll_max=4)
    assert outcomes[0][1] is True and outcomes[0][2].startswith("unrolled opset-8 Scan in place: 2 item(s) x 3 steps")
    assert "Scan" not in ops(out) and out.opset_import[0].version == 8
    assert_equivalent(m, out, engine="both")


def test_opset8_lengths_mask_each_item_and_reverse_from_its_own_end():
    """Lengths 0, 1 and 3 of T = 3 (onnxruntime rejects 0: the reference executor checks it)."""
    m = sample("scan8_reverse_seqlens", seq=3, batch=3)
    out, _ = unroll(m, unroll_max=3)
    x = np.arange(3 * 3 * 2, dtype=np.float32).reshape(3, 3, 2) + 1
    feeds = {"sequence_lens": np.array([0, 1, 3], np.int64), "init_fwd": np.zeros((3, 2), np.float32),
             "init_bwd": np.zeros((3, 2), np.float32), "x": x}
    assert_equivalent(m, out, inputs=[feeds], engine="reference")
    got = run(out, feeds, "reference")
    for key in ("z_fwd", "z_bwd"):  # scan outputs: zeros past each item's length
        assert not got[key][0].any() and not got[key][1, 1:].any() and got[key][1, 0].all()
    # item 1 (length 1) reverse reads its own last element, position 0
    np.testing.assert_array_equal(got["y_bwd"][1], x[1, 0])
    feeds["sequence_lens"] = np.array([1, 2, 3], np.int64)
    assert_equivalent(m, out, inputs=[feeds], engine="both")


def test_opset8_by_default_only_where_measured_no_slower():
    """benchmarks/bench_unroll.py --scan8: batch 1 without lengths is even; batch > 1 or
    sequence_lens is slower unrolled, so the default keeps the loop."""
    out, outcomes = unroll(sample("scan8_sum", seq=3, batch=1))
    assert outcomes[0][1] is True and "Scan" not in ops(out)
    assert unroll(sample("scan8_sum", seq=3, batch=2))[1] == [(
        "scan_sum", False, "not applied: opset-8 Scan with batch 2: unrolled per item (6 body copies) it measured "
        "slower than the loop (1.1-3.2x, benchmarks/bench_unroll.py --scan8); --unroll-max N unrolls it anyway")]
    assert unroll(sample("scan8_sum_seqlens", seq=3, batch=1))[1][0][2].startswith(
        "not applied: opset-8 Scan with sequence_lens: unrolled per item (3 body copies) it measured slower")


def test_opset8_symbolic_batch_is_skipped():
    out, outcomes = unroll(sample("scan8_sum", seq=3))
    assert outcomes == [("scan_sum", False, "opset-8 Scan with a symbolic batch size: unrolling copies the body per batch item")]


def test_opset8_zero_steps_any_batch():
    m = sample("scan8_sum_seqlens", seq=0)
    out, outcomes = unroll(m)
    assert outcomes[0][1] is True and "0 steps" in outcomes[0][2]
    feeds = {"initial": np.ones((3, 2), np.float32), "x": np.zeros((3, 0, 2), np.float32),
             "sequence_lens": np.zeros(3, np.int64)}
    feeds = {i.name: feeds[i.name] for i in m.graph.input}
    got, expected = run(out, feeds, "reference"), run(m, feeds, "reference")
    for key in expected:
        assert got[key].shape == expected[key].shape
        np.testing.assert_array_equal(got[key], expected[key])


@pytest.mark.parametrize("opset", [9, 11, 16, 21])
def test_zero_length_scans_at_every_opset(opset):
    m = b.scan9_sum(opset=opset, steps=0, weight=np.array([2.0, 1.0]))
    out, outcomes = unroll(m)
    assert outcomes[0][1] is True and "Scan" not in ops(out)
    assert_equivalent(m, out, engine="reference")
    got = run(out, {"s0": np.ones(2, np.float32), "X": np.zeros((0, 2), np.float32)}, "ort")  # now runnable
    assert got["Y"].shape == (0, 2)


def test_size_cap_declines_a_huge_trip_count_at_once():
    """issue 11: --unroll-max 2000000000 on 10^9 steps used to run without bound."""
    m = b.scan9_sum(opset=16, steps=10**9)
    out, outcomes = unroll(m, unroll_max=2_000_000_000)
    assert out is m
    assert outcomes == [("scan_sum", False, "unrolled size: 1000000000 copies of a 2-node body would add about "
                                            "5000000000 nodes, over unroll_max_nodes 100000")]
    m = _body_with_if_and_constant(50)
    assert unroll(m, unroll_max=100, unroll_max_bytes=100)[1] == [
        ("scan_if", False, "unrolled size: 50 copies of 8 bytes of nested constants would exceed unroll_max_bytes 100")]


def test_each_step_costs_the_same_number_of_name_probes(monkeypatch):
    """Fresh names are O(1): the membership checks per step do not grow with the step count."""
    from scanopt import graph as graph_module

    class CountingSet(set):
        probes = 0

        def __contains__(self, item):
            CountingSet.probes += 1
            return super().__contains__(item)

    original_init = graph_module.NameAllocator.__init__

    def counting_init(self, graph):
        original_init(self, graph)
        self._taken = CountingSet(self._taken)

    monkeypatch.setattr(graph_module.NameAllocator, "__init__", counting_init)
    probes = {}
    for steps in (40, 160):
        CountingSet.probes = 0
        unroll(b.scan9_sum(opset=16, steps=steps), unroll_max=steps)
        probes[steps] = CountingSet.probes
    assert probes[160] <= 4.2 * probes[40], probes  # linear in the steps (quadratic would be 16x)


def test_fresh_names_are_the_first_free_ones():
    from scanopt.graph import NameAllocator

    names = NameAllocator.from_names({"a", "a_1", "a_3"})
    assert [names.fresh("a") for _ in range(3)] == ["a_2", "a_4", "a_5"]
    assert names.fresh("b") == "b" and names.fresh("b") == "b_1"


class _FakeFuse(ScanPass):
    """Stands in for the fuse pass: claims the Scan named 'scan_short'."""

    name = "fuse"

    def match(self, node, view, level, ctx):
        return Match() if node.name == "scan_short" else Skip("not a cell")


def test_fusable_scan_is_left_to_fuse(monkeypatch):
    monkeypatch.setattr(chooser_module, "registered_passes", lambda: {"fuse": _FakeFuse, "unroll": unroll_module.Unroll})
    m = sample("scan_short_static")
    graph = import_model(m)
    ctx = PassContext(opset=16, names=NameAllocator(graph), shapes=ShapeTable(m), selected=("fuse", "unroll"))
    result = unroll_module.Unroll()(graph, ctx)
    assert not result.modified
    assert [(o.node, o.detail) for o in result.outcomes] == [("scan_short", "left to fuse: it becomes a native op")]
    # a Scan the fuse pass declines is unrolled
    out, outcomes = unroll(b.scan9_sum(opset=16, steps=2))
    assert outcomes[0][1] is True


def test_fusable_scan_whose_fusion_was_rolled_back_is_unrolled(monkeypatch):
    monkeypatch.setattr(chooser_module, "registered_passes", lambda: {"fuse": _FakeFuse, "unroll": unroll_module.Unroll})
    m = sample("scan_short_static")
    graph = import_model(m)
    ctx = PassContext(opset=16, names=NameAllocator(graph), shapes=ShapeTable(m),
                      denied=frozenset({("fuse", "scan_short")}))
    result = unroll_module.Unroll()(graph, ctx)
    assert result.modified and result.outcomes[0].applied
    out = export_model(graph, m)
    assert "Scan" not in ops(out)
    assert_equivalent(m, out)


# ---------------------------------------------------------------- end to end
def test_cli_reports_unrolled_and_over_threshold(cli, tmp_path):
    src = MODELS / "scan_short_static.onnx"
    result = cli("optimize", src, tmp_path / "out.onnx", "--passes", "unroll")
    assert result.code == 0, result.err
    assert "unrolled 4 steps: 25 nodes added" in result.out
    assert "verif" in result.out and "equivalent" in result.out
    assert "Scan" not in ops(onnx.load(tmp_path / "out.onnx"))
    result = cli("optimize", src, tmp_path / "out2.onnx", "--passes", "unroll", "--unroll-max", "2")
    assert result.code == 0, result.err
    assert "over threshold (4 steps > unroll_max 2)" in result.out


def test_default_pipeline_unrolls_what_fuse_declines(monkeypatch):
    """The whole pipeline with the real registry: fuse runs first and declines the nested
    running sums (not a cell), unroll takes both levels, verification passes."""
    monkeypatch.setattr(chooser_module, "registered_passes", pass_api.registered_passes)
    m = sample("scan_nested", seq=2)
    out, report = optimize(m)
    assert report.verification["passed"] is True
    assert [(o.node, o.applied) for o in report.outcomes if o.pass_name == "unroll"] == [
        ("scan_inner", True), ("scan_outer", True)]
    assert "Scan" not in ops(out)
    assert_equivalent(m, out)


def test_same_input_same_bytes():
    m = _body_with_if_and_constant(3)
    first, _ = unroll(m)
    second, _ = unroll(m)
    assert first.SerializeToString() == second.SerializeToString()


def test_bodies_that_pass_values_through():
    """Body outputs that are not computed in the body: a state passed through unchanged,
    the scan element itself, a body initializer (and a copy of an outer value); the Scan sits between
    other nodes, which stay in topological order."""
    body = h.make_graph(
        [h.make_node("Add", ["s", "x"], ["s_next"]), h.make_node("Identity", ["W"], ["w_t"])],
        "body", [b.vi("s", [2]), b.vi("keep", [2]), b.vi("x", [2])],
        [b.vi("s_next", [2]), b.vi("keep", [2]), b.vi("x", [2]), b.vi("C", [2]), b.vi("w_t", [2])],
        initializer=[b.init("C", np.array([7.0, 8.0], np.float32))],
    )
    nodes = [
        h.make_node("Neg", ["X"], ["X_neg"], name="before"),
        h.make_node("Scan", ["s0", "k0", "X_neg"], ["sf", "kf", "Y_x", "Y_c", "Y_w"], name="scan_thru", body=body,
                    num_scan_inputs=1, scan_output_directions=[1, 0, 0]),
        h.make_node("Add", ["Y_x", "Y_c"], ["Z"], name="after"),
    ]
    graph = h.make_graph(
        nodes, "main", [b.vi("s0", [2]), b.vi("k0", [2]), b.vi("X", [3, 2])],
        [b.vi("sf", [2]), b.vi("kf", [2]), b.vi("Z", [3, 2]), b.vi("Y_w", [3, 2])],
        initializer=[b.init("W", np.array([0.5, -0.5], np.float32))],
    )
    m = b.model(graph, 16)
    out, outcomes = unroll(m)
    assert outcomes[0][1] is True
    assert [n.name for n in out.graph.node][0] == "before" and out.graph.node[-1].name == "after"
    assert ops(out) == {"Neg": 1, "Gather": 3, "Add": 4, "Identity": 4, "Unsqueeze": 9, "Concat": 3}
    # onnxruntime 1.31 returns zeros for a Scan body output that is a body input passed
    # through ('keep', 'x'), so the original's numbers come from the reference executor;
    # the unrolled model gives them on both engines.
    assert_equivalent(m, out, engine="reference")
    feeds = {"s0": np.array([1.0, 2.0], np.float32), "k0": np.array([5.0, 6.0], np.float32),
             "X": np.arange(6, dtype=np.float32).reshape(3, 2)}
    expected = run(m, feeds, "reference")
    np.testing.assert_array_equal(expected["kf"], feeds["k0"])  # the spec's answer
    for name, value in run(out, feeds, "ort").items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6)


def test_fusable_scan_is_unrolled_when_fuse_does_not_run():
    """`--skip fuse` / `--passes unroll`: nothing would fuse it, so unroll must not defer."""
    import onnx as _onnx
    from scanopt.pipeline import optimize as _optimize

    m = _onnx.load(os.path.join(os.path.dirname(__file__), "..", "models", "scan_short_static.onnx"))
    out, report = _optimize(m, passes=["unroll"])
    assert "Scan" not in ops(out)
    out, report = _optimize(m)
    assert "Scan" not in ops(out) and ops(out)["RNN"] == 1


def test_cli_huge_unroll_max_on_a_huge_trip_count_returns_at_once(cli, tmp_path):
    """issue 11, end to end: nothing is built, the model is written back unchanged."""
    src, out = tmp_path / "huge.onnx", tmp_path / "out.onnx"
    onnx.save(b.scan9_sum(opset=16, steps=10**9), src)
    result = cli("optimize", src, out, "--unroll-max", "2000000000", "-v", "--skip", "linrec")  # not the CumSum
    assert result.code == 0, result.err
    assert "over unroll_max_nodes 100000" in result.out
    assert out.read_bytes() == src.read_bytes()


def test_short_cell_whose_fusion_the_cost_policy_declines_is_unrolled_not_left_to_fuse(monkeypatch):
    """A 4-step tanh RNN at batch 8, hidden 64: the native RNN is predicted slower (the cost
    table's B=8 rows), so fuse declines it; unroll must not then skip it as 'left to fuse'
    (which left a short loop nobody rewrote). With --target portable fuse takes it."""
    import cell_builders as cb
    monkeypatch.setattr(chooser_module, "registered_passes", pass_api.registered_passes)  # the real fuse
    m = cb.rnn_model(hidden=64, inputs=64, seq=4, batch=8)
    out, report = optimize(m, passes=["fuse", "unroll"], verify=False)
    verdicts = {o.pass_name: o.detail for o in report.outcomes}
    assert "slower" in verdicts["fuse"], verdicts
    assert "left to fuse" not in verdicts["unroll"] and "unrolled 4 steps" in verdicts["unroll"], verdicts
    assert "Scan" not in ops(out) and "RNN" not in ops(out)
    assert_equivalent(m, out, engine="ort")
    portable, _ = optimize(m, passes=["fuse", "unroll"], verify=False, options={"target": "portable"})
    assert "RNN" in ops(portable)
