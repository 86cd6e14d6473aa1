"""unroll: a Scan of short static length becomes the body repeated once per step.

The package: ``unroll_pass`` (the pass, its threshold and size cap) and ``batched``
(an opset-8 Scan unrolled in place, per batch item and step).
"""

from scanopt.passes.unroll.unroll_pass import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_NODES,
    DEFAULT_UNROLL_MAX,
    Unroll,
    UnrollMatch,
)

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_NODES", "DEFAULT_UNROLL_MAX", "Unroll", "UnrollMatch"]
