"""Reading and writing model files safely.

Loading turns every way a file can be unusable into one clear ScanoptError naming the
file, refusing before reading what is not a regular file or is too large for protobuf.
Saving goes through :mod:`scanopt.outputs` (checked, staged, renamed), so a failed run
never leaves a partial or modified file behind, and the input is never touched.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

import onnx
from google.protobuf.message import DecodeError

from scanopt.external_data import (ExternalDataError, attach, file_reference, has_marks, inlined, marked_tensors,
                                   serialized_size_bound, source, write_model, write_serialized)
from scanopt.errors import InvalidModelError, ScanoptError, first_line, printable
from scanopt.outputs import Writer, file_kind, write_output
from scanopt.validate import sort_nodes, validate_model

# Protobuf cannot serialize a message of 2 GiB or more; such models keep their
# tensors in an external data file.
PROTOBUF_LIMIT = 2**31 - 1
CHECK_WHOLE_BELOW = 64 * 2**20  # bytes: a model file this large is not kept in memory beside its parse
# Tensors at least this large go to the external data file when one is written.
EXTERNAL_DATA_THRESHOLD = 1024


@dataclass
class LoadedModel:
    """A validated model and what loading learned about it."""

    model: onnx.ModelProto
    path: str
    had_external_data: bool = False
    warnings: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # every file read: the model, its external data
    sorted_nodes: bool = False  # nodes were out of order and have been sorted: the file's bytes are not the model


def load_model(path: str, *, keep_external_data: bool = False) -> onnx.ModelProto:
    """Load and validate a model file; raises ScanoptError with a one-line reason.

    Tensors kept in external data are read in, so the result is an ordinary proto that any
    tool can save. ``keep_external_data=True`` leaves the big ones in their file (read on
    demand, streamed on save: far less memory); save such a proto only with
    :func:`save_model`, since the references carry scanopt's own folder mark."""
    model = load(path).model
    return model if keep_external_data or not has_marks(model) else inlined(model)


def load(path: str) -> LoadedModel:
    """Like :func:`load_model`, but also reports external data, the files read and
    lenient-check warnings."""
    data = read_regular_file(path, what="model", limit=PROTOBUF_LIMIT)
    if not data:
        raise InvalidModelError(f"{path}: empty file, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        if any(word in str(exc).lower() for word in ("depth", "recursion")):
            raise InvalidModelError(
                f"{path}: its graphs nest deeper than the protobuf parser's depth limit "
                "(about 100 message levels, some 30 nested Scan/Loop/If bodies)"
            ) from None
        raise InvalidModelError(f"{path}: not an ONNX model (protobuf parse failed; truncated or not ONNX?)") from None
    if not model.HasField("graph") or not model.opset_import or model.ir_version <= 0:
        raise InvalidModelError(f"{path}: not an ONNX model (no graph, IR version or opset import)")
    had_external = uses_external_data(model)
    files = [path]
    if had_external:
        files += external_data_files(model, path)
        try:  # big tensors stay in their file (scanopt.external_data); small ones are read
            attach(model, os.path.dirname(os.path.abspath(path)))
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise InvalidModelError(f"{path}: cannot read its external data ({reason})") from None
    # the bytes go to onnx.checker as they are (no second serialization) unless the model is
    # big: then they are dropped now, and the checker gets a copy without the weights
    serialized = None if had_external or len(data) >= CHECK_WHOLE_BELOW else data
    del data
    try:
        warnings = validate_model(model, name=path, serialized=serialized)
        sorted_nodes = sort_nodes(model)
    except (ScanoptError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - last resort: validation refuses what it knows by name
        raise InvalidModelError(f"{path}: not a valid model ({type(exc).__name__} while checking it: "
                                f"{printable(first_line(exc))})") from None
    return LoadedModel(model, path, had_external, warnings, files, sorted_nodes)


def check_regular_file(path: str, *, what: str) -> os.stat_result:
    """Refuse, without opening it, a path that is missing or not a regular file (a FIFO
    would block, a device never end)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ScanoptError(f"{path}: no such file") from None
    except OSError as exc:
        raise ScanoptError(f"{path}: cannot read ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ScanoptError(f"{path}: is a directory, not a {what} file")
    if not stat.S_ISREG(st.st_mode):
        raise ScanoptError(f"{path}: is {file_kind(st.st_mode)}, not a regular file; scanopt reads only regular files")
    return st


def read_regular_file(path: str, *, what: str, limit: int) -> bytes:
    """The bytes of ``path``, refusing before reading anything that is not a regular file
    or is larger than ``limit``."""
    st = check_regular_file(path, what=what)
    if st.st_size > limit:
        raise ScanoptError(f"{path}: {_size(st.st_size)}, over the {_size(limit)} one protobuf file can hold (larger models keep their tensors in external data)")
    try:
        with open(path, "rb") as handle:
            # read(n) allocates n bytes before reading: the file's size, not the limit (2 GiB
            # of address space per load, which a memory-capped run does not have)
            data = handle.read(min(st.st_size, limit) + 1)
            if len(data) > st.st_size:  # it grew while we looked
                data += handle.read(limit + 1 - len(data))
    except OSError as exc:
        raise ScanoptError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > limit:  # it grew while we looked
        raise ScanoptError(f"{path}: over the {_size(limit)} one protobuf file can hold")
    return data


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n} bytes"


def external_data_files(model: onnx.ModelProto, path: str) -> list[str]:
    """The external data files ``model`` (read from ``path``) refers to, each checked to
    be a regular file inside the model's folder, not a link."""
    folder = os.path.dirname(os.path.abspath(path))
    files: list[str] = []
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        try:
            location = file_reference(tensor).get("location", "")
        except ExternalDataError as exc:
            raise InvalidModelError(f"{path}: cannot read its external data ({exc})") from None
        file = os.path.join(folder, location)
        if file in files:
            continue
        problem = _external_location_problem(location, folder, file)
        if problem:
            raise InvalidModelError(f"{path}: cannot read its external data ('{location}' {problem})")
        files.append(file)
    return files


def _external_location_problem(location: str, folder: str, file: str) -> str | None:
    if not location:
        return "is empty"
    if os.path.isabs(location) or ".." in location.replace("\\", "/").split("/"):
        return "is not a path inside the model's folder"
    try:
        st = os.lstat(file)
    except OSError:
        if "\\" in location and os.path.exists(os.path.join(folder, location.replace("\\", "/"))):
            # onnx and onnxruntime read it only on Windows too: say what to change
            return f"does not exist; it is a Windows path: '{location.replace(chr(92), '/')}' does, write the location with '/'"
        return "does not exist"
    if stat.S_ISLNK(st.st_mode):  # refused as onnx refuses it: a model must not make us read any file
        return "is a symbolic link (as in a Hugging Face cache); copy the model with its data into one folder (cp -L)"
    if not stat.S_ISREG(st.st_mode):
        return f"is {file_kind(st.st_mode)}, not a regular file"
    if st.st_nlink > 1:
        return "is hard-linked elsewhere"
    if os.path.commonpath([os.path.realpath(file), os.path.realpath(folder)]) != os.path.realpath(folder):
        return "resolves outside the model's folder"
    return None


def uses_external_data(model: onnx.ModelProto) -> bool:
    """True if any tensor, at any nesting level, keeps its bytes in an external file."""
    return any(
        tensor.data_location == onnx.TensorProto.EXTERNAL
        for tensor in onnx.external_data_helper._get_all_tensors(model)
    )


def needs_external_data(model: onnx.ModelProto) -> bool:
    """Whether ``model`` with every tensor in it would be over protobuf's limit (the bytes
    of tensors still in their file count too)."""
    return serialized_size_bound(model) + sum(source(t).length for t in marked_tensors(model)) > PROTOBUF_LIMIT


def save_model(model: onnx.ModelProto, path: str, *, external_data: bool | None = None) -> None:
    """Write ``model`` to ``path`` atomically.

    ``external_data=None`` writes an external data file only when the model would not
    fit in one protobuf. The data file is ``<basename>.data`` beside ``path``. With
    external data, ``model``'s tensors are converted to external references in place, to
    the data file just written (so ``model`` is then a proto to save with this function,
    not with onnx.save, as one loaded with ``keep_external_data=True``).
    """
    write_output(path, model_writer(model, path, external_data=external_data))


def model_writer(model: onnx.ModelProto, path: str, *, external_data: bool | None = None) -> Writer:
    """A writer for :func:`scanopt.outputs.write_outputs`: the model, and with external
    data its ``<basename>.data`` file beside it (claim that path too)."""
    external = needs_external_data(model) if external_data is None else external_data

    def write(staged: str) -> None:
        if not external:
            whole = inlined(model) if has_marks(model) else model  # bytes still in a file are read now
            with open(staged, "wb") as handle:
                write_serialized(whole, handle)
            return
        write_model(model, staged, external_data_name(path), threshold=EXTERNAL_DATA_THRESHOLD,
                    folder=os.path.dirname(os.path.abspath(path)))

    return write


def external_data_name(path: str) -> str:
    """The name of the external data file scanopt writes beside a model at ``path``."""
    return os.path.basename(path) + ".data"


def bytes_writer(data: bytes) -> Writer:
    def write(staged: str) -> None:
        with open(staged, "wb") as handle:
            handle.write(data)

    return write

