"""linattn: matrix-state linear attention Scans become one LinearAttention (opset 27).

Every rewrite: structure (one LinearAttention, no Scan) and numbers (onnxruntime, the loop against
the op, synthesized inputs incl. symbolic B and T: empty batch and zero steps). Every decline: its
reason. The cost policy: unmeasured on onnxruntime the loop stays; --target portable applies where
onnxruntime is its only runtime (OpenVINO has no LinearAttention-27: tests/test_portable.py).
"""

from __future__ import annotations

import pytest

import linattn_builders as lab
from equivalence import assert_equivalent, ops
from scanopt.pipeline import optimize


def linattn(model, **options):
    options.setdefault("target", "portable")
    options.setdefault("portable_runtimes", ["onnxruntime"])  # OpenVINO has no LinearAttention-27
    out, report = optimize(model, passes=["linattn"], verify=False, options=options)
    return out, [(o.applied, o.detail) for o in report.outcomes if o.pass_name == "linattn"]


def rewritten(model, rule, **options):
    out, outcomes = linattn(model, **options)
    assert len(outcomes) == 1 and outcomes[0][0], outcomes
    assert outcomes[0][1].startswith(rule + " "), outcomes
    assert ops(out)["LinearAttention"] == 1 and "Scan" not in ops(out)
    return out


def reason(model, **options) -> str:
    _, outcomes = linattn(model, **options)
    assert len(outcomes) == 1 and not outcomes[0][0], outcomes
    return outcomes[0][1]


RULES = ["linear", "gated", "delta", "gated_delta"]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("style", ["einsum", "einsum_ellipsis", "matmul", "mul"])
def test_each_rule_in_each_product_form_equals_the_loop(rule, style):
    model = lab.attention(rule, style=style)
    assert_equivalent(model, rewritten(model, rule), engine="ort")


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("layout", [dict(nb=1), dict(nb=0, B=1), dict(batch_first=True), dict(transposed=True),
                                    dict(scale=0.5), dict(style="reduce")],
                         ids=["one_batch_axis", "no_batch_axis", "batch_first", "stored_transposed", "scaled", "reducesum"])
def test_layouts_producers_write_equal_the_loop(rule, layout):
    model = lab.attention(rule, **layout)
    assert_equivalent(model, rewritten(model, rule), engine="ort")


@pytest.mark.parametrize("rule", ["delta", "gated_delta"])
@pytest.mark.parametrize("written", [dict(beta_on="product"), dict(beta_on="key"), dict(expanded=True)],
                         ids=["beta_on_product", "beta_on_key", "expanded"])
def test_delta_rule_written_other_ways_equals_the_loop(rule, written):
    model = lab.attention(rule, **written)
    assert_equivalent(model, rewritten(model, rule), engine="ort")


@pytest.mark.parametrize("decay", ["sigmoid", "const"])
@pytest.mark.parametrize("rule", ["gated", "gated_delta"])
def test_decay_as_a_given_factor_equals_the_loop(rule, decay):
    model = lab.attention(rule, decay=decay)
    assert_equivalent(model, rewritten(model, rule), engine="ort")


def test_per_key_decay_equals_the_loop():
    model = lab.attention("gated", per_key=True)
    out = rewritten(model, "gated")
    assert_equivalent(model, out, engine="ort")


@pytest.mark.parametrize("written", [dict(), dict(style="matmul"), dict(beta_on="key"), dict(expanded=True)],
                         ids=["einsum", "matmul", "beta_on_key", "expanded"])
def test_per_key_decay_in_the_delta_rule_equals_the_loop(written):
    """gated_delta with a per-key decay (the spec's decay [B, T, H_kv*dk]): the erase reads the
    decayed state, Σ_i k_i a_i S_ij, the very key and decay of the update."""
    model = lab.attention("gated_delta", per_key=True, **written)
    out = rewritten(model, "gated_delta")
    assert_equivalent(model, out, engine="ort")


def test_per_key_decay_with_the_erase_of_the_undecayed_state_is_declined():
    model = lab.attention("gated_delta", per_key=True)
    body = model.graph.node[0].attribute[0].g
    decayed = next(n.output[0] for n in body.node if n.op_type == "Mul" and "S" in n.input)
    for node in body.node:  # the erase now reads S, not a·S: neither delta nor gated_delta
        if node.op_type == "Einsum" and node.input[0] == decayed and len(node.input) == 2 and "->" in \
                next(a.s.decode() for a in node.attribute if a.name == "equation") and node.input[1] != "q":
            node.input[0] = "S"
            break
    else:
        raise AssertionError("no read of the decayed state by the key")
    assert "not β k (v − a Sᵀk)ᵀ" in reason(model)


@pytest.mark.parametrize("rule", RULES)
def test_symbolic_batch_and_length_run_empty_like_the_loop(rule):
    """B and T symbolic: the synthesized feeds include an empty batch and zero steps, which the
    op's function body alone refuses (its Reshape); the padded form gives the loop's outputs."""
    import numpy as np

    model = lab.attention(rule, dims=["B", "T"])
    out = rewritten(model, rule)
    assert_equivalent(model, out, engine="ort")
    rng = np.random.default_rng(0)
    for B, T in [(0, 5), (2, 0), (0, 0)]:
        feeds = {v.name: rng.standard_normal([d.dim_value if d.dim_value else {"B": B, "T": T}[d.dim_param]
                                              for d in v.type.tensor_type.shape.dim]).astype(np.float32)
                 for v in model.graph.input}
        from scanopt.engines import run

        want, got = run(model, feeds, engine="reference"), run(out, feeds, engine="ort")  # ort: no zero-length Scan
        assert list(want) == list(got)
        for name in want:
            assert want[name].shape == got[name].shape and np.allclose(want[name], got[name]), (B, T, name)


# ------------------------------------------------------------------------------ declines
def test_below_opset_27_is_declined_with_the_rule():
    assert "LinearAttention is opset 27; the model is at opset 26" in reason(lab.attention("delta", opset=26))


def test_unmeasured_on_onnxruntime_the_loop_stays():
    text = reason(lab.attention("gated_delta"), target="onnxruntime")
    assert "not applied unmeasured" in text and "function body" in text


def test_erase_with_another_key_is_not_the_delta_rule():
    from onnx import helper as h

    model = lab.attention("delta")
    body = model.graph.node[0].attribute[0].g
    for node in body.node:  # the read Sᵀk now reads with q: S + β k (v − Sᵀq)ᵀ
        if node.op_type == "Einsum" and node.input[0] == "S":
            node.input[1] = "q"
            break
    else:
        raise AssertionError("no read of the state by the key")
    assert "another key" in reason(model)
    del h


def test_decay_not_known_positive_is_declined():
    model = lab.attention("gated")
    body = model.graph.node[0].attribute[0].g
    for node in body.node:
        if node.op_type == "Exp":
            node.op_type = "Tanh"  # a = tanh(g): may be negative, no log
    assert "not exp(g), a sigmoid or a positive constant" in reason(model)


def test_float16_state_is_declined():
    from onnx import TensorProto as TP

    model = lab.attention("linear")
    for g in (model.graph, model.graph.node[0].attribute[0].g):
        for v in list(g.input) + list(g.output):
            v.type.tensor_type.elem_type = TP.FLOAT16
    assert "float32 states" in reason(model)


# ------------------------------------------------------------------------------ verification's feeds
def test_a_fed_log_decay_is_drawn_nonpositive_in_verification():
    """The builders feed g itself (a = exp(g)); drawn at random, g > 0 grows the state to 1e33
    (issue 32): the pass names G a log decay and verification draws it <= 0, as models feed it
    (-softplus, logsigmoid). The input sets are seed-stable: the same as without the range elsewhere."""
    import numpy as np

    from scanopt.inputs import InputSynthesizer

    model = lab.attention("gated_delta", dims=["B", "T"])
    out, report = optimize(model, options={"target": "portable", "portable_runtimes": ["onnxruntime"]})
    assert ops(out)["LinearAttention"] == 1
    assert set(report.input_ranges) == {"G"} and report.input_ranges["G"][:2] == (None, 0.0)
    assert report.verification["passed"] is True
    notes = report.verification["details"]["notes"]
    assert any(n.startswith("'G' drawn in [-inf, 0]") for n in notes), notes
    plain, ranged = InputSynthesizer(model), InputSynthesizer(model, input_ranges=report.input_ranges)
    for seed in range(3):
        a, b = plain.feeds(seed), ranged.feeds(seed)
        assert (b["G"] <= 0).all() and (a["G"] > 0).any()
        assert np.array_equal(np.abs(a["G"]), np.abs(b["G"]))
        assert all(np.array_equal(a[k], b[k]) for k in a if k != "G")


@pytest.mark.parametrize("decay", ["exp", "sigmoid"])
def test_a_decay_hoist_moved_out_of_the_loop_is_still_a_log_decay(decay):
    """hoist computes exp(g) (or the sigmoid) for all steps before the Scan; the body's decay is
    then a scan input. linattn follows it to the outer Exp and takes its Log (issue 32: it
    declined "not exp(g)" on the hoisted loop)."""
    model = lab.attention("gated_delta", decay=decay)
    hoisted, report = optimize(model, passes=["hoist"], verify=False, options={"target": "portable", "portable_runtimes": ["onnxruntime"]})
    assert any(o.applied for o in report.outcomes if o.pass_name == "hoist")
    assert any(n.op_type in ("Exp", "Sigmoid") for n in hoisted.graph.node)  # the decay's op left the body
    out = rewritten(hoisted, "gated_delta")
    assert_equivalent(model, out, engine="ort")


def test_a_constant_per_head_decay_is_taken_in_log_space():
    """RetNet's gamma [H, 1, 1] (1 - 2^(-5-h)): a positive constant per head, not a scalar."""
    import numpy as np
    from onnx import numpy_helper

    model = lab.attention("gated")
    body = model.graph.node[0].attribute[0].g
    exp = next(n for n in body.node if n.op_type == "Exp")
    gamma = np.array([0.97, 0.5], np.float32).reshape(2, 1, 1)
    body.node.remove(exp)
    body.initializer.append(numpy_helper.from_array(gamma, exp.output[0]))
    out = rewritten(model, "gated")
    assert_equivalent(model, out, engine="ort")
