"""linrec's two-pass positions form (passes/loopfree/two_pass.py): the wide-state linear
recurrences (Mamba's selective scan, state [B, D, N]) the one-pass chunked forms leave as loops.

Each rewrite runs against the loop on onnxruntime and the reference executor; the lengths cover
T = 1, T shorter than the chunk, T not a multiple of it; batches, reversed scans, random sizes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import linrec_builders as lb
from equivalence import assert_equivalent, work_ops, ops
from scanopt.engines import run
from scanopt.pipeline import optimize
from test_linrec import assert_matches_torch, linrec, reason

TWO_PASS = "two-pass"


def two_pass(model, **options):
    out, outcomes = linrec(model, **{"linrec_min_steps": 1, "linrec_form": TWO_PASS, **options})
    assert len(outcomes) == 1 and outcomes[0][0] and TWO_PASS in outcomes[0][1], outcomes
    assert "Scan" not in work_ops(out)
    return out


@pytest.fixture(params=["lifted", "in_loops"])
def placement(request, monkeypatch):
    """Both places of a and b: lifted once over all steps (small T x state) or computed in the
    Loops per position (large; the threshold lowered so small models take that path too)."""
    import scanopt.passes.loopfree.linrec as linrec_module

    monkeypatch.setattr(linrec_module, "IN_LOOPS_FROM", 1 << 62 if request.param == "lifted" else 0)
    return request.param


@pytest.mark.parametrize("build", [lb.mamba, lb.mamba_einsum], ids=["mamba", "mamba_einsum"])
@pytest.mark.parametrize("T, B, chunk", [(1, 1, 8), (5, 2, 8), (16, 1, 8), (33, 3, 8), (40, 2, 64), (24, 1, 1)],
                         ids=["T1", "T_below_C", "T_multiple", "T_padded_B3", "one_chunk_padded", "C1"])
def test_selective_scan_matches_the_loop(build, T, B, chunk, placement):
    m = build(T=T, B=B, D=4, N=3)
    out = two_pass(m, linrec_chunk=chunk)
    assert_equivalent(m, out)
    # outside the Loops: A's Exp and Softplus's Exp(-|x|); a = Exp(Δ ⊗ A) there too only when
    # lifted; with more than one chunk, each chunk's decay Exp(A ⊗ ΣΔ) (module decay_correction)
    chunks = -(-T // min(chunk, T))
    outside = Counter(node.op_type for node in out.graph.node)["Exp"]
    assert outside == (3 if placement == "lifted" else 2) + (chunks > 1)


def test_wide_state_takes_the_two_pass_form_by_default():
    """Measured (bench_linrec, Mamba D=64, N=16): the one-pass forms lose on this width, the
    two-pass form does not; auto picks it over linrec_max_state."""
    m = lb.mamba(T=40, B=1, D=64, N=16)
    out, outcomes = linrec(m)
    assert outcomes[0][0] and f"C=8, {TWO_PASS}" in outcomes[0][1], outcomes
    assert_equivalent(m, out, seeds=1)
    out, outcomes = linrec(m, linrec_form="positions")  # the other forms still decline it
    assert not outcomes[0][0] and "over linrec_max_state=512" in outcomes[0][1]


def test_reversed_scan_matches_the_loop(placement):
    m = lb.mamba(T=21, B=2, D=4, N=3)
    scan = m.graph.node[0]
    scan.attribute.extend([onnx.helper.make_attribute("scan_input_directions", [1, 1, 1, 1]),
                           onnx.helper.make_attribute("scan_output_directions", [1])])
    assert_equivalent(m, two_pass(m, linrec_chunk=4))


def test_long_sequence_stays_within_tolerance_of_the_loop():
    """T = 4096 in float32: the chunk ends composed by doubling, then every position recomputed
    from its chunk's start; no log of the recurrence's values, no division, so nothing drifts
    (inputs of unit scale)."""
    m = lb.mamba(T=4096, B=1, D=8, N=4)
    out = two_pass(m)
    feeds = {i.name: np.random.default_rng(4).standard_normal(
        [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in m.graph.input}
    want, got = run(m, feeds), run(out, feeds)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5)
    counted = work_ops(out)
    assert not {"Div", "Reciprocal"} & set(counted)
    assert counted["Log"] == ops(m)["Softplus"]  # only Softplus's Log(1 + Exp(-|x|)), of a value >= 1


def test_verification_accepts_the_rewrite():
    m = lb.mamba(T=37, B=2, D=6, N=5)
    out, report = optimize(m, passes=["linrec"], options={"linrec_form": TWO_PASS, "tune": False})
    assert report.verification["passed"] and not report.verification["rolled_back"], report.verification["summary"]
    assert "Scan" not in work_ops(out)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(T=st.integers(1, 40), B=st.integers(1, 3), D=st.integers(1, 5), N=st.integers(1, 4),
       chunk=st.sampled_from([1, 2, 4, 8, 16]), einsum=st.booleans())
def test_random_selective_scans_match_the_loop(T, B, D, N, chunk, einsum):
    import scanopt.passes.loopfree.linrec as linrec_module

    m = (lb.mamba_einsum if einsum else lb.mamba)(T=T, B=B, D=D, N=N)
    kept = linrec_module.IN_LOOPS_FROM
    try:
        for place in (0, 1 << 62):  # a and b in the Loops, then lifted over all steps
            linrec_module.IN_LOOPS_FROM = place
            assert_equivalent(m, two_pass(m, linrec_chunk=chunk), seeds=1)
    finally:
        linrec_module.IN_LOOPS_FROM = kept


def test_forms_it_cannot_take_are_declined_with_the_reason():
    assert "one state with a general update" in reason(lb.cumulative_product(T=24), linrec_form=TWO_PASS)


LINREC = Path(__file__).resolve().parent.parent / "models" / "linrec"


def test_torch_selective_scan_export_matches_torch():
    """The dynamo export of a torch._higher_order_ops.scan selective scan (models/linrec), its
    softplus a Where over Softplus, its projections Gemms: the two-pass form equals torch."""
    m = onnx.load(LINREC / "torch_mamba.onnx")
    expected = dict(np.load(LINREC / "torch_mamba.expected.npz"))
    assert_matches_torch(m, two_pass(m, linrec_chunk=4), expected)


def test_wide_torch_export_takes_the_two_pass_form_in_the_default_pipeline():
    """The same export at Mamba's width (D=64, N=16, T=64): auto picks the two-pass form, its
    products (Gemm projections, Unsqueezes) become MatMuls and its Softplus (inside torch's
    Where threshold) the vector form; torch's outputs within 1e-5."""
    m = onnx.load(LINREC / "torch_mamba_wide.onnx")
    out, report = optimize(m, verify=False)
    done = [o.detail for o in report.outcomes if o.pass_name == "linrec" and o.applied]
    assert len(done) == 1 and TWO_PASS in done[0], report.format()
    assert "Softplus" not in work_ops(out) and work_ops(out)["MatMul"] >= 2
    assert_matches_torch(m, out, dict(np.load(LINREC / "torch_mamba_wide.expected.npz")))


def test_fast_softplus_matches_onnxruntimes():
    """The two-pass form's Softplus (passes/loopfree/softplus.py) against onnxruntime's own and
    float64 over the float32 range: relative error <= 5e-7 where the value is a normal float;
    ±inf, NaN, 0 and subnormal results as Softplus's."""
    import onnx_graphsurgeon as gs

    from scanopt.emit import Emitter
    from scanopt.graph import NameAllocator
    from scanopt.passes.loopfree.softplus import softplus
    from scanopt.rewrite import Builder, new_graph

    graph = new_graph("softplus")
    x = gs.Variable("x", dtype=np.float32, shape=[None])
    e = Emitter(Builder(graph, NameAllocator(graph)), 17)
    y = softplus(e, x, np.float32)
    y.name, y.dtype = "y", np.float32
    graph.inputs, graph.outputs = [x], [y]
    fast = gs.export_onnx(graph)
    fast.opset_import[0].version = 17
    fast.ir_version = 8  # onnx's default IR version can be newer than the oldest onnxruntime loads
    plain = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Softplus", ["x"], ["y"])], "g", list(fast.graph.input), list(fast.graph.output)),
        opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)
    values = np.concatenate([np.linspace(-100, 100, 200_001), [-1e30, 1e30, np.inf, -np.inf, np.nan, 0.0, -0.0]])
    values = values.astype(np.float32)
    got, ort = run(fast, {"x": values})["y"], run(plain, {"x": values})["y"]
    with np.errstate(all="ignore"):
        truth = np.logaddexp(0.0, values.astype(np.float64))
    normal = np.isfinite(truth) & (truth > np.finfo(np.float32).tiny)
    assert np.max(np.abs(got[normal] - truth[normal]) / truth[normal]) <= 5e-7
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ort))
    rest = ~normal & ~np.isnan(ort)  # ±inf, 0 and subnormal results: equal up to a subnormal step
    np.testing.assert_allclose(got[rest], ort[rest], rtol=0, atol=1e-43)


def test_products_are_matmuls_and_the_pipeline_rewrites_once():
    """At Mamba's width the default pipeline takes the Scan once (its own chunk Loops, which
    loop_to_scan turns into Scans without copying their inputs, are not rewritten again), with
    the outer product and the read of y as MatMuls and no Softplus left."""
    m = lb.mamba(T=64, B=1, D=64, N=16)
    out, report = optimize(m, verify=False)
    done = [o for o in report.outcomes if o.pass_name == "linrec" and o.applied]
    assert len(done) == 1 and TWO_PASS in done[0].detail, report.format()
    own = [o for o in report.outcomes if o.pass_name == "linrec" and "a loop linrec emitted" in o.detail]
    scans = [o.detail for o in report.outcomes if o.pass_name == "loop_to_scan" and o.applied]
    # the chunk pass, the correction over the positions and the carry across the chunks
    assert len(own) == 3 and len(scans) == 3, report.format()
    # the positions' inputs are declared C long, the carry's K long: no copies
    assert not any("cut" in d for d in scans), scans
    counted = work_ops(out)
    assert counted["MatMul"] + counted.get("FusedMatMul", 0) >= 3 and "Softplus" not in counted
    # the one ReduceSum left is each chunk's Σ Δ ([K, 1, 64, 1], for the chunk's decay), not y's read;
    # the others check the chunk starts, the final state and the correction's ends are finite
    reduced = [n for n in out.graph.node if n.op_type == "ReduceSum" and len(n.input) == 2]
    assert counted["ReduceSum"] - 3 == len(reduced) == 1, counted
    assert "outputs read in the chunk pass plus a decay correction" in done[0].detail
    assert_equivalent(m, out, seeds=1)


def test_a_contraction_that_broadcasts_is_left_a_mul_and_reducesum():
    """y = Σ_n (Σ_n' h')[.., d, 1] ⊙ C_t[.., 1, n]: the Mul broadcasts its last axis, so h @ C_tᵀ
    would not be the same product (its shapes do not even agree): not proven, not rewritten."""
    m = lb.mamba(T=20, B=2, D=4, N=3)
    body = m.graph.node[0].attribute[0].g
    mul = next(n for n in body.node if list(n.output) == ["hc"])
    mul.input[0] = "h_rows"
    at = list(body.node).index(mul)
    body.node.insert(at, onnx.helper.make_node("ReduceSum", ["h_new", "ax_last"], ["h_rows"], keepdims=1))
    out = two_pass(m, linrec_chunk=4)
    assert work_ops(out)["ReduceSum"] >= 2  # both sums kept (the chunk-starts doubling adds none)
    assert_equivalent(m, out)


def test_optimizing_the_result_again_leaves_its_loops():
    """A second run sees the two-pass form's loops as plain Scans (no memory of the first run),
    their states [K, ?, ...] of a width not known: declined, never guessed small and taken by a
    one-pass form (which measured 4.5x slower on them)."""
    m = lb.mamba(T=1024, B=1, D=64, N=16)  # C = 32: the loops are long enough for linrec to consider
    out, _ = optimize(m, verify=False, options={"tune": False})
    again, report = optimize(out, verify=False, options={"tune": False})
    decided = [o for o in report.outcomes if o.pass_name == "linrec"]
    assert decided and not any(o.applied for o in decided), report.format()
    assert all("unknown shape" in o.detail for o in decided)
    assert work_ops(again)["Scan"] == work_ops(out)["Scan"] == 3  # the chunk pass, the carry across, the correction


# ---------------------------------------------------------------- a state that overflows (issue 33 S7)
def _gated(T=32, H=4, read="Tanh"):
    """h' = Exp(u) ⊙ h + x, y = read(h'): a per-step decay the chunk products can underflow."""
    from onnx import helper as oh

    import builders as b

    nodes = [oh.make_node("Exp", ["u"], ["a"]), oh.make_node("Mul", ["a", "h"], ["ah"]),
             oh.make_node("Add", ["ah", "x"], ["h_new"]), oh.make_node(read, ["h_new"], ["y"])]
    body = oh.make_graph(nodes, "body", [b.vi("h", [H]), b.vi("u", [H]), b.vi("x", [H])],
                         [b.vi("h_new", [H]), b.vi("y", [H])])
    scan = oh.make_node("Scan", ["h0", "U", "X"], ["hT", "Y"], body=body, num_scan_inputs=2)
    return b.model(oh.make_graph([scan], "g", [b.vi("h0", [H]), b.vi("U", [T, H]), b.vi("X", [T, H])],
                                 [b.vi("hT", [H]), b.vi("Y", [T, H])]))


def _overflowing(T=32, H=4):
    """x = 3e38 overflows the state to inf in the first chunk (a = 1); then a chunk of a = e^-40,
    whose product over 8 steps underflows to 0: the start 0 · inf = NaN, where the loop's
    e^-40 · inf + x stays inf."""
    U = np.zeros([T, H], np.float32)
    U[8:16] = -40.0
    return {"h0": np.zeros(H, np.float32), "U": U, "X": np.full([T, H], 3e38, np.float32)}


@pytest.mark.parametrize("read, kind", [("Tanh", "chunk ends, then the outputs"), ("Identity", "decay correction"),
                                        ("Neg", "decay correction")])
def test_an_overflowing_state_gives_the_loops_inf_not_nan(read, kind):
    m = _gated(read=read)
    out = two_pass(m, linrec_chunk=8)
    _, outcomes = linrec(m, linrec_min_steps=1, linrec_form=TWO_PASS, linrec_chunk=8)
    assert kind in outcomes[0][1] and "not finite" in outcomes[0][1], outcomes
    feeds = _overflowing()
    loop, form = run(m, feeds, engine="ort"), run(out, feeds, engine="ort")
    (hT, Y), (hT2, Y2) = (loop["hT"], loop["Y"]), (form["hT"], form["Y"])
    assert np.isinf(hT).all() and not np.isnan(Y).any()  # the loop: inf, Tanh of it ±1
    np.testing.assert_array_equal(hT2, hT)
    np.testing.assert_array_equal(Y2, Y)
    assert_equivalent(m, out)  # finite inputs take the two-pass form


def test_the_overflow_fallback_is_not_rewritten_again():
    m = _gated(T=64)
    out = two_pass(m, linrec_chunk=8)
    again, report = optimize(out, passes=["linrec"], verify=False,
                             options={"linrec_min_steps": 1, "linrec_form": TWO_PASS, "linrec_chunk": 8})
    assert not any(o.applied for o in report.outcomes), report.format()
    assert ops(again)["Scan"] == 1 and work_ops(again)["Scan"] == 0
