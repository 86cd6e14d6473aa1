"""Recurrent cells in Scan bodies: recognize RNN, GRU and LSTM by their algebra.

:func:`recognize` gets the body's scan input x and its recurrent states (input, output)
and returns a :class:`Cell` in the native op's terms (ONNX gate order, W [G·H, I],
R [G·H, H], B [2·G·H], peepholes, activations, clip, linear_before_reset), or raises
NoMatch with the reason. Every value is read through :class:`scanopt.pattern.Algebra`,
so the gates are identified by what they compute, not by node order: which Split output
feeds which activation gives the gate order (PyTorch i, f, g, o or ONNX i, o, f, c),
where ``r`` sits gives linear_before_reset, and the state update is compared after
expansion (``(1-z)⊙h̃ + z⊙h``, ``h̃ + z⊙(h - h̃)``, ... are one polynomial).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.graph import constant_value, is_op
from scanopt.pattern import (
    Algebra, Group, Leaf, NoMatch, Poly, Runtime, Term, add, columns, describe, format_poly, is_algebra, producer, resolve,
    scale,
)

# ONNX activation op -> its (attribute, default) parameters; all are in the RNN ops' list.
# ThresholdedRelu is left out: onnxruntime's recurrent kernels use x > alpha, the spec x >= alpha.
ACTIVATION_OPS = {
    "Tanh": (),
    "Sigmoid": (),
    "Relu": (),
    "Softsign": (),
    "Softplus": (),
    "LeakyRelu": (("alpha", 0.01),),
    "Elu": (("alpha", 1.0),),
    "HardSigmoid": (("alpha", 0.2), ("beta", 0.5)),
}
NOT_FUSED = {
    "ThresholdedRelu": "onnxruntime's recurrent kernels use x > alpha where the spec says x >= alpha",
    "Selu": "Selu is not among the recurrent ops' activations",
    "Gelu": "Gelu is not among the recurrent ops' activations",
}


@dataclass(frozen=True)
class Activation:
    name: str
    params: tuple[tuple[str, float], ...] = ()  # ("alpha", v) / ("beta", v) in op order

    def __str__(self) -> str:
        return self.name + (f"({', '.join(f'{k}={v:g}' for k, v in self.params)})" if self.params else "")


@dataclass(frozen=True)
class Sum:
    """A bias block known only at run time: ``const`` plus run-time vectors."""

    const: np.ndarray
    runtimes: tuple[Runtime, ...]


@dataclass(frozen=True, eq=False)
class Cell:
    """One direction of a native recurrent op, weights in ONNX layout (float64).

    A weight that reads run-time values (an enclosing graph's value, a loop-invariant
    state) is instead a tuple of blocks to concatenate on axis 0: arrays (ONNX layout),
    :class:`Runtime` (x·W orientation: the emitter slices and transposes) and :class:`Sum`.
    """

    kind: str  # "RNN" | "GRU" | "LSTM"
    hidden: int
    input_size: int
    W: np.ndarray | tuple  # [G*H, I]
    R: np.ndarray | tuple  # [G*H, H]
    B: np.ndarray | tuple  # [2*G*H] = [Wb, Rb]
    P: np.ndarray | tuple | None  # [3H] LSTM peepholes (i, o, f)
    activations: tuple[Activation, ...]
    clip: float | None = None
    linear_before_reset: int = 0
    notes: tuple[str, ...] = field(default=())  # forms recognized, for the report
    h: gs.Tensor | None = None  # the body's hidden-state input
    c: gs.Tensor | None = None  # the body's cell-state input (LSTM)

    def attrs(self) -> dict:
        """The native op's attributes for one direction (activations always explicit)."""
        attrs = {"hidden_size": self.hidden, "activations": [a.name for a in self.activations]}
        alphas = [v for a in self.activations for k, v in a.params if k == "alpha"]
        betas = [v for a in self.activations for k, v in a.params if k == "beta"]
        if alphas:
            attrs["activation_alpha"] = alphas
        if betas:
            attrs["activation_beta"] = betas
        if self.clip is not None:
            attrs["clip"] = self.clip
        if self.kind == "GRU":
            attrs["linear_before_reset"] = self.linear_before_reset
        return attrs


class _NotCellState(NoMatch):
    """The state tried as the cell state does not update like one."""


@dataclass
class _Linear:
    """A gate pre-activation as matrices per role, elementwise terms per role, bias
    (and run-time bias vectors)."""

    mats: dict
    diags: dict
    bias: np.ndarray | None
    rbias: tuple = ()

    def negated(self) -> "_Linear":
        return _Linear({k: _neg(v) for k, v in self.mats.items()}, {k: _neg(v) for k, v in self.diags.items()},
                       None if self.bias is None else -self.bias, tuple(r.scaled(-1.0) for r in self.rbias))


def recognize(x: gs.Tensor, states: list[tuple[gs.Tensor, gs.Tensor]], rank=None, body: gs.Graph | None = None) -> Cell:
    """The cell that maps (x, states) to the states' new values, or NoMatch(reason).

    ``states`` are (body input, body output) pairs of the recurrent states; one state
    is tried as RNN then GRU, two as LSTM (either one may be the cell state). With
    ``body``, values the body reads but does not compute (other than x and the states)
    may be run-time weights.
    """
    outs = [resolve(o) for _, o in states]
    reader = _Reader(x, rank, stops=outs, body=body, varying=[x] + [i for i, _ in states])
    if len(states) == 1:
        ((h, _),), (h_out,) = states, outs
        node = producer(h_out)
        if node is not None and not is_algebra(node):
            cell = reader.rnn(h, h_out)
        else:
            cell = reader.gru(h, h_out)
    elif len(states) == 2:
        errors, early = [], []
        for (c, c_out), (h, h_out) in ((states[0], states[1]), (states[1], states[0])):
            try:
                cell = reader.lstm(h, resolve(h_out), c, resolve(c_out))
                break
            except NoMatch as exc:
                (early if isinstance(exc, _NotCellState) else errors).append(f"with '{c.name}' as the cell state: {exc}")
        else:
            # An assignment that got past the cell-state update says more than one that did not.
            raise NoMatch("no LSTM cell: " + "; ".join(errors or early))
    else:
        raise NoMatch(f"{len(states)} recurrent states: RNN/GRU carry one, LSTM two")
    return cell


class _Reader:
    def __init__(self, x, rank, stops, body=None, varying=()):
        self.alg = Algebra(rank, stops, body, varying)
        self.x = x
        self.roles = {id(x): "x"}
        self.names = {id(x): "x"}
        self.input_size = _last_dim(x)
        self.rh = gs.Variable("r⊙h")  # stands for r⊙h, so the lbr=0 weight is read like a role

    def _known(self, factor) -> bool:
        return isinstance(factor, Leaf) and id(factor.tensor) in self.roles

    def role(self, tensor, name):
        self.roles[id(tensor)] = name
        self.names[id(tensor)] = name

    # -- pieces -------------------------------------------------------------------------
    def gate(self, tensor: gs.Tensor, what: str) -> tuple[Activation, float | None, Poly]:
        """(activation, clip, pre-activation) of a gate value, also of a Split/Slice of one."""
        node = producer(tensor)
        if node is not None and (is_op(node, "Split") or is_op(node, "Slice")):
            act, clip, whole = self.gate(node.inputs[0], what)
            start, stop = self.alg.column_range(node, tensor, whole.width())
            return act, clip, columns(whole, start, stop)
        if node is None or not is_op(node, node.op) or node.op not in ACTIVATION_OPS:
            if node is None:
                raise NoMatch(f"{what} {self.describe(tensor)} is not computed by an activation")
            why = NOT_FUSED.get(node.op, "not an activation the recurrent ops support")
            raise NoMatch(f"{what} {self.describe(tensor)} is a {node.op} output: {why}")
        act = Activation(node.op, tuple((k, float(node.attrs.get(k, d))) for k, d in ACTIVATION_OPS[node.op]))
        pre, clip = node.inputs[0], None
        clipper = producer(resolve(pre))
        if clipper is not None and is_op(clipper, "Clip"):
            clip = _symmetric_clip(clipper)
            pre = clipper.inputs[0]
        return act, clip, self.alg.value(pre)

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
        act, clip, pre = self.gate(h_out, "the new state")
        lin = self.linear(pre, f"the pre-activation of {act}", ("x", "h"))
        hidden = self.hidden_of(lin, state=h)
        W, R, Wb, rows = self.weights([lin], ["RNN"], hidden)
        B = _cat(*Wb, np.zeros(hidden))
        return Cell("RNN", hidden, rows, _cat(*W), _cat(*R), B, None, (act,), clip, h=h)

    def gru(self, h, h_out) -> Cell:
        self.role(h, "h")
        update = _monomials(self.alg.poly(h_out), "the new state")
        z, cand, complement = self.gru_update(update, h)
        self.role(z, "z")
        self.role(cand, "h̃")
        f, clip_z, z_pre = self.gate(z, "the update gate")
        g, clip_h, h_pre = self.gate(cand, "the candidate")
        r, inner, outer, lbr = self.gru_candidate(h_pre)
        fr, clip_r, r_pre = self.gate(r, "the reset gate")
        if fr != f:
            raise NoMatch(f"the update gate uses {f} but the reset gate {fr}; GRU applies one f to both")
        if len({clip_z, clip_h, clip_r}) != 1:
            raise NoMatch(f"clips differ across the gates (z {clip_z}, r {clip_r}, h̃ {clip_h}); GRU clips all or none")
        lz = self.linear(z_pre, "the update gate", ("x", "h"))
        lr = self.linear(r_pre, "the reset gate", ("x", "h"))
        lh = self.linear(outer, "the candidate", ("x",) if lbr else ("x", "rh"))
        hidden = self.hidden_of(lz, lr, lh, state=h)
        if complement:
            if f.name != "Sigmoid":
                raise NoMatch(f"the new state is z⊙h̃ + (1-z)⊙h with z = {f}; only Sigmoid has 1-f(a) = f(-a)")
            lz = lz.negated()
        W, R, Wb, rows = self.weights([lz, lr, lh], ["the update gate", "the reset gate", "the candidate"], hidden)
        if lbr:
            li = self.linear(inner, "the term the reset gate multiplies", ("h",))
            R[2] = _onnx(self.matrix(li, "h", hidden, hidden, "the candidate"))
            rbh = _bias(li, hidden)
        else:
            R[2] = _onnx(self.matrix(lh, "rh", hidden, hidden, "the candidate"))
            rbh = np.zeros(hidden)
        W, R, B = _cat(*W), _cat(*R), _cat(*Wb, np.zeros(2 * hidden), rbh)
        notes = (f"linear_before_reset={lbr}",) + (("update gate complemented",) if complement else ())
        return Cell("GRU", hidden, rows, W, R, B, None, (f, g), clip_z, lbr, notes, h=h)

    def gru_update(self, mons, h):
        """(z, h̃, complement) from the expanded update; standard: h̃ - z⊙h̃ + z⊙h."""
        singles = [(k, w) for k, w in mons if len(k) == 1]
        pairs = [(k, w) for k, w in mons if len(k) == 2]
        shape = format_poly(Poly(tuple(_term(k, w) for k, w in mons)), self.names)
        reason = NoMatch(f"the new state expands to {shape}: not an activation (RNN), "
                         "nor (1-z)⊙h̃ + z⊙h (GRU) in any arrangement")
        with_h = [(k, w) for k, w in pairs if _count(k, h) == 1]
        if len(mons) != 3 or len(singles) != 1 or len(pairs) != 2 or len(with_h) != 1:
            raise reason
        ((s,), ws), (kh, wh) = singles[0], with_h[0]
        ((ko, wo),) = [(k, w) for k, w in pairs if k is not kh]
        z = _other(kh, h)
        if _count(ko, z) == 0:
            raise reason
        other = _other(ko, z)
        complement = s is h
        if complement:
            ok = _is(ws, 1) and _is(wh, -1) and _is(wo, 1) and other is not h and other is not z
        else:
            ok = _is(ws, 1) and _is(wh, 1) and _is(wo, -1) and other is s and z is not s
        if not ok:
            raise reason
        return z, other, complement

    def gru_candidate(self, p: Poly):
        """(r, inner, outer, lbr): which leaf is r, and what it multiplies.

        lbr=0: a term (r⊙h)·M; lbr=1: r ⊙ (group | h | constant). ``outer`` keeps the
        rest (x terms and the bias) plus, for lbr=0, (r⊙h)·M as role "rh".
        """
        gated, rest = [], []
        for t in p.terms:
            known = not t.factors or (len(t.factors) == 1 and self._known(t.factors[0]))
            (rest if known else gated).append(t)
        leaves = {id(f.tensor): f.tensor for t in gated for f in t.factors if isinstance(f, Leaf) and not self._known(f)}
        if len(leaves) != 1:
            raise NoMatch(f"the candidate's pre-activation {format_poly(p, self.names)} has no single reset gate")
        (r,) = leaves.values()
        self.role(r, "r")
        lbr0, inner = [], []
        for t in gated:
            others = tuple(f for f in t.factors if not (isinstance(f, Leaf) and f.tensor is r))
            if len(others) != len(t.factors) - 1 or len(others) > 1:
                raise NoMatch(f"the candidate reads {self.term(t)}")
            if t.matrix:
                if not (len(others) == 1 and isinstance(others[0], Leaf) and self.roles.get(id(others[0].tensor)) == "h"):
                    raise NoMatch(f"the candidate reads {self.term(t)}")
                lbr0.append(t)
            elif not others:
                inner.append(Poly((Term((), t.weight),)) if isinstance(t.weight, Runtime) else Poly((), t.weight))
            elif isinstance(t.weight, Runtime):
                raise NoMatch(f"the candidate reads {self.term(t)}")
            elif isinstance(others[0], Group):
                inner.append(scale(others[0].poly, t.weight))
            else:
                inner.append(Poly((Term(others, t.weight),)))
        if lbr0 and inner:
            raise NoMatch("the reset gate enters the candidate both as (r⊙h)·Rᵀ and as r⊙(...): neither linear_before_reset")
        if lbr0:
            self.roles[id(self.rh)] = "rh"
            return r, None, Poly(tuple(rest) + tuple(Term((Leaf(self.rh),), t.weight, True) for t in lbr0), p.bias), 0
        return r, add(*inner), Poly(tuple(rest), p.bias), 1

    def lstm(self, h, h_out, c, c_out) -> Cell:
        self.roles = {id(self.x): "x"}
        self.names = {id(self.x): "x"}
        self.role(h, "h")
        self.role(c, "c")
        self.role(c_out, "c_new")
        mons = _monomials(self.alg.poly(c_out), "the new cell state")
        shape = format_poly(Poly(tuple(_term(k, w) for k, w in mons)), self.names)
        keep = [k for k, _ in mons if len(k) == 2 and _count(k, c) == 1]
        if len(mons) != 2 or len(keep) != 1 or not all(_is(w, 1) for _, w in mons):
            raise _NotCellState(f"the new cell state expands to {shape}, not f⊙c + i⊙g")
        (fgate,) = [t for t in keep[0] if t is not c]
        (pair,) = [k for k, _ in mons if k is not keep[0]]
        if len(pair) != 2 or _count(pair, c):
            raise _NotCellState(f"the new cell state expands to {shape}, not f⊙c + i⊙g")
        out = _monomials(self.alg.poly(h_out), "the new hidden state")
        if len(out) != 1 or len(out[0][0]) != 2 or not _is(out[0][1], 1):
            raise NoMatch(f"the new hidden state is {format_poly(self.alg.poly(h_out), self.names)}, not o⊙h(c_new)")
        (o, a), _ = out[0]
        act_f, clip, f_pre = self.gate(fgate, "the forget gate")
        h_act, h_clip, a_pre = self._output_activation(o, a, c_out)
        if h_act is None:
            a, o = o, a
            h_act, h_clip, a_pre = self._output_activation(o, a, c_out)
        if h_act is None:
            raise NoMatch("the new hidden state is not o ⊙ h(new cell state)")
        if h_clip is not None:
            raise NoMatch("a Clip before the output activation h(c): the LSTM clip attribute does not apply there")
        gi, gg = self.input_and_candidate(pair, act_f, c)
        act_o, clip_o, o_pre = self.gate(o, "the output gate")
        if gi[0] != act_f or act_o != act_f:
            raise NoMatch(f"the input, forget and output gates use {gi[0]}, {act_f}, {act_o}; LSTM applies one f to all")
        if len({clip, clip_o, gi[1], gg[1]}) != 1:
            raise NoMatch("clips differ across the gates; LSTM clips all or none")
        li = self.linear(gi[2], "the input gate", ("x", "h", "c"))
        lo = self.linear(o_pre, "the output gate", ("x", "h", "c_new"))
        lf = self.linear(f_pre, "the forget gate", ("x", "h", "c"))
        lc = self.linear(gg[2], "the cell candidate", ("x", "h"))
        for lin, role, name in ((li, "c", "input"), (lo, "c_new", "output"), (lf, "c", "forget")):
            if role in lin.mats:
                raise NoMatch(f"the {name} gate multiplies the cell state by a matrix; LSTM peepholes are elementwise")
        hidden = self.hidden_of(li, lo, lf, lc, state=h)
        names = ["the input gate", "the output gate", "the forget gate", "the cell candidate"]
        W, R, Wb, rows = self.weights([li, lo, lf, lc], names, hidden)
        peep = [lin.diags.get(role) for lin, role in ((li, "c"), (lo, "c_new"), (lf, "c"))]
        P = None if all(v is None for v in peep) else _cat(*(v if isinstance(v, Runtime) else _vector(v, hidden) for v in peep))
        W, R, B = _cat(*W), _cat(*R), _cat(*Wb, np.zeros(4 * hidden))
        notes = ("peepholes",) if P is not None else ()
        return Cell("LSTM", hidden, rows, W, R, B, P, (act_f, gg[0], h_act), clip, 0, notes, h=h, c=c)

    def input_and_candidate(self, pair, act_f, c):
        """Which factor of i⊙g is the input gate: the one with the gate activation f; if both
        have it, the one that peeks at c (with neither, i⊙g is symmetric and either is exact)."""
        first, second = (self.gate(t, "a factor of i⊙g") for t in pair)

        def peeks(g):
            return any(isinstance(f, Leaf) and f.tensor is c for t in g[2].terms for f in t.factors)

        if first[0] != act_f and second[0] != act_f:
            raise NoMatch(f"neither factor of i⊙g uses the forget gate's activation {act_f}")
        if first[0] != act_f or (second[0] == act_f and peeks(second) and not peeks(first)):
            return second, first
        return first, second

    def _output_activation(self, o, a, c_out):
        """h's activation, its clip and input when ``a`` is h(c_new), else (None, None, None)."""
        node = producer(a)
        if node is None or node.op not in ACTIVATION_OPS:
            return None, None, None
        act, clip, pre = self.gate(a, "the output activation")
        (t,) = pre.terms if len(pre.terms) == 1 else (None,)
        if (t is None or pre.bias is not None or t.matrix or not _is(t.weight, 1)
                or [f.key for f in t.factors] != [Leaf(c_out).key]):
            return None, None, None
        return act, clip, pre


def _term(key, weight):
    return Term(tuple(Leaf(t) for t in key), weight)


def _count(key, tensor) -> int:
    return sum(t is tensor for t in key)


def _other(pair, tensor):
    """The factor of a two-factor product that is not ``tensor`` (itself for tensor⊙tensor)."""
    return pair[1] if pair[0] is tensor else pair[0]


def _monomials(p: Poly, what: str) -> list[tuple[tuple, np.ndarray]]:
    """Elementwise monomials [(leaf tensors, weight)], equal products merged, zeros dropped."""
    if p.bias is not None and np.any(p.bias != 0):
        raise NoMatch(f"{what} adds a constant: {format_poly(p)}")
    merged: dict = {}
    keys: dict = {}
    for t in p.terms:
        if isinstance(t.weight, Runtime):
            raise NoMatch(f"{what} reads run-time value '{t.weight.tensor.name}' outside any gate")
        if t.matrix or not all(isinstance(f, Leaf) for f in t.factors):
            raise NoMatch(f"{what} has a matrix product outside any activation: {format_poly(p)}")
        ident = t.monomial
        keys.setdefault(ident, tuple(f.tensor for f in t.factors))
        merged[ident] = t.weight if ident not in merged else merged[ident] + t.weight
    return [(keys[k], w) for k, w in merged.items() if np.any(w != 0)]


def _neg(v):
    return v.scaled(-1.0) if isinstance(v, Runtime) else -v


def _size(v, axis) -> int | None:
    """Columns (axis 1) or rows (axis 0) of a matrix in x·W orientation; length of a vector."""
    if isinstance(v, Runtime):
        return v.in_size if axis == 0 and not v.vector else v.width
    v = np.asarray(v)
    if v.ndim == 2:
        return v.shape[axis]
    return v.shape[0] if v.ndim == 1 else None


def _onnx(m):
    """A matrix block in ONNX layout (rows = outputs); a run-time one stays as it is."""
    return m if isinstance(m, Runtime) else m.T


def _bias(lin: _Linear, size: int):
    const = _vector(lin.bias, size)
    return Sum(const, lin.rbias) if lin.rbias else const


def _cat(*blocks):
    """Blocks joined on axis 0: an array when all are constant, else the tuple of blocks."""
    if all(isinstance(b, np.ndarray) for b in blocks):
        return np.concatenate(blocks)
    return tuple(blocks)


def _is(weight, value) -> bool:
    return bool(np.all(np.asarray(weight) == value))


def _vector(v, size):
    return np.zeros(size) if v is None else np.broadcast_to(np.asarray(v, np.float64), (size,)).copy()


def _last_dim(tensor):
    shape = tensor.shape
    return shape[-1] if shape and isinstance(shape[-1], int) else None


def _symmetric_clip(node: gs.Node) -> float:
    if "min" in node.attrs or "max" in node.attrs or len(node.inputs) == 1:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
    else:
        bounds = [constant_value(t) if t.name else None for t in node.inputs[1:3]] + [None]
        if any(t.name and b is None for t, b in zip(node.inputs[1:3], bounds)):
            raise NoMatch(f"Clip '{node.name}' bounds are not constant")
        lo, hi = (None if b is None else float(b) for b in bounds[:2])
    if lo is None or hi is None or hi <= 0 or lo != -hi:
        raise NoMatch(f"Clip '{node.name}' bounds [{lo}, {hi}] are not a symmetric ±c (the clip attribute)")
    return float(hi)
