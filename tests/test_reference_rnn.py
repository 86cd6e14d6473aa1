"""scanopt.reference.rnn: differential tests against onnxruntime 1.31, plus independent numpy loops.

onnxruntime is the oracle wherever it follows the spec. It has no layout=1 kernels, so layout 1 is
checked against onnxruntime's layout-0 result on transposed tensors. Where onnxruntime departs
from the spec (Affine / ThresholdedRelu defaults, ThresholdedRelu at x == alpha) the expected values
come from the formulas instead, and the drawn cases give those activations explicit parameters.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import helper
from onnx.reference import ReferenceEvaluator

from scanopt.reference.rnn import RECURRENT_OPS

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
ACTS_PER_DIR = {"RNN": 1, "GRU": 2, "LSTM": 3}
INPUTS = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
OUTPUTS = ["Y", "Y_h", "Y_c"]
ACTIVATIONS = ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh",
               "HardSigmoid", "Elu", "Softsign", "Softplus"]
# Functions a GRU/LSTM gate (f) may draw in random cases: bounded, so the state cannot blow up.
BOUNDED = ["Tanh", "Sigmoid", "ScaledTanh", "HardSigmoid", "Softsign"]
USES_ALPHA = {"Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid", "Elu"}
USES_BETA = {"Affine", "ScaledTanh", "HardSigmoid"}
# onnxruntime defaults alpha to 0 for these, the spec to 1 (tested in test_spec_defaults_*).
ORT_ALPHA_DEFAULT_DIFFERS = {"Affine", "ThresholdedRelu"}
TOL = dict(rtol=1e-5, atol=1e-5)


def make_model(op, feeds, outputs, opset=22, **attrs):
    """One-node model. Inputs missing from ``feeds`` and outputs missing from ``outputs`` get
    empty names; trailing empty names are dropped, so both optional-argument forms occur."""
    ins = [n if n in feeds else "" for n in INPUTS[: 8 if op == "LSTM" else 6]]
    outs = [n if n in outputs else "" for n in OUTPUTS[: 3 if op == "LSTM" else 2]]
    while ins[-1] == "":
        ins.pop()
    while outs[-1] == "":
        outs.pop()
    elem = helper.np_dtype_to_tensor_dtype(feeds["X"].dtype)
    graph = helper.make_graph(
        [helper.make_node(op, ins, outs, **attrs)], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype), None)
         for n in ins if n],
        [helper.make_tensor_value_info(n, elem, None) for n in outs if n])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def run_ref(model, feeds):
    names = [o.name for o in model.graph.output]
    return dict(zip(names, ReferenceEvaluator(model, new_ops=RECURRENT_OPS).run(None, feeds)))


def run_ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def random_feeds(op, rng, T, B, I, H, num_dir, present, lens=None, dtype=np.float32):
    """Layout-0 tensors for the inputs named in ``present`` (X, W, R always)."""
    g = GATES[op]
    shapes = {"X": (T, B, I), "W": (num_dir, g * H, I), "R": (num_dir, g * H, H),
              "B": (num_dir, 2 * g * H), "initial_h": (num_dir, B, H),
              "initial_c": (num_dir, B, H), "P": (num_dir, 3 * H)}
    feeds = {n: rng.uniform(-1, 1, s).astype(dtype) for n, s in shapes.items()
             if n in ("X", "W", "R") or (n in present and n in INPUTS[: 8 if op == "LSTM" else 6])}
    if "sequence_lens" in present:
        feeds["sequence_lens"] = np.asarray(lens, np.int32)
    return feeds


def to_layout1(feeds):
    """Layout-0 feeds -> layout-1 feeds: X [B, T, I], initial states [B, D, H]."""
    out = dict(feeds)
    for n in ("X", "initial_h", "initial_c"):
        if n in out:
            out[n] = np.ascontiguousarray(np.swapaxes(out[n], 0, 1))
    return out


def results_to_layout1(results):
    """Layout-0 outputs -> layout-1: Y [B, T, D, H], Y_h / Y_c [B, D, H]."""
    return {n: v.transpose(2, 0, 1, 3) if n == "Y" else v.transpose(1, 0, 2)
            for n, v in results.items()}


def check_against_ort(op, feeds, outputs, opset=22, layout=0, **attrs):
    """Run the reference in ``layout`` and onnxruntime in layout 0; compare every output."""
    expected = run_ort(make_model(op, feeds, outputs, opset, **attrs), feeds)
    if layout == 1:
        feeds, expected = to_layout1(feeds), results_to_layout1(expected)
        attrs["layout"] = 1
    got = run_ref(make_model(op, feeds, outputs, opset, **attrs), feeds)
    assert got.keys() == expected.keys()
    for name, want in expected.items():
        assert got[name].dtype == want.dtype
        # float32 rounding error scales with the values, which unbounded activations (Relu,
        # Affine, Softplus, ...) push above 1; so atol is relative to the output's largest value.
        atol = TOL["atol"] * max(1.0, float(np.abs(want).max(initial=0)))
        np.testing.assert_allclose(got[name], want, rtol=TOL["rtol"], atol=atol, err_msg=name)
    return got


# --- differential, random ------------------------------------------------------------------------


@st.composite
def activation_attrs(draw, op, num_dir):
    """Random activations (per direction: forward's then reverse's) with alpha/beta lists.

    Gate functions (GRU/LSTM f) are bounded: an unbounded gate makes the state grow doubly
    exponentially and overflow float32 within a few steps. A list may be shorter than the number
    of functions taking the parameter (the rest use the defaults), but never so short that
    Affine/ThresholdedRelu falls back to its alpha default, where onnxruntime departs from the spec.
    """
    slots = [ACTIVATIONS] if op == "RNN" else [BOUNDED] + [ACTIVATIONS] * (ACTS_PER_DIR[op] - 1)
    names = [draw(st.sampled_from(choices)) for choices in slots * num_dir]
    users = [n for n in names if n in USES_ALPHA]
    need = max((k + 1 for k, n in enumerate(users) if n in ORT_ALPHA_DEFAULT_DIFFERS), default=0)
    value = st.floats(-1.5, 1.5, width=32)
    n_alpha = draw(st.integers(need, len(users)))
    n_beta = draw(st.integers(0, sum(n in USES_BETA for n in names)))
    attrs = {"activations": names}
    if n_alpha:
        attrs["activation_alpha"] = draw(st.lists(value, min_size=n_alpha, max_size=n_alpha))
    if n_beta:
        attrs["activation_beta"] = draw(st.lists(value, min_size=n_beta, max_size=n_beta))
    return attrs


@st.composite
def cases(draw, op):
    opset = draw(st.sampled_from([7, 14, 22]))
    layout = draw(st.sampled_from([0, 1])) if opset >= 14 else 0
    direction = draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    num_dir = 2 if direction == "bidirectional" else 1
    T, B, I, H = (draw(st.integers(1, n)) for n in (5, 3, 4, 4))
    optional = ["B", "sequence_lens", "initial_h"] + (["initial_c", "P"] if op == "LSTM" else [])
    present = draw(st.sets(st.sampled_from(optional)))
    lens = draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
    if op == "LSTM" and max(lens) == 0:
        lens[0] = 1  # onnxruntime's LSTM leaves Y_c uninitialized when no item takes a step
    outputs = draw(st.sets(st.sampled_from(OUTPUTS[: 3 if op == "LSTM" else 2]), min_size=1))
    attrs = {"direction": direction, "hidden_size": H}
    if draw(st.booleans()):
        attrs.update(draw(activation_attrs(op, num_dir)))
    if draw(st.booleans()):
        attrs["clip"] = clip = draw(st.floats(0.125, 3.0, width=32))
        # A clipped input equal to ThresholdedRelu's alpha hits the spec/onnxruntime >= vs > split.
        assume(clip not in np.abs(attrs.get("activation_alpha", [])))
    if op == "GRU":
        attrs["linear_before_reset"] = draw(st.sampled_from([0, 1]))
    if op == "LSTM":
        attrs["input_forget"] = draw(st.sampled_from([0, 1]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    feeds = random_feeds(op, rng, T, B, I, H, num_dir, present, lens)
    return feeds, outputs, opset, layout, attrs


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_random_against_onnxruntime(op, data):
    feeds, outputs, opset, layout, attrs = data.draw(cases(op))
    check_against_ort(op, feeds, outputs, opset, layout, **attrs)


# --- differential, systematic --------------------------------------------------------------------

RICH_ATTRS = {  # non-default activations with parameters in every slot, for both directions
    "RNN": dict(activations=["LeakyRelu", "HardSigmoid"], activation_alpha=[0.3, 0.4],
                activation_beta=[0.6]),
    "GRU": dict(activations=["HardSigmoid", "Elu", "Sigmoid", "ScaledTanh"],
                activation_alpha=[0.3, 0.8, 1.1], activation_beta=[0.45, 0.9],
                linear_before_reset=1),
    "LSTM": dict(activations=["HardSigmoid", "Softsign", "ScaledTanh",
                              "Sigmoid", "Affine", "Tanh"],
                 activation_alpha=[0.25, 1.2, 0.7], activation_beta=[0.5, 0.8, 0.1]),
}


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("with_lens", [False, True])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_grid_against_onnxruntime(op, direction, with_lens, layout):
    """Every direction x sequence_lens x layout, with all optional inputs, clip and activations
    that differ per direction (bidirectional lists are forward's then reverse's)."""
    num_dir = 2 if direction == "bidirectional" else 1
    optional = {"B", "initial_h", "initial_c", "P"} | ({"sequence_lens"} if with_lens else set())
    feeds = random_feeds(op, np.random.default_rng(7), 5, 4, 3, 3, num_dir, optional,
                         lens=[3, 5, 0, 1])
    attrs = dict(RICH_ATTRS[op])
    if num_dir == 1:  # keep the first direction's functions
        attrs["activations"] = attrs["activations"][: ACTS_PER_DIR[op]]
    check_against_ort(op, feeds, set(OUTPUTS), 22, layout, direction=direction, hidden_size=3,
                      clip=0.9, **attrs)


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_each_activation_against_onnxruntime(op, name):
    """Each function in every slot of a bidirectional op, with explicit alpha/beta values."""
    acts = [name] * (2 * ACTS_PER_DIR[op])
    feeds = random_feeds(op, np.random.default_rng(3), 4, 3, 2, 3, 2,
                         {"B", "initial_h", "sequence_lens"}, lens=[4, 2, 3])
    check_against_ort(op, feeds, set(OUTPUTS), direction="bidirectional", hidden_size=3,
                      activations=acts, activation_alpha=[0.5, 0.7, 0.9, 0.2, 0.3, 0.4],
                      activation_beta=[0.4, 0.6, 0.1, 0.2, 0.8, 0.3])


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_zero_length_items_end_in_zero_state(op, direction):
    """Spec silent: an item with sequence_lens 0 gets Y = 0 and Y_h = Y_c = 0 (not initial_h), as
    onnxruntime returns."""
    num_dir = 2 if direction == "bidirectional" else 1
    feeds = random_feeds(op, np.random.default_rng(5), 3, 3, 2, 2, num_dir,
                         {"sequence_lens", "initial_h", "initial_c"}, lens=[2, 0, 3])
    got = check_against_ort(op, feeds, set(OUTPUTS), direction=direction, hidden_size=2)
    assert not got["Y"][:, :, 1].any() and not got["Y_h"][:, 1].any()
    assert got["Y_h"][:, 0].any()


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_zero_length_sequence(op):
    """seq_length 0: empty Y and zero final states. onnxruntime's RNN agrees; its GRU aborts the
    process and its LSTM returns uninitialized memory in Y_c, so they are not asked."""
    feeds = random_feeds(op, np.random.default_rng(0), 0, 2, 3, 2, 1, {"initial_h", "initial_c"})
    outputs = set(OUTPUTS)
    got = run_ref(make_model(op, feeds, outputs, hidden_size=2), feeds)
    assert got["Y"].shape == (0, 1, 2, 2)
    assert all(v.shape == (1, 2, 2) and not v.any() for n, v in got.items() if n != "Y")
    if op == "RNN":
        check_against_ort(op, feeds, outputs, hidden_size=2)


# --- against the formulas, where onnxruntime is not the oracle -----------------------------------


def scalar_rnn(xs, **attrs):
    """1x1 RNN with W = R = 1 on a sequence of scalars (one batch item): Ht = f(xt + Ht-1)."""
    feeds = {"X": np.array(xs, np.float32).reshape(-1, 1, 1),
             "W": np.ones((1, 1, 1), np.float32), "R": np.ones((1, 1, 1), np.float32)}
    return run_ref(make_model("RNN", feeds, {"Y"}, hidden_size=1, **attrs), feeds)["Y"].ravel()


def test_spec_defaults_affine():
    """Affine defaults to alpha=1, beta=0 (the ONNX Affine op; onnxruntime uses 0, 0)."""
    np.testing.assert_allclose(scalar_rnn([1, 2, 3], activations=["Affine"]), [1, 3, 6])
    np.testing.assert_allclose(scalar_rnn([1, 2], activations=["Affine"],
                                          activation_alpha=[2.0], activation_beta=[0.5]),
                               [2.5, 9.5])


def test_spec_defaults_thresholded_relu():
    """ThresholdedRelu: alpha defaults to 1 (onnxruntime: 0) and keeps x == alpha (spec's
    x >= alpha; onnxruntime uses x > alpha)."""
    np.testing.assert_allclose(scalar_rnn([0.5, 0.5], activations=["ThresholdedRelu"]), [0, 0])
    np.testing.assert_allclose(scalar_rnn([1.0, -1.0], activations=["ThresholdedRelu"]), [1, 0])
    np.testing.assert_allclose(scalar_rnn([0.25, 0.5], activations=["ThresholdedRelu"],
                                          activation_alpha=[0.5]), [0, 0.5])


def test_alpha_consumed_only_by_functions_that_take_it():
    """Bidirectional [Tanh, LeakyRelu] with alpha [0.3]: the reverse LeakyRelu takes 0.3."""
    feeds = {"X": np.array([[[-2.0]]], np.float32), "W": np.ones((2, 1, 1), np.float32),
             "R": np.zeros((2, 1, 1), np.float32)}
    model = make_model("RNN", feeds, {"Y"}, direction="bidirectional", hidden_size=1,
                       activations=["Tanh", "LeakyRelu"], activation_alpha=[0.3])
    np.testing.assert_allclose(run_ref(model, feeds)["Y"].ravel(), [np.tanh(-2.0), -0.6], rtol=1e-6)


def test_reverse_starts_at_each_items_last_valid_position():
    """Running sum (Affine, W = R = 1): item 0 has length 2 and reads positions 1 then 0."""
    feeds = {"X": np.array([[[1.0], [1.0]], [[2.0], [1.0]], [[100.0], [1.0]]], np.float32),
             "W": np.ones((1, 1, 1), np.float32), "R": np.ones((1, 1, 1), np.float32),
             "sequence_lens": np.array([2, 3], np.int32)}
    model = make_model("RNN", feeds, {"Y", "Y_h"}, direction="reverse", hidden_size=1,
                       activations=["Affine"])
    got = run_ref(model, feeds)
    np.testing.assert_array_equal(got["Y"][:, 0, :, 0], [[3, 3], [2, 2], [0, 1]])
    np.testing.assert_array_equal(got["Y_h"][0, :, 0], [3, 3])


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def loop_gru(X, W, R, Bias, h0, linear_before_reset):
    """Forward GRU written from the spec equations, one item and one step at a time."""
    H = R.shape[-1]
    Wz, Wr, Wh = W[:H], W[H:2 * H], W[2 * H:]
    Rz, Rr, Rh = R[:H], R[H:2 * H], R[2 * H:]
    Wbz, Wbr, Wbh, Rbz, Rbr, Rbh = (Bias[k * H:(k + 1) * H] for k in range(6))
    Y = np.zeros((X.shape[0], X.shape[1], H))
    for b in range(X.shape[1]):
        h = h0[b]
        for t in range(X.shape[0]):
            x = X[t, b]
            z = sigmoid(Wz @ x + Rz @ h + Wbz + Rbz)
            r = sigmoid(Wr @ x + Rr @ h + Wbr + Rbr)
            if linear_before_reset:
                cand = np.tanh(Wh @ x + r * (Rh @ h + Rbh) + Wbh)
            else:
                cand = np.tanh(Wh @ x + Rh @ (r * h) + Rbh + Wbh)
            h = (1 - z) * cand + z * h
            Y[t, b] = h
    return Y


def test_gru_linear_before_reset_matches_the_spec_equations():
    rng = np.random.default_rng(11)
    feeds = random_feeds("GRU", rng, 4, 2, 3, 3, 1, {"B", "initial_h"})
    args = (feeds["X"].astype(np.float64), feeds["W"][0], feeds["R"][0], feeds["B"][0],
            feeds["initial_h"][0])
    ys = {}
    for lbr in (0, 1):
        model = make_model("GRU", feeds, {"Y"}, hidden_size=3, linear_before_reset=lbr)
        ys[lbr] = run_ref(model, feeds)["Y"][:, 0]
        np.testing.assert_allclose(ys[lbr], loop_gru(*args, lbr), **TOL)
    assert np.abs(ys[0] - ys[1]).max() > 1e-3  # the two variants are told apart


def loop_lstm(X, W, R, Bias, P, h0, c0, output_peephole_sees_new_cell=True):
    """Forward LSTM written from the spec equations, one item and one step at a time."""
    H = R.shape[-1]
    gate = {k: slice(j * H, (j + 1) * H) for j, k in enumerate("iofc")}
    Pi, Po, Pf = P[:H], P[H:2 * H], P[2 * H:]
    Y = np.zeros((X.shape[0], X.shape[1], H))
    for b in range(X.shape[1]):
        h, c = h0[b], c0[b]
        for t in range(X.shape[0]):
            pre = W @ X[t, b] + R @ h + Bias[:4 * H] + Bias[4 * H:]
            i = sigmoid(pre[gate["i"]] + Pi * c)
            f = sigmoid(pre[gate["f"]] + Pf * c)
            c_new = f * c + i * np.tanh(pre[gate["c"]])
            o = sigmoid(pre[gate["o"]] + Po * (c_new if output_peephole_sees_new_cell else c))
            h, c = o * np.tanh(c_new), c_new
            Y[t, b] = h
    return Y


def test_lstm_output_peephole_uses_the_new_cell_state():
    rng = np.random.default_rng(12)
    feeds = random_feeds("LSTM", rng, 4, 2, 3, 3, 1, {"B", "P", "initial_h", "initial_c"})
    feeds["P"] *= 3  # large peepholes so the o-gate's cell input is visible in Y
    args = [feeds[n][0] for n in ("W", "R", "B", "P", "initial_h", "initial_c")]
    got = run_ref(make_model("LSTM", feeds, {"Y"}, hidden_size=3), feeds)["Y"][:, 0]
    np.testing.assert_allclose(got, loop_lstm(feeds["X"].astype(np.float64), *args), **TOL)
    old_cell = loop_lstm(feeds["X"].astype(np.float64), *args, output_peephole_sees_new_cell=False)
    assert np.abs(got - old_cell).max() > 1e-3


# --- dtypes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_other_float_types_keep_their_dtype(op, dtype):
    """onnxruntime has no float64/float16 CPU kernels; compare with the float32 result."""
    feeds32 = random_feeds(op, np.random.default_rng(4), 3, 2, 3, 2, 2,
                           {"B", "initial_h", "sequence_lens"}, lens=[3, 1])
    feeds = {n: v if n == "sequence_lens" else v.astype(dtype) for n, v in feeds32.items()}
    attrs = dict(direction="bidirectional", hidden_size=2)
    want = run_ref(make_model(op, feeds32, {"Y", "Y_h"}, **attrs), feeds32)
    got = run_ref(make_model(op, feeds, {"Y", "Y_h"}, **attrs), feeds)
    tol = 1e-5 if dtype == np.float64 else 2e-3
    for name in want:
        assert got[name].dtype == dtype
        np.testing.assert_allclose(got[name].astype(np.float32), want[name], rtol=tol, atol=tol)
