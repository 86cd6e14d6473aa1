"""onnx.reference's ReferenceEvaluator with scanopt's own operator implementations.

onnx.reference hands ``new_ops`` to the evaluators of If/Loop/Scan bodies, but not to the
evaluators it builds for model-local functions or for operators defined by a function
body; it builds those with ``self.__class__``. Subclassing and defaulting ``new_ops``
therefore puts scanopt's Scan in every evaluator of the model, at every depth, so
onnx.reference's own (partial) Scan is never used.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from scanopt.protos import fed_inputs
from scanopt.reference.loop import Loop
from scanopt.reference.scan import Scan


def scanopt_ops() -> list[type[OpRun]]:
    """Scan and Loop, plus the full-spec recurrent ops when their module is available."""
    try:
        from scanopt.reference.rnn import RECURRENT_OPS
    except ImportError:
        RECURRENT_OPS = []
    return [Scan, Loop, *RECURRENT_OPS]


class ScanoptEvaluator(ReferenceEvaluator):
    """A ReferenceEvaluator whose nested evaluators all run scanopt's ops first."""

    def __init__(
        self,
        proto: Any,
        opsets: dict[str, int] | None = None,
        functions: list | None = None,
        verbose: int = 0,
        new_ops: list[type[OpRun]] | None = None,
        check_shape_annotations: bool = False,
    ) -> None:
        # The first implementation listed for an op wins, so ops a caller passes
        # explicitly still take precedence over scanopt's.
        extra = {"check_shape_annotations": check_shape_annotations} if check_shape_annotations else {}
        super().__init__(  # onnx before 1.23 has no check_shape_annotations
            proto,
            opsets=opsets,
            functions=functions,
            verbose=verbose,
            new_ops=[*(new_ops or []), *scanopt_ops()],
            **extra,
        )


def make_evaluator(model: onnx.ModelProto) -> ReferenceEvaluator:
    """An evaluator for ``model`` with scanopt's Scan (and recurrent ops) registered."""
    return ScanoptEvaluator(model)


def run_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every graph output of ``model`` on ``feeds``, by name."""
    evaluator = make_evaluator(model)
    missing = [i.name for i in fed_inputs(model.graph) if i.name not in feeds]
    if missing:
        raise ValueError(f"missing feeds for graph inputs {missing}")
    values = evaluator.run(None, feeds)
    return dict(zip(evaluator.output_names, values))
