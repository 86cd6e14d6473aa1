"""Where the model will run: the input shapes and thread count the cost policy decides for.

Users declare shapes as ``NAME:D0,D1,...`` (onnxsim's ``--overwrite-input-shape``
syntax; polygraphy's ``--input-shapes`` and trtexec's ``--optShapes`` mean the same), or
imply them with their own feeds (``--inputs``); the library takes
``options["input_shapes"] = {name: [ints]}``. The model's interface never changes: the
declared sizes only reach a throw-away copy (:func:`shaped_model`) that the cost policy,
tuning and one verification seed read.
"""

from __future__ import annotations

import os
from typing import Mapping

import onnx

from scanopt.errors import ScanoptError, did_you_mean
from scanopt.protos import fed_inputs
from scanopt.shapes import declared_type


def parse_input_shape(text: str) -> tuple[str, list[int]]:
    """``NAME:D0,D1,...`` -> (name, dims). A name may itself hold ':' (the last one splits)."""
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise ScanoptError(f"--input-shape {text}: expected NAME:D0,D1,... (e.g. X:100,8,64)")
    try:
        sizes = [int(d) for d in dims.split(",")] if dims.strip() else []
    except ValueError:
        raise ScanoptError(f"--input-shape {text}: dims must be whole numbers separated by commas") from None
    return name, sizes


def merge_input_shapes(texts, feeds: list[dict] | None = None) -> dict[str, list[int]] | None:
    """{name: dims} from repeated ``--input-shape`` texts and the shapes of user feeds
    (``--inputs`` implies them); a name given twice with different dims is an error."""
    shapes: dict[str, list[int]] = {}
    for feed in feeds or []:
        for name, value in feed.items():
            shapes.setdefault(name, [int(d) for d in getattr(value, "shape", ())])
    for text in texts or ():
        name, dims = parse_input_shape(text)
        if name in shapes and shapes[name] != dims:
            raise ScanoptError(f"--input-shape {text}: contradicts {name}:{','.join(map(str, shapes[name]))} "
                               "(given earlier or by --inputs)")
        shapes[name] = dims
    return shapes or None


def check_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, list[int]] | None) -> dict[str, list[int]]:
    """The declared shapes, checked against the model's graph inputs: an unknown name, a
    wrong rank, a negative size or a size contradicting a static dim is a ScanoptError."""
    if not shapes:
        return {}
    inputs = {v.name: v for v in fed_inputs(model.graph)}
    checked: dict[str, list[int]] = {}
    for name, dims in shapes.items():
        if name not in inputs:
            raise ScanoptError(f"input shape for '{name}': the model has no such input{did_you_mean(name, inputs)} "
                               f"(inputs: {', '.join(inputs) or 'none'})")
        try:
            dims = [int(d) for d in dims]
        except (TypeError, ValueError):
            raise ScanoptError(f"input shape for '{name}': {dims!r} is not a list of whole numbers") from None
        if any(d < 0 for d in dims):
            raise ScanoptError(f"input shape for '{name}': sizes must be 0 or more, got {dims}")
        declared = declared_type(inputs[name])[1]
        if declared is not None:
            if len(declared) != len(dims):
                raise ScanoptError(f"input shape for '{name}': rank {len(dims)} given, the model declares rank "
                                   f"{len(declared)} ({_text(declared)})")
            for axis, (have, want) in enumerate(zip(declared, dims)):
                if isinstance(have, int) and have != want:
                    raise ScanoptError(f"input shape for '{name}': dim {axis} is {have} in the model, {want} given")
        checked[name] = dims
    _check_symbols(inputs, checked)
    return checked


def _check_symbols(inputs: Mapping[str, onnx.ValueInfoProto], shapes: Mapping[str, list[int]]) -> None:
    """One size per symbolic dim: `batch` given 8 in one input and 4 in another is refused
    (the model cannot run at both; onnxruntime failed at run time and the run went on)."""
    bound: dict[str, tuple[int, str, int]] = {}
    for name, dims in shapes.items():
        for axis, (symbol, size) in enumerate(zip(declared_type(inputs[name])[1] or [], dims)):
            if not isinstance(symbol, str) or not symbol:
                continue
            first = bound.setdefault(symbol, (size, name, axis))
            if first[0] != size:
                raise ScanoptError(f"input shapes contradict: dim '{symbol}' is {first[0]} in '{first[1]}' (axis "
                                   f"{first[2]}) and {size} in '{name}' (axis {axis})")


def shaped_model(model: onnx.ModelProto, shapes: Mapping[str, list[int]]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs declare ``shapes`` (symbolic names bound
    consistently: a symbolic dim fixed in one input is fixed wherever the model names it),
    for inference and input synthesis only. Without shapes, ``model`` itself."""
    if not shapes:
        return model
    bound: dict[str, int] = {}
    for value in model.graph.input:
        if value.name in shapes:
            for d, size in zip(declared_type(value)[1] or [], shapes[value.name]):
                if isinstance(d, str):
                    bound.setdefault(d, size)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for value in copy.graph.input:
        dims = value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else None
        if value.name in shapes:
            del value.type.tensor_type.shape.dim[:]
            for size in shapes[value.name]:
                value.type.tensor_type.shape.dim.add().dim_value = size
        elif dims is not None:
            for d in dims:
                if d.HasField("dim_param") and d.dim_param in bound:
                    d.dim_value = bound[d.dim_param]
    return copy


def check_threads(threads) -> int | None:
    """The intra-op thread count decisions are made for: a whole number >= 1, or None
    (onnxruntime's default)."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ScanoptError(f"threads must be a whole number of at least 1, got {threads!r}")
    return threads


def tune_default() -> bool:
    """Whether to measure when the caller did not say (``tune`` None): yes, unless
    ``$SCANOPT_TUNE`` is 0/off/no (the test suite sets it, for machine-independent output)."""
    return os.environ.get("SCANOPT_TUNE", "1").strip().lower() not in ("0", "off", "no", "false")


def describe_shapes(shapes: Mapping[str, list[int]] | None) -> str:
    return " ".join(f"{name}:{','.join(map(str, dims))}" for name, dims in (shapes or {}).items())


def _text(dims: list) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
