"""linattn: matrix-state linear attention Scans (linear, gated, delta, gated_delta) become one
``LinearAttention`` node at opset 27+ (:mod:`linattn_pass`; the body's algebra in :mod:`algebra`,
the four rules in :mod:`rules`). A pass of its own, not a fifth cell of fuse: fuse's cells are
vector-state gate algebra (weights, activations, gate splits); this is matrix-state algebra
(outer products, reads of the state) shared with nothing in fuse."""

from scanopt.passes.linattn import linattn_pass  # noqa: F401
