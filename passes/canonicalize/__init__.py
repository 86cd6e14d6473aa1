"""canonicalize: every Scan-9+ in one canonical form (axes 0, no unread or duplicate
inputs, outputs and states, defaults left out).

The package: ``canonicalize_pass`` (the pass and the canonical form), ``analysis``
(read-only: what depends on what), ``edit`` (apply a plan to one Scan), ``epilogue``
(scan outputs computed after the loop from other outputs' stacks), and loop fission:
``fission`` (when to split a Scan in two, and the rewrite), ``fission_plan`` (the state
graph's components and what the second piece reads) and ``fission_build`` (the pieces).
"""

from scanopt.passes.canonicalize.canonicalize_pass import CanonicalPlan, Canonicalize

__all__ = ["CanonicalPlan", "Canonicalize"]
