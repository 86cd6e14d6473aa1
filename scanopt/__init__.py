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



def _version() -> str:
    """The installed distribution's version where it describes this copy of the package (a
    wheel install), else this source tree's (a checkout, an editable install)."""
    from pathlib import Path

    from scanopt._version import VERSION

    try:
        from importlib.metadata import PackageNotFoundError, distribution
    except ImportError:
        return VERSION
    try:
        dist = distribution("scanopt")
        if Path(str(dist.locate_file("scanopt/__init__.py"))).resolve() == Path(__file__).resolve():
            return dist.version
    except (PackageNotFoundError, OSError):
        pass
    return VERSION


# __version__ is computed on first use (see __getattr__): importlib.metadata costs tens of
# milliseconds at start-up, before the command line's signal handlers exist.

# The names below load on first use (PEP 562), so `import scanopt.cli` stays light: the command
# line installs its signal handlers before onnx, onnxruntime and graphsurgeon are imported.
_EXPORTS = {
    "scanopt.api": ("optimize",),
    "scanopt.errors": ("InvalidArgumentError", "InvalidModelError", "ScanoptError", "UnsupportedModelError",
                       "VerificationError"),
    "scanopt.model_io": ("load_model", "save_model"),
    "scanopt.onnx_ir_pass": ("ir_pass",),
    "scanopt.pass_api": ("NodeOutcome", "Pass", "PassContext", "ScanPass", "ScanPassResult", "Skip", "register_pass"),
    "scanopt.pipeline": ("PIPELINE_ORDER", "select_passes"),
    "scanopt.report": ("Report",),
    "scanopt.scan_view": ("ScanView",),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


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
    if name == "__version__":
        globals()[name] = value = _version()
        return value
    if name == "PassResult":  # deprecated alias, with its warning (scanopt.pass_api)
        from scanopt import pass_api

        return pass_api.__getattr__(name)
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'scanopt' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
