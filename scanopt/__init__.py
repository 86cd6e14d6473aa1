"""scanopt: verified rewrites for the ONNX Scan operator.

Library use::

    import onnx, scanopt
    model = scanopt.load_model("model.onnx")
    optimized, report = scanopt.optimize(model, passes=["upgrade", "canonicalize"])
    print(report.format())
    scanopt.save_model(optimized, "model.opt.onnx")
"""

__version__ = "0.1.0"

# The names below load on first use (PEP 562), so `import scanopt.cli` stays light: the command
# line installs its signal handlers before onnx, onnxruntime and graphsurgeon are imported.
_EXPORTS = {
    "scanopt.errors": ("InvalidModelError", "ScanoptError", "UnsupportedModelError", "VerificationError"),
    "scanopt.model_io": ("load_model", "save_model"),
    "scanopt.pass_api": ("NodeOutcome", "Pass", "PassContext", "PassResult", "ScanPass", "Skip", "register_pass"),
    "scanopt.pipeline": ("PIPELINE_ORDER", "optimize", "select_passes"),
    "scanopt.report": ("Report",),
    "scanopt.scan_view": ("ScanView",),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str):
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'scanopt' has no attribute '{name}'")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


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
