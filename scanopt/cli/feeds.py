"""The user's feeds on the command line (--inputs FILE.npz, --input NAME=FILE.npy): the
files checked before numpy reads them, and the inputs the user did not give synthesized
to agree with the ones they did."""

from __future__ import annotations

import numpy as np
import onnx

from scanopt.errors import ScanoptError
from scanopt.inputs import check_feeds, input_specs, parse_input_assignment, read_feeds, synthesize_inputs
from scanopt.model_io import check_regular_file


def feed_files(npz: str | None, arrays=()) -> list[tuple[str, str]]:
    """(label, path) of the --inputs / --input files, each checked to be a non-empty
    regular file (a FIFO would block numpy, an empty file make it raise EOFError)."""
    files = [("--inputs", npz)] if npz else []
    for text in arrays:
        name, path = parse_input_assignment(text)
        files.append((f"--input {name}", path))
    for label, path in files:
        shown = f"{label}={path}" if label.startswith("--input ") else f"{label} {path}"
        try:
            st = check_regular_file(path, what="numpy")
        except ScanoptError as exc:
            raise ScanoptError(f"{shown}: {str(exc).split(': ', 1)[1]}") from None
        if st.st_size == 0:
            raise ScanoptError(f"{shown}: empty file, not numpy data")
    return files


def user_feeds(
    model: onnx.ModelProto, *, npz: str | None, arrays=(), seeds=(0,), engine: str = "ort"
) -> tuple[list[dict[str, np.ndarray]] | None, list[str]]:
    """(one feed dict per seed, the names synthesized) from the user's files; (None, [])
    when they gave none. Inputs they left out are synthesized for each seed, their
    symbolic dims bound to the sizes the given arrays have."""
    feed_files(npz, arrays)
    given = read_feeds(npz=npz, arrays=arrays)
    if given is None:
        return None, []
    specs = input_specs(model)
    missing = [s.name for s in specs if s.required and s.name not in given]
    if not missing:
        return [check_feeds(model, given)], []
    known = {s.name for s in specs}
    fixed = {name: value for name, value in given.items() if name in known}
    if len(fixed) < len(given):
        check_feeds(model, given)  # names the unknown inputs
    partial = _with_inputs_fixed(model, fixed)
    sets = [check_feeds(model, {**synthesize_inputs(partial, seed, engine=engine), **given}) for seed in seeds]
    return sets, missing


def _with_inputs_fixed(model: onnx.ModelProto, fixed: dict[str, np.ndarray]) -> onnx.ModelProto:
    """``model`` with the ``fixed`` inputs turned into initializers holding the given values
    and every symbolic dim they bind replaced by its size in the other inputs, so that
    what is synthesized for those agrees with them (shape inference sees the sizes too)."""
    sizes: dict[str, int] = {}
    for value in model.graph.input:
        if value.name in fixed and value.type.tensor_type.HasField("shape"):
            array = np.asarray(fixed[value.name])
            for dim, size in zip(value.type.tensor_type.shape.dim, array.shape):
                if dim.dim_param:
                    sizes.setdefault(dim.dim_param, size)
    partial = onnx.ModelProto()
    partial.CopyFrom(model)
    kept = [v for v in partial.graph.input if v.name not in fixed]
    for value in kept:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in sizes:
                dim.dim_value = sizes[dim.dim_param]
    kept = [onnx.ValueInfoProto.FromString(v.SerializeToString()) for v in kept]
    del partial.graph.input[:]
    partial.graph.input.extend(kept)
    existing = {t.name for t in partial.graph.initializer}
    declared = {s.name: s for s in input_specs(model)}
    for name, value in fixed.items():
        if name in existing:
            continue
        try:
            tensor = onnx.numpy_helper.from_array(np.asarray(value), name)
        except (TypeError, ValueError, KeyError):  # a dtype onnx cannot store: its shape is what matters
            tensor = onnx.numpy_helper.from_array(np.zeros(np.shape(value), declared[name].dtype), name)
        partial.graph.initializer.append(tensor)
    return partial
