"""Embedded reference executor: onnx.reference plus scanopt's full-spec Scan.

``run_model`` runs a model where onnxruntime cannot (Scan-8 with zero-length items,
zero-length Scan-9+ sequences) and gives the numbers every rewrite is checked against.
"""

from scanopt.reference.evaluator import make_evaluator, run_model

__all__ = ["make_evaluator", "run_model"]
