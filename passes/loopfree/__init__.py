"""The loop-free family: Scans whose steps can run all at once become loop-free graphs.

``lift`` (the body lifted with the step axis as a leading batch axis: the shared rules),
``vectorize`` (map Scans -> the body applied once to the whole sequence), ``hoist``
(step-independent body values computed once outside the loop), ``linrec`` (linear
recurrences h' = a*h + b: ``linear_form`` recognizes them, ``prefix_scan`` emits CumSum or a
chunked parallel scan), ``distances`` (skl2onnx's pairwise squared distances as one GEMM).
"""

from scanopt.passes.loopfree import distances, hoist, linrec, vectorize  # noqa: F401
