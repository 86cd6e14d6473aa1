"""linrec's two-pass form with an Einsum reading the state (issue #21, mamba-minimal's
``einsum("bdn,bn->bd", state, C_i)``): a batched matrix-vector or matrix-matrix product is
emitted as a MatMul (passes/loopfree/einsum_products.py), any other equation kept an Einsum;
each checked against the loop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper as h

import builders as b
import linrec_builders as lb
from equivalence import assert_equivalent, work_ops, ops
from scanopt.engines import run
from scanopt.passes.loopfree.einsum_products import MatMulForm, emit_matmul, matmul_form
from test_linrec import assert_matches_torch
from test_linrec_two_pass import placement, two_pass  # noqa: F401 - placement: a fixture

LINREC = Path(__file__).resolve().parent.parent / "models" / "linrec"
B, D, N, M = 2, 4, 3, 5


def einsum_read(equation: str, state: list[int], operand: list[int], *, state_first=True, invariant=False, T=12):
    """h' = Sigmoid(u_t) ⊙ h + b_t (state ``state``), y = Einsum(equation) of h' and w (``operand``
    per step, or an initializer with ``invariant``), h' the first operand with ``state_first``."""
    pair = ["h_new", "w"] if state_first else ["w", "h_new"]
    nodes = [h.make_node("Sigmoid", ["u"], ["a"]), h.make_node("Mul", ["a", "h"], ["ah"]),
             h.make_node("Add", ["ah", "bt"], ["h_new"]), h.make_node("Einsum", pair, ["y"], equation=equation)]
    body_in = [b.vi("h", state), b.vi("u", state), b.vi("bt", state)]
    outer_in = [b.vi("h0", state), b.vi("U", [T] + state), b.vi("BT", [T] + state)]
    scanned, inits = ["h0", "U", "BT"], []
    if invariant:
        inits = [b.init("w", np.random.default_rng(0).normal(size=operand).astype(np.float32))]
    else:
        body_in.append(b.vi("w", operand))
        outer_in.append(b.vi("W", [T] + operand))
        scanned.append("W")
    return lb._scan_model(nodes, body_in, [b.vi("h_new", state), b.vi("y", None)], outer_in,
                          [b.vi("hT", state), b.vi("Y", None)], inits, num_scan_inputs=len(scanned) - 1,
                          scan_inputs=scanned)


# equation, state shape, the other operand's shape, h' first
PRODUCTS = {
    "matrix_vector": ("bdn,bn->bd", [B, D, N], [B, N], True),  # mamba-minimal's read of y
    "vector_first": ("bn,bdn->bd", [B, D, N], [B, N], False),
    "state_laid_nd": ("bnd,bn->bd", [B, N, D], [B, N], True),  # a row vector times the state
    "query_times_state": ("bk,bkv->bv", [B, D, N], [B, D], False),  # linear attention's q·S
    "matrix_matrix": ("bdn,bnm->bdm", [B, D, N], [B, N, M], True),
    "heads": ("bhkv,bhk->bhv", [B, 2, D, N], [B, 2, D], True),  # RetNet / GLA per-head reads
    "no_batch": ("dn,n->d", [D, N], [N], True),
    "spaced": ("b d n , b n -> b d", [B, D, N], [B, N], True),
}
KEPT = {
    "dot_products": ("bdn,bdn->bd", [B, D, N], [B, D, N], True),  # elementwise, then a sum
    "contracted_broadcast": ("bdn,bn->bd", [B, D, N], [B, 1], True),  # Einsum broadcasts n, MatMul would not
    "transposed": ("bnd,bnm->bdm", [B, N, D], [B, N, M], True),  # hᵀ w: a Transpose first
}


def _in_loops(model: onnx.ModelProto, op: str) -> int:
    """``op`` nodes in subgraphs (the two-pass Loops; the Scan's body)."""
    return work_ops(model)[op] - sum(n.op_type == op for n in model.graph.node)


@pytest.mark.parametrize("case", list(PRODUCTS))
def test_products_are_matmuls_equal_to_the_loop(case, placement):
    equation, state, operand, state_first = PRODUCTS[case]
    m = einsum_read(equation, state, operand, state_first=state_first)
    out = two_pass(m, linrec_chunk=4)
    assert work_ops(out)["Einsum"] == 0 and work_ops(out)["MatMul"] >= 1, work_ops(out)
    assert_equivalent(m, out)


@pytest.mark.parametrize("case", list(KEPT))
def test_other_equations_stay_einsums_equal_to_the_loop(case, placement):
    equation, state, operand, state_first = KEPT[case]
    m = einsum_read(equation, state, operand, state_first=state_first)
    out = two_pass(m, linrec_chunk=4)
    # the chunk pass and (the read being linear in h') the decay correction each keep it
    assert work_ops(out)["Einsum"] == 2, work_ops(out)
    assert_equivalent(m, out)


def test_an_invariant_operand_broadcasts_over_the_steps(placement):
    """C an initializer: the lifted Einsum has no step letter on it; the MatMul broadcasts it alike."""
    m = einsum_read("bdn,bn->bd", [B, D, N], [B, N], invariant=True)
    out = two_pass(m, linrec_chunk=4)
    assert work_ops(out)["Einsum"] == 0
    assert_equivalent(m, out)


def einsum_input(equation: str, T=12):
    """h' = Sigmoid(u_t) ⊙ h + Einsum(equation) of x_t [B, D] and a weight W [D, N] (in the
    equation's order: x first when its term starts with b): a per-step projection in the
    update, state [B, N]."""
    pair = ["x", "W"] if equation.startswith("b") else ["W", "x"]
    nodes = [h.make_node("Sigmoid", ["u"], ["a"]), h.make_node("Mul", ["a", "h"], ["ah"]),
             h.make_node("Einsum", pair, ["bx"], equation=equation), h.make_node("Add", ["ah", "bx"], ["h_new"]),
             h.make_node("Identity", ["h_new"], ["y"])]
    weight = b.init("W", np.random.default_rng(1).normal(size=[D, N]).astype(np.float32))
    return lb._scan_model(nodes, [b.vi("h", [B, N]), b.vi("u", [B, N]), b.vi("x", [B, D])],
                          [b.vi("h_new", [B, N]), b.vi("y", [B, N])],
                          [b.vi("h0", [B, N]), b.vi("U", [T, B, N]), b.vi("X", [T, B, D])],
                          [b.vi("hT", [B, N]), b.vi("Y", [T, B, N])], [weight], num_scan_inputs=2,
                          scan_inputs=["h0", "U", "X"])


@pytest.mark.parametrize("equation", ["bd,dn->bn", "dn,bd->bn"])
def test_a_projection_in_the_update_is_a_matmul_equal_to_the_loop(equation, placement):
    """b_t = x_t W by an Einsum: x's extra letter b is MatMul's row, the weight (no step axis)
    broadcast over the steps."""
    m = einsum_input(equation)
    out = two_pass(m, linrec_chunk=4)
    assert work_ops(out)["Einsum"] == 0 and work_ops(out)["MatMul"] >= 1, work_ops(out)
    assert_equivalent(m, out)


@pytest.mark.parametrize("equation, form", [
    ("bdn,bn->bd", MatMulForm(swap=False, row=False, column=True, k_axis=(-1, -1), ranks=(3, 2))),
    ("bn,bdn->bd", MatMulForm(swap=True, row=False, column=True, k_axis=(-1, -1), ranks=(2, 3))),
    ("bk,bkv->bv", MatMulForm(swap=False, row=True, column=False, k_axis=(-1, -2), ranks=(2, 3))),
    ("bkv,bk->bv", MatMulForm(swap=True, row=True, column=False, k_axis=(-2, -1), ranks=(3, 2))),
    ("zbij,zbjk->zbik", MatMulForm(swap=False, row=False, column=False, k_axis=(-1, -2), ranks=(4, 4))),
])
def test_the_equation_alone_proves_the_matmul(equation, form):
    assert matmul_form(equation) == form


@pytest.mark.parametrize("equation", [
    "bdn,bdn->bd",  # dot products
    "...dn,...n->...d", "bdn,bn",  # ellipsis, implicit output
    "bii,bi->bi", "bdn,bn->bdd",  # a letter repeated within a term
    "bdn,bn,bn->bd", "bdn->bd",  # not two operands
    "bdn,bn->db", "bdn,nb->bd",  # batch letters not leading all three in one order
    "bnd,bnm->bdm", "bdn,bmn->bdm",  # a transposed operand
    "bd,bn->bdn", "bn,bn->b",  # no contracted letter; no free letter
    "bcdn,bn->bcd",  # two row letters: MatMul would align b against c
    "bdn,bn->bdx",  # a result letter in no operand
])
def test_other_equations_are_not_proven(equation):
    assert matmul_form(equation) is None


def _emitted(equation: str, shapes: list[list[int]], ranks_known: bool) -> onnx.ModelProto:
    """A graph of emit_matmul's nodes for ``equation`` on inputs of ``shapes``."""
    import onnx_graphsurgeon as gs

    from scanopt.emit import Emitter
    from scanopt.graph import NameAllocator
    from scanopt.rewrite import Builder

    graph = gs.Graph(opset=17)
    graph.inputs = [gs.Variable(name, np.float32, shape) for name, shape in zip("xy", shapes)]
    form = matmul_form(equation)
    ranks = [len(shape) if ranks_known else None for shape in shapes]
    length = shapes[0][form.k_axis[0]]  # k's length (the step axis, if any, leads)
    y, = emit_matmul(Emitter(Builder(graph, NameAllocator(graph)), 17), graph.inputs, form, length, ranks)
    y.dtype = np.float32
    graph.outputs = [y]
    model = gs.export_onnx(graph)
    model.opset_import[0].version = 17
    model.ir_version = 8  # onnx's default IR can be newer than the oldest onnxruntime loads
    return model


@pytest.mark.parametrize("ranks_known", [True, False], ids=["reshaped", "unsqueezed"])
@pytest.mark.parametrize("equation, lifted, shapes", [
    ("bdn,bn->bd", None, [[2, 4, 3], [2, 3]]), ("bn,bdn->bd", None, [[2, 3], [2, 4, 3]]),
    ("bk,bkv->bv", None, [[2, 4], [2, 4, 3]]), ("bkv,bk->bv", None, [[2, 4, 3], [2, 4]]),
    ("bij,bjk->bik", None, [[2, 4, 5], [2, 5, 6]]), ("bd,dn->bn", None, [[7, 4], [4, 3]]),
    ("bdn,bn->bd", "zbdn,bn->zbd", [[5, 2, 4, 3], [2, 3]]),  # lifted: the step axis on h' only
    ("bdn,bn->bd", "zbdn,zbn->zbd", [[5, 2, 4, 3], [5, 2, 3]]),  # lifted: on both
    ("bk,bkv->bv", "bk,zbkv->zbv", [[2, 4], [5, 2, 4, 3]]),
    ("bdn,bn->bd", None, [[1, 4, 3], [2, 3]]),  # a batch axis of length 1 broadcasts, as in Einsum
])
def test_the_emitted_matmul_is_the_einsum(equation, lifted, shapes, ranks_known):
    """emit_matmul's nodes run by onnxruntime against numpy's einsum, on the body's operands
    or on lifted ones (``lifted``: the equation with the step axis z)."""
    rng = np.random.default_rng(0)
    feeds = {name: rng.normal(size=shape).astype(np.float32) for name, shape in zip("xy", shapes)}
    got, = run(_emitted(equation, shapes, ranks_known), feeds).values()
    np.testing.assert_allclose(got, np.einsum(lifted or equation, feeds["x"], feeds["y"]), rtol=1e-5, atol=1e-6)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(sorted(PRODUCTS)), T=st.integers(1, 20), chunk=st.sampled_from([1, 2, 4, 8]),
       in_loops=st.booleans())
def test_random_products_match_the_loop(case, T, chunk, in_loops):
    import scanopt.passes.loopfree.linrec as linrec_module

    equation, state, operand, state_first = PRODUCTS[case]
    m = einsum_read(equation, state, operand, state_first=state_first, T=T)
    kept = linrec_module.IN_LOOPS_FROM
    linrec_module.IN_LOOPS_FROM = 0 if in_loops else 1 << 62
    try:
        out = two_pass(m, linrec_chunk=chunk)
    finally:
        linrec_module.IN_LOOPS_FROM = kept
    assert work_ops(out)["Einsum"] == 0
    assert_equivalent(m, out, seeds=1)


def test_mamba_minimal_export_reads_y_with_matmuls():
    """mamba-minimal's selective_scan exported by PyTorch's dynamo exporter at Mamba's width
    (T=40, B=1, D=64, N=16; models/generate_linrec.py): its body's Einsum is gone from both
    Loops, and so are the two Einsums before the Scan (Δ⊗A, Δ·x⊗B: taken into the steps by module
    absorb, as products); C_t's column is reshaped once before the Loops (no Reshape or Unsqueeze
    per position), and torch's outputs hold."""
    m = onnx.load(LINREC / "torch_mamba_minimal_wide.onnx")
    assert _in_loops(m, "Einsum") == 1 and ops(m)["Einsum"] == 3  # y read by an Einsum; a and b made by two
    out = two_pass(m)
    assert work_ops(out)["Einsum"] == 0, work_ops(out)
    assert _in_loops(out, "MatMul") == 2 and _in_loops(out, "Reshape") == _in_loops(out, "Unsqueeze") == 0, work_ops(out)
    assert_matches_torch(m, out, dict(np.load(LINREC / "torch_mamba_minimal_wide.expected.npz")))
