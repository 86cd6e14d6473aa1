"""the fuse algebra (scanopt.passes.fuse.algebra): every supported form of a value reduces to the same canonical
polynomial, and the polynomial computes what onnxruntime computes for the graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from scanopt.passes.fuse.algebra import Algebra
from scanopt.passes.fuse.poly import Group, Leaf, NoMatch, Runtime, format_poly

B, I, H = 3, 2, 4
RNG = np.random.default_rng(7)
W_XH = RNG.uniform(-1, 1, (I, 3 * H)).astype(np.float32)  # x·W orientation
W_HH = RNG.uniform(-1, 1, (H, H)).astype(np.float32)
BIAS = RNG.uniform(-1, 1, 3 * H).astype(np.float32)


def graph(nodes, out="out", opset=17, inits=()):
    """A model over x [B, I], h [B, H], z [B, H] whose output ``out`` is [B, H]-ish."""
    vi = h.make_tensor_value_info
    inits = [numpy_helper.from_array(v, k) for k, v in
             {"W": W_XH, "WT": W_XH.T.copy(), "R": W_HH, "b": BIAS, "one": np.float32(1.0),
              "b1": BIAS[:H].reshape(1, H), "sizes": np.array([H] * 3, np.int64), **dict(inits)}.items()]
    g = h.make_graph(nodes, "g", [vi("x", TP.FLOAT, [B, I]), vi("h", TP.FLOAT, [B, H]), vi("z", TP.FLOAT, [B, H])],
                     [vi(out, TP.FLOAT, None)], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)
    return onnx.shape_inference.infer_shapes(m)


def expand(model, name="out"):
    g = gs.import_onnx(model)
    tensors = g.tensors()
    alg = Algebra(rank=lambda t: len(t.shape) if t.shape is not None else None)
    return alg.poly(tensors[name]), tensors


FEEDS = {k: RNG.standard_normal(s).astype(np.float32) for k, s in (("x", (B, I)), ("h", (B, H)), ("z", (B, H)))}


def evaluate(poly, values):
    """What the polynomial computes for the given leaf values (by tensor name)."""
    total = 0.0
    for t in poly.terms:
        prod = 1.0
        for f in t.factors:
            prod = prod * (values[f.tensor.name] if isinstance(f, Leaf) else evaluate(f.poly, values))
        total = total + (prod @ t.weight if t.matrix else prod * t.weight)
    return total + (0.0 if poly.bias is None else poly.bias)


def _leaf_names(poly):
    for t in poly.terms:
        for f in t.factors:
            yield from ([f.tensor.name] if isinstance(f, Leaf) else _leaf_names(f.poly))


def check_numbers(model, name="out"):
    """The polynomial, evaluated on onnxruntime's values of its leaves, gives onnxruntime's output."""
    poly, _ = expand(model, name)
    leaves = sorted(set(_leaf_names(poly)) - set(FEEDS))
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(h.make_tensor_value_info(v, TP.FLOAT, None) for v in leaves)
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip([name] + leaves, sess.run([name] + leaves, FEEDS)))
    np.testing.assert_allclose(evaluate(poly, {**FEEDS, **got}), got[name], rtol=1e-5, atol=1e-5)
    return poly


def n(op, ins, out, **attrs):
    return h.make_node(op, ins, [out], **attrs)


CASES = {
    "matmul_add_bias_first": [n("MatMul", ["x", "W"], "xw"), n("Add", ["b", "xw"], "out")],
    "gemm_transB": [n("Gemm", ["x", "WT", "b"], "out", transB=1)],
    "gemm_alpha_beta": [n("Gemm", ["x", "W", "b"], "out", alpha=0.5, beta=2.0)],
    "split_then_sum": [n("MatMul", ["x", "W"], "xw"), h.make_node("Split", ["xw", "sizes"], ["a", "c", "d"], axis=1),
                       n("Add", ["d", "h"], "e"), n("Sub", ["e", "a"], "out")],
    "slice_middle": [n("Gemm", ["x", "W", "b"], "xw"), n("Slice", ["xw", "s", "e", "ax"], "out")],
    "gru_update_lerp": [n("Sub", ["h", "x4"], "d"), n("Mul", ["z", "d"], "zd"), n("Add", ["x4", "zd"], "out")],
    "gru_update_standard": [n("Sub", ["one", "z"], "omz"), n("Mul", ["omz", "x4"], "a"), n("Mul", ["z", "h"], "c"),
                            n("Add", ["a", "c"], "out")],
    "reset_group": [n("MatMul", ["h", "R"], "hr"), n("Add", ["hr", "b1"], "hrb"), n("Mul", ["z", "hrb"], "out")],
    "reset_inside": [n("Mul", ["z", "h"], "zh"), n("MatMul", ["zh", "R"], "out")],
    "concat_matmul": [h.make_node("Concat", ["x", "h"], ["xh"], axis=-1), n("MatMul", ["xh", "K"], "out")],
    "neg_sum_identity": [n("Neg", ["h"], "nh"), n("Identity", ["nh"], "i"), h.make_node("Sum", ["i", "z", "b1"], ["out"])],
    "unsqueeze_leading": [n("Unsqueeze", ["h", "zero"], "u"), n("MatMul", ["u", "R"], "ur"), n("Squeeze", ["ur", "zero"], "out")],
}
EXTRA = {
    "slice_middle": {"s": np.array([H], np.int64), "e": np.array([2 * H], np.int64), "ax": np.array([-1], np.int64)},
    "concat_matmul": {"K": RNG.uniform(-1, 1, (I + H, H)).astype(np.float32)},
    "unsqueeze_leading": {"zero": np.array([0], np.int64)},
}


def _with_x4(nodes):
    """Cases that need a leaf of x's: x4 = tanh(x·W[:, :H])."""
    return [n("MatMul", ["x", "W"], "xw_all"), n("Slice", ["xw_all", "s0", "s4", "ax0"], "x4_pre"),
            n("Tanh", ["x4_pre"], "x4")] + nodes


@pytest.mark.parametrize("case", sorted(CASES))
def test_polynomial_computes_what_onnxruntime_computes(case):
    nodes = CASES[case]
    extra = dict(EXTRA.get(case, {}))
    if any("x4" in node.input for node in nodes):
        nodes = _with_x4(nodes)
        extra.update({"s0": np.array([0], np.int64), "s4": np.array([H], np.int64), "ax0": np.array([1], np.int64)})
    check_numbers(graph(nodes, inits=extra))


def _canon(poly):
    """Comparable form: {monomial names: weight} plus the bias."""
    out = {}
    for t in poly.terms:
        key = (tuple(f.tensor.name if isinstance(f, Leaf) else "group" for f in t.factors), t.matrix)
        out[key] = out.get(key, 0) + t.weight
    return out, poly.bias


def _same(p, q):
    (a, ab), (b, bb) = _canon(p), _canon(q)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6)
    np.testing.assert_allclose(0 if ab is None else ab, 0 if bb is None else bb, rtol=1e-6)


def test_matmul_and_gemm_forms_give_the_same_terms():
    p, _ = expand(graph([n("MatMul", ["x", "W"], "xw"), n("Add", ["xw", "b"], "out")]))
    q, _ = expand(graph([n("Gemm", ["x", "WT", "b"], "out", transB=1)]))
    r, _ = expand(graph([n("Add", ["b", "xw"], "out"), n("MatMul", ["x", "W"], "xw")][::-1]))
    _same(p, q)
    _same(p, r)


def test_the_three_ways_of_writing_the_gru_update_expand_alike():
    forms = [CASES["gru_update_lerp"], CASES["gru_update_standard"],
             [n("Mul", ["h", "z"], "a"), n("Add", ["a", "x4"], "c"), n("Mul", ["x4", "z"], "d"), n("Sub", ["c", "d"], "out")]]
    extra = {"s0": np.array([0], np.int64), "s4": np.array([H], np.int64), "ax0": np.array([1], np.int64)}
    polys = [expand(graph(_with_x4(f), inits=extra))[0] for f in forms]
    for p in polys[1:]:
        _same(polys[0], p)
    assert sorted(len(t.factors) for t in polys[0].terms) == [1, 2, 2]


def test_reset_gate_group_stays_a_group():
    poly, _ = expand(graph(CASES["reset_group"]))
    (t,) = poly.terms
    assert [type(f) for f in t.factors] == [Leaf, Group] or [type(f) for f in t.factors] == [Group, Leaf]


def test_reset_inside_is_a_matrix_term_of_a_product():
    poly, _ = expand(graph(CASES["reset_inside"]))
    (t,) = poly.terms
    assert t.matrix and sorted(f.tensor.name for f in t.factors) == ["h", "z"]


def test_format_poly_is_readable():
    poly, _ = expand(graph([n("Sub", ["one", "z"], "omz"), n("Mul", ["omz", "h"], "out")]))
    assert format_poly(poly) == "-1·'h'⊙'z' + 'h'"


@pytest.mark.parametrize(
    "nodes, extra, reason",
    [
        ([n("MatMul", ["x", "h"], "out")], {}, "multiplies by 'h', which is not a constant"),
        ([n("Add", ["h", "M"], "out")], {"M": np.ones((B, H), np.float32)}, "is not a scalar or a row vector"),
        ([n("Slice", ["h", "s", "e", "ax", "st"], "out")],
         {"s": np.array([0], np.int64), "e": np.array([H], np.int64), "ax": np.array([1], np.int64), "st": np.array([2], np.int64)},
         "has step 2"),
        ([n("Unsqueeze", ["h", "ax"], "u"), n("Squeeze", ["u", "ax"], "out")], {"ax": np.array([-1], np.int64)},
         "changes the last axis"),
        ([n("MatMul", ["x", "W"], "xw"), h.make_node("Split", ["xw", "sizes"], ["a", "c", "out"], axis=0)], {},
         "does not cut the last axis"),
        ([n("Gemm", ["x", "W"], "out", transA=1)], {}, "transposes its data operand"),
        ([h.make_node("Split", ["h", "two"], ["out", "c"], axis=-1)], {"two": np.array([2, 2], np.int64)},
         "cuts 'h' itself, not a matrix product"),
    ],
)
def test_forms_outside_the_algebra_raise_nomatch_with_the_reason(nodes, extra, reason):
    with pytest.raises(NoMatch, match=reason):
        expand(graph(nodes, inits=extra))


def test_unknown_ops_are_leaves():
    poly, _ = expand(graph([n("Tanh", ["h"], "t"), n("Add", ["t", "b1"], "out")]))
    (t,) = poly.terms
    assert t.factors[0].tensor.name == "t" and poly.bias.shape == (H,)


def test_values_the_body_does_not_compute_are_runtime_weights():
    """With the graph as the body and x, h, z varying, a graph input W is a run-time weight;
    a Split of Gemm(x, W, transB=1) keeps which columns of W each part uses."""
    m = graph([n("Gemm", ["x", "Wrt", "b"], "g", transB=1), h.make_node("Split", ["g", "sizes"], ["a", "c", "out"], axis=-1),
               n("MatMul", ["g", "V"], "sum_times_runtime")])
    m.graph.input.extend([h.make_tensor_value_info("Wrt", TP.FLOAT, [3 * H, I]),
                          h.make_tensor_value_info("V", TP.FLOAT, [3 * H, H])])
    g = gs.import_onnx(m)
    t = g.tensors()
    alg = Algebra(rank=lambda v: len(v.shape) if v.shape is not None else None, body=g, varying=[t["x"], t["h"], t["z"]])
    poly = alg.poly(t["out"])
    (term,) = poly.terms
    w = term.weight
    assert isinstance(w, Runtime) and w.tensor is t["Wrt"] and w.transposed and (w.start, w.stop) == (2 * H, 3 * H)
    np.testing.assert_allclose(poly.bias, BIAS[2 * H:])
    with pytest.raises(NoMatch, match="run-time weight 'V' multiplies a sum, not a single value"):
        alg.poly(t["sum_times_runtime"])
