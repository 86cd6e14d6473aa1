"""scanopt: verified rewrites for the ONNX Scan operator.

Library use::

    import onnx, scanopt
    model = scanopt.load_model("model.onnx")
    optimized, report = scanopt.optimize(model, passes=["upgrade", "canonicalize"])
    print(report.format())
    scanopt.save_model(optimized, "model.opt.onnx")
"""

__version__ = "0.1.0"

from scanopt.errors import InvalidModelError, ScanoptError, UnsupportedModelError, VerificationError
from scanopt.model_io import load_model, save_model
from scanopt.pass_api import NodeOutcome, Pass, PassContext, PassResult, ScanPass, Skip, register_pass
from scanopt.pipeline import PIPELINE_ORDER, optimize, select_passes
from scanopt.report import Report
from scanopt.scan_view import ScanView

__all__ = [
    "InvalidModelError",
    "NodeOutcome",
    "PIPELINE_ORDER",
    "Pass",
    "PassContext",
    "PassResult",
    "Report",
    "ScanPass",
    "ScanView",
    "ScanoptError",
    "Skip",
    "UnsupportedModelError",
    "VerificationError",
    "load_model",
    "optimize",
    "register_pass",
    "save_model",
    "select_passes",
]
