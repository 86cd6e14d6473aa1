"""onnxscript models for models/generate_heldout_linattn_onnxscript.py (needs ``pip install onnxscript``).
A module of its own: onnxscript resolves the names a script uses (FLOAT, op) from its module's
globals. The four LinearAttention recurrences (plain causal linear attention, decayed with a
per-head scalar decay, DeltaNet, Gated DeltaNet) written at opset 27 the way an onnxscript author
writes a recurrence: a function with a Scan over T whose state is a matrix per head, in three
styles (H heads, dk keys, dv values: 2, 8, 6; B and T symbolic):

- ``*_mm``: batch-first packed heads q, k, v [B, T, H, d], Scan over axis 1, state [B, H, dk, dv]
  given as an input; outer products and reads are MatMuls of unsqueezed vectors (k[..., :, None] @
  v[..., None, :], q[..., None, :] @ S); the scale multiplies the output in the body. Decay:
  GLA-like data-dependent exp(logsigmoid(a) / 16) per head.
- ``*_es``: PyTorch's layout [B, H, T, d] with the heads folded into the batch ([B*H, T, d]), Scan
  over axis 1, zero state from ConstantOfShape; Einsum outer products and reads; the scale on q
  before the loop. Decay: RetNet's fixed gamma per head (tiled over the batch).
- ``*_rs``: time-major [T, B, H, d], the heads looped: a model-local function holding one head's
  Scan (state [B, dk, dv]) called once per head on the Split inputs, the outputs stacked; outer
  products as a broadcast Mul, reads as ReduceSum of a broadcast Mul; the output divided by
  sqrt(dk) in the body. Decay: a sigmoid gate per head (the factor itself, not its log).

DeltaNet's keys are L2-normalized and β = sigmoid(b) before the loop (as fla's reference code);
Gated DeltaNet's log decay is g = -exp(A_log) * softplus(a + dt_bias) (<= 0) with A_log and
dt_bias per head, and the delta rule reads the decayed state.
"""

import numpy as np
from onnx import numpy_helper
import onnxscript
from onnxscript import FLOAT, graph, script
from onnxscript.onnx_opset import opset27 as op

H, DK, DV = 2, 8, 6
SCALE = DK ** -0.5
GAMMA = numpy_helper.from_array((1.0 - 2.0 ** (-5.0 - np.arange(H))).astype(np.float32), "gamma")  # RetNet
A_LOG = numpy_helper.from_array(np.log(np.linspace(1.0, 4.0, H)).astype(np.float32), "A_log")
heads = onnxscript.values.Opset("heads", 1)  # the domain of the per-head functions (rs)
DT_BIAS = numpy_helper.from_array(np.linspace(-1.0, 1.0, H).astype(np.float32), "dt_bias")


# ---------------------------------------------------------------- mm: [B, T, H, d], MatMul
@script(default_opset=op)
def linear_mm(q: FLOAT["B", "T", 2, 8], k: FLOAT["B", "T", 2, 8], v: FLOAT["B", "T", 2, 6],
              s0: FLOAT["B", 2, 8, 6]) -> (FLOAT["B", "T", 2, 6], FLOAT["B", 2, 8, 6]):
    one = op.Constant(value_float=1.0)
    qf = op.Add(op.Elu(q), one)  # the feature map elu(x) + 1
    kf = op.Add(op.Elu(k), one)
    col = op.Constant(value_ints=[-1])
    row = op.Constant(value_ints=[-2])

    @graph()
    def step(S: FLOAT["B", 2, 8, 6], q_t: FLOAT["B", 2, 8], k_t: FLOAT["B", 2, 8], v_t: FLOAT["B", 2, 6]):
        S2 = op.Add(S, op.MatMul(op.Unsqueeze(k_t, col), op.Unsqueeze(v_t, row)))
        o_t = op.Squeeze(op.MatMul(op.Unsqueeze(q_t, row), S2), row)
        return S2, o_t

    state, o = op.Scan(s0, qf, kf, v, body=step, num_scan_inputs=3, scan_input_axes=[1, 1, 1], scan_output_axes=[1])
    return o, state


@script(default_opset=op)
def decayed_mm(q: FLOAT["B", "T", 2, 8], k: FLOAT["B", "T", 2, 8], v: FLOAT["B", "T", 2, 6], a: FLOAT["B", "T", 2],
               s0: FLOAT["B", 2, 8, 6]) -> (FLOAT["B", "T", 2, 6], FLOAT["B", 2, 8, 6]):
    g = op.Div(op.Neg(op.Softplus(op.Neg(a))), op.Constant(value_float=16.0))  # logsigmoid(a) / 16
    scale = op.Constant(value_float=SCALE)
    col = op.Constant(value_ints=[-1])
    row = op.Constant(value_ints=[-2])
    hw = op.Constant(value_ints=[2, 3])

    @graph()
    def step(S: FLOAT["B", 2, 8, 6], q_t: FLOAT["B", 2, 8], k_t: FLOAT["B", 2, 8], v_t: FLOAT["B", 2, 6],
             g_t: FLOAT["B", 2]):
        decay = op.Unsqueeze(op.Exp(g_t), hw)
        S2 = op.Add(op.Mul(decay, S), op.MatMul(op.Unsqueeze(k_t, col), op.Unsqueeze(v_t, row)))
        o_t = op.Mul(op.Squeeze(op.MatMul(op.Unsqueeze(q_t, row), S2), row), scale)
        return S2, o_t

    state, o = op.Scan(s0, q, k, v, g, body=step, num_scan_inputs=4, scan_input_axes=[1, 1, 1, 1],
                     scan_output_axes=[1])
    return o, state


@script(default_opset=op)
def delta_mm(q: FLOAT["B", "T", 2, 8], k: FLOAT["B", "T", 2, 8], v: FLOAT["B", "T", 2, 6], b: FLOAT["B", "T", 2],
             s0: FLOAT["B", 2, 8, 6]) -> (FLOAT["B", "T", 2, 6], FLOAT["B", 2, 8, 6]):
    kn = op.LpNormalization(k, axis=-1, p=2)
    beta = op.Sigmoid(b)
    scale = op.Constant(value_float=SCALE)
    col = op.Constant(value_ints=[-1])
    row = op.Constant(value_ints=[-2])

    @graph()
    def step(S: FLOAT["B", 2, 8, 6], q_t: FLOAT["B", 2, 8], k_t: FLOAT["B", 2, 8], v_t: FLOAT["B", 2, 6],
             b_t: FLOAT["B", 2]):
        k_row = op.Unsqueeze(k_t, row)
        v_old = op.Squeeze(op.MatMul(k_row, S), row)  # S^T k
        u = op.Mul(op.Sub(v_t, v_old), op.Unsqueeze(b_t, col))
        S2 = op.Add(S, op.MatMul(op.Unsqueeze(k_t, col), op.Unsqueeze(u, row)))
        o_t = op.Mul(op.Squeeze(op.MatMul(op.Unsqueeze(q_t, row), S2), row), scale)
        return S2, o_t

    state, o = op.Scan(s0, q, kn, v, beta, body=step, num_scan_inputs=4, scan_input_axes=[1, 1, 1, 1],
                     scan_output_axes=[1])
    return o, state


@script(default_opset=op)
def gated_delta_mm(q: FLOAT["B", "T", 2, 8], k: FLOAT["B", "T", 2, 8], v: FLOAT["B", "T", 2, 6],
                   b: FLOAT["B", "T", 2], a: FLOAT["B", "T", 2],
                   s0: FLOAT["B", 2, 8, 6]) -> (FLOAT["B", "T", 2, 6], FLOAT["B", 2, 8, 6]):
    kn = op.LpNormalization(k, axis=-1, p=2)
    beta = op.Sigmoid(b)
    g = op.Mul(op.Neg(op.Exp(op.Constant(value=A_LOG))), op.Softplus(op.Add(a, op.Constant(value=DT_BIAS))))
    scale = op.Constant(value_float=SCALE)
    col = op.Constant(value_ints=[-1])
    row = op.Constant(value_ints=[-2])
    hw = op.Constant(value_ints=[2, 3])

    @graph()
    def step(S: FLOAT["B", 2, 8, 6], q_t: FLOAT["B", 2, 8], k_t: FLOAT["B", 2, 8], v_t: FLOAT["B", 2, 6],
             b_t: FLOAT["B", 2], g_t: FLOAT["B", 2]):
        Sd = op.Mul(S, op.Unsqueeze(op.Exp(g_t), hw))
        v_old = op.Squeeze(op.MatMul(op.Unsqueeze(k_t, row), Sd), row)
        u = op.Mul(op.Sub(v_t, v_old), op.Unsqueeze(b_t, col))
        S2 = op.Add(Sd, op.MatMul(op.Unsqueeze(k_t, col), op.Unsqueeze(u, row)))
        o_t = op.Mul(op.Squeeze(op.MatMul(op.Unsqueeze(q_t, row), S2), row), scale)
        return S2, o_t

    state, o = op.Scan(s0, q, kn, v, beta, g, body=step, num_scan_inputs=5, scan_input_axes=[1, 1, 1, 1, 1],
                     scan_output_axes=[1])
    return o, state


# ---------------------------------------------------------------- es: [B, H, T, d] folded to [B*H, T, d], Einsum
@script(default_opset=op)
def linear_es(q: FLOAT["B", 2, "T", 8], k: FLOAT["B", 2, "T", 8],
              v: FLOAT["B", 2, "T", 6]) -> (FLOAT["B", 2, "T", 6], FLOAT["B", 2, 8, 6]):
    one = op.Constant(value_float=1.0)
    seq = op.Shape(q, start=2, end=3)
    flat_k = op.Concat(op.Constant(value_ints=[-1]), seq, op.Constant(value_ints=[8]), axis=0)  # [B*H, T, dk]
    qf = op.Reshape(op.Add(op.Elu(q), one), flat_k)
    kf = op.Reshape(op.Add(op.Elu(k), one), flat_k)
    vf = op.Reshape(v, op.Concat(op.Constant(value_ints=[-1]), seq, op.Constant(value_ints=[6]), axis=0))
    n = op.Shape(qf, start=0, end=1)
    s0 = op.ConstantOfShape(op.Concat(n, op.Constant(value_ints=[8, 6]), axis=0))

    @graph()
    def step(S: FLOAT["N", 8, 6], q_t: FLOAT["N", 8], k_t: FLOAT["N", 8], v_t: FLOAT["N", 6]):
        S2 = op.Add(S, op.Einsum(k_t, v_t, equation="nk,nv->nkv"))
        o_t = op.Einsum(q_t, S2, equation="nk,nkv->nv")
        return S2, o_t

    state_flat, o_flat = op.Scan(s0, qf, kf, vf, body=step, num_scan_inputs=3, scan_input_axes=[1, 1, 1], scan_output_axes=[1])
    bh = op.Shape(q, start=0, end=2)
    o = op.Reshape(o_flat, op.Concat(bh, op.Constant(value_ints=[-1, 6]), axis=0))
    state = op.Reshape(state_flat, op.Concat(bh, op.Constant(value_ints=[8, 6]), axis=0))
    return o, state


@script(default_opset=op)
def decayed_es(q: FLOAT["B", 2, "T", 8], k: FLOAT["B", 2, "T", 8],
               v: FLOAT["B", 2, "T", 6]) -> (FLOAT["B", 2, "T", 6], FLOAT["B", 2, 8, 6]):
    qs = op.Mul(q, op.Constant(value_float=SCALE))
    seq = op.Shape(q, start=2, end=3)
    flat_k = op.Concat(op.Constant(value_ints=[-1]), seq, op.Constant(value_ints=[8]), axis=0)  # [B*H, T, dk]
    qf = op.Reshape(qs, flat_k)
    kf = op.Reshape(k, flat_k)
    vf = op.Reshape(v, op.Concat(op.Constant(value_ints=[-1]), seq, op.Constant(value_ints=[6]), axis=0))
    n = op.Shape(qf, start=0, end=1)
    batch = op.Shape(q, start=0, end=1)
    gamma = op.Reshape(op.Tile(op.Constant(value=GAMMA), batch), op.Constant(value_ints=[-1, 1, 1]))  # [B*H, 1, 1]
    s0 = op.ConstantOfShape(op.Concat(n, op.Constant(value_ints=[8, 6]), axis=0))

    @graph()
    def step(S: FLOAT["N", 8, 6], q_t: FLOAT["N", 8], k_t: FLOAT["N", 8], v_t: FLOAT["N", 6]):
        S2 = op.Add(op.Mul(gamma, S), op.Einsum(k_t, v_t, equation="nk,nv->nkv"))
        o_t = op.Einsum(q_t, S2, equation="nk,nkv->nv")
        return S2, o_t

    state_flat, o_flat = op.Scan(s0, qf, kf, vf, body=step, num_scan_inputs=3, scan_input_axes=[1, 1, 1], scan_output_axes=[1])
    bh = op.Shape(q, start=0, end=2)
    o = op.Reshape(o_flat, op.Concat(bh, op.Constant(value_ints=[-1, 6]), axis=0))
    state = op.Reshape(state_flat, op.Concat(bh, op.Constant(value_ints=[8, 6]), axis=0))
    return o, state


@script(default_opset=op)
def delta_es(q: FLOAT["B", 2, "T", 8], k: FLOAT["B", 2, "T", 8], v: FLOAT["B", 2, "T", 6],
             b: FLOAT["B", 2, "T"]) -> (FLOAT["B", 2, "T", 6], FLOAT["B", 2, 8, 6]):
    last = op.Constant(value_ints=[-1])
    norm = op.Sqrt(op.ReduceSum(op.Mul(k, k), last, keepdims=1))
    kn = op.Div(k, op.Max(norm, op.Constant(value_float=1e-6)))  # F.normalize
    seq = op.Shape(q, start=2, end=3)
    flat = op.Concat(op.Constant(value_ints=[-1]), seq, axis=0)  # [B*H, T]
    flat_k = op.Concat(flat, op.Constant(value_ints=[8]), axis=0)
    qf = op.Reshape(op.Mul(q, op.Constant(value_float=SCALE)), flat_k)
    kf = op.Reshape(kn, flat_k)
    vf = op.Reshape(v, op.Concat(flat, op.Constant(value_ints=[6]), axis=0))
    bf = op.Reshape(op.Sigmoid(b), flat)
    n = op.Shape(qf, start=0, end=1)
    s0 = op.ConstantOfShape(op.Concat(n, op.Constant(value_ints=[8, 6]), axis=0))

    @graph()
    def step(S: FLOAT["N", 8, 6], q_t: FLOAT["N", 8], k_t: FLOAT["N", 8], v_t: FLOAT["N", 6], b_t: FLOAT["N"]):
        v_old = op.Einsum(k_t, S, equation="nk,nkv->nv")
        u = op.Mul(op.Sub(v_t, v_old), op.Unsqueeze(b_t, last))
        S2 = op.Add(S, op.Einsum(k_t, u, equation="nk,nv->nkv"))
        o_t = op.Einsum(q_t, S2, equation="nk,nkv->nv")
        return S2, o_t

    state_flat, o_flat = op.Scan(s0, qf, kf, vf, bf, body=step, num_scan_inputs=4, scan_input_axes=[1, 1, 1, 1],
                     scan_output_axes=[1])
    bh = op.Shape(q, start=0, end=2)
    o = op.Reshape(o_flat, op.Concat(bh, op.Constant(value_ints=[-1, 6]), axis=0))
    state = op.Reshape(state_flat, op.Concat(bh, op.Constant(value_ints=[8, 6]), axis=0))
    return o, state


@script(default_opset=op)
def gated_delta_es(q: FLOAT["B", 2, "T", 8], k: FLOAT["B", 2, "T", 8], v: FLOAT["B", 2, "T", 6],
                   b: FLOAT["B", 2, "T"], a: FLOAT["B", 2, "T"]) -> (FLOAT["B", 2, "T", 6], FLOAT["B", 2, 8, 6]):
    last = op.Constant(value_ints=[-1])
    norm = op.Sqrt(op.ReduceSum(op.Mul(k, k), last, keepdims=1))
    kn = op.Div(k, op.Max(norm, op.Constant(value_float=1e-6)))
    per_head = op.Constant(value_ints=[2, 1])
    g = op.Mul(op.Neg(op.Exp(op.Reshape(op.Constant(value=A_LOG), per_head))),
               op.Softplus(op.Add(a, op.Reshape(op.Constant(value=DT_BIAS), per_head))))
    seq = op.Shape(q, start=2, end=3)
    flat = op.Concat(op.Constant(value_ints=[-1]), seq, axis=0)  # [B*H, T]
    flat_k = op.Concat(flat, op.Constant(value_ints=[8]), axis=0)
    qf = op.Reshape(op.Mul(q, op.Constant(value_float=SCALE)), flat_k)
    kf = op.Reshape(kn, flat_k)
    vf = op.Reshape(v, op.Concat(flat, op.Constant(value_ints=[6]), axis=0))
    bf = op.Reshape(op.Sigmoid(b), flat)
    gf = op.Reshape(g, flat)
    n = op.Shape(qf, start=0, end=1)
    s0 = op.ConstantOfShape(op.Concat(n, op.Constant(value_ints=[8, 6]), axis=0))
    hw = op.Constant(value_ints=[1, 2])

    @graph()
    def step(S: FLOAT["N", 8, 6], q_t: FLOAT["N", 8], k_t: FLOAT["N", 8], v_t: FLOAT["N", 6], b_t: FLOAT["N"],
             g_t: FLOAT["N"]):
        Sd = op.Mul(S, op.Unsqueeze(op.Exp(g_t), hw))
        v_old = op.Einsum(k_t, Sd, equation="nk,nkv->nv")
        u = op.Mul(op.Sub(v_t, v_old), op.Unsqueeze(b_t, last))
        S2 = op.Add(Sd, op.Einsum(k_t, u, equation="nk,nv->nkv"))
        o_t = op.Einsum(q_t, S2, equation="nk,nkv->nv")
        return S2, o_t

    state_flat, o_flat = op.Scan(s0, qf, kf, vf, bf, gf, body=step, num_scan_inputs=5, scan_input_axes=[1, 1, 1, 1, 1],
                     scan_output_axes=[1])
    bh = op.Shape(q, start=0, end=2)
    o = op.Reshape(o_flat, op.Concat(bh, op.Constant(value_ints=[-1, 6]), axis=0))
    state = op.Reshape(state_flat, op.Concat(bh, op.Constant(value_ints=[8, 6]), axis=0))
    return o, state


# ---------------------------------------------------------------- rs: [T, B, H, d], a function per head
# One head's recurrence is a model-local function (domain "heads") holding the Scan, called once per
# head on the Split inputs; state [B, dk, dv], outer products a broadcast Mul, reads ReduceSum.
@script(heads, default_opset=op)
def linear_head(q: FLOAT["T", "B", 8], k: FLOAT["T", "B", 8], v: FLOAT["T", "B", 6]):
    col = op.Constant(value_ints=[-1])
    row = op.Constant(value_ints=[-2])
    s0 = op.Expand(op.Constant(value_float=0.0), op.Concat(op.Shape(q, start=1, end=2),
                                                           op.Constant(value_ints=[8, 6]), axis=0))

    @graph()
    def step(S: FLOAT["B", 8, 6], q_t: FLOAT["B", 8], k_t: FLOAT["B", 8], v_t: FLOAT["B", 6]):
        S2 = op.Add(S, op.Mul(op.Unsqueeze(k_t, col), op.Unsqueeze(v_t, row)))
        o_t = op.ReduceSum(op.Mul(op.Unsqueeze(q_t, col), S2), row, keepdims=0)
        return S2, o_t

    state, o = op.Scan(s0, q, k, v, body=step, num_scan_inputs=3)
    return o, state


@script(heads, default_opset=op)
def decayed_head(q: FLOAT["T", "B", 8], k: FLOAT["T", "B", 8], v: FLOAT["T", "B", 6], a: FLOAT["T", "B"]):
    col = op.Constant(value_ints=[-1])
    row = op.Constant(value_ints=[-2])
    hw = op.Constant(value_ints=[1, 2])
    sqrt_dk = op.Constant(value_float=DK ** 0.5)
    s0 = op.Expand(op.Constant(value_float=0.0), op.Concat(op.Shape(q, start=1, end=2),
                                                           op.Constant(value_ints=[8, 6]), axis=0))

    @graph()
    def step(S: FLOAT["B", 8, 6], q_t: FLOAT["B", 8], k_t: FLOAT["B", 8], v_t: FLOAT["B", 6], a_t: FLOAT["B"]):
        S2 = op.Add(op.Mul(S, op.Unsqueeze(a_t, hw)), op.Mul(op.Unsqueeze(k_t, col), op.Unsqueeze(v_t, row)))
        o_t = op.Div(op.ReduceSum(op.Mul(op.Unsqueeze(q_t, col), S2), row, keepdims=0), sqrt_dk)
        return S2, o_t

    state, o = op.Scan(s0, q, k, v, a, body=step, num_scan_inputs=4)
    return o, state


@script(heads, default_opset=op)
def delta_head(q: FLOAT["T", "B", 8], k: FLOAT["T", "B", 8], v: FLOAT["T", "B", 6], beta: FLOAT["T", "B"]):
    col = op.Constant(value_ints=[-1])
    row = op.Constant(value_ints=[-2])
    sqrt_dk = op.Constant(value_float=DK ** 0.5)
    s0 = op.Expand(op.Constant(value_float=0.0), op.Concat(op.Shape(q, start=1, end=2),
                                                           op.Constant(value_ints=[8, 6]), axis=0))

    @graph()
    def step(S: FLOAT["B", 8, 6], q_t: FLOAT["B", 8], k_t: FLOAT["B", 8], v_t: FLOAT["B", 6], b_t: FLOAT["B"]):
        k_c = op.Unsqueeze(k_t, col)
        v_old = op.ReduceSum(op.Mul(S, k_c), row, keepdims=0)  # (S * k[..., None]).sum(-2)
        u = op.Mul(op.Sub(v_t, v_old), op.Unsqueeze(b_t, col))
        S2 = op.Add(S, op.Mul(k_c, op.Unsqueeze(u, row)))
        o_t = op.Div(op.ReduceSum(op.Mul(op.Unsqueeze(q_t, col), S2), row, keepdims=0), sqrt_dk)
        return S2, o_t

    state, o = op.Scan(s0, q, k, v, beta, body=step, num_scan_inputs=4)
    return o, state


@script(heads, default_opset=op)
def gated_delta_head(q: FLOAT["T", "B", 8], k: FLOAT["T", "B", 8], v: FLOAT["T", "B", 6], beta: FLOAT["T", "B"],
                     g: FLOAT["T", "B"]):
    col = op.Constant(value_ints=[-1])
    row = op.Constant(value_ints=[-2])
    hw = op.Constant(value_ints=[1, 2])
    sqrt_dk = op.Constant(value_float=DK ** 0.5)
    s0 = op.Expand(op.Constant(value_float=0.0), op.Concat(op.Shape(q, start=1, end=2),
                                                           op.Constant(value_ints=[8, 6]), axis=0))

    @graph()
    def step(S: FLOAT["B", 8, 6], q_t: FLOAT["B", 8], k_t: FLOAT["B", 8], v_t: FLOAT["B", 6], b_t: FLOAT["B"],
             g_t: FLOAT["B"]):
        Sd = op.Mul(S, op.Unsqueeze(op.Exp(g_t), hw))
        k_c = op.Unsqueeze(k_t, col)
        v_old = op.ReduceSum(op.Mul(Sd, k_c), row, keepdims=0)
        u = op.Mul(op.Sub(v_t, v_old), op.Unsqueeze(b_t, col))
        S2 = op.Add(Sd, op.Mul(k_c, op.Unsqueeze(u, row)))
        o_t = op.Div(op.ReduceSum(op.Mul(op.Unsqueeze(q_t, col), S2), row, keepdims=0), sqrt_dk)
        return S2, o_t

    state, o = op.Scan(s0, q, k, v, beta, g, body=step, num_scan_inputs=5)
    return o, state


@script(default_opset=op)
def linear_rs(q: FLOAT["T", "B", 2, 8], k: FLOAT["T", "B", 2, 8],
              v: FLOAT["T", "B", 2, 6]) -> (FLOAT["T", "B", 2, 6], FLOAT["B", 2, 8, 6]):
    one = op.Constant(value_float=1.0)
    head = op.Constant(value_ints=[2])
    q0, q1 = op.Split(op.Add(op.Elu(q), one), axis=2, num_outputs=2)
    k0, k1 = op.Split(op.Add(op.Elu(k), one), axis=2, num_outputs=2)
    v0, v1 = op.Split(v, axis=2, num_outputs=2)
    oa, sa = linear_head(op.Squeeze(q0, head), op.Squeeze(k0, head), op.Squeeze(v0, head))
    ob, sb = linear_head(op.Squeeze(q1, head), op.Squeeze(k1, head), op.Squeeze(v1, head))
    o = op.Concat(op.Unsqueeze(oa, head), op.Unsqueeze(ob, head), axis=2)
    state = op.Concat(op.Unsqueeze(sa, 1), op.Unsqueeze(sb, 1), axis=1)
    return o, state


@script(default_opset=op)
def decayed_rs(q: FLOAT["T", "B", 2, 8], k: FLOAT["T", "B", 2, 8], v: FLOAT["T", "B", 2, 6],
               f: FLOAT["T", "B", 2]) -> (FLOAT["T", "B", 2, 6], FLOAT["B", 2, 8, 6]):
    head = op.Constant(value_ints=[2])
    q0, q1 = op.Split(q, axis=2, num_outputs=2)
    k0, k1 = op.Split(k, axis=2, num_outputs=2)
    v0, v1 = op.Split(v, axis=2, num_outputs=2)
    a = op.Sigmoid(op.Add(f, op.Constant(value_float=3.0)))  # a forget gate biased towards keeping
    a0, a1 = op.Split(a, axis=2, num_outputs=2)
    oa, sa = decayed_head(op.Squeeze(q0, head), op.Squeeze(k0, head), op.Squeeze(v0, head), op.Squeeze(a0, head))
    ob, sb = decayed_head(op.Squeeze(q1, head), op.Squeeze(k1, head), op.Squeeze(v1, head), op.Squeeze(a1, head))
    o = op.Concat(op.Unsqueeze(oa, head), op.Unsqueeze(ob, head), axis=2)
    state = op.Concat(op.Unsqueeze(sa, 1), op.Unsqueeze(sb, 1), axis=1)
    return o, state


@script(default_opset=op)
def delta_rs(q: FLOAT["T", "B", 2, 8], k: FLOAT["T", "B", 2, 8], v: FLOAT["T", "B", 2, 6],
             b: FLOAT["T", "B", 2]) -> (FLOAT["T", "B", 2, 6], FLOAT["B", 2, 8, 6]):
    head = op.Constant(value_ints=[2])
    q0, q1 = op.Split(q, axis=2, num_outputs=2)
    k0, k1 = op.Split(op.LpNormalization(k, axis=-1, p=2), axis=2, num_outputs=2)
    v0, v1 = op.Split(v, axis=2, num_outputs=2)
    b0, b1 = op.Split(op.Sigmoid(b), axis=2, num_outputs=2)
    oa, sa = delta_head(op.Squeeze(q0, head), op.Squeeze(k0, head), op.Squeeze(v0, head), op.Squeeze(b0, head))
    ob, sb = delta_head(op.Squeeze(q1, head), op.Squeeze(k1, head), op.Squeeze(v1, head), op.Squeeze(b1, head))
    o = op.Concat(op.Unsqueeze(oa, head), op.Unsqueeze(ob, head), axis=2)
    state = op.Concat(op.Unsqueeze(sa, 1), op.Unsqueeze(sb, 1), axis=1)
    return o, state


@script(default_opset=op)
def gated_delta_rs(q: FLOAT["T", "B", 2, 8], k: FLOAT["T", "B", 2, 8], v: FLOAT["T", "B", 2, 6],
                   b: FLOAT["T", "B", 2], a: FLOAT["T", "B", 2]) -> (FLOAT["T", "B", 2, 6], FLOAT["B", 2, 8, 6]):
    head = op.Constant(value_ints=[2])
    q0, q1 = op.Split(q, axis=2, num_outputs=2)
    k0, k1 = op.Split(op.LpNormalization(k, axis=-1, p=2), axis=2, num_outputs=2)
    v0, v1 = op.Split(v, axis=2, num_outputs=2)
    b0, b1 = op.Split(op.Sigmoid(b), axis=2, num_outputs=2)
    g = op.Mul(op.Neg(op.Exp(op.Constant(value=A_LOG))), op.Softplus(op.Add(a, op.Constant(value=DT_BIAS))))
    g0, g1 = op.Split(g, axis=2, num_outputs=2)
    oa, sa = gated_delta_head(op.Squeeze(q0, head), op.Squeeze(k0, head), op.Squeeze(v0, head),
                              op.Squeeze(b0, head), op.Squeeze(g0, head))
    ob, sb = gated_delta_head(op.Squeeze(q1, head), op.Squeeze(k1, head), op.Squeeze(v1, head),
                              op.Squeeze(b1, head), op.Squeeze(g1, head))
    o = op.Concat(op.Unsqueeze(oa, head), op.Unsqueeze(ob, head), axis=2)
    state = op.Concat(op.Unsqueeze(sa, 1), op.Unsqueeze(sb, 1), axis=1)
    return o, state


MODELS = {f.name: f for f in (linear_mm, decayed_mm, delta_mm, gated_delta_mm, linear_es, decayed_es, delta_es,
                              gated_delta_es, linear_rs, decayed_rs, delta_rs, gated_delta_rs)}
