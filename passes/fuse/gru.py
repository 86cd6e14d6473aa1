"""GRU cells: the update (any arrangement of (1-z)⊙h̃ + z⊙h), the reset gate's place
(linear_before_reset read from the graph), gate order from which Split output feeds which gate."""

from __future__ import annotations

import numpy as np

from scanopt.passes.fuse.algebra import add, scale
from scanopt.passes.fuse.cell import Cell
from scanopt.passes.fuse.linear import _bias, _cat, _count, _is, _monomials, _onnx, _other, _term
from scanopt.passes.fuse.poly import Group, Leaf, NoMatch, Poly, Runtime, Term, format_poly
from scanopt.passes.fuse.reader import GateReader


class GruReader(GateReader):
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
            others = [self.describe(t) for t in leaves.values()] + [self.describe(f.tensor) for t in rest for f in t.factors
                                                                    if isinstance(f, Leaf) and not self._known(f)]
            reads = f" (it reads {', '.join(dict.fromkeys(others))})" if others else ""
            raise NoMatch(f"the candidate's pre-activation {format_poly(p, self.names)} has no single reset gate{reads}")
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
