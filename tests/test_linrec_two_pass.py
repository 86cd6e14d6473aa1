"""linrec's two-pass positions form (passes/loopfree/two_pass.py): the wide-state linear
recurrences (Mamba's selective scan, state [B, D, N]) the one-pass chunked forms leave as loops.

Each rewrite runs against the loop on onnxruntime and the reference executor; the lengths cover
T = 1, T shorter than the chunk, T not a multiple of it; batches, reversed scans, random sizes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import linrec_builders as lb
from equivalence import assert_equivalent, ops
from scanopt.engines import run
from scanopt.pipeline import optimize
from test_linrec import linrec, reason

TWO_PASS = "two-pass"


def two_pass(model, **options):
    out, outcomes = linrec(model, **{"linrec_min_steps": 1, "linrec_form": TWO_PASS, **options})
    assert len(outcomes) == 1 and outcomes[0][0] and TWO_PASS in outcomes[0][1], outcomes
    assert "Scan" not in ops(out)
    return out


@pytest.mark.parametrize("build", [lb.mamba, lb.mamba_einsum], ids=["mamba", "mamba_einsum"])
@pytest.mark.parametrize("T, B, chunk", [(1, 1, 8), (5, 2, 8), (16, 1, 8), (33, 3, 8), (40, 2, 64), (24, 1, 1)],
                         ids=["T1", "T_below_C", "T_multiple", "T_padded_B3", "one_chunk_padded", "C1"])
def test_selective_scan_matches_the_loop(build, T, B, chunk):
    m = build(T=T, B=B, D=4, N=3)
    assert_equivalent(m, two_pass(m, linrec_chunk=chunk))


def test_wide_state_takes_the_two_pass_form_by_default():
    """Measured (bench_linrec, Mamba D=64, N=16): the one-pass forms lose on this width, the
    two-pass form does not; auto picks it over linrec_max_state."""
    m = lb.mamba(T=40, B=1, D=64, N=16)
    out, outcomes = linrec(m)
    assert outcomes[0][0] and f"C=8, {TWO_PASS}" in outcomes[0][1], outcomes
    assert_equivalent(m, out, seeds=1)
    out, outcomes = linrec(m, linrec_form="positions")  # the other forms still decline it
    assert not outcomes[0][0] and "over linrec_max_state=512" in outcomes[0][1]


def test_reversed_scan_matches_the_loop():
    m = lb.mamba(T=21, B=2, D=4, N=3)
    scan = m.graph.node[0]
    scan.attribute.extend([onnx.helper.make_attribute("scan_input_directions", [1, 1, 1, 1]),
                           onnx.helper.make_attribute("scan_output_directions", [1])])
    assert_equivalent(m, two_pass(m, linrec_chunk=4))


def test_long_sequence_stays_within_tolerance_of_the_loop():
    """T = 4096 in float32: the chunk ends composed by doubling, then every position recomputed
    from its chunk's start; no log, no division, so nothing drifts (inputs of unit scale)."""
    m = lb.mamba(T=4096, B=1, D=8, N=4)
    out = two_pass(m)
    feeds = {i.name: np.random.default_rng(4).standard_normal(
        [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in m.graph.input}
    want, got = run(m, feeds), run(out, feeds)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5)
    assert not {"Log", "Div", "Reciprocal"} & set(ops(out)) - set(ops(m))


def test_verification_accepts_the_rewrite():
    m = lb.mamba(T=37, B=2, D=6, N=5)
    out, report = optimize(m, passes=["linrec"], options={"linrec_form": TWO_PASS, "tune": False})
    assert report.verification["passed"] and not report.verification["rolled_back"], report.verification["summary"]
    assert "Scan" not in ops(out)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(T=st.integers(1, 40), B=st.integers(1, 3), D=st.integers(1, 5), N=st.integers(1, 4),
       chunk=st.sampled_from([1, 2, 4, 8, 16]), einsum=st.booleans())
def test_random_selective_scans_match_the_loop(T, B, D, N, chunk, einsum):
    m = (lb.mamba_einsum if einsum else lb.mamba)(T=T, B=B, D=D, N=N)
    assert_equivalent(m, two_pass(m, linrec_chunk=chunk), seeds=1)


def test_forms_it_cannot_take_are_declined_with_the_reason():
    assert "one state with a general update" in reason(lb.cumulative_product(T=24), linrec_form=TWO_PASS)
    assert "static length" in reason(lb.mamba(T="T", B=1, D=4, N=2), linrec_form=TWO_PASS)


LINREC = Path(__file__).resolve().parent.parent / "models" / "linrec"


def test_torch_selective_scan_export_matches_torch():
    """The dynamo export of a torch._higher_order_ops.scan selective scan (models/linrec), its
    softplus a Where over Softplus, its projections Gemms: the two-pass form equals torch."""
    m = onnx.load(LINREC / "torch_mamba.onnx")
    expected = dict(np.load(LINREC / "torch_mamba.expected.npz"))
    out = two_pass(m, linrec_chunk=4)
    feeds = {i.name: expected[i.name] for i in m.graph.input}
    got = run(out, feeds)
    for key in got:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-5)
    assert_equivalent(m, out, inputs=[feeds])
