"""``LinearAttention`` (opset 27) written as a Scan, for a model moved below opset 27: the other
direction of :mod:`linattn_pass`. scanopt.opset_adapters calls :func:`lower` for every such node
when a migration's target is below 27; this module knows the op, the adapter only the migration.

The spec's recurrence, per KV head, with q, k, v unpacked from [B, T, H*d] to [B, T, H, d]:

- linear:      S' = S + k vᵀ
- gated:       S' = a S + k vᵀ,                     a = exp(g) (per head, or per key row)
- delta:       S' = S + k (β (v − Sᵀk))ᵀ
- gated_delta: S' = a S + k (β (v − (a S)ᵀk))ᵀ
- output:      y = scale · (q · S'), scale 1/sqrt(dk) where the attribute is 0; with grouped heads
  (q_num_heads = G · kv_num_heads) query head h reads KV head h // G: the query is unpacked to
  [B, T, H_kv, G, dk] and read as one MatMul against S'.

The Scan runs over axis 1 of the unpacked [B, T, H, d] values with the state [B, H_kv, dk, dv] in
float32 (the op's reference accumulates in float32: float16/bfloat16 inputs are cast in, the
output cast back to T, the final state to past_state's type, or T's without one). The body is
written the way :mod:`linattn_pass` reads (MatMul of unsqueezed vectors, Exp as the decay's last
op, a constant scale), so moving the model back to 27 gives the op again (grouped heads stay a
Scan: the pass reads one query per KV head).

An empty batch or zero steps give the spec's outputs (an empty output, the initial state as the
final one) behind ``If(B == 0 or T == 0)``: onnxruntime refuses a Scan over zero steps and dies
of SIGFPE in a Scan over axis 1 of an empty batch. The guard is left out where B and T are
static and positive.

Not lowered (:class:`NotLowered`, one line): an input of unknown type, an input that is not
rank 3 (past_state 4), an update rule, head counts or optional inputs the spec rejects, and
bfloat16 below opset 13 (Cast takes it from 13).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.emit import Emitter
from scanopt.rewrite import Builder, new_graph

RULES = ("linear", "gated", "delta", "gated_delta")
F32 = np.dtype(np.float32)
_TYPES = ("float32", "float16", "bfloat16")
INPUTS = ("query", "key", "value", "past_state", "decay", "beta")


# ranges verification draws a graph input fed straight into the op in (index of the op's input: (low,
# high, why)), the values the op is meant for
INPUT_RANGES = {
    4: (None, 0.0, "LinearAttention's decay is a log decay g (the state decays by exp(g) <= 1; past 0 it grows "
                   "without bound in every form)"),
    5: (0.0, 1.0, "LinearAttention's beta is an update rate (a sigmoid output)"),
}


class NotLowered(Exception):
    """The node is not written as a Scan; the message says why."""


@dataclass
class Operand:
    """One input of the node: its tensor, element type and shape (None where not known)."""

    tensor: gs.Tensor
    dtype: np.dtype | None
    shape: list | None


@dataclass
class _Plan:
    rule: str
    hq: int
    hkv: int
    scale: float  # the attribute (0: 1/sqrt(dk))
    dk: int | None
    dv: int | None
    per_key: bool | None  # decay [B, T, H_kv*dk] (True), [B, T, H_kv] (False), not known (None)
    t_type: np.dtype
    s_type: np.dtype

    @property
    def group(self) -> int:
        return self.hq // self.hkv

    @property
    def gated(self) -> bool:
        return self.rule in ("gated", "gated_delta")

    @property
    def delta(self) -> bool:
        return self.rule in ("delta", "gated_delta")


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _static(d) -> int | None:
    return int(d) if isinstance(d, (int, np.integer)) and d >= 0 else None


def plan(operands: list[Operand | None], attrs: dict, opset: int) -> _Plan:
    """What the node is, checked against the spec; NotLowered with the reason otherwise."""
    rule = _text(attrs.get("update_rule", "gated_delta"))
    if rule not in RULES:
        raise NotLowered(f"update_rule '{rule}' is none of {', '.join(RULES)}")
    hq, hkv = attrs.get("q_num_heads"), attrs.get("kv_num_heads")
    if not isinstance(hq, int) or not isinstance(hkv, int) or hq <= 0 or hkv <= 0 or hq % hkv:
        raise NotLowered(f"q_num_heads {hq} is not a positive multiple of kv_num_heads {hkv}")
    operands = list(operands) + [None] * (len(INPUTS) - len(operands))
    q, k, v, past, decay, beta = operands[:len(INPUTS)]
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    for name, op, wanted in (("query", q, True), ("key", k, True), ("value", v, True),
                             ("decay", decay, gated), ("beta", beta, delta)):
        if (op is not None) != wanted:
            raise NotLowered(f"update_rule '{rule}' {'requires' if wanted else 'forbids'} the input {name}")
    for name, op in zip(INPUTS, operands):
        if op is None:
            continue
        if op.dtype is None:
            raise NotLowered(f"the type of {name} '{op.tensor.name}' is not known")
        if op.dtype.name not in _TYPES:
            raise NotLowered(f"{name} '{op.tensor.name}' is {op.dtype.name}, not a type of the op")
        rank = 4 if name == "past_state" else 3
        if op.shape is not None and len(op.shape) != rank:
            raise NotLowered(f"{name} '{op.tensor.name}' has rank {len(op.shape)}, not {rank}")
    t_type = q.dtype
    for name, op in (("key", k), ("value", v), ("decay", decay), ("beta", beta)):
        if op is not None and op.dtype != t_type:
            raise NotLowered(f"{name} is {op.dtype.name} and query {t_type.name}: the op takes one type T for both")
    s_type = past.dtype if past is not None else t_type
    if opset < 13 and "bfloat16" in (t_type.name, s_type.name):
        raise NotLowered(f"bfloat16 values need Cast from opset 13; the target is {opset}")

    def last(op, heads):
        d = _static(op.shape[-1]) if op is not None and op.shape else None
        return d // heads if d is not None and d % heads == 0 else None

    state = [_static(d) for d in past.shape] if past is not None and past.shape else [None] * 4
    dk = last(q, hq) or last(k, hkv) or state[2]
    dv = last(v, hkv) or state[3]
    per_key = None
    if decay is not None and decay.shape:
        width = _static(decay.shape[-1])
        if width == hkv:
            per_key = False
        elif width is not None and dk is not None and width == hkv * dk:
            per_key = True
        elif width is not None and dk is not None:
            raise NotLowered(f"decay's last dim {width} is neither kv_num_heads ({hkv}) nor kv_num_heads*dk "
                             f"({hkv * dk})")
    if beta is not None and beta.shape:
        width = _static(beta.shape[-1])
        if width is not None and width not in (1, hkv):
            raise NotLowered(f"beta's last dim {width} is neither kv_num_heads ({hkv}) nor 1")
    scale = float(attrs.get("scale", 0.0))
    return _Plan(rule, hq, hkv, scale, dk, dv, per_key, t_type, s_type)


def lower(e: Emitter, operands: list[Operand | None], outputs: list[gs.Variable], attrs: dict) -> str:
    """Append to ``e``'s graph the Scan form of a LinearAttention node whose inputs are
    ``operands`` (None: absent), writing its ``outputs`` [output, present_state]. Returns the
    report's line. NotLowered (nothing appended) when the node has no Scan form here."""
    p = plan(operands, attrs, e.opset)
    operands = list(operands) + [None] * (len(INPUTS) - len(operands))
    q = operands[0]
    outputs[0].dtype, outputs[1].dtype = p.t_type, p.s_type
    dims = list(q.shape[:2]) if q.shape else [None, None]
    if all(_static(d) for d in dims):  # B and T static and positive: nothing to guard
        _run(e, p, operands, outputs)
    else:
        _guarded(e, p, operands, outputs)
    what = f"{p.rule}{' per-key' if p.per_key else ''} LinearAttention"
    heads = f"H={p.hq}" if p.group == 1 else f"H_q={p.hq}, H_kv={p.hkv}"
    return f"{what} ({heads}) -> Scan at opset {e.opset}"


def _sub(e: Emitter, graph: gs.Graph) -> Emitter:
    return Emitter(Builder(graph, e.b.names, e.b.prefix), e.opset, e.domain)


def _guarded(e: Emitter, p: _Plan, operands, outputs) -> None:
    q = operands[0].tensor
    shape = e.op("Shape", [q])
    zero = e.ints("zero", [0])
    batch = e.op("Gather", [shape, zero], axis=0)
    steps = e.op("Gather", [shape, e.ints("one", [1])], axis=0)
    empty = e.op("Or", [e.op("Equal", [batch, zero]), e.op("Equal", [steps, zero])])  # [1]: If's condition
    then_graph, else_graph = new_graph("linear_attention_empty"), new_graph("linear_attention_scan")
    ran = [gs.Variable(e.b.names.fresh(f"{o.name}_scan"), dtype=o.dtype) for o in outputs]
    _run(_sub(e, else_graph), p, operands, ran)
    else_graph.outputs = ran
    t = _sub(e, then_graph)
    width = _width(t, p, operands)
    y = _zeros(t, [batch, steps, width], p.t_type)
    past = operands[3]
    if past is not None:
        state = t.op("Identity", [past.tensor], dtype=p.s_type)
    else:
        state = _zeros(t, [batch, t.ints("heads", [p.hkv]), _size(t, p, operands, "dk"), _size(t, p, operands, "dv")],
                       p.s_type)
    then_graph.outputs = [y, state]
    e.op("If", [empty], outputs=outputs, then_branch=then_graph, else_branch=else_graph)


def _zeros(e: Emitter, parts, dtype: np.dtype) -> gs.Tensor:
    """Zeros of the shape ``parts`` concatenates (int64 [1] each), in ``dtype``."""
    value = gs.Constant(e.b.names.fresh("zero_value"), np.zeros([1], np.float32))
    x = e.op("ConstantOfShape", [e.op("Concat", parts, axis=0)], value=value, dtype=F32)
    return x if dtype == F32 else e.op("Cast", [x], to=_onnx_type(dtype), dtype=dtype)


def _onnx_type(dtype: np.dtype) -> int:
    from onnx import TensorProto

    return {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}[dtype.name]


def _size(e: Emitter, p: _Plan, operands, which: str) -> gs.Tensor:
    """dk or dv as int64 [1]: a constant where known, else the packed width over the heads."""
    known = p.dk if which == "dk" else p.dv
    if known is not None:
        return e.ints(which, [known])
    source, heads = (operands[0].tensor, p.hq) if which == "dk" else (operands[2].tensor, p.hkv)
    width = e.slice(e.op("Shape", [source]), [2], [3], [0])
    return e.op("Div", [width, e.ints("heads", [heads])])


def _width(e: Emitter, p: _Plan, operands) -> gs.Tensor:
    """The output's packed width q_num_heads * dv as int64 [1]."""
    if p.dv is not None:
        return e.ints("width", [p.hq * p.dv])
    return e.op("Mul", [_size(e, p, operands, "dv"), e.ints("heads", [p.hq])])


def _run(e: Emitter, p: _Plan, operands, outputs) -> None:
    """The Scan and its layout changes, writing ``outputs``."""
    q, k, v, past, decay, beta = operands[:len(INPUTS)]
    g = p.group

    def unpacked(op, heads, d):
        shape = [0, 0] + heads + [-1 if d is None else d]
        x = e.op("Reshape", [op.tensor, e.ints("unpacked", shape)], dtype=op.dtype)
        return _f32(e, x, op.dtype)

    q4 = unpacked(q, [p.hq] if g == 1 else [p.hkv, g], p.dk)
    k4, v4 = unpacked(k, [p.hkv], p.dk), unpacked(v, [p.hkv], p.dv)
    scanned = [q4, k4, v4]
    if decay is not None:
        if p.per_key is False:  # [B, T, H_kv] as it is
            scanned.append(_f32(e, decay.tensor, decay.dtype))
        else:  # [B, T, H_kv, dk] (per key, or -1 where not known: 1 or dk)
            scanned.append(unpacked(decay, [p.hkv], p.dk if p.per_key else None))
    if beta is not None:
        scanned.append(_f32(e, beta.tensor, beta.dtype))
    if past is not None:
        s0 = _f32(e, past.tensor, past.dtype)
    else:
        batch = e.slice(e.op("Shape", [q.tensor]), [0], [1], [0])
        s0 = _zeros(e, [batch, e.ints("heads", [p.hkv]), _size(e, p, operands, "dk"), _size(e, p, operands, "dv")], F32)
    scale = _scale(e, p, operands)
    body = _body(e, p, scale)
    final = outputs[1] if p.s_type == F32 else e.b.variable("final_state", dtype=F32)
    ys = e.b.variable("outputs", dtype=F32)
    m = len(scanned)
    e.op("Scan", [s0] + scanned, outputs=[final, ys], body=body, num_scan_inputs=m, scan_input_axes=[1] * m,
         scan_output_axes=[1])
    y_out = outputs[0] if p.t_type == F32 else e.b.variable("output", dtype=F32)
    e.op("Reshape", [ys, e.ints("packed", [0, 0, -1 if p.dv is None else p.hq * p.dv])], outputs=[y_out])
    if p.t_type != F32:
        e.op("Cast", [y_out], outputs=[outputs[0]], to=_onnx_type(p.t_type))
    if p.s_type != F32:
        e.op("Cast", [final], outputs=[outputs[1]], to=_onnx_type(p.s_type))


def _f32(e: Emitter, x: gs.Tensor, dtype: np.dtype) -> gs.Tensor:
    return x if dtype == F32 else e.op("Cast", [x], to=_onnx_type(F32), dtype=F32)


def _scale(e: Emitter, p: _Plan, operands) -> float | gs.Tensor:
    """The output's scale: the attribute, else 1/sqrt(dk) (a number where dk is known, else
    computed from query's width, a float32 scalar the body reads from outside)."""
    if p.scale != 0.0:
        return float(np.float32(p.scale))
    if p.dk is not None:
        return float(np.float32(1.0 / np.sqrt(np.float64(p.dk))))
    dk = e.op("Cast", [e.squeeze(_size(e, p, operands, "dk"), [0])], to=_onnx_type(F32), dtype=F32)
    return e.op("Reciprocal", [e.op("Sqrt", [dk], dtype=F32)], dtype=F32)


def _body(outer: Emitter, p: _Plan, scale) -> gs.Graph:
    """One step: S [B, H_kv, dk, dv], q [B, H, dk] ([B, H_kv, G, dk] grouped), k [B, H_kv, dk],
    v [B, H_kv, dv], g [B, H_kv] or [B, H_kv, dk], β [B, H_kv or 1] -> S', y."""
    body = new_graph("linear_attention_step")
    e = _sub(outer, body)
    hkv, g = p.hkv, p.group

    def value(hint, shape):
        return gs.Variable(e.b.names.fresh(hint), dtype=F32, shape=shape)

    state = value("state", [None, hkv, p.dk, p.dv])
    q = value("q", [None, p.hq, p.dk] if g == 1 else [None, hkv, g, p.dk])
    k, v = value("k", [None, hkv, p.dk]), value("v", [None, hkv, p.dv])
    body.inputs = [state, q, k, v]
    decayed = state
    if p.gated:
        per_head = p.per_key is False
        gate = value("g", [None, hkv] if per_head else [None, hkv, p.dk if p.per_key else None])
        body.inputs.append(gate)
        a = e.op("Exp", [e.unsqueeze(gate, [2, 3] if per_head else [3], dtype=F32)], dtype=F32)
        decayed = e.op("Mul", [a, state], dtype=F32)
    written = v
    if p.delta:
        beta = value("beta", [None, None])
        body.inputs.append(beta)
        read = e.squeeze(e.op("MatMul", [e.unsqueeze(k, [2], dtype=F32), decayed], dtype=F32), [2], dtype=F32)  # Sᵀk
        written = e.op("Mul", [e.op("Sub", [v, read], dtype=F32), e.unsqueeze(beta, [2], dtype=F32)], dtype=F32)
    outer_product = e.op("MatMul", [e.unsqueeze(k, [3], dtype=F32), e.unsqueeze(written, [2], dtype=F32)], dtype=F32)
    new_state = e.op("Add", [decayed, outer_product], dtype=F32, shape=[None, hkv, p.dk, p.dv])
    if g == 1:
        y = e.squeeze(e.op("MatMul", [e.unsqueeze(q, [2], dtype=F32), new_state], dtype=F32), [2], dtype=F32)
        shape = [None, p.hq, p.dv]
    else:  # [B, H_kv, G, dk] x [B, H_kv, dk, dv]: query head kv*G + j reads KV head kv
        y = e.op("MatMul", [q, new_state], dtype=F32)
        shape = [None, hkv, g, p.dv]
    if isinstance(scale, gs.Tensor) or scale != 1.0:
        factor = scale if isinstance(scale, gs.Tensor) else e.const("scale", np.asarray(scale, np.float32))
        y = e.op("Mul", [y, factor], dtype=F32)
    y.shape = shape
    body.outputs = [new_state, y]
    return body
