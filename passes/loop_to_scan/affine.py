"""The index a Loop body computes from its iteration number i: ``scale·i + const + Σ ±term``.

TorchScript writes ``for j in range(a, b, s)`` as a Loop whose body reads ``x[a + i·s]``,
and ``x[-1 - i]``, ``x[i - 1]``, ``x[n - 1 - i]`` as Sub/Add of the counter. The analysis
follows the counter through such arithmetic and keeps the expression here; each term is a
value the same in every iteration (an outer value, or body nodes computing one from outer
values alone, which move out of the loop with the read).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs


@dataclass(frozen=True)
class Affine:
    scale: int = 1
    const: int = 0
    terms: tuple[tuple[int, gs.Tensor], ...] = ()  # (coefficient, loop-invariant value)
    invariant: tuple[gs.Node, ...] = ()  # body nodes computing the terms from outer values
    narrow: str = ""  # why the index may not be computed in int64 (an int32 Cast or operand), else ""

    def is_counter(self) -> bool:
        return self.scale == 1 and self.const == 0 and not self.terms

    def is_counter_plus(self, k: int) -> bool:
        return self.scale == 1 and self.const == k and not self.terms

    def times(self, k: int) -> Affine:
        return Affine(self.scale * k, self.const * k, tuple((c * k, t) for c, t in self.terms), self.invariant, self.narrow)

    def plus_const(self, k: int) -> Affine:
        return Affine(self.scale, self.const + k, self.terms, self.invariant, self.narrow)

    def plus_term(self, coefficient: int, term: gs.Tensor, nodes: list[gs.Node]) -> Affine:
        moved = self.invariant + tuple(n for n in nodes if not any(n is m for m in self.invariant))
        return Affine(self.scale, self.const, self.terms + ((coefficient, term),), moved, self.narrow)

    def narrowed(self, why: str) -> Affine:
        return Affine(self.scale, self.const, self.terms, self.invariant, self.narrow or why)

    def unit_steps(self) -> bool:
        """A step of ±1 and every term added or subtracted once: what a read may index by."""
        return abs(self.scale) == 1 and all(abs(c) == 1 for c, _ in self.terms)

    def describe(self) -> str:
        parts = [(c, t.name) for c, t in self.terms] + [(self.scale, "i")] + ([(self.const, "")] if self.const else [])
        text = ""
        for c, name in parts:
            size = f"{abs(c)}" if not name else "" if abs(c) == 1 else f"{abs(c)}·"
            sign = ("-" if c < 0 else "") if not text else (" - " if c < 0 else " + ")
            text += f"{sign}{size}{name}"
        return text
