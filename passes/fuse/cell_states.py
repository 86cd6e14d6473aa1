"""An LSTM Scan that also emits its cell state per step: the native op gives every h_t (Y);
the c_t sequence is recomputed from it.

Every step's gates read only x_t and h_{t-1}, and h_{t-1} is Y shifted by one step with h0
first (last, for a reverse op), so all gates come out of two matrix products over the whole
sequence. What is left is ``c_t = f_t ⊙ c_{t-1} + i_t ⊙ g_t``: a linear recurrence with a = f,
b = i ⊙ g known before it runs, emitted as a two-node Scan over (a, b) in the native op's
direction (the linrec pass makes it loop-free where that pays). A scan output that is an
activation of c_t (tanh(c)) is that activation of the sequence.

Refused (by :func:`cell_output_problem`): peepholes on the input or forget gate (a and b
would read c_{t-1}), per-item lengths and Scan-8 batches (c past an item's length would have
to follow the Scan's own semantics there).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.emit import INT64_MAX
from scanopt.passes.fuse.algebra import producer, resolve
from scanopt.passes.fuse.cell import ACTIVATION_OPS, Activation, Cell
from scanopt.rewrite import Builder, new_graph


def cell_output(y: gs.Tensor, c_out: gs.Tensor) -> tuple | None:
    """What a scan output ``y`` is in terms of the new cell state ``c_out``: ("c", None) for
    c_out itself, ("act", (op, attrs)) for an activation of it, else None."""
    y = resolve(y)
    if y is c_out:
        return ("c", None)
    node = producer(y)
    if node is not None and node.op in ACTIVATION_OPS and node.domain in (None, "", "ai.onnx") and len(node.inputs) == 1 \
            and resolve(node.inputs[0]) is c_out:
        return ("act", (node.op, dict(node.attrs)))
    return None


def cell_output_problem(cell: Cell, batched: bool, lengths) -> str | None:
    """Why the per-step cell state cannot be recomputed from Y exactly, or None."""
    if batched:
        return "an opset-8 batched Scan (c past an item's sequence_lens would need the Scan's own semantics there)"
    if lengths is not None:
        return "the body masks its steps by per-item lengths (c past a length would need the Scan's own semantics)"
    if cell.P is not None:
        if not isinstance(cell.P, np.ndarray):
            return "the gates peek at the cell state through run-time peepholes"
        h = cell.hidden
        if np.any(cell.P[:h]) or np.any(cell.P[2 * h:3 * h]):
            return ("the input or forget gate peeks at c_{t-1} (peepholes): the cell update is then not a linear "
                    "recurrence with coefficients known before the loop")
    return None


GATE_BLOCKS = {"i": 0, "o": 1, "f": 2, "c": 3}  # ONNX LSTM's gate order in W, R and B


def cell_sequence(emit, cell: Cell, native: list, y: gs.Tensor, index: int, count: int, reverse: bool,
                  per_gate: bool = False):
    """The cell state of every step [T, B, H], aligned with the native op's input time.

    ``native``: the LSTM's inputs (X [T, B, I], W, R, B, sequence_lens, initial_h, initial_c);
    ``y``: its Y for this direction [T, B, H]; ``index`` of ``count`` directions. Only the
    gates c's update reads are recomputed (i, f, g; i, g with input_forget): the output gate's
    quarter of the products is left out where the weights are constants. ``per_gate``
    (--target portable): one pair of products per gate, each [T, B, H], instead of one pair
    over all gates sliced after: OpenVINO 2026.4's CPU runtime wrote garbage for a product of
    the guard If's Y wider than Y added to another product, on every run whose shapes grew its
    memory (the first included; scanopt.portable)."""
    x, w, r, bias = native[:4]
    h0, c0 = emit.pick(native[5], index, count, 0), emit.pick(native[6], index, count, 0)  # [B, H]
    hidden = cell.hidden
    first = emit.unsqueeze(h0, [0])
    if reverse:  # step t follows step t + 1: h_{t+1} is Y[t + 1], h0 after the last
        before = emit.slice(emit.op("Concat", [y, first], axis=0), [1], [INT64_MAX], [0])
    else:
        before = emit.slice(emit.op("Concat", [first, y], axis=0), [0], [-1], [0])
    wanted = ["i", "c"] if cell.input_forget else ["i", "f", "c"]
    if per_gate:
        pre = {g: _products(emit, x, before, native, index, count, [g], hidden) for g in wanted}
    else:
        constant = all(isinstance(t, gs.Constant) for t in (w, r, bias))
        blocks = wanted if constant else list(GATE_BLOCKS)
        gates = _products(emit, x, before, native, index, count, blocks, hidden)
        pre = {g: emit.slice(gates, [k * hidden], [(k + 1) * hidden], [2]) for k, g in enumerate(blocks) if g in wanted}
    act_f, act_g = cell.activations[0], cell.activations[1]
    i = activate(emit, act_f, _clipped(emit, pre["i"], cell.clip))
    g = activate(emit, act_g, _clipped(emit, pre["c"], cell.clip))
    if cell.input_forget:
        f = emit.op("Sub", [emit.const("one", np.float32(1.0)), i])
    else:
        f = activate(emit, act_f, _clipped(emit, pre["f"], cell.clip))
    return _linear_scan(emit, c0, f, emit.op("Mul", [i, g]), reverse, [_batch_dim(emit, x), hidden])


def _products(emit, x, before, native, index, count, blocks, hidden):
    """``X·Wᵀ + before·Rᵀ + Wb + Rb`` for the gate ``blocks``, [T, B, len(blocks)·H]."""
    w, r, bias = native[1:4]
    products = emit.op("Add", [emit.op("MatMul", [x, _transposed(emit, w, index, count, blocks, hidden)]),
                               emit.op("MatMul", [before, _transposed(emit, r, index, count, blocks, hidden)])])
    return emit.op("Add", [products, _bias(emit, bias, index, count, blocks, hidden)])


def activate(emit, act: Activation, x: gs.Tensor) -> gs.Tensor:
    """The recurrent ops' activation ``act`` applied to ``x`` as ONNX ops."""
    params = dict(act.params)
    if act.name == "Affine":
        scaled = emit.op("Mul", [x, emit.const("alpha", np.float32(params["alpha"]))])
        return emit.op("Add", [scaled, emit.const("beta", np.float32(params["beta"]))])
    if act.name == "ScaledTanh":
        inner = emit.op("Mul", [x, emit.const("beta", np.float32(params["beta"]))])
        return emit.op("Mul", [emit.op("Tanh", [inner]), emit.const("alpha", np.float32(params["alpha"]))])
    return emit.op(act.name, [x], **params)


def _clipped(emit, x, clip):
    if clip is None:
        return x
    if emit.opset < 11:
        return emit.op("Clip", [x], min=-float(clip), max=float(clip))
    return emit.op("Clip", [x, emit.const("low", np.float32(-clip)), emit.const("high", np.float32(clip))])


def _rows(value: np.ndarray, blocks, hidden: int) -> np.ndarray:
    """The rows of the gate ``blocks`` of a [4H, ...] weight, in that order."""
    return np.concatenate([value[GATE_BLOCKS[g] * hidden:(GATE_BLOCKS[g] + 1) * hidden] for g in blocks])


def _transposed(emit, weight, index, count, blocks, hidden):
    """Direction ``index`` of a [D, 4H, K] weight as [K, len(blocks)·H]; a constant stays a
    constant (cut to ``blocks``), a run-time weight is transposed whole (all four blocks) and
    cut to one block where ``blocks`` is one."""
    if isinstance(weight, gs.Constant):
        return emit.const("weight_t", np.ascontiguousarray(_rows(np.asarray(weight.values)[index], blocks, hidden).T))
    whole = emit.op("Transpose", [emit.pick(weight, index, count, 0)], perm=[1, 0])
    return _block(emit, whole, blocks, hidden, axis=1)


def _bias(emit, bias, index, count, blocks, hidden):
    """Wb + Rb of direction ``index`` of B [D, 8H], as [len(blocks)·H] (run-time: [4H], or one
    block where ``blocks`` is one)."""
    if isinstance(bias, gs.Constant):
        value = np.asarray(bias.values)[index]
        both = value[:4 * hidden] + value[4 * hidden:]
        return emit.const("gate_bias", _rows(both, blocks, hidden).astype(np.float32))
    picked = emit.pick(bias, index, count, 0)
    whole = emit.op("Add", [emit.slice(picked, [0], [4 * hidden], [0]),
                            emit.slice(picked, [4 * hidden], [8 * hidden], [0])])
    return _block(emit, whole, blocks, hidden, axis=0)


def _block(emit, whole, blocks, hidden, axis):
    """``whole`` (all four gate blocks along ``axis``) cut to the one block in ``blocks``;
    ``whole`` itself for all four."""
    if len(blocks) == len(GATE_BLOCKS):
        return whole
    (gate,) = blocks
    k = GATE_BLOCKS[gate]
    return emit.slice(whole, [k * hidden], [(k + 1) * hidden], [axis])


def _batch_dim(emit, x):
    """X's batch dim (X [T, B, I]) as gs knows it, else a fresh symbolic name: the c loop's
    state is declared [B, H], its width known (linrec sizes its forms by it)."""
    shape = x.shape
    dim = shape[1] if shape is not None and len(shape) == 3 else None
    return dim if isinstance(dim, (int, np.integer, str)) and dim != "" else emit.b.names.fresh("batch")


def _linear_scan(emit, c0, a, b, reverse: bool, shape):
    """A Scan computing c_t = a_t ⊙ c_{t-1} + b_t from ``c0`` over a, b [T, B, H]; the stacked
    c_t aligned with a and b (a reverse scan prepends its outputs); ``shape``: one step's [B, H]."""
    names = emit.b.names
    body = new_graph(names.fresh("cell_state_steps"))
    inner = Builder(body, names)
    c_in = gs.Variable(names.fresh("c"), dtype=np.float32, shape=list(shape))
    a_t = gs.Variable(names.fresh("a"), dtype=np.float32, shape=list(shape))
    b_t = gs.Variable(names.fresh("b"), dtype=np.float32, shape=list(shape))
    c_new = inner.op("Add", [inner.op("Mul", [a_t, c_in], dtype=np.float32), b_t], dtype=np.float32,
                     shape=list(shape))
    stacked = inner.op("Identity", [c_new], dtype=np.float32, shape=list(shape))
    body.inputs = [c_in, a_t, b_t]
    body.outputs = [c_new, stacked]
    attrs = {"body": body, "num_scan_inputs": 2}
    if reverse:
        attrs.update(scan_input_directions=[1, 1], scan_output_directions=[1])
    outs = [emit.b.variable("c_last", np.float32), emit.b.variable("c_steps", np.float32)]
    emit.op("Scan", [c0, a, b], outputs=outs, **attrs)
    return outs[1]

