"""LSTM cells: the cell-state update f⊙c + i⊙g, the output o⊙h(c_new), peepholes, gate order."""

from __future__ import annotations

import numpy as np

from scanopt.passes.fuse.algebra import producer
from scanopt.passes.fuse.cell import ACTIVATION_OPS, AFFINE, Cell
from scanopt.passes.fuse.linear import _Linear, _NotCellState, _cat, _count, _is, _monomials, _other, _term, _vector
from scanopt.passes.fuse.poly import Leaf, NoMatch, Poly, Runtime, format_poly
from scanopt.passes.fuse.reader import GateReader


class LstmReader(GateReader):
    def lstm(self, h, h_out, c, c_out) -> Cell:
        self.roles = {id(self.x): "x"}
        self.names = {id(self.x): "x"}
        self.role(h, "h")
        self.role(c, "c")
        self.role(c_out, "c_new")
        mons = _monomials(self.alg.poly(c_out), "the new cell state", self.linear_gates)
        shape = format_poly(Poly(tuple(_term(k, w) for k, w in mons)), self.names)
        coupled = _coupled_update(mons, c)
        if coupled is None:
            keep = [k for k, _ in mons if len(k) == 2 and _count(k, c) == 1]
            if len(mons) != 2 or len(keep) != 1 or not all(_is(w, 1) for _, w in mons):
                raise _NotCellState(f"the new cell state expands to {shape}, not f⊙c + i⊙g nor a coupled (1-f)⊙g")
            (fgate,) = [t for t in keep[0] if t is not c]
            (pair,) = [k for k, _ in mons if k is not keep[0]]
            if len(pair) != 2 or _count(pair, c):
                raise _NotCellState(f"the new cell state expands to {shape}, not f⊙c + i⊙g")
        else:
            fgate, pair = coupled[0], (coupled[0], coupled[1])
        out = _monomials(self.alg.poly(h_out), "the new hidden state")
        if len(out) != 1 or len(out[0][0]) != 2 or not _is(out[0][1], 1):
            raise NoMatch(f"the new hidden state is {format_poly(self.alg.poly(h_out), self.names)}, not o⊙h(c_new)")
        (o, a), _ = out[0]
        act_f, clip, f_pre = self.gate(fgate, "the input gate" if coupled else "the forget gate")
        h_act, h_clip, a_pre = self._output_activation(o, a, c_out)
        if h_act is None:
            a, o = o, a
            h_act, h_clip, a_pre = self._output_activation(o, a, c_out)
        if h_act is None:
            raise NoMatch("the new hidden state is not o ⊙ h(new cell state)")
        if h_clip is not None:
            raise NoMatch("a Clip before the output activation h(c): the LSTM clip attribute does not apply there")
        if coupled:  # one gate and its complement: input_forget=1 (f = 1 - i)
            gi, gg = (act_f, clip, f_pre), self.gate(coupled[1], "the cell candidate")
            if coupled[2] and act_f.name != "Sigmoid":
                raise NoMatch(f"the cell state keeps f⊙c and adds (1-f)⊙g with f = {act_f}; "
                              "only Sigmoid has 1-f(a) = f(-a)")
        else:
            gi, gg = self.input_and_candidate(pair, act_f, c)
        act_o, clip_o, o_pre = self.gate(o, "the output gate")
        if gi[0] != act_f or act_o != act_f:
            raise NoMatch(f"the input, forget and output gates use {gi[0]}, {act_f}, {act_o}; LSTM applies one f to all")
        if len({clip, clip_o, gi[1], gg[1]}) != 1:
            raise NoMatch("clips differ across the gates; LSTM clips all or none")
        li = self.linear(gi[2], "the input gate", ("x", "h", "c"))
        lo = self.linear(o_pre, "the output gate", ("x", "h", "c_new"))
        lf = _Linear({}, {}, None) if coupled else self.linear(f_pre, "the forget gate", ("x", "h", "c"))
        if coupled and coupled[2]:
            li = li.negated()
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
        notes = (("peepholes",) if P is not None else ()) + (("input_forget=1",) if coupled else ())
        return Cell("LSTM", hidden, rows, W, R, B, P, (act_f, gg[0], h_act), clip, 0, notes, h=h, c=c,
                    input_forget=int(coupled is not None))

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
        """h's activation, its clip and input when ``a`` is h(c_new), else (None, None, None);
        ``a`` = c_new itself (no output nonlinearity) is Affine(1, 0)."""
        if a is c_out:
            return AFFINE, None, self.alg.value(c_out)
        node = producer(a)
        if node is None or node.op not in ACTIVATION_OPS:
            return None, None, None
        act, clip, pre = self.gate(a, "the output activation")
        (t,) = pre.terms if len(pre.terms) == 1 else (None,)
        if (t is None or pre.bias is not None or t.matrix or not _is(t.weight, 1)
                or [f.key for f in t.factors] != [Leaf(c_out).key]):
            return None, None, None
        return act, clip, pre


def _coupled_update(mons, c):
    """(gate, candidate, complemented) for a coupled input-forget update: ``c + i⊙g - i⊙c``
    (gate i, not complemented) or ``f⊙c + g - f⊙g`` (gate f = 1 - i, complemented); else None."""
    if len(mons) != 3:
        return None
    singles = [(k, w) for k, w in mons if len(k) == 1]
    pairs = [(k, w) for k, w in mons if len(k) == 2]
    if len(singles) != 1 or len(pairs) != 2 or not _is(singles[0][1], 1):
        return None
    (s,), _ = singles[0]
    with_c = [(k, w) for k, w in pairs if _count(k, c) == 1]
    if len(with_c) != 1:
        return None
    (kc, wc), (ko, wo) = with_c[0], next((k, w) for k, w in pairs if k is not with_c[0][0])
    gate = _other(kc, c)
    if gate is c or _count(ko, gate) != 1 or _count(ko, c):
        return None
    cand = _other(ko, gate)
    if s is c and _is(wc, -1) and _is(wo, 1) and cand is not gate:
        return gate, cand, False
    if s is cand and s is not c and _is(wc, 1) and _is(wo, -1) and cand is not gate:
        return gate, cand, True
    return None
