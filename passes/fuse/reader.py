"""Reading gates: an activation and its pre-activation, the pre-activation as weights per
role (x, h, c, ...), the weight blocks in ONNX layout; and the plain RNN cell."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.graph import is_op
from scanopt.passes.fuse.algebra import Algebra, cut_source, describe, is_cut, producer, resolve
from scanopt.passes.fuse.cell import ACTIVATION_OPS, AFFINE, NOT_FUSED, Activation, Cell
from scanopt.passes.fuse.linear import (
    _Linear, _bias, _cat, _last_dim, _onnx, _size, _symmetric_clip, clip_bounds,
)
from scanopt.passes.fuse.stacked import entry, picked
from scanopt.passes.fuse.poly import Leaf, NoMatch, Poly, Runtime, columns, format_poly


class GateReader:
    def __init__(self, x, rank, stops, body=None, varying=(), folder=None):
        self.alg = Algebra(rank, stops, body, varying, folder)
        self.x = x
        self.roles = {id(x): "x"}
        self.names = {id(x): "x"}
        self.input_size = _last_dim(x)
        self.rh = gs.Variable("r⊙h")  # stands for r⊙h, so the lbr=0 weight is read like a role
        self.linear_gates: dict = {}  # id(placeholder) -> the sum a gate with no nonlinearity is

    def _known(self, factor) -> bool:
        return isinstance(factor, Leaf) and id(factor.tensor) in self.roles

    def role(self, tensor, name):
        self.roles[id(tensor)] = name
        self.names[id(tensor)] = name

    # -- pieces -------------------------------------------------------------------------
    def gate(self, tensor: gs.Tensor, what: str, scaled: bool = False) -> tuple[Activation, float | None, Poly]:
        """(activation, clip, pre-activation) of a gate value, also of a Split/Slice of one; a
        gate with no nonlinearity (a placeholder of ``linear_gates``) is Affine(1, 0).

        The clip attribute clips each gate's pre-activation to [-c, c] before its activation, so
        a symmetric Clip under the activation is the clip, also when the gates are cut from one
        clipped value (Clip is elementwise: a cut of Clip(p) is Clip of that cut of p). A Clip as
        the activation itself is one with the clip: Clip(p, -c, c) = Affine(1, 0)(Clip(p, -c, c))
        (hardtanh), Clip(p, 0, c) = Relu(Clip(p, -c, c)) (ReLU6), Clip(p, 0) = Relu(p)."""
        if id(tensor) in self.linear_gates:
            return AFFINE, None, self.linear_gates[id(tensor)]
        cuts, tensor = _cuts(tensor)
        node = producer(tensor)
        pick = picked(self.alg, node) if node is not None else None
        if pick is not None and producer(pick[0]) is not None and (
                self.activation(pick[0], scaled) is not None or is_op(producer(pick[0]), "Clip")):
            tensor, node = pick[0], producer(pick[0])  # entry k of a stack of activations: act(entry k)
        else:
            pick = None
        if node is not None and is_op(node, "Clip"):
            act, clip, pre = _clip_activation(node, what, self.describe(tensor), self.alg.const)
        else:
            found = self.activation(tensor, scaled)
            if found is None:
                if node is None:
                    raise NoMatch(f"{what} {self.describe(tensor)} is not computed by an activation")
                why = NOT_FUSED.get(node.op, "not an activation the recurrent ops support")
                raise NoMatch(f"{what} {self.describe(tensor)} is a {node.op} output: {why}")
            act, pre = found
            clip = None
            inner, base = _cuts(resolve(pre))
            clipper = producer(base)
            if clipper is not None and is_op(clipper, "Clip"):
                clip = _symmetric_clip(clipper, self.alg.const)
                pre, cuts = clipper.inputs[0], cuts + inner
        whole = self.alg.value(pre) if pick is None else entry(self.alg, pre, pick[1])
        for node, out in reversed(cuts):
            start, stop = self.alg.column_range(node, out, whole.width())
            whole = columns(whole, start, stop)
        return act, clip, whole

    def activation(self, tensor: gs.Tensor, scaled: bool = False) -> tuple[Activation, gs.Tensor] | None:
        """(activation, its input) when ``tensor`` is an activation the native ops accept;
        with ``scaled``, ``alpha ⊙ Tanh(v)`` too, as ScaledTanh(alpha, 1) (a beta inside the
        Tanh stays in the pre-activation's weights)."""
        node = producer(tensor)
        if node is None or not is_op(node, node.op):
            return None
        if scaled and node.op == "Mul":
            for k in (0, 1):
                alpha, inner = self.alg.const(node.inputs[k]), producer(node.inputs[1 - k])
                if alpha is not None and alpha.size == 1 and alpha.dtype.kind == "f" and inner is not None \
                        and is_op(inner, "Tanh") and float(alpha.reshape(-1)[0]) != 0:
                    return Activation("ScaledTanh", (("alpha", float(alpha.reshape(-1)[0])), ("beta", 1.0))), inner.inputs[0]
            return None
        if node.op not in ACTIVATION_OPS:
            return None
        act = Activation(node.op, tuple((k, float(node.attrs.get(k, d))) for k, d in ACTIVATION_OPS[node.op]))
        return act, node.inputs[0]

    def linear(self, p: Poly, what: str, allowed: tuple[str, ...]) -> _Linear:
        mats, diags, rbias = {}, {}, []
        for t in p.terms:
            if not t.factors:  # a run-time bias
                rbias.append(t.weight)
                continue
            f = t.factors[0] if len(t.factors) == 1 else None
            role = self.roles.get(id(f.tensor)) if isinstance(f, Leaf) else None
            if role not in allowed:
                raise NoMatch(f"{what} reads {self.term(t)}")
            bucket = mats if t.matrix else diags
            if role in bucket and (isinstance(t.weight, Runtime) or isinstance(bucket[role], Runtime)):
                raise NoMatch(f"{what} reads {role} through a run-time weight and through another weight")
            bucket[role] = t.weight if role not in bucket else bucket[role] + t.weight
        return _Linear(mats, diags, p.bias, tuple(rbias))

    def term(self, t) -> str:
        leaves = [f for f in t.factors if isinstance(f, Leaf)]
        if len(t.factors) == 1 and leaves:
            return self.describe(leaves[0].tensor)
        return "the product " + format_poly(Poly((t,)), self.names)

    def describe(self, tensor) -> str:
        role = self.roles.get(id(tensor))
        return f"{role} ('{tensor.name}')" if role else describe(tensor)

    def hidden_of(self, *lins: _Linear, state: gs.Tensor) -> int:
        vectors = [v for lin in lins for v in list(lin.diags.values()) + [lin.bias] + list(lin.rbias)]
        sizes = {_size(m, 1) for lin in lins for m in lin.mats.values()} | {_size(v, 0) for v in vectors}
        sizes.discard(None)
        declared = _last_dim(state)
        if declared is not None:
            sizes.add(declared)
        if not sizes and state.shape is not None and len(state.shape) == 0:
            raise NoMatch("the state is a scalar (rank 0): the native ops keep a [batch, hidden] state")
        if len(sizes) != 1:
            raise NoMatch(f"gate sizes disagree: {sorted(sizes)}" if sizes else "the hidden size is unknown")
        return sizes.pop()

    def matrix(self, lin: _Linear, role: str, rows: int | None, hidden: int, what: str) -> np.ndarray:
        """Role's weight in x·W orientation [rows, H]; an elementwise term is a diagonal.
        A run-time weight comes back as the :class:`Runtime` itself."""
        m = lin.mats.get(role)
        if isinstance(lin.diags.get(role), Runtime):
            raise NoMatch(f"{what} multiplies {role} elementwise by run-time '{lin.diags[role].tensor.name}'; "
                          "only LSTM peepholes may be elementwise run-time weights")
        if isinstance(m, Runtime):
            if role in lin.diags:
                raise NoMatch(f"{what} reads {role} through a run-time weight and elementwise")
            if (None not in (m.in_size, rows) and m.in_size != rows) or m.width not in (None, hidden):
                raise NoMatch(f"{what}: run-time weight '{m.tensor.name}' does not fit [{rows}, {hidden}]")
            return m
        if rows is None:
            rows = m.shape[0] if m is not None else None
        if rows is None:
            raise NoMatch(f"the size of {role} is unknown")
        out = np.zeros((rows, hidden)) if m is None else m.copy()
        if out.shape != (rows, hidden):
            raise NoMatch(f"{what}: the {role} weight is {list(out.shape)}, expected {[rows, hidden]}")
        if role in lin.diags:
            scale_ = np.broadcast_to(lin.diags[role], (hidden,))
            if rows == hidden:
                out += np.diag(scale_)
            elif rows == 1:  # a size-1 value broadcast across the gate
                out[0] += scale_
            else:
                raise NoMatch(f"{what} adds {role} elementwise, but its size {rows} is not the hidden size {hidden}")
        return out

    def input_rows(self, *lins: _Linear) -> int:
        sizes = {_size(lin.mats["x"], 0) for lin in lins if "x" in lin.mats} - {None}
        if self.input_size is not None:
            sizes.add(self.input_size)
        if len(sizes) != 1:
            raise NoMatch(f"input sizes disagree: {sorted(sizes)}" if sizes else "the input size is unknown")
        return sizes.pop()

    def weights(self, gates: list[_Linear], names: list[str], hidden: int):
        """Blocks of W, R and Wb in ONNX layout for gates in ONNX order, and the input size."""
        rows = self.input_rows(*gates)
        W = [_onnx(self.matrix(g, "x", rows, hidden, n)) for g, n in zip(gates, names)]
        R = [_onnx(self.matrix(g, "h", hidden, hidden, n)) for g, n in zip(gates, names)]
        Wb = [_bias(g, hidden) for g in gates]
        return W, R, Wb, rows

    # -- cells --------------------------------------------------------------------------
    def rnn(self, h, h_out) -> Cell:
        self.role(h, "h")
        act, clip, pre = self.gate(h_out, "the new state", scaled=True)
        lin = self.linear(pre, f"the pre-activation of {act}", ("x", "h"))
        hidden = self.hidden_of(lin, state=h)
        W, R, Wb, rows = self.weights([lin], ["RNN"], hidden)
        B = _cat(*Wb, np.zeros(hidden))
        return Cell("RNN", hidden, rows, _cat(*W), _cat(*R), B, None, (act,), clip, h=h)

    def affine_rnn(self, h, h_out) -> Cell | None:
        """A cell with no nonlinearity: the new state is linear in x and h (an ``alpha·pre + beta``
        written with Mul/Add is linear too) and becomes RNN with Affine(alpha=1, beta=0), every
        scale folded into W, R and B; None when the new state is not linear in x and h. A state
        that reads h only elementwise (EMA ``a⊙h + (1-a)⊙x·W``, a running sum) is declined."""
        self.role(h, "h")
        try:
            p = self.alg.poly(h_out)
        except NoMatch:
            return None
        if not p.terms or any(t.factors and (len(t.factors) != 1 or not self._known(t.factors[0])) for t in p.terms):
            return None
        lin = self.linear(p, "the new state", ("x", "h"))
        if "h" in lin.diags and "h" not in lin.mats:
            raise NoMatch("the new state is linear with h read elementwise only (a diagonal recurrence such as an "
                          "EMA or a running sum): the native RNN (Affine) would turn its O(H) elementwise steps "
                          "into H×H products")
        hidden = self.hidden_of(lin, state=h)
        W, R, Wb, rows = self.weights([lin], ["the new state"], hidden)
        return Cell("RNN", hidden, rows, _cat(*W), _cat(*R), _cat(*Wb, np.zeros(hidden)), None, (AFFINE,),
                    notes=("no nonlinearity: Affine(1, 0)",), h=h)


def _cuts(tensor: gs.Tensor) -> tuple[list, gs.Tensor]:
    """The last-axis cuts (node, output), outermost first, that ``tensor`` is taken through,
    and the value they cut."""
    cuts = []
    node = producer(tensor)
    while is_cut(node):
        cuts.append((node, tensor))
        tensor = resolve(cut_source(node))
        node = producer(tensor)
    return cuts, tensor


def _clip_activation(node: gs.Node, what: str, name: str, const) -> tuple[Activation, float | None, gs.Tensor]:
    """A Clip used as the activation as (activation, clip, pre-activation), or NoMatch with the
    reason; ``Clip(Relu(p), lo <= 0, c)`` (onnx-tf's Relu6) is min(relu(p), c) = Relu with clip c."""
    lo, hi = clip_bounds(node, const)
    pre = resolve(node.inputs[0])
    inner = producer(pre)
    if inner is not None and is_op(inner, "Relu") and (lo is None or lo <= 0) and (hi is None or hi > 0):
        return Activation("Relu"), hi, inner.inputs[0]
    if lo is not None and hi is not None and hi > 0 and lo == -hi:
        return AFFINE, hi, node.inputs[0]  # hardtanh
    if lo == 0 and (hi is None or hi > 0):
        return Activation("Relu"), hi, node.inputs[0]  # ReLU6 (hi = 6); Relu when unbounded above
    raise NoMatch(f"{what} {name} is Clip(·, {lo}, {hi}): the recurrent ops clip the pre-activation to a symmetric "
                  "[-c, c] before the activation, so only Clip(·, -c, c) (identity with clip=c) and Clip(·, 0, c) "
                  "(Relu with clip=c) are recurrent activations")
