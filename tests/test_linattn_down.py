"""LinearAttention (opset 27) moved below 27 becomes a Scan (passes/linattn/to_scan.py, hooked into the
migration by scanopt/opset_adapters.py), and back (issue 32, "the other direction").

Each rule and variant the spec allows is built as a model builder writes it (one node, packed
[B, T, H*d] inputs), moved to 26 (verified by the migration itself), then run by onnxruntime against
onnx's reference implementation of the op on random inputs, at the edges too (an empty batch, zero
steps: the spec's empty output and initial state, which the op's own function body refuses in
onnxruntime). Moved back with ``--target-opset 27 --target portable`` the Scan is LinearAttention again
where the linattn pass takes it. What cannot move is refused with one line, exit 2, nothing written.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import linattn_builders as lab
from equivalence import ops
from scanopt.engines import run
from scanopt.migrate import migrate, migrate_verified
from scanopt.pipeline import optimize
from scanopt.validate import default_opset

RULES = ["linear", "gated", "delta", "gated_delta"]
EDGES = [(2, 5), (3, 1), (0, 4), (2, 0), (0, 0)]  # (B, T): the last three are the spec's empty cases
VARIANTS = {  # id: (rule, builder keywords)
    "per_key_decay": ("gated", dict(per_key=True)),
    "per_key_decay_delta": ("gated_delta", dict(per_key=True)),
    "beta_one": ("delta", dict(beta_width=1)),
    "beta_one_gated": ("gated_delta", dict(beta_width=1)),
    "no_past_state": ("linear", dict(past=False)),
    "no_past_state_delta": ("gated_delta", dict(past=False)),
    "grouped_heads": ("gated_delta", dict(q_heads=4, kv_heads=2)),
    "multi_query": ("linear", dict(q_heads=3, kv_heads=1)),
    "one_head": ("delta", dict(q_heads=1, kv_heads=1, DK=5, DV=2)),
    "scale": ("gated", dict(scale=0.3)),
    "scale_one": ("delta", dict(scale=1.0)),
    "chunk_size": ("gated_delta", dict(chunk_size=16)),
    "float16": ("gated", dict(elem=TP.FLOAT16)),
    "float16_float32_state": ("gated_delta", dict(elem=TP.FLOAT16, state_elem=TP.FLOAT)),
    "bfloat16": ("delta", dict(elem=TP.BFLOAT16)),
    "static_batch_and_length": ("gated_delta", dict(B=2, T=5)),
}


def feeds(model: onnx.ModelProto, batch: int, steps: int, seed: int = 0) -> dict:
    """Inputs as models feed them: decay a log decay (<= 0), beta a sigmoid output, keys
    L2-normalized per head (the spec asks it of the delta rules)."""
    rng = np.random.default_rng(seed)
    node = model.graph.node[0]
    kv = next(a.i for a in node.attribute if a.name == "kv_num_heads")
    found = {}
    for v in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else {"B": batch, "T": steps}[d.dim_param]
                for d in v.type.tensor_type.shape.dim]
        x = rng.standard_normal(dims)
        if v.name == "decay":
            x = -np.abs(x)
        elif v.name == "beta":
            x = 1 / (1 + np.exp(-x))
        elif v.name == "key":
            x = x.reshape(dims[:2] + [kv, dims[2] // kv])
            x = (x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-6)).reshape(dims)
        found[v.name] = x.astype(onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))
    return found


def sizes(model: onnx.ModelProto) -> list[tuple[int, int]]:
    dims = model.graph.input[0].type.tensor_type.shape.dim
    if dims[0].HasField("dim_value"):
        return [(dims[0].dim_value, dims[1].dim_value)]
    return EDGES


def max_error(original: onnx.ModelProto, candidate: onnx.ModelProto, engine: str = "ort") -> float:
    """The largest |candidate - reference| over every output and input size, relative to the
    output's scale (at least 1); shapes and dtypes must be the spec's."""
    worst = 0.0
    for batch, steps in sizes(original):
        f = feeds(original, batch, steps)
        want, got = run(original, f, engine="reference"), run(candidate, f, engine=engine)
        assert list(want) == list(got)
        for name in want:
            assert want[name].shape == got[name].shape and want[name].dtype == got[name].dtype, (name, batch, steps)
            if want[name].size:
                w, g = want[name].astype(np.float64), got[name].astype(np.float64)
                worst = max(worst, float(np.max(np.abs(w - g)) / max(1.0, float(np.max(np.abs(w))))))
    return worst


TOLERANCE = {TP.FLOAT: 1e-5, TP.FLOAT16: 2e-3, TP.BFLOAT16: 1.6e-2}  # a few ulp of the output's type


def lowered(model: onnx.ModelProto, target: int = 26) -> onnx.ModelProto:
    migration = migrate_verified(model, target)
    out = migration.model
    assert default_opset(out) == target and migration.verification["passed"], migration.verification
    assert "LinearAttention" not in ops(out) and ops(out)["Scan"] == 1
    assert [o.detail for o in migration.outcomes if o.pass_name == "linattn"][0].endswith(f"-> Scan at opset {target}")
    onnx.checker.check_model(out)
    return out


# ------------------------------------------------------------------------------ down to 26
@pytest.mark.parametrize("rule", RULES)
def test_each_rule_moves_down_equal_to_the_op(rule):
    model = lab.linear_attention_node(rule)
    out = lowered(model)
    assert ops(out)["If"] == 1  # B and T symbolic: the empty cases are guarded
    assert max_error(model, out) <= TOLERANCE[TP.FLOAT]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_moves_down_equal_to_the_op(variant):
    rule, kw = VARIANTS[variant]
    model = lab.linear_attention_node(rule, **kw)
    out = lowered(model)
    assert max_error(model, out) <= TOLERANCE[kw.get("elem", TP.FLOAT)]
    if variant == "static_batch_and_length":
        assert "If" not in ops(out)
    for value, want in zip(out.graph.output, model.graph.output):
        assert value == want  # the interface is the original's, types and shapes


@pytest.mark.parametrize("target", [9, 12, 13, 17, 21])
def test_older_targets(target):
    model = lab.linear_attention_node("gated_delta", per_key=True, past=False)
    assert max_error(model, lowered(model, target)) <= TOLERANCE[TP.FLOAT]


def test_zero_steps_give_the_initial_state_and_an_empty_output():
    model = lab.linear_attention_node("gated_delta")
    out = lowered(model)
    f = feeds(model, 2, 0)
    got = run(out, f, engine="ort")
    assert got["output"].shape == (2, 0, 6)
    np.testing.assert_array_equal(got["present_state"], f["past_state"])
    without = lowered(lab.linear_attention_node("linear", past=False))
    got = run(without, feeds(lab.linear_attention_node("linear", past=False), 3, 0), engine="ort")
    assert got["output"].shape == (3, 0, 6) and got["present_state"].shape == (3, 2, 4, 3)
    assert not got["present_state"].any()


def test_a_node_nested_in_an_if_branch_moves_down():
    inner = lab.linear_attention_node("gated", past=False)
    y, s = inner.graph.output
    then = h.make_graph(list(inner.graph.node), "then", [], [y, s])
    copies = [h.make_node("Identity", ["value"], ["y2"]), h.make_node("Identity", ["zero_state"], ["s2"])]
    other = h.make_graph(copies, "else", [], [h.make_tensor_value_info("y2", TP.FLOAT, ["B", "T", 6]),
                                               h.make_tensor_value_info("s2", TP.FLOAT, ["B", 2, 4, 3])])
    node = h.make_node("If", ["flag"], ["Y", "S"], then_branch=then, else_branch=other)
    inputs = list(inner.graph.input) + [h.make_tensor_value_info("flag", TP.BOOL, []),
                                        h.make_tensor_value_info("zero_state", TP.FLOAT, ["B", 2, 4, 3])]
    outputs = [h.make_tensor_value_info("Y", TP.FLOAT, ["B", "T", 6]),
               h.make_tensor_value_info("S", TP.FLOAT, ["B", 2, 4, 3])]
    model = h.make_model(h.make_graph([node], "g", inputs, outputs), opset_imports=[h.make_opsetid("", 27)],
                         ir_version=10)
    migration = migrate_verified(model, 26)
    assert [(o.path, o.node) for o in migration.outcomes] == [("then", "linear_attention")]
    for flag in (True, False):
        f = feeds(inner, 2, 5)
        f.update(flag=np.array(flag), zero_state=np.zeros([2, 2, 4, 3], np.float32))
        want, got = run(model, f, engine="reference"), run(migration.model, f, engine="ort")
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------ and back
ROUND_TRIP = [("linear", {}), ("gated", {}), ("delta", {}), ("gated_delta", {}), ("gated", dict(per_key=True)),
              ("gated_delta", dict(per_key=True)), ("delta", dict(beta_width=1)), ("linear", dict(past=False)),
              ("gated", dict(scale=0.3)), ("gated", dict(elem=TP.FLOAT16))]


@pytest.mark.parametrize("rule,kw", ROUND_TRIP, ids=[f"{r}-{'-'.join(k) or 'plain'}" for r, k in ROUND_TRIP])
def test_down_and_back_gives_linear_attention_again(rule, kw):
    model = lab.linear_attention_node(rule, **kw)
    back, report = optimize(lowered(model), options={"target_opset": 27, "target": "portable", "portable_runtimes": ["onnxruntime"]})
    assert default_opset(back) == 27 and ops(back)["LinearAttention"] == 1 and "Scan" not in ops(back)
    applied = [o.detail for o in report.outcomes if o.pass_name == "linattn" and o.applied]
    assert applied and applied[0].startswith(f"{rule} "), report.outcomes
    assert max_error(model, back) <= TOLERANCE[kw.get("elem", TP.FLOAT)]


def test_grouped_heads_come_back_as_a_scan_with_the_reason():
    """The linattn pass reads one query per KV head; grouped heads stay the (equal) Scan."""
    model = lab.linear_attention_node("gated_delta", q_heads=4, kv_heads=2)
    back, report = optimize(lowered(model), options={"target_opset": 27, "target": "portable", "portable_runtimes": ["onnxruntime"]})
    assert "LinearAttention" not in ops(back) and ops(back)["Scan"] == 1
    reasons = [o.detail for o in report.outcomes if o.pass_name == "linattn"]
    assert reasons and all("not linear attention" in r for r in reasons)
    assert max_error(model, back) <= TOLERANCE[TP.FLOAT]


# ------------------------------------------------------------------------------ refused
def test_bfloat16_below_opset_13_is_refused():
    model = lab.linear_attention_node("gated", elem=TP.BFLOAT16)
    with pytest.raises(Exception, match="bfloat16 values need Cast from opset 13; the target is 12"):
        migrate(model, 12)


def test_cli_moves_down_and_refuses_with_one_line(cli, tmp_path):
    source, out = tmp_path / "m27.onnx", tmp_path / "m26.onnx"
    onnx.save(lab.linear_attention_node("gated_delta"), source)
    result = cli("upgrade", source, out, "--target-opset", "26")
    assert result.code == 0, result.err
    assert "linear_attention: gated_delta LinearAttention (H=2) -> Scan at opset 26" in result.out
    assert default_opset(onnx.load(out)) == 26
    optimized = tmp_path / "o26.onnx"
    result = cli("optimize", source, optimized, "--target-opset", "26")
    assert result.code == 0 and default_opset(onnx.load(optimized)) == 26, result.err

    bf16 = tmp_path / "bf16.onnx"
    onnx.save(lab.linear_attention_node("gated", elem=TP.BFLOAT16), bf16)
    refused = tmp_path / "refused.onnx"
    result = cli("upgrade", bf16, refused, "--target-opset", "12")
    assert result.code == 2 and not refused.exists() and "Traceback" not in result.err
    assert result.err.strip().count("\n") == 0
    assert "LinearAttention 'linear_attention' has no form below opset 27" in result.err

    # an op with no older form anywhere (CausalConvWithState is new in 27)
    model = lab.linear_attention_node("linear")
    model.graph.node.append(h.make_node("CausalConvWithState", ["output", "w"], ["conv", "conv_state"]))
    model.graph.input.append(h.make_tensor_value_info("w", TP.FLOAT, [6, 1, 3]))
    model.graph.output.append(h.make_tensor_value_info("conv", TP.FLOAT, ["B", "T", 6]))
    conv = tmp_path / "conv.onnx"
    onnx.save(model, conv)
    result = cli("upgrade", conv, refused, "--target-opset", "26")
    assert result.code == 2 and not refused.exists() and result.err.strip().count("\n") == 0
    assert "does not lower it to 26: 'CausalConvWithState' (opset 27) does not exist at opset 26" in result.err

    # an op whose form changed above the target (Unsqueeze's axes became an input at 13)
    model = lab.linear_attention_node("linear")
    model.graph.node.append(h.make_node("Unsqueeze", ["output", "axes"], ["wide"]))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([0], np.int64), "axes"))
    model.graph.output.append(h.make_tensor_value_info("wide", TP.FLOAT, [1, "B", "T", 6]))
    changed = tmp_path / "changed.onnx"
    onnx.save(model, changed)
    result = cli("upgrade", changed, refused, "--target-opset", "12")
    assert result.code == 2 and not refused.exists()
    assert "does not lower it to 12: 'Unsqueeze' changed form at opset 13" in result.err
    result = cli("upgrade", changed, out, "--target-opset", "13")  # at 13 it keeps its form: lowered
    assert result.code == 0, result.err
