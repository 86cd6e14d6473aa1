"""scanopt as an onnx_ir pass, for conversion pipelines built on onnx_ir (PyTorch's
``torch.onnx.export(..., dynamo=True)`` exporter, onnxscript's optimizer).

onnx_ir is optional: it is imported when :func:`ir_pass` is called, never with scanopt.
The pass is functional (onnx_ir's ``FunctionalPass``): it serializes the ir.Model to a
proto, runs :func:`scanopt.optimize` (the input is never modified) and returns a new
ir.Model in onnx_ir's ``PassResult(model, modified)``. The last run's scanopt report is
kept on the pass as ``.report``.
"""

from __future__ import annotations

from functools import lru_cache

from scanopt.errors import InvalidArgumentError, ScanoptError, did_you_mean


def ir_pass(**kwargs):
    """An onnx_ir pass running scanopt's pipeline; ``kwargs`` are :func:`scanopt.optimize`'s
    keyword arguments (passes, skip, verify, input_shapes, inputs, engine, seeds, options,
    progress), checked now, so a misspelled option fails before any pass runs.

    Usage::

        result = scanopt.ir_pass(options={"target": "portable"})(ir_model)
        result.model, result.modified
    """
    import inspect

    from scanopt.api import check_arguments

    known = list(inspect.signature(check_arguments).parameters)
    for key in kwargs:
        if key not in known:
            raise InvalidArgumentError(f"ir_pass: unknown argument '{key}'{did_you_mean(key, known)}; "
                                       f"known: {', '.join(known)}")
    check_arguments(**kwargs)
    return _pass_class()(kwargs)


@lru_cache(maxsize=None)
def _pass_class():
    try:
        import onnx_ir as ir
    except ImportError:
        raise ScanoptError("scanopt.ir_pass needs onnx_ir (pip install onnx-ir)") from None

    class ScanoptPass(ir.passes.FunctionalPass):
        """scanopt's pipeline on an ir.Model: upgrade, canonicalize, fuse, vectorize, hoist,
        unroll, cleanup, each rewrite verified numerically."""

        def __init__(self, arguments: dict):
            super().__init__()
            self.arguments = arguments
            self.report = None

        def call(self, model):
            from scanopt.api import optimize

            proto = ir.serde.serialize_model(model)
            optimized, self.report = optimize(proto, **self.arguments)
            # a functional pass returns a new model even when nothing changed
            return ir.passes.PassResult(ir.serde.deserialize_model(optimized), self.report.modified)

    return ScanoptPass
