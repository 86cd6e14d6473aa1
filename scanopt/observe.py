"""Shapes learnt by running: what a Scan reads, at the declared input shapes, when static
inference cannot say.

A Scan's scan input often comes from a run-time Slice (loop_to_scan cuts a converted Loop's
input to its trip count; tf2onnx slices by a computed length): onnx shape inference leaves
its dims unknown even when every graph input is declared, and the tuner could only model
the Scan at guessed sizes. One onnxruntime run of the model at the declared shapes, with
those values exposed as outputs, gives their actual shapes; the tuner then measures at
them. The run is the user's model code, which may never end (a Loop with trip count 2^62
that stacks an output every step): it runs in a child process (scanopt.isolated.run_bounded)
with feeds within the synthesis memory budget, :data:`RUN_SECONDS` of time (onnxruntime's
import included) and an address-space limit, killed at either limit or when scanopt is
interrupted. Any failure leaves the shapes unknown with the reason: the Scans reading them
are modelled instead of measured, and the rest of the run goes on.
"""

from __future__ import annotations

import time

import onnx

from scanopt.deploy import shaped_model
from scanopt.errors import ScanoptError
from scanopt.isolated import run_bounded
from scanopt.protos import fed_inputs
from scanopt.shapes import ShapeTable, declared_type

RUN_SECONDS = 10.0  # the one run's time limit (at most the tuning budget, options["tune_seconds"])


def observed_deployment(model: onnx.ModelProto, declared: dict, deployment: ShapeTable, reads: dict[str, int],
                        options: dict) -> tuple[ShapeTable, set[str], list[str]]:
    """(deployment shapes, names observed, report notes): ``deployment`` with the shapes of
    ``reads`` ({value name: elem type}, values the top-level Scans read whose deployment
    shape inference leaves open) taken from one run of ``model`` at the ``declared`` shapes."""
    if not reads:
        return deployment, set(), []
    shaped = shaped_model(model, declared)
    seconds = min(RUN_SECONDS, float(options.get("tune_seconds", RUN_SECONDS)))
    started = time.perf_counter()
    found = observe(shaped, reads, seconds)
    names = ", ".join(f"'{n}'" for n in reads)
    if isinstance(found, str):
        return deployment, set(), [f"shapes of {names} not observed ({found}); the Scans reading them are modelled"]
    shown = ", ".join(f"{n} [{','.join(map(str, s))}]" for n, s in found.items())
    note = f"shapes observed in one onnxruntime run at the declared shapes ({time.perf_counter() - started:.2g} s): {shown}"
    return ShapeTable(with_value_shapes(shaped, found, reads)), set(found), [note]


def observe(model: onnx.ModelProto, reads: dict[str, int], seconds: float) -> dict[str, list[int]] | str:
    """{name: shape} of ``reads`` in one onnxruntime run of ``model`` (every fed input
    static) on synthesized feeds, or why not."""
    from scanopt.engines import ort_miscomputes
    from scanopt.inputs import synthesize_inputs

    for value in fed_inputs(model.graph):
        shape = declared_type(value)[1]
        if shape is None or not all(isinstance(d, int) for d in shape):
            return f"input '{value.name}' has no declared size"
    unsafe = ort_miscomputes(model)
    if unsafe:
        return unsafe
    try:
        feeds = synthesize_inputs(model, seed=0)
    except ScanoptError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a model the synthesizer misreads only stays modelled
        return f"no inputs synthesized: {type(exc).__name__}: {str(exc)[:120]}"
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    outputs = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(n, elem, None) for n, elem in reads.items() if n not in outputs)
    values = run_bounded(probe, feeds, list(reads), seconds)
    if isinstance(values, str):
        return f"onnxruntime: {values}"
    return {name: [int(d) for d in value.shape] for name, value in zip(reads, values)}


def with_value_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]], elems: dict[str, int]) -> onnx.ModelProto:
    """A copy of ``model`` declaring ``shapes`` as value_info (inference keeps them and
    carries them on), for the deployment ShapeTable only."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    kept = [v for v in copy.graph.value_info if v.name not in shapes]
    del copy.graph.value_info[:]
    copy.graph.value_info.extend(kept)
    copy.graph.value_info.extend(onnx.helper.make_tensor_value_info(n, elems[n], s) for n, s in shapes.items())
    return copy
