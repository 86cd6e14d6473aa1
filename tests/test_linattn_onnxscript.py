"""Issue 32's onnxscript samples (models/heldout_linattn_onnxscript, written by
generate_heldout_linattn_onnxscript.py at opset 27): plain causal linear attention, a per-head
scalar decay (GLA-like exp(logsigmoid), RetNet's fixed gamma, a sigmoid gate), DeltaNet and
Gated DeltaNet, each in three styles (batch-first packed heads with MatMul, heads folded into the
batch with Einsum, a per-head model-local function called per head with Mul/ReduceSum).

``--target portable --portable-runtime onnxruntime`` writes one LinearAttention per Scan (in the function, for the per-head
style), verified, equal to the stored outputs and to the original at T=1024 on three input sets
(max abs error within 1e-4 of the output's scale). The default writes what the chooser keeps,
equal to the original, and its report says which form and why."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import scanopt

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models" / "heldout_linattn_onnxscript"
sys.path.insert(0, str(ROOT / "models"))  # the generator's names, feeds and float64 reference

import generate_heldout_linattn_onnxscript as gen  # noqa: E402

RULE = {"linear": "linear", "decayed": "gated", "delta": "delta", "gated_delta": "gated_delta"}


def _ops(model: onnx.ModelProto) -> Counter:
    """Ops of the graph, its bodies and its model-local functions."""
    found = Counter()
    stack = [model.graph] + [g for f in model.functions for n in f.node for a in n.attribute
                             for g in ([a.g] if a.HasField("g") else list(a.graphs))]
    found.update(n.op_type for f in model.functions for n in f.node)
    while stack:
        graph = stack.pop()
        for node in graph.node:
            found[node.op_type] += 1
            stack.extend(g for a in node.attribute for g in ([a.g] if a.HasField("g") else list(a.graphs)))
    return found


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _assert_equal_at(model, out, name: str, t: int, seeds=(0, 1, 2)) -> float:
    """Original vs ``out`` on three input sets at length ``t``: max |error| / max |original|
    per output within 1e-4; returns the worst ratio."""
    worst = 0.0
    for seed in seeds:
        feeds = gen.feeds(name, 2, t, seed=seed)
        for want, got in zip(_run(model, feeds), _run(out, feeds)):
            assert want.shape == got.shape
            worst = max(worst, float(np.max(np.abs(got - want)) / np.max(np.abs(want))))
    assert worst <= 1e-4, worst
    return worst


def test_every_model_is_listed():
    assert sorted(p.stem for p in MODELS.glob("*.onnx")) == sorted(gen.NAMES)
    for name in gen.NAMES:
        assert onnx.load(str(MODELS / f"{name}.onnx")).opset_import[0].version == 27


@pytest.mark.parametrize("name", gen.NAMES)
def test_stored_outputs_are_the_float64_recurrence(name):
    """The committed outputs (onnxruntime on the original) are the recurrence the model means."""
    stored = np.load(MODELS / f"{name}.expected.npz")
    want = gen.reference(name, {k: stored[k] for k in stored.files if k not in ("o", "state")})
    for key in ("o", "state"):
        np.testing.assert_allclose(stored[key], want[key], rtol=1e-4, atol=1e-5 * np.max(np.abs(want[key])))


@pytest.mark.parametrize("name", gen.NAMES)
def test_portable_writes_one_linear_attention_per_scan_equal_at_t1024(name):
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    out, report = scanopt.optimize(model, options={"target": "portable", "portable_runtimes": ["onnxruntime"]})
    before, after = _ops(model), _ops(out)
    assert before["Scan"] >= 1 and after["Scan"] == after["Loop"] == 0, [o.detail for o in report.outcomes]
    assert after["LinearAttention"] == before["Scan"], after
    applied = [o.detail for o in report.outcomes if o.pass_name == "linattn" and o.applied]
    assert applied and all(d.startswith(RULE[gen.split(name)[0]] + " ") for d in applied), applied
    assert report.verification["passed"] is True, report.verification
    stored = np.load(MODELS / f"{name}.expected.npz")
    feeds = {i.name: stored[i.name] for i in model.graph.input}
    for got, output in zip(_run(out, feeds), model.graph.output):
        np.testing.assert_allclose(got, stored[output.name], rtol=1e-4, atol=1e-5)
    _assert_equal_at(model, out, name, 1024)


@pytest.mark.parametrize("name", ["gated_delta_mm", "decayed_es", "delta_rs"])
def test_default_says_why_linear_attention_is_not_written_at_unknown_shapes(name):
    """T symbolic: onnxruntime runs LinearAttention through a Scan, so only a measurement can
    choose it; the default keeps a loop (hoisted, where that is modelled faster) and says so."""
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    out, report = scanopt.optimize(model)
    proposals = [o.detail for o in report.outcomes if o.pass_name == "linattn" and not o.applied]
    assert any("unmeasured" in d and "only a measurement at the model's shapes can tell" in d
               for d in proposals), proposals
    assert _ops(out)["LinearAttention"] == 0 and _ops(out)["Scan"] >= 1
    if report.modified:
        assert report.verification["passed"] is True, report.verification
    _assert_equal_at(model, out, name, 64, seeds=(0,))


@pytest.mark.parametrize("name", ["gated_delta_mm", "linear_es", "decayed_es"])
def test_default_at_declared_shapes_writes_the_form_it_measured_fastest(name):
    """At declared shapes the chooser times the loop, LinearAttention (and hoist's, linrec's
    forms); the report's tuning line gives each time and the form kept, and the written model is
    that form. decayed_es's gamma is Tile'd over the batch outside the loop: an input of the
    Scan's subgraph that is timed, known positive from the model (tune's positive_inputs)."""
    model = onnx.load(str(MODELS / f"{name}.onnx"))
    shapes = {k: list(v.shape) for k, v in gen.feeds(name, 2, 256, seed=0).items()}
    out, report = scanopt.optimize(model, input_shapes=shapes, options={"tune": True, "threads": 1})
    lines = [line for line in report.tuning if "LinearAttention" in line]
    assert len(lines) == 1 and " ms" in lines[0] and "->" in lines[0], report.tuning
    kept = lines[0].split("->")[1].split("(")[0].strip()
    assert (_ops(out)["LinearAttention"] == 1) == (kept == "LinearAttention"), (lines, _ops(out))
    losers = [o.detail for o in report.outcomes if o.pass_name == "linattn" and not o.applied]
    if kept != "LinearAttention":
        assert any("not applied" in d and "LinearAttention" in d and "measured" in d for d in losers), losers
    if report.modified:
        assert report.verification["passed"] is True, report.verification
    _assert_equal_at(model, out, name, 256, seeds=(0,))


def test_a_decay_the_callers_compute_is_taken_only_where_every_call_passes_positive_values():
    """decayed_rs hands a per-head function its gate sigmoid(f + 3) (Split, Squeeze): inside the
    function it is a plain input, whose log exists only because every caller passes a sigmoid
    output (scanopt.functions.positive_inputs). Made a Tanh, its sign is unknown: declined."""
    from scanopt.functions import positive_inputs

    model = onnx.load(str(MODELS / "decayed_rs.onnx"))
    (head,) = [f for f in model.functions if f.name == "decayed_head"]
    assert positive_inputs(model, head) == ["a"]
    (sigmoid,) = [n for n in model.graph.node if n.op_type == "Sigmoid"]
    sigmoid.op_type = "Tanh"
    assert positive_inputs(model, head) == []
    out, report = scanopt.optimize(model, options={"target": "portable", "portable_runtimes": ["onnxruntime"]}, passes=["canonicalize", "linattn"])
    reasons = [o.detail for o in report.outcomes if o.pass_name == "linattn"]
    assert _ops(out)["LinearAttention"] == 0 and any("its log is not known to exist" in r for r in reasons), reasons


def _hoisted(name: str) -> onnx.ModelProto:
    """The sample after canonicalize and hoist: the default's form when it keeps the loop, its
    body reading k as a column and as a row, and q, from scan inputs Unsqueeze(K, axis) over all
    steps (or k vᵀ itself, where no state is involved)."""
    out, _ = scanopt.optimize(onnx.load(str(MODELS / f"{name}.onnx")), passes=["canonicalize", "hoist", "cleanup"],
                              options={"target": "portable", "portable_runtimes": ["onnxruntime"]})
    return out


@pytest.mark.parametrize("name", ["linear_mm", "decayed_es", "delta_rs", "gated_delta_mm"])
def test_the_hoisted_loop_is_read_as_linear_attention_too(name):
    """After hoist (what the default keeps where LinearAttention is unmeasured or measured
    slower), linattn reads the vectors and outer products hoist computed over all steps: the
    report's reason for a loop kept is the cost, not 'not linear attention'."""
    hoisted = _hoisted(name)
    assert _ops(hoisted)["Scan"] >= 1
    out, report = scanopt.optimize(hoisted, passes=["canonicalize", "linattn"], options={"target": "portable", "portable_runtimes": ["onnxruntime"]})
    applied = [o.detail for o in report.outcomes if o.pass_name == "linattn" and o.applied]
    assert applied and all(d.startswith(RULE[gen.split(name)[0]] + " ") for d in applied), \
        [o.detail for o in report.outcomes]
    assert _ops(out)["Scan"] == 0 and report.verification["passed"] is True, report.verification
    _assert_equal_at(onnx.load(str(MODELS / f"{name}.onnx")), out, name, 1024, seeds=(0,))


def test_a_hoisted_erase_read_by_another_vector_is_not_the_delta_rule():
    """gated_delta_mm hoisted, its erase reading the state with q (Unsqueeze(Q, row) outside)
    while the write adds k vᵀ: not β k (v − Sᵀk)ᵀ, declined."""
    from onnx import helper, numpy_helper

    model = _hoisted("gated_delta_mm")
    graph = model.graph
    scan = next(n for n in graph.node if n.op_type == "Scan")
    axes = {n.output[0]: list(helper.get_attribute_value(n.attribute[0])) for n in graph.node
            if n.op_type == "Constant" and n.attribute[0].name == "value_ints"}
    axes.update({t.name: numpy_helper.to_array(t).reshape(-1).tolist() for t in graph.initializer})
    unsq = [n for n in graph.node if n.op_type == "Unsqueeze" and n.output[0] in scan.input]
    (k_row,) = [n for n in unsq if axes.get(n.input[1]) == [3] and any(
        m.input[0] == n.input[0] and axes.get(m.input[1]) == [4] for m in unsq)]
    k_row.input[0] = next(n.output[0] for n in graph.node if n.op_type == "Transpose" and n.input[0] == "q")
    out, report = scanopt.optimize(model, passes=["canonicalize", "linattn"], options={"target": "portable", "portable_runtimes": ["onnxruntime"]})
    reasons = [o.detail for o in report.outcomes if o.pass_name == "linattn"]
    assert _ops(out)["LinearAttention"] == 0 and any("another key" in r for r in reasons), reasons
