"""scanopt: verified rewrites for the ONNX Scan operator.

Library use::

    import scanopt
    optimized, report = scanopt.optimize("model.onnx")          # or a ModelProto
    print(report.format())
    scanopt.save_model(optimized, "model.opt.onnx")

``scanopt.optimize`` checks every argument (an unknown option, pass or engine raises
:class:`InvalidArgumentError`) and never modifies a proto it is given; ``scanopt.ir_pass``
runs the same pipeline as an onnx_ir pass.
"""

__version__ = "0.1.0"

from scanopt.api import optimize
from scanopt.errors import (
    InvalidArgumentError,
    InvalidModelError,
    ScanoptError,
    UnsupportedModelError,
    VerificationError,
)
from scanopt.model_io import load_model, save_model
from scanopt.onnx_ir_pass import ir_pass
from scanopt.pass_api import NodeOutcome, Pass, PassContext, ScanPass, ScanPassResult, Skip, register_pass
from scanopt.pipeline import PIPELINE_ORDER, select_passes
from scanopt.report import Report
from scanopt.scan_view import ScanView

__all__ = [
    "InvalidArgumentError",
    "InvalidModelError",
    "NodeOutcome",
    "PIPELINE_ORDER",
    "Pass",
    "PassContext",
    "Report",
    "ScanPass",
    "ScanPassResult",
    "ScanView",
    "ScanoptError",
    "Skip",
    "UnsupportedModelError",
    "VerificationError",
    "ir_pass",
    "load_model",
    "optimize",
    "register_pass",
    "save_model",
    "select_passes",
]


def __getattr__(name: str):
    if name == "PassResult":  # deprecated alias, with its warning (scanopt.pass_api)
        from scanopt import pass_api

        return pass_api.__getattr__(name)
    raise AttributeError(f"module 'scanopt' has no attribute {name!r}")
