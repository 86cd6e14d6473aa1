"""Matrix-state linear-attention Scans in the layouts producers write (tests/test_linattn.py)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP
from onnx import helper as h

import builders as b


class _Body:
    def __init__(self, nb: int):
        self.nodes, self.inits, self.n, self.nb = [], [], 0, nb

    def fresh(self, hint):
        self.n += 1
        return f"{hint}{self.n}"

    def node(self, op, ins, **attrs):
        out = self.fresh(op.lower())
        self.nodes.append(h.make_node(op, ins, [out], **attrs))
        return out

    def const(self, value, dtype=np.int64):
        name = self.fresh("c")
        self.inits.append(b.init(name, np.asarray(value, dtype)))
        return name

    def unsq(self, x, axes):
        return self.node("Unsqueeze", [x, self.const(axes)])

    def letters(self):
        return "bh"[2 - self.nb:] if self.nb <= 2 else None

    def outer(self, x, y, style):
        if style == "einsum":
            p = self.letters()
            return self.node("Einsum", [x, y], equation=f"{p}i,{p}j->{p}ij")
        if style == "einsum_ellipsis":
            return self.node("Einsum", [x, y], equation="...i,...j->...ij")
        op = "MatMul" if style == "matmul" else "Mul"
        return self.node(op, [self.unsq(x, [-1]), self.unsq(y, [-2])])

    def read_row(self, m, x, style):
        """Σ_i x_i m_ij."""
        if style in ("einsum", "einsum_ellipsis"):
            p = self.letters() if style == "einsum" else "..."
            return self.node("Einsum", [m, x], equation=f"{p}ij,{p}i->{p}j")
        if style == "matmul":
            return self.node("Squeeze", [self.node("MatMul", [self.unsq(x, [-2]), m]), self.const([-2])])
        return self.node("ReduceSum", [self.node("Mul", [m, self.unsq(x, [-1])]), self.const([-2])], keepdims=0)

    def read_col(self, m, x, style):
        """Σ_j m_ij x_j."""
        if style in ("einsum", "einsum_ellipsis"):
            p = self.letters() if style == "einsum" else "..."
            return self.node("Einsum", [m, x], equation=f"{p}ij,{p}j->{p}i")
        if style == "matmul":
            return self.node("Squeeze", [self.node("MatMul", [m, self.unsq(x, [-1])]), self.const([-1])])
        return self.node("ReduceSum", [self.node("Mul", [m, self.unsq(x, [-2])]), self.const([-1])], keepdims=0)


def attention(rule="linear", *, B=2, H=2, DK=4, DV=3, T=9, nb=2, style="einsum", batch_first=False,
              decay="exp", scale=None, transposed=False, beta_on="difference", expanded=False, opset=27,
              per_key=False, dims=None):
    """A Scan over Q, K, V [T, *b, d] (``batch_first``: [*b0, T, ...] scanned on axis 1 when nb >= 1) with
    state S [*b, DK, DV] ([*b, DV, DK] if ``transposed``): S' by ``rule``, y = scale·(q·S').
    ``decay``: "exp" (a = exp(g), g a scan input), "sigmoid" (a = sigmoid(x)), "const" (0.9).
    ``beta_on``: where β multiplies: "difference" (β(v − Sᵀk)), "product" (β·outer), "key" (outer(βk, ..));
    ``expanded``: the delta rule written S + β k vᵀ − β k (Sᵀk)ᵀ."""
    bd = ([B, H] if dims is None else [dims[0], H])[2 - nb:] if nb else []
    w = _Body(nb)
    S, q, k, v = "S", "q", "k", "v"
    gated = rule in ("gated", "gated_delta")
    delta = rule in ("delta", "gated_delta")
    extra_in, extra_outer = [], []
    m_rank = nb + 2
    S_dec = S
    if gated:
        if decay == "const":
            S_dec = w.node("Mul", [S, w.const(0.9, np.float32)])
        else:
            extra_in.append(b.vi("g", bd + ([DK] if per_key else [])))
            extra_outer.append("G")
            axes = [m_rank - 1] if per_key else [m_rank - 2, m_rank - 1]
            if transposed and per_key:
                axes = [m_rank - 2]
            a = w.node("Exp" if decay == "exp" else "Sigmoid", [w.unsq("g", axes)])
            S_dec = w.node("Mul", [a, S])
    outer = (lambda x, y: w.outer(y, x, style)) if transposed else (lambda x, y: w.outer(x, y, style))
    read_k = (lambda m, x: w.read_col(m, x, style)) if transposed else (lambda m, x: w.read_row(m, x, style))
    if delta:  # DeltaNet L2-normalizes its keys (unnormalized, S grows without bound)
        k = w.node("Div", [k, w.node("ReduceL2", [k, w.const([-1])], keepdims=1)])
        extra_in.append(b.vi("braw", bd))
        extra_outer.append("BR")
        beta = w.node("Sigmoid", ["braw"])
        pred = read_k(S_dec, k)
        if expanded:
            b4 = w.unsq(beta, [m_rank - 2, m_rank - 1])
            S_new = w.node("Sub", [w.node("Add", [S_dec, w.node("Mul", [b4, outer(k, v)])]),
                                   w.node("Mul", [b4, outer(k, pred)])])
        elif beta_on == "difference":
            u = w.node("Mul", [w.node("Sub", [v, pred]), w.unsq(beta, [m_rank - 2])])
            S_new = w.node("Add", [S_dec, outer(k, u)])
        elif beta_on == "product":
            S_new = w.node("Add", [S_dec, w.node("Mul", [outer(k, w.node("Sub", [v, pred])),
                                                         w.unsq(beta, [m_rank - 2, m_rank - 1])])])
        else:
            kb = w.node("Mul", [k, w.unsq(beta, [m_rank - 2])])
            S_new = w.node("Add", [S_dec, outer(kb, w.node("Sub", [v, pred]))])
    else:
        S_new = w.node("Add", [S_dec, outer(k, v)])
    y = (w.read_col if transposed else w.read_row)(S_new, q, style)
    if scale is not None:
        y = w.node("Mul", [y, w.const(scale, np.float32)])
    w.nodes.append(h.make_node("Identity", [S_new], ["S_out"]))
    w.nodes.append(h.make_node("Identity", [y], ["y"]))
    s_shape = bd + ([DV, DK] if transposed else [DK, DV])
    body_in = [b.vi("S", s_shape), b.vi("q", bd + [DK]), b.vi("k", bd + [DK]), b.vi("v", bd + [DV])] + extra_in
    body = h.make_graph(w.nodes, "body", body_in, [b.vi("S_out", s_shape), b.vi("y", bd + [DV])], initializer=w.inits)
    axis = 1 if batch_first and nb else 0
    Tn = T if dims is None else dims[1]
    outer_bd = bd

    def seq(d):
        full = outer_bd + d
        return full[:axis] + [Tn] + full[axis:]

    ins = [b.vi("S0", outer_bd + s_shape[nb:]), b.vi("Q", seq([DK])), b.vi("K", seq([DK])), b.vi("V", seq([DV]))]
    for name, vi in zip(extra_outer, extra_in):
        d = [DK] if (name == "G" and per_key) else []
        ins.append(b.vi(name, seq(d)))
    n_scan = 3 + len(extra_outer)
    scan = h.make_node("Scan", ["S0", "Q", "K", "V"] + extra_outer, ["ST", "Y"], body=body, num_scan_inputs=n_scan,
                       scan_input_axes=[axis] * n_scan, scan_output_axes=[axis])
    outs = [b.vi("ST", outer_bd + s_shape[nb:]), b.vi("Y", seq([DV]))]
    return b.model(h.make_graph([scan], "g", ins, outs), opset=opset, ir_version=10)


def linear_attention_node(rule="gated_delta", *, q_heads=2, kv_heads=2, DK=4, DV=3, B="B", T="T", past=True,
                          per_key=False, beta_width=None, scale=None, elem=TP.FLOAT, state_elem=None, opset=27,
                          chunk_size=None):
    """One ``LinearAttention`` node as a model builder writes it (tests/test_linattn_down.py): q, k,
    v [B, T, H*d] packed, past_state [B, H_kv, DK, DV] (left out unless ``past``), decay [B, T, H_kv]
    (``per_key``: [B, T, H_kv*DK]) for the gated rules, beta [B, T, ``beta_width`` or H_kv] for the
    delta rules, outputs output [B, T, H_q*DV] and present_state."""
    state_elem = elem if state_elem is None else state_elem
    ins = [b.vi("query", [B, T, q_heads * DK], elem), b.vi("key", [B, T, kv_heads * DK], elem),
           b.vi("value", [B, T, kv_heads * DV], elem)]
    names = ["query", "key", "value", "", "", ""]
    if past:
        ins.append(b.vi("past_state", [B, kv_heads, DK, DV], state_elem))
        names[3] = "past_state"
    if rule in ("gated", "gated_delta"):
        ins.append(b.vi("decay", [B, T, kv_heads * DK if per_key else kv_heads], elem))
        names[4] = "decay"
    if rule in ("delta", "gated_delta"):
        ins.append(b.vi("beta", [B, T, kv_heads if beta_width is None else beta_width], elem))
        names[5] = "beta"
    while not names[-1]:
        names.pop()
    attrs = dict(update_rule=rule, q_num_heads=q_heads, kv_num_heads=kv_heads)
    if scale is not None:
        attrs["scale"] = scale
    if chunk_size is not None:
        attrs["chunk_size"] = chunk_size
    node = h.make_node("LinearAttention", names, ["output", "present_state"], name="linear_attention", **attrs)
    outs = [b.vi("output", [B, T, q_heads * DV], elem), b.vi("present_state", [B, kv_heads, DK, DV], state_elem)]
    return b.model(h.make_graph([node], "model_builder", ins, outs), opset=opset, ir_version=10)
