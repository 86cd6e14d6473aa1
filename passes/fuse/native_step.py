"""A Scan body that runs one step of a native RNN/GRU/LSTM (TorchScript exports ``nn.LSTMCell``,
``nn.GRUCell`` and ``nn.RNNCell`` in a scripted loop this way): X = Unsqueeze(x_t, 0), the
initial states Unsqueeze(h, 0) (and c), the new states Squeeze(Y_h, 0) (and Squeeze(Y_c, 0)).

One step of the op over x_t from (h, c) is the op's own recurrence, so the Scan is that op over
the whole sequence: its W, R, B and peepholes (constants behind any nodes, read by the
constant folder) and its attributes are the cell's. Taken only when every piece is proven:
forward or reverse (one step is the same in both), one direction, no sequence_lens, layout 0,
the default activations' parameters (explicit alpha/beta are declined).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.graph import constant_axes, is_op
from scanopt.passes.fuse.algebra import producer, resolve
from scanopt.passes.fuse.cell import ACTIVATION_OPS, Activation, Cell
from scanopt.passes.fuse.poly import NoMatch

DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def native_step(x: gs.Tensor, states: list[tuple[gs.Tensor, gs.Tensor]], folder) -> Cell | None:
    """The cell when the new hidden state is Squeeze(Y_h, 0) of a one-step native op in the
    body; None when it is not (the algebra reads the body then); NoMatch when it is but cannot
    be taken, with the reason."""
    outs = [resolve(o) for _, o in states]
    found = [(k, _squeezed_output(o)) for k, o in enumerate(outs)]
    found = [(k, node, slot) for k, (node, slot) in found if node is not None]
    if not found:
        return None
    node = found[0][1]
    kind = node.op
    if any(n is not node for _, n, _ in found) or len(found) != len(states) or len(states) != (2 if kind == "LSTM" else 1):
        raise NoMatch(f"the states are not exactly the outputs of the one-step {kind} '{node.name}' in the body")
    by_slot = {slot: states[k] for k, _, slot in found}
    if set(by_slot) != ({1, 2} if kind == "LSTM" else {1}):
        raise NoMatch(f"the new states are not {kind} '{node.name}''s Y_h{' and Y_c' if kind == 'LSTM' else ''}")
    inputs = list(node.inputs) + [gs.Variable.empty()] * (8 - len(node.inputs))
    if _unsqueezed(inputs[0]) is not resolve(x):
        raise NoMatch(f"{kind} '{node.name}' in the body does not read Unsqueeze(x, 0) as its X")
    if inputs[4].name:
        raise NoMatch(f"{kind} '{node.name}' in the body has sequence_lens")
    h, c = by_slot[1][0], by_slot[2][0] if kind == "LSTM" else None
    if _unsqueezed(inputs[5]) is not h or (kind == "LSTM" and _unsqueezed(inputs[6]) is not c):
        raise NoMatch(f"{kind} '{node.name}' in the body does not start from Unsqueeze(state, 0)")
    attrs = node.attrs
    if attrs.get("direction", "forward") not in ("forward", "reverse") or int(attrs.get("layout", 0)) != 0:
        raise NoMatch(f"{kind} '{node.name}' in the body is {attrs.get('direction')} with layout {attrs.get('layout', 0)}")
    if "activation_alpha" in attrs or "activation_beta" in attrs:
        raise NoMatch(f"{kind} '{node.name}' in the body sets activation_alpha/beta")
    names = tuple(attrs.get("activations", DEFAULT_ACTIVATIONS[kind]))
    if any(n not in ACTIVATION_OPS or ACTIVATION_OPS[n] for n in names):
        raise NoMatch(f"{kind} '{node.name}' in the body uses activations {list(names)}")
    hidden, gates = int(attrs["hidden_size"]), GATES[kind]
    W, R = folder.value(inputs[1]), folder.value(inputs[2])
    B = folder.value(inputs[3]) if inputs[3].name else np.zeros([1, 2 * gates * hidden])
    P = folder.value(inputs[7]) if kind == "LSTM" and inputs[7].name else None
    if any(v is None for v in (W, R, B)) or (kind == "LSTM" and inputs[7].name and P is None):
        raise NoMatch(f"{kind} '{node.name}' in the body reads weights computed at run time")
    if W.shape[:2] != (1, gates * hidden) or R.shape != (1, gates * hidden, hidden) or B.shape != (1, 2 * gates * hidden):
        raise NoMatch(f"{kind} '{node.name}' in the body has weights of shapes {W.shape}, {R.shape}, {B.shape}")
    clip = float(attrs["clip"]) if "clip" in attrs else None
    notes = (f"one-step {kind} in the body",)
    return Cell(kind, hidden, int(W.shape[2]), W[0].astype(np.float64), R[0].astype(np.float64),
                B[0].astype(np.float64), None if P is None else P[0].astype(np.float64),
                tuple(Activation(n) for n in names), clip, int(attrs.get("linear_before_reset", 0)), notes,
                h=h, c=c, input_forget=int(attrs.get("input_forget", 0)))


def _squeezed_output(tensor: gs.Tensor):
    """(native op, output slot) when ``tensor`` is Squeeze(that output, [0]), else (None, None)."""
    node = producer(tensor)
    if node is None or not is_op(node, "Squeeze") or constant_axes(node) != [0]:
        return None, None
    source = resolve(node.inputs[0])
    op = producer(source)
    if op is None or not any(is_op(op, k) for k in GATES):
        return None, None
    return op, next(i for i, t in enumerate(op.outputs) if t is source)


def _unsqueezed(tensor: gs.Tensor) -> gs.Tensor | None:
    """t when ``tensor`` is Unsqueeze(t, [0]) (through Identity), else None."""
    node = producer(resolve(tensor))
    if node is None or not is_op(node, "Unsqueeze") or constant_axes(node) != [0]:
        return None
    return resolve(node.inputs[0])
