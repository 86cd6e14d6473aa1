"""linrec's loop-free forms on the edge inputs the loop accepts (issue 33: S2, S5, S7, S8): the
rewrite is kept by the default verification (which feeds those edges) and gives the loop's
outputs there: no value read from a later step, the loop's shapes at an empty batch, a state
that overflows as the loop's does, integer sums exact and wrapping as the loop's."""

from __future__ import annotations

import numpy as np
import pytest

import linrec_builders as lb
from equivalence import ops
from scanopt.engines import run
from scanopt.pipeline import optimize


def kept(model, form: str, loop_free: bool = True, **options):
    """The model optimized with verification on (edge inputs included): the linrec rewrite kept
    (``loop_free``: no Scan or Loop left; the symbolic-length forms loop over chunk positions)."""
    out, report = optimize(model, options=options)
    done = [(o.applied, o.detail) for o in report.outcomes if o.pass_name == "linrec"]
    assert any(applied and form in detail for applied, detail in done), (done, report.verification)
    assert not loop_free or ("Scan" not in ops(out) and "Loop" not in ops(out))
    return out


def same_where_finite(want: dict, got: dict, rtol=1e-4, atol=1e-4):
    """``got`` equals ``want`` where ``want`` is finite, and is non-finite where ``want`` is."""
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape)
        finite = np.isfinite(w)
        assert np.array_equal(np.isfinite(g), finite), (name, np.argwhere(np.isfinite(g) != finite)[:5])
        np.testing.assert_allclose(g[finite], w[finite], rtol=rtol, atol=atol, err_msg=name)


# ---------------------------------------------------------------- S2: decayed linear attention
ATTENTION = {
    "einsum": lambda: lb.linear_attention(T=64, DK=4, DV=4, gamma=0.9, einsum=True),
    "matmul": lambda: lb.linear_attention(T=64, DK=4, DV=5, gamma=0.9, einsum=False),
    "transposed": lambda: lb.linear_attention_transposed(T=64, DK=4, DV=6, gamma=0.9),
}


@pytest.mark.parametrize("chunk", [64, 16])
@pytest.mark.parametrize("case", list(ATTENTION))
def test_attention_matmul_form_never_reads_a_later_step(case, chunk):
    """A NaN or inf in K or V at step 30: the loop's steps 0..29 stay finite (and each later step
    is non-finite only in the loop's places); the masked product once multiplied a later inf by 0."""
    m = ATTENTION[case]()
    out = kept(m, "chunked matmul form", target="portable", linrec_attention_chunk=chunk)
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in m.graph.input}
    for name in ("K", "V", "Q"):
        for bad in (np.nan, np.inf, -np.inf):
            probe = dict(feeds)
            probe[name] = feeds[name].copy()
            probe[name][30, 1] = bad
            want, got = run(m, probe), run(out, probe)
            assert np.all(np.isfinite(got["Y"][:30])), (name, bad)
            same_where_finite(want, got)


# ---------------------------------------------------------------- S8: integer running sums
def integer_sum(dtype):
    """h' = h + x over X [T, 2] of an integer type, T symbolic: the final state is not a static row."""
    from onnx import helper as h

    return lb.body_model([h.make_node("Add", ["h", "x"], ["h_new"])], T="T", H=2, dtype=dtype)


@pytest.mark.parametrize("target", ["portable", None])
def test_integer_running_sum_is_exact_and_wraps_like_the_loop(target):
    """onnxruntime's int64 ReduceSum rounds (2^55 + 3 -> 2^55) and its int32 one may saturate;
    the loop's sum is exact and wraps. The final state is the last row of the running sum."""
    from onnx import TensorProto as TP

    options = {"target": target} if target else {"input_shapes": {"X": [4, 2]}}
    cases = {TP.INT64: (np.array([0, 7], np.int64), np.array([[2 ** 55, 1], [1, 2], [1, 3], [1, 4]], np.int64)),
             TP.INT32: (np.array([2 ** 31 - 10, -5], np.int32), np.array([[5, -2 ** 31 + 9], [5, 0], [5, -7], [5, 1]],
                                                                           np.int32))}
    for dtype, (h0, x) in cases.items():
        m = integer_sum(dtype)
        out = kept(m, "CumSum", **options)
        for steps in (4, 1, 0):
            feeds = {"h0": h0, "X": x[:steps]}
            # onnxruntime refuses a zero-step Scan: the spec's (the reference executor's) loop there
            want, got = run(m, feeds, engine="reference" if steps == 0 else "ort"), run(out, feeds)
            for name in want:
                assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
                np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} at {steps} steps")
        assert run(m, {"h0": h0, "X": x})["hT"][0] == (2 ** 55 + 3 if dtype == TP.INT64 else -2 ** 31 + 10)


# ---------------------------------------------------------------- S5: an empty batch, symbolic T and B
def decay_model(with_x: bool):
    """h' = a ⊙ h (+ x) with a constant a per channel, state [B, 4], X [T, B, 4], T and B symbolic;
    y = h' (without x: y = h' ⊙ x, so the scan input is read)."""
    from onnx import helper as h

    import builders as b

    nodes = [h.make_node("Mul", ["h", "a"], ["ah"])]
    nodes += [h.make_node("Add", ["ah", "x"], ["h_new"]), h.make_node("Identity", ["h_new"], ["y"])] if with_x else \
        [h.make_node("Identity", ["ah"], ["h_new"]), h.make_node("Mul", ["h_new", "x"], ["y"])]
    st = ["B", 4]
    return lb._scan_model(nodes, [b.vi("h", st), b.vi("x", st)], [b.vi("h_new", st), b.vi("y", st)],
                          [b.vi("h0", st), b.vi("X", ["T"] + st)], [b.vi("hT", st), b.vi("Y", ["T"] + st)],
                          [b.init("a", np.array([0.9, 0.5, -0.7, 1.1], np.float32))], num_scan_inputs=1,
                          scan_inputs=["h0", "X"])


@pytest.mark.parametrize("with_x", [False, True], ids=["product", "decay_plus_x"])
def test_symbolic_chunked_forms_keep_an_empty_batch(with_x):
    """A Reshape to [-1, *tail] (or [count, *h0's shape]) read the 0 of an empty batch as "copy
    the input's dim": the product form gave hT [0, 4] but Y [0, 32, 4], the decay + x form failed."""
    m = decay_model(with_x)
    out = kept(m, "symbolic length", loop_free=False, target="portable")
    rng = np.random.default_rng(3)
    for steps, batch in [(5, 0), (40, 0), (5, 2), (37, 3)]:
        feeds = {"h0": rng.standard_normal((batch, 4)).astype(np.float32),
                 "X": rng.standard_normal((steps, batch, 4)).astype(np.float32)}
        want, got = run(m, feeds), run(out, feeds)
        for name in want:
            assert got[name].shape == want[name].shape, (name, steps, batch)
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


def test_a_cumulative_product_that_overflows_after_a_zero_initial_state_stays_zero():
    """h' = h ⊙ x at opset 26 (CumProd): h0 ⊙ CumProd(x) made 0 ⊙ inf = NaN where x's product
    overflows and h0 is 0 (the differential fuzz's x1e4 regime); the loop stays 0. One CumProd
    over [h0; x] multiplies in the loop's order: equal to the loop, NaN-free, at every step."""
    import onnxruntime as ort

    import linrec_builders as lb
    import scanopt

    model = lb.cumulative_product(T=16, H=4, opset=26)
    out, report = scanopt.optimize(model, options={"target": "portable"})
    assert any("CumProd" in o.detail for o in report.outcomes if o.applied) and report.verification["passed"]
    feeds = {"h0": np.array([0, 1, 0, -2], np.float32), "X": np.full([16, 4], 1e4, np.float32)}
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
                 for m in (model, out))
    for w, g in zip(want, got):
        assert np.array_equal(w, g) and not np.isnan(g).any()
