"""The loop-free family: Scans whose steps can run all at once become loop-free graphs.

``lift`` (the body lifted with the step axis as a leading batch axis: the shared rules),
``vectorize`` (map Scans -> the body applied once to the whole sequence), ``hoist``
(step-independent body values computed once outside the loop).
"""

from scanopt.passes.loopfree import hoist, vectorize  # noqa: F401
