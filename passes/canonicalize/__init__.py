"""canonicalize: every Scan-9+ in one canonical form (axes 0, no unread or duplicate
inputs, outputs and states, defaults left out).

The package: ``canonicalize_pass`` (the pass and the canonical form), ``analysis``
(read-only: what depends on what) and ``edit`` (apply a plan to one Scan).
"""

from scanopt.passes.canonicalize.canonicalize_pass import CanonicalPlan, Canonicalize

__all__ = ["CanonicalPlan", "Canonicalize"]
