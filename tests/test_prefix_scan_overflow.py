"""linrec's one-pass chunked forms (module prefix_scan: doubling, the positions loop, the
symbolic-length positions loop, the chunked product) on a state that overflows float32
(issue 33, the differential fuzz's x1e4 regime): the loop's state runs to ±inf and stays there
(a·inf + b), where the chunked forms combine chunk-local products and sums the loop never forms
(inf - inf, 0·inf) and gave NaN. A rewritten model gives a NaN only where the original does:
the forms sit behind If(the state is not finite somewhere), whose other branch runs the loop.

The models are the fuzz findings' (``decay_input``: h' = h ⊙ g + x and h' = h ⊙ x ⊙ g with the
decay g a graph input, T = 16 and 17, static and symbolic lengths, default target and
``--target portable``), plus a per-step decay (h' = a_t ⊙ h + x_t) and the plain product
h' = h ⊙ x, in each chunked form.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper as oh

import builders as b
import linrec_builders as lb
from scanopt.pipeline import optimize


def per_step_decay(T=17, H=4):
    """h' = a_t ⊙ h + x_t, a and x both scanned."""
    nodes = [oh.make_node("Mul", ["a", "h"], ["ah"]), oh.make_node("Add", ["ah", "x"], ["h_new"]),
             oh.make_node("Identity", ["h_new"], ["y"])]
    body = oh.make_graph(nodes, "body", [b.vi("h", [H]), b.vi("a", [H]), b.vi("x", [H])],
                         [b.vi("h_new", [H]), b.vi("y", [H])])
    scan = oh.make_node("Scan", ["h0", "A", "X"], ["hT", "Y"], body=body, num_scan_inputs=2)
    return b.model(oh.make_graph([scan], "g", [b.vi("h0", [H]), b.vi("A", [T, H]), b.vi("X", [T, H])],
                                 [b.vi("hT", [H]), b.vi("Y", [T, H])]))


def overflowing_feeds(model, seed=0):
    """Values of magnitude 1e4..1e5 (the fuzz's x1e4 regime), the initial state with a 0: the
    decays grow the state past float32's range in a few steps, with alternating signs."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value if d.dim_value else 17 for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = (rng.standard_normal(dims) * 3e4).astype(np.float32)
    feeds["h0"][..., 0] = 0.0
    return feeds


def run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def assert_as_the_loop(want: dict, got: dict):
    """NaN exactly where the loop's, the same infinities, finite values within float32 rounding."""
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape, (name, g.shape, w.shape)
        nan = np.isnan(g) & ~np.isnan(w)
        assert not nan.any(), f"{name}: NaN at {np.argwhere(nan)[:4].tolist()} where the loop has {w[nan][:4]}"
        assert np.array_equal(np.isnan(g), np.isnan(w)), name
        inf = np.isinf(w)
        assert np.array_equal(g[inf], w[inf]) and not np.isinf(g[~inf]).any(), name
        finite = np.isfinite(w)
        np.testing.assert_allclose(g[finite], w[finite], rtol=1e-3, atol=1e-4 * max(1.0, np.abs(w[finite]).max(initial=0)))


MODELS = {
    "decay_input T=17": lambda: lb.decay_input(T=17, H=4),
    "decay_input T=16": lambda: lb.decay_input(T=16, H=4),
    "decay_input product T=17": lambda: lb.decay_input(T=17, H=4, product=True),
    "decay_input symbolic": lambda: lb.symbolic_steps(lb.decay_input(T=17, H=4)),
    "decay_input product symbolic": lambda: lb.symbolic_steps(lb.decay_input(T=17, H=4, product=True)),
    "per-step decay": lambda: per_step_decay(T=17),
    "per-step decay symbolic": lambda: lb.symbolic_steps(per_step_decay(T=17)),
    "cumulative_product": lambda: lb.cumulative_product(T=17, H=4),
}


def linrec_applied(report) -> str:
    done = [o.detail for o in report.outcomes if o.pass_name == "linrec" and o.applied]
    assert done, report.format()
    return done[0]


@pytest.mark.parametrize("options", [{}, {"target": "portable"}], ids=["default", "portable"])
@pytest.mark.parametrize("case", list(MODELS))
def test_an_overflowing_state_gives_the_loops_values_not_nan(case, options):
    model = MODELS[case]()
    out, report = optimize(model, options={**options, "linrec_min_steps": 1})
    if out is model:
        pytest.skip(f"not rewritten under {options}: {report.format()}")
    linrec_applied(report)
    assert report.verification["passed"], report.verification
    for seed in range(4):
        feeds = overflowing_feeds(model, seed)
        want = run(model, feeds)
        assert any(np.isinf(w).any() for w in want.values()), "the inputs do not overflow the loop's state"
        assert_as_the_loop(want, run(out, feeds))


@pytest.mark.parametrize("form", ["doubling", "positions"])
@pytest.mark.parametrize("case", ["decay_input T=17", "decay_input product T=17", "per-step decay",
                                  "cumulative_product", "decay_input symbolic", "per-step decay symbolic"])
def test_each_chunked_form_is_guarded(case, form):
    """Each form the pass writes, chosen by linrec_form (a symbolic length: the positions form)."""
    model = MODELS[case]()
    if "symbolic" in case and form == "doubling":
        pytest.skip("the doubling form needs a static length")
    out, report = optimize(model, passes=["linrec"], options={"linrec_min_steps": 1, "linrec_form": form,
                                                                 "linrec_chunk": 4})
    detail = linrec_applied(report)
    assert "not finite" in detail, detail
    for seed in range(4):
        feeds = overflowing_feeds(model, seed)
        assert_as_the_loop(run(model, feeds), run(out, feeds))
    rng = np.random.default_rng(7)  # ordinary values: the form, equal to the loop
    feeds = {k: (rng.standard_normal(v.shape) * 0.5).astype(np.float32) for k, v in overflowing_feeds(model).items()}
    assert_as_the_loop(run(model, feeds), run(out, feeds))
