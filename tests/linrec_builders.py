"""Hand-written ONNX Scans computing linear recurrences, the shapes people write them in.

Shared by the tests and by ``models/linrec/generate.py`` (the committed samples). Each builder
returns a Scan-9+ model; sizes are arguments so benchmarks can scale them.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h

import builders as b


def _scan_model(nodes, body_in, body_out, outer_in, outer_out, inits, opset=17, **attrs):
    body = h.make_graph(nodes, "body", body_in, body_out)
    scan = h.make_node("Scan", attrs.pop("scan_inputs"), [o.name for o in outer_out], body=body, **attrs)
    graph = h.make_graph([scan], "g", list(outer_in), outer_out, initializer=inits)
    return b.model(graph, opset=opset)


def _rng(seed):
    return np.random.default_rng(seed)


def symbolic_steps(model: onnx.ModelProto) -> onnx.ModelProto:
    """Axis 0 of every graph input and output of rank >= 2 made the symbolic dim 'T' (the
    Scan-9 builders' sequence axis), so a zero-length sequence is an input the model accepts."""
    for value in list(model.graph.input) + list(model.graph.output):
        dims = value.type.tensor_type.shape.dim
        if len(dims) >= 2:
            dims[0].ClearField("dim_value")
            dims[0].dim_param = "T"
    return model


def running_sum(T=64, H=8, B=None, reverse=False, opset=17):
    """h' = h + x (a = 1): the states is the running sum; outputs h' each step."""
    shape = [H] if B is None else [B, H]
    nodes = [h.make_node("Add", ["h", "x"], ["h_new"]), h.make_node("Identity", ["h_new"], ["y"])]
    return _scan_model(nodes, [b.vi("h", shape), b.vi("x", shape)], [b.vi("h_new", shape), b.vi("y", shape)],
                       [b.vi("h0", shape), b.vi("X", [T] + shape)], [b.vi("hT", shape), b.vi("Y", [T] + shape)], [],
                       opset=opset, num_scan_inputs=1, scan_inputs=["h0", "X"],
                       **({"scan_input_directions": [1], "scan_output_directions": [1]} if reverse else {}))


def ema(T=64, H=8, seed=0, opset=17):
    """Learned decay: a = Sigmoid(w) per channel, h' = a ⊙ h + (1 - a) ⊙ x."""
    w = _rng(seed).normal(size=[H]).astype(np.float32)
    nodes = [
        h.make_node("Sigmoid", ["w"], ["a"]),
        h.make_node("Sub", ["one", "a"], ["one_minus_a"]),
        h.make_node("Mul", ["a", "h"], ["ah"]),
        h.make_node("Mul", ["one_minus_a", "x"], ["bx"]),
        h.make_node("Add", ["ah", "bx"], ["h_new"]),
        h.make_node("Identity", ["h_new"], ["y"]),
    ]
    return _scan_model(nodes, [b.vi("h", [H]), b.vi("x", [H])], [b.vi("h_new", [H]), b.vi("y", [H])],
                       [b.vi("h0", [H]), b.vi("X", [T, H])], [b.vi("hT", [H]), b.vi("Y", [T, H])],
                       [b.init("w", w), b.init("one", np.ones([], np.float32))], opset=opset,
                       num_scan_inputs=1, scan_inputs=["h0", "X"])


def mingru(T=64, I=16, H=16, B=1, seed=0, opset=17):
    """minGRU: z = σ(x W_z), h̃ = x W_h, h' = (1 - z) ⊙ h + z ⊙ h̃; outputs h'."""
    r = _rng(seed)
    wz = (r.normal(size=[I, H]) / np.sqrt(I)).astype(np.float32)
    wh = (r.normal(size=[I, H]) / np.sqrt(I)).astype(np.float32)
    nodes = [
        h.make_node("MatMul", ["x", "Wz"], ["zl"]), h.make_node("Sigmoid", ["zl"], ["z"]),
        h.make_node("MatMul", ["x", "Wh"], ["ht"]),
        h.make_node("Sub", ["one", "z"], ["keep"]),
        h.make_node("Mul", ["keep", "h"], ["kh"]), h.make_node("Mul", ["z", "ht"], ["zh"]),
        h.make_node("Add", ["kh", "zh"], ["h_new"]), h.make_node("Identity", ["h_new"], ["y"]),
    ]
    return _scan_model(nodes, [b.vi("h", [B, H]), b.vi("x", [B, I])], [b.vi("h_new", [B, H]), b.vi("y", [B, H])],
                       [b.vi("h0", [B, H]), b.vi("X", [T, B, I])], [b.vi("hT", [B, H]), b.vi("Y", [T, B, H])],
                       [b.init("Wz", wz), b.init("Wh", wh), b.init("one", np.ones([], np.float32))], opset=opset,
                       num_scan_inputs=1, scan_inputs=["h0", "X"])


def mamba(T=64, B=1, D=8, N=4, seed=0, opset=17):
    """Selective scan, state [B, D, N]: a = Exp(Δ ⊗ A) with A = -Exp(A_log) < 0,
    b = (Δ ⊙ x) ⊗ B_t, h' = a ⊙ h + b, y = Σ_n h' ⊙ C_t. Per step x, Δ [B, D], B_t, C_t [B, N]."""
    a_log = np.log(np.arange(1, N + 1, dtype=np.float32))[None, :].repeat(D, 0)
    nodes = [
        h.make_node("Exp", ["A_log"], ["A_pos"]), h.make_node("Neg", ["A_pos"], ["A"]),
        h.make_node("Softplus", ["dl"], ["delta"]),
        h.make_node("Unsqueeze", ["delta", "ax_last"], ["delta3"]),
        h.make_node("Mul", ["delta3", "A"], ["dA"]), h.make_node("Exp", ["dA"], ["a"]),
        h.make_node("Mul", ["delta", "x"], ["dx"]), h.make_node("Unsqueeze", ["dx", "ax_last"], ["dx3"]),
        h.make_node("Unsqueeze", ["bt", "ax_mid"], ["bt3"]), h.make_node("Mul", ["dx3", "bt3"], ["bx"]),
        h.make_node("Mul", ["a", "h"], ["ah"]), h.make_node("Add", ["ah", "bx"], ["h_new"]),
        h.make_node("Unsqueeze", ["ct", "ax_mid"], ["ct3"]), h.make_node("Mul", ["h_new", "ct3"], ["hc"]),
        h.make_node("ReduceSum", ["hc", "ax_last"], ["y"], keepdims=0),
    ]
    body_in = [b.vi("h", [B, D, N]), b.vi("x", [B, D]), b.vi("dl", [B, D]), b.vi("bt", [B, N]), b.vi("ct", [B, N])]
    outer_in = [b.vi("h0", [B, D, N]), b.vi("X", [T, B, D]), b.vi("DL", [T, B, D]), b.vi("BT", [T, B, N]),
                b.vi("CT", [T, B, N])]
    inits = [b.init("A_log", a_log), b.init("ax_last", np.array([-1], np.int64)), b.init("ax_mid", np.array([1], np.int64))]
    return _scan_model(nodes, body_in, [b.vi("h_new", [B, D, N]), b.vi("y", [B, D])], outer_in,
                       [b.vi("hT", [B, D, N]), b.vi("Y", [T, B, D])], inits, opset=opset, num_scan_inputs=4,
                       scan_inputs=["h0", "X", "DL", "BT", "CT"])


def linear_attention(T=64, DK=8, DV=8, gamma=0.95, opset=17, einsum=True, read="i,ij->j"):
    """Decayed linear attention, matrix state S [DK, DV]: S' = γ S + k ⊗ v, y = q S' (``read``:
    the equation of y's Einsum)."""
    if einsum:
        outer = [h.make_node("Einsum", ["k", "v"], ["kv"], equation="i,j->ij")]
        read = [h.make_node("Einsum", ["q", "S_new"], ["y"], equation=read)]
    else:
        outer = [h.make_node("Unsqueeze", ["k", "ax1"], ["kc"]), h.make_node("Unsqueeze", ["v", "ax0"], ["vr"]),
                 h.make_node("MatMul", ["kc", "vr"], ["kv"])]
        read = [h.make_node("MatMul", ["q", "S_new"], ["y"])]
    nodes = outer + [h.make_node("Mul", ["S", "gamma"], ["gs"]), h.make_node("Add", ["gs", "kv"], ["S_new"])] + read
    inits = [b.init("gamma", np.array(gamma, np.float32)), b.init("ax0", np.array([0], np.int64)),
             b.init("ax1", np.array([1], np.int64))]
    return _scan_model(nodes, [b.vi("S", [DK, DV]), b.vi("q", [DK]), b.vi("k", [DK]), b.vi("v", [DV])],
                       [b.vi("S_new", [DK, DV]), b.vi("y", [DV])],
                       [b.vi("S0", [DK, DV]), b.vi("Q", [T, DK]), b.vi("K", [T, DK]), b.vi("V", [T, DV])],
                       [b.vi("ST", [DK, DV]), b.vi("Y", [T, DV])], inits, opset=opset, num_scan_inputs=3,
                       scan_inputs=["S0", "Q", "K", "V"])


def cumulative_product(T=64, H=8, opset=17):
    """h' = h ⊙ x (b = 0)."""
    nodes = [h.make_node("Mul", ["x", "h"], ["h_new"]), h.make_node("Identity", ["h_new"], ["y"])]
    return _scan_model(nodes, [b.vi("h", [H]), b.vi("x", [H])], [b.vi("h_new", [H]), b.vi("y", [H])],
                       [b.vi("h0", [H]), b.vi("X", [T, H])], [b.vi("hT", [H]), b.vi("Y", [T, H])], [],
                       opset=opset, num_scan_inputs=1, scan_inputs=["h0", "X"])


def body_model(update_nodes, T=16, H=4, extra_inputs=(), opset=17, state="h_new", outputs=("h_new",), dtype=TP.FLOAT,
               inits=()):
    """A one-state Scan over X [T, H] whose body is ``update_nodes`` (reading h, x, and the
    ``extra_inputs`` initializers); the new state is ``state``, scan outputs ``outputs``.
    For negative tests: the shapes people write that are not linear."""
    nodes = list(update_nodes) + [h.make_node("Identity", [o], [f"out{k}"]) for k, o in enumerate(outputs)]
    body_out = [b.vi(state, [H], dtype)] + [b.vi(f"out{k}", [H], dtype) for k in range(len(outputs))]
    return _scan_model(nodes, [b.vi("h", [H], dtype), b.vi("x", [H], dtype)], body_out,
                       [b.vi("h0", [H], dtype), b.vi("X", [T, H], dtype)],
                       [b.vi("hT", [H], dtype)] + [b.vi(f"Y{k}", [T, H], dtype) for k in range(len(outputs))],
                       list(inits), opset=opset, num_scan_inputs=1, scan_inputs=["h0", "X"])


def decay_input(T=40, H=8, product=False, opset=17):
    """The decay g [H] a graph input (a value the optimizer cannot see): h' = h ⊙ g + x, or
    with ``product`` h' = h ⊙ x ⊙ g (b = 0)."""
    nodes = ([h.make_node("Mul", ["h", "x"], ["hx"]), h.make_node("Mul", ["hx", "g"], ["h_new"])] if product else
             [h.make_node("Mul", ["h", "g"], ["hg"]), h.make_node("Add", ["hg", "x"], ["h_new"])])
    nodes.append(h.make_node("Identity", ["h_new"], ["y"]))
    return _scan_model(nodes, [b.vi("h", [H]), b.vi("x", [H])], [b.vi("h_new", [H]), b.vi("y", [H])],
                       [b.vi("h0", [H]), b.vi("X", [T, H]), b.vi("g", [H])], [b.vi("hT", [H]), b.vi("Y", [T, H])], [],
                       opset=opset, num_scan_inputs=1, scan_inputs=["h0", "X"])


def mamba_einsum(T=24, B=1, D=4, N=3, opset=17):
    """:func:`mamba` as an Einsum author writes it: Δ⊗A, Δ⊙x⊗B_t and Σ_n h'⊙C_t each one Einsum."""
    a_log = np.log(np.arange(1, N + 1, dtype=np.float32))[None, :].repeat(D, 0)
    nodes = [
        h.make_node("Exp", ["A_log"], ["A_pos"]), h.make_node("Neg", ["A_pos"], ["A"]),
        h.make_node("Softplus", ["dl"], ["delta"]),
        h.make_node("Einsum", ["delta", "A"], ["dA"], equation="bd,dn->bdn"), h.make_node("Exp", ["dA"], ["a"]),
        h.make_node("Einsum", ["delta", "x", "bt"], ["bx"], equation="bd,bd,bn->bdn"),
        h.make_node("Mul", ["a", "h"], ["ah"]), h.make_node("Add", ["ah", "bx"], ["h_new"]),
        h.make_node("Einsum", ["h_new", "ct"], ["y"], equation="bdn,bn->bd"),
    ]
    body_in = [b.vi("h", [B, D, N]), b.vi("x", [B, D]), b.vi("dl", [B, D]), b.vi("bt", [B, N]), b.vi("ct", [B, N])]
    outer_in = [b.vi("h0", [B, D, N]), b.vi("X", [T, B, D]), b.vi("DL", [T, B, D]), b.vi("BT", [T, B, N]),
                b.vi("CT", [T, B, N])]
    return _scan_model(nodes, body_in, [b.vi("h_new", [B, D, N]), b.vi("y", [B, D])], outer_in,
                       [b.vi("hT", [B, D, N]), b.vi("Y", [T, B, D])], [b.init("A_log", a_log)], opset=opset,
                       num_scan_inputs=4, scan_inputs=["h0", "X", "DL", "BT", "CT"])


def linear_attention_transposed(T=24, DK=4, DV=4, gamma=0.9, opset=17, einsum=True, read=None):
    """Linear attention with the state stored [DV, DK]: S' = γ S + vᵀk, y = S'·q (``einsum``: the
    outer product an Einsum and y a MatMul, else the other way round; ``read``: y's Einsum equation)."""
    if einsum:
        nodes = [h.make_node("Einsum", ["v", "k"], ["vk"], equation="i,j->ij")]
        y = h.make_node("MatMul", ["S_new", "q"], ["y"])
    else:
        nodes = [h.make_node("Unsqueeze", ["v", "ax1"], ["vc"]), h.make_node("Unsqueeze", ["k", "ax0"], ["kr"]),
                 h.make_node("Mul", ["vc", "kr"], ["vk"])]
        y = h.make_node("Einsum", ["S_new", "q"], ["y"], equation=read or "ij,j->i")
    nodes += [h.make_node("Mul", ["gamma", "S"], ["gs"]), h.make_node("Add", ["gs", "vk"], ["S_new"]), y]
    return _scan_model(nodes, [b.vi("S", [DV, DK]), b.vi("q", [DK]), b.vi("k", [DK]), b.vi("v", [DV])],
                       [b.vi("S_new", [DV, DK]), b.vi("y", [DV])],
                       [b.vi("S0", [DV, DK]), b.vi("Q", [T, DK]), b.vi("K", [T, DK]), b.vi("V", [T, DV])],
                       [b.vi("ST", [DV, DK]), b.vi("Y", [T, DV])],
                       [b.init("gamma", np.array(gamma, np.float32)), b.init("ax0", np.array([0], np.int64)),
                        b.init("ax1", np.array([1], np.int64))],
                       opset=opset, num_scan_inputs=3, scan_inputs=["S0", "Q", "K", "V"])


def mamba_precomputed(T=12, B=1, D=4, N=3, wide="bldn", seed=0, opset=17, read_a=False):
    """mamba-minimal's ``selective_scan`` as PyTorch exports it: deltaA = Exp(Einsum('bld,dn->W'))
    and deltaB_u = Einsum('bld,bln,bld->W') of Δ = Softplus(Δ raw), x [B, T, D], B_t [B, T, N] computed for every
    step before the Scan (``wide`` = W, their [B, L, D, N] layout), each permuted steps first; the
    body h' = a ⊙ h + b, y = Einsum('bdn,bn->bd', h', C_t). ``read_a``: deltaA is also a model
    output (read outside the Scan). ``T`` may be a symbolic name."""
    a_neg = -np.exp(np.log(np.arange(1, N + 1, dtype=np.float32)))[None, :].repeat(D, 0)
    steps_first = [wide.index(c) for c in "lbdn"]
    nodes = [
        h.make_node("Softplus", ["dl"], ["delta"]),
        h.make_node("Einsum", ["delta", "A"], ["dA"], equation=f"bld,dn->{wide}"), h.make_node("Exp", ["dA"], ["a_w"]),
        h.make_node("Einsum", ["delta", "Bm", "x"], ["b_w"], equation=f"bld,bln,bld->{wide}"),
        h.make_node("Transpose", ["a_w"], ["a_s"], perm=steps_first),
        h.make_node("Transpose", ["b_w"], ["b_s"], perm=steps_first),
        h.make_node("Transpose", ["Cm"], ["c_s"], perm=[1, 0, 2]),
    ]
    body = h.make_graph([h.make_node("Mul", ["a", "h"], ["ah"]), h.make_node("Add", ["ah", "bt"], ["h_new"]),
                         h.make_node("Einsum", ["h_new", "ct"], ["y"], equation="bdn,bn->bd")], "body",
                        [b.vi("h", [B, D, N]), b.vi("a", [B, D, N]), b.vi("bt", [B, D, N]), b.vi("ct", [B, N])],
                        [b.vi("h_new", [B, D, N]), b.vi("y", [B, D])])
    nodes.append(h.make_node("Scan", ["h0", "a_s", "b_s", "c_s"], ["hT", "Y"], body=body, num_scan_inputs=3))
    outputs = [b.vi("hT", [B, D, N]), b.vi("Y", [T, B, D])]
    if read_a:
        outputs.append(b.vi("a_w", [{"b": B, "l": T, "d": D, "n": N}[c] for c in wide]))
    graph = h.make_graph(nodes, "g", [b.vi("h0", [B, D, N]), b.vi("dl", [B, T, D]), b.vi("x", [B, T, D]),
                                      b.vi("Bm", [B, T, N]), b.vi("Cm", [B, T, N])], outputs,
                         initializer=[b.init("A", a_neg)])
    return b.model(graph, opset=opset)


def mamba_hf(T=12, B=1, D=4, N=3, opset=17):
    """Hugging Face's ``MambaMixer.slow_forward`` layout: Δ = Softplus(Δ raw), x [B, D, T]; deltaA = Exp(A[None, :, None, :]
    * Δ[..., None]) and deltaB_u = Δ[..., None] * B_t[:, None] * x[..., None], [B, D, T, N], built
    with Unsqueeze and broadcast Muls before a Scan that reads them on axis 2 (and C [B, T, N] on
    axis 1); y_t = (h' @ C_t[..., None]) squeezed, stacked on axis 2 ([B, D, T])."""
    a_neg = -np.exp(np.log(np.arange(1, N + 1, dtype=np.float32)))[None, :].repeat(D, 0)
    nodes = [
        h.make_node("Softplus", ["dl"], ["dt"]),
        h.make_node("Unsqueeze", ["A", "ax02"], ["A4"]), h.make_node("Unsqueeze", ["dt", "ax3"], ["dt4"]),
        h.make_node("Mul", ["A4", "dt4"], ["dA"]), h.make_node("Exp", ["dA"], ["a_w"]),
        h.make_node("Unsqueeze", ["Bm", "ax1"], ["B4"]), h.make_node("Unsqueeze", ["x", "ax3"], ["x4"]),
        h.make_node("Mul", ["dt4", "B4"], ["dtB"]), h.make_node("Mul", ["dtB", "x4"], ["b_w"]),
    ]
    body = h.make_graph([h.make_node("Mul", ["a", "h"], ["ah"]), h.make_node("Add", ["ah", "bt"], ["h_new"]),
                         h.make_node("Unsqueeze", ["ct", "ax_last"], ["c_col"]),
                         h.make_node("MatMul", ["h_new", "c_col"], ["hc"]),
                         h.make_node("Squeeze", ["hc", "ax_last"], ["y"])], "body",
                        [b.vi("h", [B, D, N]), b.vi("a", [B, D, N]), b.vi("bt", [B, D, N]), b.vi("ct", [B, N])],
                        [b.vi("h_new", [B, D, N]), b.vi("y", [B, D])])
    nodes.append(h.make_node("Scan", ["h0", "a_w", "b_w", "Cm"], ["hT", "Y"], body=body, num_scan_inputs=3,
                             scan_input_axes=[2, 2, 1], scan_output_axes=[2]))
    graph = h.make_graph(nodes, "g", [b.vi("h0", [B, D, N]), b.vi("dl", [B, D, T]), b.vi("x", [B, D, T]),
                                      b.vi("Bm", [B, T, N]), b.vi("Cm", [B, T, N])],
                         [b.vi("hT", [B, D, N]), b.vi("Y", [B, D, T])],
                         initializer=[b.init("A", a_neg), b.init("ax02", np.array([0, 2], np.int64)),
                                      b.init("ax3", np.array([3], np.int64)), b.init("ax1", np.array([1], np.int64)),
                                      b.init("ax_last", np.array([-1], np.int64))])
    return b.model(graph, opset=opset)
