"""linrec: linear recurrences h' = a*h + b become CumSum or a chunked parallel scan.

Every rewrite is checked for structure (no Scan left but the chunk Scans of the symbolic-length
forms, the form named) and numbers (onnxruntime and the reference executor against the loop);
every decline for its reason.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper as h

import builders as b
import linrec_builders as lb
from equivalence import assert_equivalent, loop_scans, ops
from scanopt.engines import run
from scanopt.pipeline import optimize


EMITTED = "a loop linrec emitted as the form it chose"


def linrec(model, **options):
    """The model with linrec alone, and linrec's outcomes on the model's own Scans (not on the
    chunk Scans its symbolic-length forms emit, which it reports as not rewritten again)."""
    out, report = optimize(model, passes=["linrec"], verify=False, options=options)
    return out, [(o.applied, o.detail) for o in report.outcomes
                 if o.pass_name == "linrec" and not o.detail.startswith(EMITTED)]


def rewritten(model, form: str, **options):
    out, outcomes = linrec(model, **options)
    assert len(outcomes) == 1 and outcomes[0][0], outcomes
    assert form in outcomes[0][1], outcomes
    assert not loop_scans(out)
    return out


def reason(model, **options) -> str:
    _, outcomes = linrec(model, **options)
    assert len(outcomes) == 1 and not outcomes[0][0], outcomes
    return outcomes[0][1]


# ---------------------------------------------------------------- forms people write
@pytest.mark.parametrize("model, form", [
    (lb.running_sum(), "CumSum"),
    (lb.running_sum(B=2, reverse=True), "CumSum"),
    (lb.ema(T=37), "chunked scan"),  # 37 steps: a padded last chunk
    (lb.mingru(T=40, B=2), "chunked scan"),
    (lb.mamba(T=33, B=2), "chunked scan"),
    (lb.linear_attention(T=20, DK=4, DV=4, gamma=0.5, einsum=False), "chunked matmul form"),
    (lb.linear_attention(T=20, DK=4, DV=4, gamma=0.5, einsum=True), "chunked matmul form"),
    (lb.cumulative_product(T=24), "chunked product"),
], ids=["sum", "sum_reverse_batched", "ema", "mingru", "mamba", "linear_attention_matmul", "linear_attention_einsum",
        "cumprod"])
@pytest.mark.parametrize("within", ["positions", "doubling"])
def test_forms_match_the_loop(model, form, within):
    out = rewritten(model, form, linrec_chunk=8, linrec_form=within)
    assert_equivalent(model, out)


@pytest.mark.parametrize("within", ["positions", "doubling"])
@pytest.mark.parametrize("chunk", [1, 3, 8, 64])
def test_every_chunk_length_matches_the_loop(chunk, within):
    m = lb.mingru(T=29, B=2, I=4, H=4)
    assert_equivalent(m, rewritten(m, "chunked scan", linrec_chunk=chunk, linrec_form=within))


@pytest.mark.parametrize("model, form, h0, atol", [
    (lb.ema(T=4096, H=16), "chunked scan", np.ones([16], np.float32), 1e-5),
    (lb.running_sum(T=4096, H=16), "CumSum", np.zeros([16], np.float32), 1e-4),
], ids=["ema", "cumsum"])
def test_4096_steps_in_float32_stay_at_rounding(model, form, h0, atol):
    """The parallel forms sum in another order; with a decay in (0, 1) (or none) the error
    stays at float32 rounding (no division, nothing grows)."""
    out = rewritten(model, form)
    feeds = {"h0": h0, "X": np.random.default_rng(1).normal(size=[4096, 16]).astype(np.float32)}
    want, got = run(model, feeds), run(out, feeds)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=atol)


def test_product_underflow_gives_zeros_not_nan():
    """Products underflowing to 0 stay 0 (no division by them, which would give nan/inf)."""
    m = lb.cumulative_product(T=200, H=4)
    out = rewritten(m, "chunked product")
    feeds = {"h0": np.ones([4], np.float32), "X": np.full([200, 4], 0.5, np.float32)}
    want, got = run(m, feeds), run(out, feeds)
    assert np.isfinite(got["Y"]).all() and got["Y"][-1].max() == 0.0
    np.testing.assert_allclose(got["Y"], want["Y"], rtol=1e-6)


# ---------------------------------------------------------------- the same recurrences written other ways
_A = np.full([8], 0.3, np.float32)
OTHER_WAYS = {
    "ema_as_h_plus_a_times_x_minus_h": (lb.body_model([
        h.make_node("Sub", ["x", "h"], ["d"]), h.make_node("Mul", ["a", "d"], ["ad"]), h.make_node("Add", ["h", "ad"], ["h_new"])],
        T=40, H=8, inits=[b.init("a", _A)]), "chunked scan"),
    "ema_float64": (lb.body_model([
        h.make_node("Sub", ["x", "h"], ["d"]), h.make_node("Mul", ["a", "d"], ["ad"]), h.make_node("Add", ["h", "ad"], ["h_new"])],
        T=40, H=8, inits=[b.init("a", _A.astype(np.float64))], dtype=TP.DOUBLE), "chunked scan"),
    "sum_as_sub_of_a_negative": (lb.body_model([h.make_node("Neg", ["x"], ["nx"]), h.make_node("Sub", ["h", "nx"], ["h_new"])],
                                               T=40, H=8), "CumSum"),
    "mamba_einsum": (lb.mamba_einsum(), "chunked scan"),
    # the state stored [dv, dk], read as S'·q: the matmul form on Sᵀ
    "linear_attention_transposed_einsum": (lb.linear_attention_transposed(DK=4, DV=6), "chunked matmul form"),
    "linear_attention_transposed_matmul": (lb.linear_attention_transposed(DK=6, DV=4, einsum=False), "chunked matmul form"),
    # y_i = S'_ii·q_i (a diagonal, not a product; square state): the elementwise form
    "linear_attention_diagonal_read": (lb.linear_attention(T=24, DK=4, DV=4, read="i,ii->i"), "chunked scan"),
    "linear_attention_transposed_diagonal_read": (lb.linear_attention_transposed(einsum=False, read="ii,i->i"),
                                                  "chunked scan"),
}


@pytest.mark.parametrize("name", sorted(OTHER_WAYS))
def test_written_other_ways_match_the_loop(name):
    model, form = OTHER_WAYS[name]
    assert_equivalent(model, rewritten(model, form))


@pytest.mark.parametrize("product, form", [(False, "chunked scan"), (True, "chunked")])
def test_decay_from_a_graph_input_matches_the_loop_where_it_is_finite(product, form):
    """A decay the optimizer cannot see still gives h' = a⊙h + b. Fed |g| < 1 (and > 1 short of
    overflow) the forms agree; past float32's range the loop gives ±inf and the reassociated
    form may give nan, which verification catches (it rolls the rewrite back)."""
    m = lb.decay_input(product=product)
    out = rewritten(m, form)
    r = np.random.default_rng(4)
    for g in (r.uniform(0.1, 0.99, 8), r.uniform(-2.5, 2.5, 8)):
        feeds = {"h0": r.normal(size=8).astype(np.float32), "X": r.normal(size=[40, 8]).astype(np.float32),
                 "g": g.astype(np.float32)}
        assert_equivalent(m, out, inputs=feeds)


# ---------------------------------------------------------------- random linear recurrences
def _random_update(draw):
    """A random body: h' = combination of a*h, b terms built from x and constants."""
    nodes, k = [], [0]

    def fresh():
        k[0] += 1
        return f"t{k[0]}"

    def free():
        kind = draw(st.sampled_from(["x", "c", "sig", "mulx"]))
        out = fresh()
        if kind == "x":
            nodes.append(h.make_node("Identity", ["x"], [out]))
        elif kind == "c":
            nodes.append(h.make_node("Identity", ["c"], [out]))
        elif kind == "sig":
            nodes.append(h.make_node("Sigmoid", ["x"], [out]))
        else:
            nodes.append(h.make_node("Mul", ["x", "c"], [out]))
        return out

    def linear(depth):
        if depth == 0:
            return "h"
        kind = draw(st.sampled_from(["add", "sub", "mul", "div", "neg", "rsub"]))
        inner, out = linear(depth - 1), fresh()
        if kind == "add":
            nodes.append(h.make_node("Add", [free(), inner], [out]))
        elif kind == "sub":
            nodes.append(h.make_node("Sub", [inner, free()], [out]))
        elif kind == "rsub":
            nodes.append(h.make_node("Sub", [free(), inner], [out]))
        elif kind == "mul":
            gate = fresh()
            nodes.append(h.make_node("Sigmoid", [free()], [gate]))
            nodes.append(h.make_node("Mul", [inner, gate], [out]))
        elif kind == "div":
            nodes.append(h.make_node("Div", [inner, "two"], [out]))
        else:
            nodes.append(h.make_node("Neg", [inner], [out]))
        return out

    top = linear(draw(st.integers(1, 4)))
    nodes.append(h.make_node("Identity", [top], ["h_new"]))
    return nodes


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_linear_recurrences_match_the_loop(data):
    nodes = _random_update(data.draw)
    T = data.draw(st.integers(1, 40))
    chunk = data.draw(st.sampled_from([1, 2, 4, 16]))
    within = data.draw(st.sampled_from(["positions", "doubling"]))
    c = np.linspace(-1, 1, 4).astype(np.float32)
    m = lb.body_model(nodes, T=T, H=4, inits=[b.init("c", c), b.init("two", np.array(2, np.float32))])
    out, outcomes = linrec(m, linrec_chunk=chunk, linrec_min_steps=1, linrec_form=within)
    assert outcomes and outcomes[0][0], outcomes
    assert_equivalent(m, out, seeds=1)


# ---------------------------------------------------------------- declines
def test_state_read_nonlinearly_is_declined():
    m = lb.body_model([h.make_node("Tanh", ["h"], ["t"]), h.make_node("Add", ["t", "x"], ["h_new"])])
    assert "Tanh" in reason(m) and "nonlinearly" in reason(m)


def test_quadratic_state_is_declined():
    m = lb.body_model([h.make_node("Mul", ["h", "h"], ["hh"]), h.make_node("Add", ["hh", "x"], ["h_new"])])
    assert "quadratic" in reason(m)


def test_coefficient_depending_on_the_state_is_declined():
    m = lb.body_model([h.make_node("Sigmoid", ["h"], ["g"]), h.make_node("Mul", ["g", "x"], ["gx"]),
                       h.make_node("Add", ["h", "gx"], ["h_new"])])
    assert "Sigmoid" in reason(m)
    m = lb.body_model([h.make_node("Sigmoid", ["x"], ["g"]), h.make_node("Div", ["x", "h"], ["xh"]),
                       h.make_node("Add", ["g", "xh"], ["h_new"])])
    assert "divides by a value that depends on the state" in reason(m)


def test_output_reading_the_old_state_is_declined():
    m = lb.body_model([h.make_node("Add", ["h", "x"], ["h_new"])], outputs=("h",))
    assert "before its update" in reason(m)


def test_output_reading_part_of_the_update_is_declined():
    m = lb.body_model([h.make_node("Mul", ["h", "x"], ["hx"]), h.make_node("Add", ["hx", "x"], ["h_new"])],
                      outputs=("hx",))
    assert "part of a state update" in reason(m)


def test_float16_state_is_declined():
    m = lb.body_model([h.make_node("Add", ["h", "x"], ["h_new"])], dtype=TP.FLOAT16)
    assert "float16" in reason(m)


def test_short_sequences_are_left_to_unroll():
    for m in (lb.ema(T=4), lb.running_sum(T=4)):
        assert "below linrec_min_steps=8" in reason(m, linrec_min_steps=8)
    rewritten(lb.running_sum(T=4), "CumSum", linrec_min_steps=4)


def test_unknown_form_is_a_reason():
    assert "not one of auto, positions, doubling, two-pass" in reason(lb.ema(T=20), linrec_form="magic")


def test_map_is_left_to_vectorize():
    m = lb.body_model([h.make_node("Add", ["h", "x"], ["y"]), h.make_node("Identity", ["h"], ["h_new"])],
                      outputs=("y",))
    assert "a map" in reason(m)


def test_wide_states_leave_the_one_pass_forms_but_sums_do_not():
    """Measured: the one-pass chunked forms lose to the loop on wide states (Mamba [1, 64, 16]);
    there auto takes the two-pass form (tests/test_linrec_two_pass.py), the others decline."""
    m = lb.mamba(T=20, B=1, D=64, N=16)
    assert "1,024 elements per step, over linrec_max_state=512" in reason(m, linrec_form="positions")
    rewritten(m, "two-pass")
    rewritten(lb.running_sum(T=20, H=4096), "CumSum")
    rewritten(m, "chunked scan (C=8, positions", linrec_max_state=1024, linrec_form="positions")


# ---------------------------------------------------------------- decayed linear attention
def _attention_truth(feeds, gamma):
    """The recurrence in float64: the reference both the loop and the rewrite are held to."""
    s = feeds["S0"].astype(np.float64)
    ys = []
    for q, k, v in zip(feeds["Q"], feeds["K"], feeds["V"]):
        s = gamma * s + np.outer(k, v)
        ys.append(q @ s)
    return {"ST": s, "Y": np.stack(ys)}


@pytest.mark.parametrize("einsum", [True, False])
@pytest.mark.parametrize("steps, chunk", [(48, 16), (32, 64)])
def test_linear_attention_matmul_form_is_as_accurate_as_the_loop(einsum, steps, chunk):
    """S' = γS + kᵀv, y = qS' in the chunked matmul form: it sums in another order, so it is held to
    the float64 recurrence, no farther from it than the loop (x4) plus float32 rounding of the
    magnitudes summed."""
    m = lb.linear_attention(T=steps, DK=8, DV=8, gamma=0.9, einsum=einsum)
    out = rewritten(m, "chunked matmul form", linrec_attention_chunk=chunk)
    rng = np.random.default_rng(steps)
    feeds = {"S0": rng.standard_normal((8, 8)).astype(np.float32)}
    feeds.update({k: rng.standard_normal((steps, 8)).astype(np.float32) for k in ("Q", "K", "V")})
    truth, loop, got = _attention_truth(feeds, np.float32(0.9)), run(m, feeds), run(out, feeds)
    for key in truth:
        scale = float(np.max(np.abs(truth[key])))
        loop_error, form_error = np.abs(loop[key] - truth[key]), np.abs(got[key] - truth[key])
        assert np.all(form_error <= 4 * loop_error + 4e-6 * scale), (key, loop_error.max(), form_error.max())


def test_linear_attention_without_a_chunk_dividing_t_uses_the_elementwise_form():
    m = lb.linear_attention(T=37, DK=4, DV=4)  # 37 is prime
    out = rewritten(m, "chunked scan", linrec_attention_chunk=16)
    assert_equivalent(m, out)


def test_per_step_decay_is_not_the_matmul_form():
    """γ_t read from the input: the decay matrix differs per step pair; the elementwise form."""
    m = lb.linear_attention(T=24, DK=4, DV=4, einsum=False)
    body = m.graph.node[0].attribute[0].g
    mul = next(n for n in body.node if n.output[0] == "gs")
    body.node.insert(0, h.make_node("Sigmoid", ["k"], ["gamma_t"]))
    body.node.insert(1, h.make_node("Unsqueeze", ["gamma_t", "ax1"], ["gamma_col"]))
    mul.input[1] = "gamma_col"
    out = rewritten(m, "chunked scan")
    assert_equivalent(m, out)


# ---------------------------------------------------------------- PyTorch exports (models/linrec)
LINREC = Path(__file__).resolve().parent.parent / "models" / "linrec"
EXPORTS = {
    "torch_cumsum": "CumSum", "torch_cumsum_dyn": "CumSum", "torch_ema": "chunked scan",
    "torch_mingru": "chunked scan", "torch_mingru_dyn": "symbolic length", "torch_mamba": "chunked scan", "torch_mamba_wide": "two-pass",
    "torch_mamba_minimal_wide": "two-pass",
    "torch_linear_attention": "chunked matmul form",
    "torch_cumprod": "chunked product",
}


def test_every_export_is_listed():
    assert {p.stem for p in LINREC.glob("*.onnx")} == set(EXPORTS)


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_torch_scan_exports_match_torch(name):
    """torch._higher_order_ops.scan exported by the dynamo exporter: the pipeline takes the Scan
    with linrec (by default; a chunked form on a symbolic length under --target portable), and
    the result equals what torch computed and the loop."""
    m = onnx.load(LINREC / f"{name}.onnx")
    expected = dict(np.load(LINREC / f"{name}.expected.npz"))
    # linrec's own form: in the default pipeline loop_to_scan then turns a chunk-positions Loop
    # into a Scan (minGRU, T=1024: 0.26 ms against 0.33 ms as a Loop, 2.75 ms the original)
    options = {"target": "portable"} if name == "torch_mingru_dyn" else {}
    out, report = optimize(m, verify=False, skip=["loop_to_scan"], options=options)
    done = [o.detail for o in report.outcomes if o.pass_name == "linrec" and o.applied]
    assert len(done) == 1 and EXPORTS[name] in done[0], report.format()
    assert not loop_scans(out)
    assert_matches_torch(m, out, expected)


def assert_matches_torch(model, rewritten, expected: dict) -> None:
    """``rewritten`` on the export's recorded inputs equals what torch computed, and the loop."""
    feeds = {i.name: expected[i.name] for i in model.graph.input}
    got = run(rewritten, feeds)
    for key in got:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-5)
    assert_equivalent(model, rewritten, inputs=[feeds])


def test_products_use_cumprod_where_the_opset_has_it():
    """CumProd is probed in onnx.defs (opset 26+), never assumed: below, the chunked product."""
    import onnx.defs

    try:
        since = onnx.defs.get_schema("CumProd").since_version
    except Exception:  # noqa: BLE001 - an onnx without CumProd
        since = None
    assert "chunked product" in linrec(lb.cumulative_product(T=24, opset=17))[1][0][1]
    if since is None or b.ort_refuses(lb.cumulative_product(T=24, opset=since)):
        pytest.skip("no CumProd in this onnx/onnxruntime")
    for steps in (24, "T"):
        m = lb.cumulative_product(T=steps, opset=since)
        out = rewritten(m, "CumProd")
        assert "CumProd" in ops(out)
        if b.ort_refuses(out):
            pytest.skip("this onnxruntime loads the opset but has no CumProd kernel")
        assert_equivalent(m, out)


# ---------------------------------------------------------------- symbolic length
def _feeds(model, steps: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value if d.dim_value else steps for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


@pytest.mark.parametrize("build, form", [
    (lambda: lb.ema(T="T"), "chunked scan"),
    (lambda: lb.mingru(T="T", B=2, I=4, H=4), "chunked scan"),
    (lambda: lb.mamba(T="T", B=1, D=4, N=2), "chunked scan"),
    (lambda: lb.cumulative_product(T="T"), "chunked product"),
], ids=["ema_steady_decay", "mingru", "mamba", "cumprod"])
def test_symbolic_length_takes_the_positions_form_with_runtime_padding(build, form):
    """A symbolic T (torch exports with a dynamic seq): the chunk count is computed at run time,
    the steps read by position with one Gather, the state carried across chunks by a Scan;
    checked at 0 steps (final = h0), 1, fewer than a chunk, an exact multiple and a padded
    length."""
    m = build()
    out = rewritten(m, "symbolic length", linrec_chunk=8, target="portable")  # unmeasured, the loop is kept
    assert f"{form} (C=8, positions, symbolic length)" in linrec(m, linrec_chunk=8, target="portable")[1][0][1]
    empty = _feeds(m, 0)  # onnxruntime cannot run the zero-length Scan itself; the loop's meaning
    got = run(out, empty)
    np.testing.assert_array_equal(got["hT"], empty["h0"])
    assert got["Y"].shape[0] == 0
    for steps in (1, 5, 16, 37):
        feeds = _feeds(m, steps, seed=steps)
        want, got = run(m, feeds), run(out, feeds)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5, err_msg=f"{key} at T={steps}")
    assert_equivalent(m, out, inputs=[_feeds(m, 21)])
