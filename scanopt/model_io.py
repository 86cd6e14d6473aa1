"""Reading and writing model files safely.

Loading turns every way a file can be unusable into one clear ScanoptError naming the
file. Saving is atomic (temporary files in the target directory, then rename), so a
failed run never leaves a partial or modified file behind, and the input is never
touched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Callable

import onnx
from google.protobuf.message import DecodeError

from scanopt.errors import InvalidModelError, ScanoptError
from scanopt.validate import validate_model

# Protobuf cannot serialize a message of 2 GiB or more; such models keep their
# tensors in an external data file.
PROTOBUF_LIMIT = 2**31 - 1
# Tensors at least this large go to the external data file when one is written.
EXTERNAL_DATA_THRESHOLD = 1024


@dataclass
class LoadedModel:
    """A validated model and what loading learned about it."""

    model: onnx.ModelProto
    path: str
    had_external_data: bool = False
    warnings: list[str] = field(default_factory=list)


def load_model(path: str) -> onnx.ModelProto:
    """Load and validate a model file; raises ScanoptError with a one-line reason."""
    return load(path).model


def load(path: str) -> LoadedModel:
    """Like :func:`load_model`, but also reports external data and lenient-check warnings."""
    if not os.path.exists(path):
        raise ScanoptError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ScanoptError(f"{path}: is a directory, not a model file")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ScanoptError(f"{path}: cannot read ({exc.strerror})") from None
    if not data:
        raise InvalidModelError(f"{path}: empty file, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        raise InvalidModelError(f"{path}: not an ONNX model (protobuf parse failed; truncated or not ONNX?)") from None
    if not model.HasField("graph") or not model.opset_import or model.ir_version <= 0:
        raise InvalidModelError(f"{path}: not an ONNX model (no graph, IR version or opset import)")
    had_external = uses_external_data(model)
    if had_external:
        try:
            onnx.load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
        except (OSError, ValueError, onnx.checker.ValidationError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise InvalidModelError(f"{path}: cannot read its external data ({reason})") from None
    warnings = validate_model(model, name=path)
    return LoadedModel(model, path, had_external, warnings)


def uses_external_data(model: onnx.ModelProto) -> bool:
    """True if any tensor, at any nesting level, keeps its bytes in an external file."""
    return any(
        tensor.data_location == onnx.TensorProto.EXTERNAL
        for tensor in onnx.external_data_helper._get_all_tensors(model)
    )


def needs_external_data(model: onnx.ModelProto) -> bool:
    return model.ByteSize() > PROTOBUF_LIMIT


def save_model(model: onnx.ModelProto, path: str, *, external_data: bool | None = None) -> None:
    """Write ``model`` to ``path`` atomically.

    ``external_data=None`` writes an external data file only when the model would not
    fit in one protobuf. The data file is ``<basename>.data`` beside ``path``. With
    external data, ``model``'s tensors are converted to external references in place.
    """
    if external_data is None:
        external_data = needs_external_data(model)

    def write(staged: str) -> None:
        if not external_data:
            with open(staged, "wb") as handle:
                handle.write(model.SerializeToString())
            return
        onnx.save_model(
            model,
            staged,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=os.path.basename(path) + ".data",
            size_threshold=EXTERNAL_DATA_THRESHOLD,
        )

    write_atomically(path, write)


def save_bytes(data: bytes, path: str) -> None:
    """Write ``data`` to ``path`` atomically (used to pass an untouched model through as is)."""

    def write(staged: str) -> None:
        with open(staged, "wb") as handle:
            handle.write(data)

    write_atomically(path, write)


def write_atomically(path: str, write: Callable[[str], None]) -> None:
    """Call ``write(staged_path)`` in a private folder beside ``path``, then move the
    results (the file, and any companion files it wrote, such as external data) into
    place. On failure nothing is left behind and ``path`` is untouched.
    """
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise ScanoptError(f"{path}: output directory does not exist")
    if os.path.isdir(path):
        raise ScanoptError(f"{path}: is a directory")
    try:
        staging = tempfile.mkdtemp(prefix=".scanopt-", dir=directory)
    except OSError as exc:
        raise ScanoptError(f"{path}: cannot write to its directory ({exc.strerror})") from None
    base = os.path.basename(path)
    try:
        write(os.path.join(staging, base))
        for companion in sorted(os.listdir(staging)):
            if companion != base:
                os.replace(os.path.join(staging, companion), os.path.join(directory, companion))
        os.replace(os.path.join(staging, base), path)
    except OSError as exc:
        raise ScanoptError(f"{path}: cannot write ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
