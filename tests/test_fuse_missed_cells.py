"""fuse, the cells users write that the matcher used to miss (issue 32), each built the way its
producer writes it and compared with the Scan and with the native op written by hand.

Clip as the activation (ReLU6, hardtanh): the recurrent ops' ``clip`` clips the pre-activation
to [-c, c] before the activation, so Clip(p, 0, c) = Relu(clip(p)) and Clip(p, -c, c) =
Affine(1, 0)(clip(p)) exactly; a Clip on the stacked pre-activation before the gate Split is the
clip of every gate it feeds."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import cell_builders as cb

H, I = cb.H, cb.I
AFFINE = dict(activation_alpha=[1.0], activation_beta=[0.0])


def big(seed, *shape):
    """Weights large enough that pre-activations reach past the clip bounds on normal feeds."""
    return cb.rand(seed, *shape, scale=3.0)


def _clip(b, value, lo, hi):
    bound = lambda v: b.const(np.float32(v), "bound", where="body") if v is not None else ""  # noqa: E731
    return b.op("Clip", value, bound(lo), bound(hi))


def _rnn_scan(build, opset=17):
    body = cb.Body(opset=opset)
    h_new = build(body)
    return cb.scan_model(body, [("h", h_new, H)], ys=[h_new])


# -- 1. a Clip as the activation ---------------------------------------------------------------

@pytest.mark.parametrize("lo, hi, act, clip", [
    (0.0, 6.0, "Relu", 6.0),  # ReLU6: F.relu6 / nn.Hardtanh(0, 6) export as Clip(p, 0, 6)
    (-1.0, 1.0, "Affine", 1.0),  # hardtanh
    (0.0, None, "Relu", None),  # clamp(min=0)
])
def test_clip_activation_fuses_to_the_native_activation_with_clip(lo, hi, act, clip):
    W, R, Wb, Rb = big(0, H, I), big(1, H, H), big(2, H), big(3, H)
    model = _rnn_scan(lambda b: _clip(b, b.op("Add", b.linear("x", W, Wb, form="gemm"), b.linear("h", R, Rb, form="gemm")), lo, hi))
    out = cb.check_fused(model, "RNN")
    _, attrs = cb.native(out)
    assert attrs["activations"] == [act.encode()] and attrs.get("clip") == clip
    native = cb.native_model("RNN", W, R, np.concatenate([Wb, Rb]), activations=[act],
                             **({"clip": clip} if clip is not None else {}), **(AFFINE if act == "Affine" else {}))
    cb.assert_same_as_native(out, native)
    cb.assert_same_as_native(model, native, shapes=((9, 3),))


def test_tf1_basic_rnn_cell_with_relu6_fuses():
    """TF1 ``BasicRNNCell(activation=tf.nn.relu6)`` through tf2onnx: relu6(Concat([x, h]) @ K + b),
    Relu6 written as Clip(·, 0, 6) with its bounds as Constant inputs."""
    W, R, Wb = big(0, H, I), big(1, H, H), big(2, H)
    K = np.concatenate([W.T, R.T])

    def build(b):
        pre = b.op("Add", b.op("MatMul", b.op("Concat", "x", "h", axis=1), b.const(K, "kernel")), b.const(Wb, "bias"))
        lo, hi = (b.const(np.float32(v), "relu6", where="node") for v in (0.0, 6.0))
        return b.op("Clip", pre, lo, hi)

    model = _rnn_scan(build, opset=13)
    out = cb.check_fused(model, "RNN")
    assert cb.native(out)[1]["clip"] == 6.0
    cb.assert_same_as_native(out, cb.native_model("RNN", W, R, np.concatenate([Wb, np.zeros(H)]), activations=["Relu"], clip=6.0))


def test_relu_then_clip_fuses_as_relu6():
    """onnx-tf's Relu6: Clip(Relu(p), 0, 6) = min(relu(p), 6)."""
    W, R, Wb = big(0, H, I), big(1, H, H), big(2, H)
    model = _rnn_scan(lambda b: _clip(b, b.op("Relu", b.op("Add", b.linear("x", W, Wb), b.linear("h", R))), 0.0, 6.0))
    out = cb.check_fused(model, "RNN")
    cb.assert_same_as_native(out, cb.native_model("RNN", W, R, np.concatenate([Wb, np.zeros(H)]), activations=["Relu"], clip=6.0))


@pytest.mark.parametrize("lo, hi", [(-1.0, 2.0), (0.5, 6.0), (None, 6.0)])
def test_asymmetric_clip_activation_is_declined(lo, hi):
    W, R = big(0, H, I), big(1, H, H)
    reason = cb.declined(_rnn_scan(lambda b: _clip(b, b.op("Add", b.linear("x", W), b.linear("h", R)), lo, hi)))
    assert f"is Clip(·, {lo}, {hi}): the recurrent ops clip the pre-activation to a symmetric [-c, c]" in reason


def test_hardtanh_gru_candidate_with_unclipped_gates_is_declined():
    """clip applies to every gate: a hardtanh candidate beside unclipped sigmoid gates is no GRU clip."""
    body = cb.Body()
    h_new = cb.gru(body, "x", "h", acts=("Sigmoid", "Clip"), act_attrs=({}, {}))
    # the builder's "Clip" candidate has no bounds; give it ±1
    clip = next(n for n in body.nodes if n.op_type == "Clip")
    clip.input.extend([body.const(np.float32(-1.0), "lo", where="body"), body.const(np.float32(1.0), "hi", where="body")])
    reason = cb.declined(cb.scan_model(body, [("h", h_new, H)], ys=[h_new]))
    assert "clips differ across the gates (z None, r None, h̃ 1.0)" in reason


# -- 2. a Clip on the stacked pre-activation, before the gate Split ----------------------------

def _clipped_lstm(c, *, order="torch", unclipped=()):
    """PyTorch-style LSTM cell with ``gates = clamp(x·Wᵀ + h·Rᵀ + b, -c, c)`` split into i, f, g, o;
    gates named in ``unclipped`` read the Split of the unclipped sum instead. Returns the model
    and the native LSTM (ONNX order i, o, f, c) with the same weights."""
    W, R, Wb, Rb = big(0, 4 * H, I), big(1, 4 * H, H), big(2, 4 * H), big(3, 4 * H)
    names = ["i", "f", "c", "o"] if order == "torch" else ["i", "o", "f", "c"]
    onnx_order = ["i", "o", "f", "c"]
    rows = lambda a, g: a[onnx_order.index(g) * H:(onnx_order.index(g) + 1) * H]  # noqa: E731
    stack = lambda a: np.concatenate([rows(a, g) for g in names])  # noqa: E731
    body = cb.Body()
    pre = body.op("Add", body.linear("x", stack(W), stack(Wb), form="gemm"), body.linear("h", stack(R), stack(Rb), form="gemm"))
    clipped = dict(zip(names, body.split(_clip(body, pre, -c, c), 4)))
    if unclipped:
        raw = dict(zip(names, body.split(pre, 4)))
        clipped.update({g: raw[g] for g in unclipped})
    i, f, o = (body.op("Sigmoid", clipped[g]) for g in "ifo")
    g = body.op("Tanh", clipped["c"])
    c_new = body.op("Add", body.op("Mul", f, "c"), body.op("Mul", i, g))
    h_new = body.op("Mul", o, body.op("Tanh", c_new))
    model = cb.scan_model(body, [("h", h_new, H), ("c", c_new, H)], ys=[h_new])
    native = cb.native_model("LSTM", W, R, np.concatenate([Wb, Rb]), clip=c)
    return model, native


@pytest.mark.parametrize("order", ["torch", "onnx"])
def test_clip_before_the_gate_split_is_the_lstm_clip(order):
    model, native = _clipped_lstm(2.5, order=order)
    out = cb.check_fused(model, "LSTM")
    assert cb.native(out)[1]["clip"] == 2.5
    cb.assert_same_as_native(out, native)
    cb.assert_same_as_native(model, native, shapes=((9, 3),))


def test_clip_before_the_split_read_by_some_gates_only_is_declined():
    model, _ = _clipped_lstm(2.5, unclipped=("o",))
    assert "clips differ across the gates; LSTM clips all or none" in cb.declined(model)


def test_asymmetric_clip_before_the_gate_split_is_declined():
    body = cb.Body()
    pre = body.op("Add", body.linear("x", big(0, 3 * H, I)), body.linear("h", big(1, 3 * H, H)))
    a, g, o = body.split(_clip(body, pre, -1.0, 3.0), 3)
    c_new = body.op("Add", body.op("Mul", body.op("Sigmoid", a), "c"), body.op("Mul", body.op("Sigmoid", a), body.op("Tanh", g)))
    h_new = body.op("Mul", body.op("Sigmoid", o), body.op("Tanh", c_new))
    reason = cb.declined(cb.scan_model(body, [("h", h_new, H), ("c", c_new, H)], ys=[h_new]))
    assert "bounds [-1.0, 3.0] are not a symmetric ±c (the clip attribute)" in reason


# -- 3. gate weights stacked on a leading gate axis ---------------------------------------------

def _stacked_cell(kind, read="gather", batch=True, bias_rows=True):
    """A PyTorch module holding W [G, H, I], R [G, H, H] (gate order z, r, n for GRU; i, f, g, o
    for LSTM) and biases [G, H]: ``gx = x @ W.transpose(1, 2) + bx[:, None]`` (a [G, B, H] stack),
    read per gate as ``gx[k]`` (Gather, ``read="gather"``) or ``gx.unbind(0)`` (Split on axis 0 +
    Squeeze). Returns the Scan model and the native op with the same weights."""
    G = 3 if kind == "GRU" else 4
    W, R, Wb, Rb = cb.rand(0, G, H, I), cb.rand(1, G, H, H), cb.rand(2, G, H), cb.rand(3, G, H)
    b = cb.Body(batch=batch)
    ints = lambda v: b.const(np.asarray(v, np.int64), "idx", where="body")  # noqa: E731

    def stack(src, w, bias):
        prod = b.op("MatMul", src, b.op("Transpose", b.const(w, "stacked_w"), perm=[0, 2, 1]))
        return b.op("Add", prod, b.const(bias[:, None, :] if batch and bias_rows else bias, "stacked_b"))

    def gates(value):
        if read == "gather":
            return [b.op("Gather", value, ints(k), axis=0) for k in range(G)]
        parts = b.op("Split", value, ints([1] * G), outputs=G, axis=0)
        return [b.op("Squeeze", p, ints([0])) for p in parts]

    xg, hg = gates(stack("x", W, Wb)), gates(stack("h", R, Rb))
    if kind == "GRU":
        z = b.op("Sigmoid", b.op("Add", xg[0], hg[0]))
        r = b.op("Sigmoid", b.op("Add", xg[1], hg[1]))
        n = b.op("Tanh", b.op("Add", xg[2], b.op("Mul", r, hg[2])))
        one = b.const(np.float32(1.0), "one", where="body")
        h_new = b.op("Add", b.op("Mul", b.op("Sub", one, z), n), b.op("Mul", z, "h"))
        model = cb.scan_model(b, [("h", h_new, H)], ys=[h_new])
        flat = lambda a, n: a.reshape(G * H, n)  # noqa: E731
        return model, cb.native_model("GRU", flat(W, I), flat(R, H), np.concatenate([Wb.reshape(-1), Rb.reshape(-1)]),
                                      linear_before_reset=1)
    i, f, g, o = (b.op(a, b.op("Add", xg[k], hg[k])) for k, a in enumerate(["Sigmoid", "Sigmoid", "Tanh", "Sigmoid"]))
    c_new = b.op("Add", b.op("Mul", f, "c"), b.op("Mul", i, g))
    h_new = b.op("Mul", o, b.op("Tanh", c_new))
    model = cb.scan_model(b, [("h", h_new, H), ("c", c_new, H)], ys=[h_new])
    onnx_order = [0, 3, 1, 2]  # i, o, f, c from i, f, g, o
    flat = lambda a, n: a[onnx_order].reshape(G * H, n)  # noqa: E731
    return model, cb.native_model("LSTM", flat(W, I), flat(R, H),
                                  np.concatenate([Wb[onnx_order].reshape(-1), Rb[onnx_order].reshape(-1)]))


@pytest.mark.parametrize("kind", ["GRU", "LSTM"])
@pytest.mark.parametrize("read", ["gather", "split"])
def test_gate_weights_stacked_on_a_leading_axis_fuse(kind, read):
    model, native = _stacked_cell(kind, read)
    out = cb.check_fused(model, kind)
    cb.assert_same_as_native(out, native)
    cb.assert_same_as_native(model, native, shapes=((9, 3),))


@pytest.mark.parametrize("read", ["gather", "split"])
def test_stacked_gates_in_a_body_without_batch_axis_fuse(read):
    """x [I] @ W [G, I, H] is a [G, H] stack; its biases [G, H] have the stack's rank."""
    model, _ = _stacked_cell("GRU", read, batch=False)
    cb.check_fused(model, "GRU")


def test_a_stack_read_along_another_axis_is_declined():
    """Gather on axis 1 of the [G, B, H] stack picks a batch row, not a gate: no cell."""
    model, _ = _stacked_cell("GRU")
    for node in model.graph.node[0].attribute[0].g.node:
        if node.op_type == "Gather":
            node.attribute[0].i = 1
    reason = cb.declined(model)
    assert "(Gather output)" in reason


def test_gates_picked_from_a_stack_of_activations_fuse():
    """``g = sigmoid(gx + gh); z, r = g[0], g[1]``: entry k of an activated stack is the activation
    of entry k (elementwise), so each gate reads its own pre-activation."""
    W, R, Wb = cb.rand(0, 3, H, I), cb.rand(1, 3, H, H), cb.rand(2, 3, H)
    b = cb.Body()
    idx = lambda k: b.const(np.int64(k), "k", where="body")  # noqa: E731
    tw = lambda w: b.op("Transpose", b.const(w, "stacked_w"), perm=[0, 2, 1])  # noqa: E731
    gx = b.op("Add", b.op("MatMul", "x", tw(W[:2])), b.const(Wb[:2, None, :], "bx"))
    zr = b.op("Sigmoid", b.op("Add", gx, b.op("MatMul", "h", tw(R[:2]))))
    z, r = (b.op("Gather", zr, idx(k), axis=0) for k in range(2))
    n = b.op("Tanh", b.op("Add", b.linear("x", W[2], Wb[2]), b.op("Mul", r, b.linear("h", R[2]))))
    one = b.const(np.float32(1.0), "one", where="body")
    h_new = b.op("Add", b.op("Mul", b.op("Sub", one, z), n), b.op("Mul", z, "h"))
    out = cb.check_fused(cb.scan_model(b, [("h", h_new, H)], ys=[h_new]), "GRU")
    native = cb.native_model("GRU", W.reshape(3 * H, I), R.reshape(3 * H, H),
                             np.concatenate([Wb.reshape(-1), np.zeros(3 * H)]), linear_before_reset=1)
    cb.assert_same_as_native(out, native)


# -- 4. onnxscript's ``1 - z``: Sub(CastLike(1, z), z) ----------------------------------------------

def _onnxscript_gru(one):
    """A GRU cell as onnxscript writes it: Python literals become Constant nodes cast to the
    other operand's type, ``(1 - z) * n + z * h`` is ``Sub(CastLike(Constant(1), z), z)``."""
    from onnx import helper as oh

    b = cb.Body(opset=19)
    h_new = cb.gru(b, "x", "h", lbr=1, form="gemm")
    sub = next(n for n in b.nodes if n.op_type == "Sub")
    literal = b._name("const")
    value = oh.make_tensor(literal, *((7, [], [1]) if one == "int" else (1, [], [1.0])))  # INT64 / FLOAT scalar
    b.nodes.insert(0, oh.make_node("Constant", [], [literal], value=value))
    cast = b._name("castlike")
    b.nodes.insert(b.nodes.index(sub), oh.make_node("CastLike", [literal, sub.input[1]], [cast]))
    sub.input[0] = cast
    return cb.scan_model(b, [("h", h_new, H)], ys=[h_new])


@pytest.mark.parametrize("one", ["int", "float"])
def test_onnxscript_castlike_one_minus_z_fuses(one):
    cb.check_fused(_onnxscript_gru(one), "GRU")


def test_castlike_to_a_value_of_unknown_dtype_stays_opaque():
    """The target's dtype must be known (declared, a constant's, or kept from a declared input) to
    fold the cast: a CastLike like the output of an op fuse does not follow (Erf) stays a leaf, and the
    update is no GRU update."""
    model = _onnxscript_gru("float")
    body = model.graph.node[0].attribute[0].g
    cast = next(n for n in body.node if n.op_type == "CastLike")
    # cast like the output of an op whose dtype the fuse algebra does not follow
    body.node.insert(list(body.node).index(cast), onnx.helper.make_node("Erf", ["h"], ["erf_h"]))
    cast.input[1] = "erf_h"
    reason = cb.declined(model)
    assert "the new state expands to 'castlike_" in reason and "nor (1-z)⊙h̃ + z⊙h (GRU)" in reason
