"""linrec takes a Scan's widening per-step producers into its steps (module absorb): selective scans
whose deltaA / deltaB_u the model computes for every step before the loop, as mamba-minimal,
Hugging Face's slow path and PyTorch's exporter write them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper as h

import builders as b
import linrec_builders as lb
import scanopt
from equivalence import assert_equivalent, work_ops, ops
from scanopt.passes.loopfree.einsum_products import ProductTerm, product_terms
from test_linrec import assert_matches_torch
from test_linrec_einsum import LINREC, _in_loops
from test_linrec_two_pass import placement  # noqa: F401 - a fixture

TAKEN = "taken into the steps"


def linrec_detail(model, **options):
    """(the optimized model, linrec's line for the model's Scan)."""
    out, report = scanopt.optimize(model, verify=False, options={"tune": False, **options})
    lines = [o.detail for o in report.outcomes if o.pass_name == "linrec"]
    return out, lines[0]


def two_pass(model, **options):
    return linrec_detail(model, linrec_min_steps=1, linrec_form="two-pass", **options)


def top_level(model, op: str) -> int:
    return sum(n.op_type == op for n in model.graph.node)


@pytest.mark.parametrize("wide", ["bldn", "dlbn", "lbdn", "bdnl"])
@pytest.mark.parametrize("T, B, chunk", [(12, 1, 4), (13, 2, 8), (1, 1, 4)], ids=["T12", "T13_B2_padded", "T1"])
def test_precomputed_selective_scan_takes_its_producers_in(wide, T, B, chunk, placement):
    m = lb.mamba_precomputed(T=T, B=B, wide=wide)
    out, detail = two_pass(m, linrec_chunk=chunk)
    assert TAKEN in detail and "6 producers" in detail, detail
    assert "no Scan left" in detail and work_ops(out)["Einsum"] == 0, work_ops(out)
    if placement == "in_loops" and T > chunk:  # deltaA made per position in both Loops
        assert _in_loops(out, "Exp") == 2, work_ops(out)
    assert_equivalent(m, out)


def test_hugging_face_layout_with_broadcast_muls(placement):
    """Unsqueeze and broadcast Muls on [B, D, T, N], the Scan reading axis 2 (canonicalize moves it
    first by a Transpose, which the body takes in as the identity); A[None, :, None, :] broadcasts
    along the steps and is squeezed in the body; the Unsqueezes of Δ, B_t and x and the Softplus
    of Δ move too (linrec then emits the products as MatMuls and Softplus in its faster form)."""
    m = lb.mamba_hf(T=14, B=2)
    out, detail = two_pass(m, linrec_chunk=4)
    assert TAKEN in detail and "10 producers" in detail, detail
    if placement == "in_loops":
        assert _in_loops(out, "Exp") == 2, work_ops(out)
    assert_equivalent(m, out)


def test_a_producer_read_elsewhere_stays_outside():
    """deltaA is also a model output: its Einsum and Exp stay, deltaB_u's Einsum moves."""
    m = lb.mamba_precomputed(T=12, read_a=True)
    out, detail = two_pass(m, linrec_chunk=4)
    assert TAKEN in detail and "2 producers" in detail, detail
    assert top_level(out, "Einsum") == 1 and top_level(out, "Exp") == 1, work_ops(out)
    assert_equivalent(m, out)


def test_producers_that_do_not_widen_stay_outside():
    """a = Sigmoid(U) over all steps: as many elements per step in as out; it runs once outside."""
    T, H = 20, 6
    body = h.make_graph([h.make_node("Mul", ["a", "h"], ["ah"]), h.make_node("Add", ["ah", "x"], ["h_new"]),
                         h.make_node("Identity", ["h_new"], ["y"])], "body",
                        [b.vi("h", [H]), b.vi("a", [H]), b.vi("x", [H])], [b.vi("h_new", [H]), b.vi("y", [H])])
    graph = h.make_graph([h.make_node("Sigmoid", ["U"], ["A"]),
                          h.make_node("Scan", ["h0", "A", "X"], ["hT", "Y"], body=body, num_scan_inputs=2)], "g",
                         [b.vi("h0", [H]), b.vi("U", [T, H]), b.vi("X", [T, H])], [b.vi("hT", [H]), b.vi("Y", [T, H])])
    m = b.model(graph)
    out, detail = linrec_detail(m, target="portable")
    assert "no Scan left" in detail and TAKEN not in detail, detail
    assert top_level(out, "Sigmoid") == 1
    assert_equivalent(m, out)


def test_a_contracting_producer_moves_as_an_einsum():
    """b = Einsum('blk,kn->lbn', X, W) widens per step (K < N) and sums k: it moves as it is."""
    T, B, K, N = 24, 2, 2, 6
    body = h.make_graph([h.make_node("Mul", ["h", "decay"], ["hd"]), h.make_node("Add", ["hd", "bt"], ["h_new"]),
                         h.make_node("Identity", ["h_new"], ["y"])], "body",
                        [b.vi("h", [B, N]), b.vi("bt", [B, N])], [b.vi("h_new", [B, N]), b.vi("y", [B, N])])
    rng = np.random.default_rng(0)
    graph = h.make_graph([h.make_node("Einsum", ["X", "W"], ["Bw"], equation="blk,kn->lbn"),
                          h.make_node("Scan", ["h0", "Bw"], ["hT", "Y"], body=body, num_scan_inputs=1)], "g",
                         [b.vi("h0", [B, N]), b.vi("X", [B, T, K])], [b.vi("hT", [B, N]), b.vi("Y", [T, B, N])],
                         initializer=[b.init("W", rng.normal(size=[K, N]).astype(np.float32)),
                                      b.init("decay", rng.uniform(0.5, 0.99, size=[N]).astype(np.float32))])
    m = b.model(graph)
    out, detail = linrec_detail(m, target="portable")
    assert TAKEN in detail and "1 producer " in detail and "no Scan left" in detail, detail
    assert_equivalent(m, out)


@pytest.mark.parametrize("build", [lb.mamba_precomputed, lb.mamba_hf], ids=["minimal", "hugging_face"])
def test_symbolic_length(build):
    m = build(T="T", B=2)
    out, detail = linrec_detail(m, target="portable")
    assert TAKEN in detail, detail
    for steps in (1, 5, 37):
        rng = np.random.default_rng(steps)
        feeds = {i.name: rng.normal(size=[steps if d.dim_param else d.dim_value for d in i.type.tensor_type.shape.dim])
                 .astype(np.float32) for i in m.graph.input}
        assert_equivalent(m, out, inputs=feeds, seeds=1)


def test_mamba_minimal_export(placement):
    """PyTorch's dynamo export of mamba-minimal's selective_scan at Mamba's width (T=40, D=64,
    N=16): both Einsums before the Scan move, none is left, torch's outputs hold."""
    m = onnx.load(LINREC / "torch_mamba_minimal_wide.onnx")
    out, detail = two_pass(m)
    assert TAKEN in detail and work_ops(out)["Einsum"] == 0, (detail, work_ops(out))
    if placement == "in_loops":
        assert _in_loops(out, "Exp") == 2, work_ops(out)
    assert_matches_torch(m, out, dict(np.load(LINREC / "torch_mamba_minimal_wide.expected.npz")))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wide=st.permutations("bldn").map("".join), T=st.integers(1, 20), B=st.integers(1, 2),
       chunk=st.sampled_from([1, 2, 4, 8]), in_loops=st.booleans())
def test_random_layouts_match_the_loop(wide, T, B, chunk, in_loops):
    import scanopt.passes.loopfree.linrec as linrec_module

    m = lb.mamba_precomputed(T=T, B=B, D=3, N=2, wide=wide)
    kept = linrec_module.IN_LOOPS_FROM
    linrec_module.IN_LOOPS_FROM = 0 if in_loops else 1 << 62
    try:
        out, detail = two_pass(m, linrec_chunk=chunk)
    finally:
        linrec_module.IN_LOOPS_FROM = kept
    assert TAKEN in detail, detail
    assert_equivalent(m, out, seeds=1)


@pytest.mark.parametrize("equation, expected", [
    # Mamba's deltaA: Δ [b, d] unsqueezed at n, A [d, n] at b
    ("bd,dn->bdn", [[(0, ProductTerm(None, (2,)))], [(1, ProductTerm(None, (0,)))]]),
    # deltaB_u: Δ and x share their letters (multiplied first), B_t [b, n] unsqueezed at d
    ("bd,bn,bd->bdn", [[(0, ProductTerm(None, (2,))), (2, ProductTerm(None, (2,)))], [(1, ProductTerm(None, (1,)))]]),
    # the result laid out otherwise: operands transposed into its order
    ("bd,bn,bd->dbn", [[(0, ProductTerm((1, 0), (2,))), (2, ProductTerm((1, 0), (2,)))],
                       [(1, ProductTerm(None, (0,)))]]),
    ("b d , d n -> b d n", [[(0, ProductTerm(None, (2,)))], [(1, ProductTerm(None, (0,)))]]),
    ("ij->ji", [[(0, ProductTerm((1, 0), ()))]]),
])
def test_product_terms(equation, expected):
    assert product_terms(equation) == expected


@pytest.mark.parametrize("equation", ["bdn,bn->bd", "bd,dn", "...d,dn->...dn", "bdd,dn->bdn", "bd,dn->bdnn",
                                      "bd->bdn"])
def test_product_terms_declines(equation):
    """A sum (n), an implicit result, an ellipsis, a repeated letter, a result letter twice or
    one no operand has: left an Einsum."""
    assert product_terms(equation) is None


def test_opset_12_writes_the_axes_as_attributes():
    """Einsum exists from opset 12; Unsqueeze takes its axes as an attribute there (module emit)."""
    m = lb.mamba_precomputed(T=13, B=2, opset=12)
    out, detail = two_pass(m, linrec_chunk=4)
    assert TAKEN in detail and work_ops(out)["Einsum"] == 0, detail
    assert_equivalent(m, out)


# -- as other authors and exporters write the producers (tried after the forms above were built) --
_T, _B, _D, _N = 13, 2, 4, 3
_A = -np.arange(1, _N + 1, dtype=np.float32)[None, :].repeat(_D, 0)


def _precomputed(producers, slots, axes):
    """A selective scan whose a and b scan inputs (``slots``, read on ``axes``) the ``producers``
    compute from Δ = Softplus(dl), x, B_t and the decay A before the Scan; y read by an Einsum."""
    body = h.make_graph([h.make_node("Mul", ["a", "h"], ["ah"]), h.make_node("Add", ["ah", "bt"], ["h_new"]),
                         h.make_node("Einsum", ["h_new", "ct"], ["y"], equation="bdn,bn->bd")], "body",
                        [b.vi("h", [_B, _D, _N]), b.vi("a", [_B, _D, _N]), b.vi("bt", [_B, _D, _N]), b.vi("ct", [_B, _N])],
                        [b.vi("h_new", [_B, _D, _N]), b.vi("y", [_B, _D])])
    nodes = [h.make_node("Softplus", ["dl"], ["delta"])] + producers
    nodes.append(h.make_node("Scan", ["h0"] + slots, ["hT", "Y"], body=body, num_scan_inputs=3, scan_input_axes=axes))
    g = h.make_graph(nodes, "g", [b.vi("h0", [_B, _D, _N]), b.vi("dl", [_B, _T, _D]), b.vi("x", [_B, _T, _D]), b.vi("Bm", [_B, _T, _N]),
                                  b.vi("Cm", [_B, _T, _N])], [b.vi("hT", [_B, _D, _N]), b.vi("Y", [_T, _B, _D])],
                     initializer=[b.init("A", _A), b.init("m1", np.array([-1], np.int64)), b.init("two", np.array([2], np.int64))])
    return b.model(g)


_E = h.make_node
OTHER_WRITERS = {
 "swapped_steps_first": _precomputed([_E("Einsum", ["A", "delta"], ["dA"], equation="dn,bld->lbdn"), _E("Exp", ["dA"], ["a"]),
                               _E("Einsum", ["Bm", "x", "delta"], ["bb"], equation="bln,bld,bld->lbdn")], ["a", "bb", "Cm"], [0, 0, 1]),
 "mambapy_unsqueeze_axis1": _precomputed([_E("Unsqueeze", ["delta", "m1"], ["d4"]), _E("Mul", ["d4", "A"], ["dA"]), _E("Exp", ["dA"], ["a"]),
                                   _E("Unsqueeze", ["Bm", "two"], ["B4"]), _E("Mul", ["d4", "B4"], ["dB"]),
                                   _E("Unsqueeze", ["x", "m1"], ["x4"]), _E("Mul", ["dB", "x4"], ["bb"])], ["a", "bb", "Cm"], [1, 1, 1]),
 "cast_float": _precomputed([_E("Einsum", ["delta", "A"], ["dA"], equation="bld,dn->bldn"), _E("Cast", ["dA"], ["dAf"], to=TP.FLOAT),
                      _E("Exp", ["dAf"], ["a"]), _E("Einsum", ["delta", "Bm", "x"], ["bb"], equation="bld,bln,bld->bldn")],
                     ["a", "bb", "Cm"], [1, 1, 1]),
 "uppercase": _precomputed([_E("Einsum", ["delta", "A"], ["dA"], equation="BLD,DN->BLDN"), _E("Exp", ["dA"], ["a"]),
                     _E("Einsum", ["delta", "Bm", "x"], ["bb"], equation="BLD,BLN,BLD->BLDN")], ["a", "bb", "Cm"], [1, 1, 1]),
 "neg_exp_abs": _precomputed([_E("Einsum", ["delta", "A"], ["dA"], equation="bld,dn->bldn"), _E("Abs", ["dA"], ["ab"]), _E("Neg", ["ab"], ["na"]),
                       _E("Exp", ["na"], ["a"]), _E("Mul", ["delta", "x"], ["dx"]),
                       _E("Einsum", ["dx", "Bm"], ["bb"], equation="bld,bln->bldn")], ["a", "bb", "Cm"], [1, 1, 1]),
}


@pytest.mark.parametrize("name", sorted(OTHER_WRITERS))
def test_producers_as_other_writers_put_them(name):
    """Einsum operands swapped and the result steps first (no permute), mamba.py's Unsqueeze(-1)
    and broadcast Muls on a Scan reading axis 1, HF's .float() Cast, uppercase Einsum letters,
    -|Δ⊗A| and Δ·x multiplied before a two-operand Einsum."""
    m = OTHER_WRITERS[name]
    out, detail = two_pass(m, linrec_chunk=4)
    assert TAKEN in detail and work_ops(out)["Einsum"] == 0, detail
    assert_equivalent(m, out)


def test_one_einsum_parser():
    from scanopt.shapes import einsum_terms

    assert einsum_terms(b"b d , d n -> b d n") == (["bd", "dn"], "bdn")
    assert einsum_terms("bd,dn") is None and einsum_terms("a->b->c") is None and einsum_terms("...d->d") is None
    assert einsum_terms(None) is None
