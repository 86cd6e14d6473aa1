"""Big weights stay in their file: external data read on demand and written by streaming.

A model loaded with external data keeps each big initializer as the reference its file
holds (``data_location = EXTERNAL``: location, offset, length), so nothing untouched is
ever read into memory. :func:`attach` (at load) checks every reference against its file,
reads the small ones into the proto, and marks the big ones with the absolute folder
their location is relative to (:data:`FOLDER_KEY`), so that each reference says where its
bytes are wherever the proto travels (copies, exports, candidates). Then:

- a pass that reads a value gets a read-only memory map of the file (:func:`as_array`);
- the engines give onnxruntime and the reference executor one shared memory map per weight
  (scanopt.engines), and onnxruntime the folder for the rest;
- :func:`write_model` copies each big tensor's bytes from the input file into the output's
  data file in chunks and serializes only the small proto.

The mark is scanopt's own: onnxruntime refuses a model carrying it ("model format error"),
so a proto with marks is written only through :func:`write_model` (``scanopt.save_model``),
and :func:`without_marks` gives engines a clean copy.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
import onnx
from onnx.external_data_helper import _get_attribute_tensors, _get_initializer_tensors

from scanopt.errors import printable
from scanopt.protos import copy_fields

FOLDER_KEY = "scanopt.folder"
# The data file's size and modification time when the model was loaded ("size:mtime_ns"):
# bytes read later from a file that changed since are refused, not written into OUT.
STAMP_KEY = "scanopt.stamp"
MARK_KEYS = (FOLDER_KEY, STAMP_KEY)
# External tensors smaller than this are read into the proto at load (shape constants and
# the like: code that reads them from the proto needs no file).
INLINE_BELOW = 64 * 1024
CHUNK = 16 * 2**20  # bytes copied per step when streaming a tensor into the output's data file
ALIGN_FROM = 2**20  # tensors at least this large start at a multiple of ALIGN in the data file
ALIGN = 64 * 1024  # onnxruntime memory-maps a tensor whose offset is a multiple of the page size

EXTERNAL = onnx.TensorProto.EXTERNAL


@dataclass(frozen=True)
class Source:
    """Where an external tensor's bytes are: absolute file path, offset, length."""

    path: str
    offset: int
    length: int
    stamp: str | None = None  # "size:mtime_ns" of the file at load (STAMP_KEY)


class ExternalDataError(OSError):
    """A reference that its file cannot satisfy (a one-line reason). An OSError, so that a
    data file that shrank while a run read it fails a write as any read error does."""


def entries(tensor: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


# The keys of a file's external-data reference that onnx and onnxruntime read. A loader
# keeps the *last* of two equal keys, a confinement check that reads the first would pass
# one file and read another: so duplicates, unknown keys and scanopt's own marks (which
# only scanopt writes, never into a file) are refused when a model is read.
READ_KEYS = ("location", "offset", "length")
IGNORED_KEYS = ("checksum",)  # onnx's helpers may write it; onnxruntime accepts it (and refuses "basepath")


def file_reference(tensor: onnx.TensorProto) -> dict[str, str]:
    """The external-data entries of ``tensor`` as read from a file, checked as the loaders
    will read them: each key at most once, and only keys onnx defines. Raises ExternalDataError."""
    info: dict[str, str] = {}
    for entry in tensor.external_data:
        key = entry.key
        if key in info:
            raise ExternalDataError(f"tensor '{printable(tensor.name)}' names its external data key "
                                    f"'{printable(key)}' twice")
        if key not in READ_KEYS + IGNORED_KEYS:
            raise ExternalDataError(f"tensor '{printable(tensor.name)}' has an unknown external data key "
                                    f"'{printable(key)}' (onnx defines {', '.join(READ_KEYS + IGNORED_KEYS)})")
        info[key] = entry.value
    return info


def source(tensor: onnx.TensorProto) -> Source | None:
    """The bytes a marked external tensor refers to, or None (inline, or unmarked)."""
    if tensor.data_location != EXTERNAL:
        return None
    info = entries(tensor)
    if FOLDER_KEY not in info:
        return None
    return Source(os.path.join(info[FOLDER_KEY], info["location"]), int(info.get("offset", 0)), int(info["length"]),
                  info.get(STAMP_KEY))


def file_stamp(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}"


def check_unchanged(where: Source, handle) -> None:
    """Refuse to read ``where`` from an open ``handle`` whose file changed since load."""
    if where.stamp is not None and file_stamp(os.fstat(handle.fileno())) != where.stamp:
        raise ExternalDataError(f"'{where.path}' changed since the model was loaded (size or modification time)")


def marked_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of ``model`` (any level) whose bytes are still in a file."""
    return (t for t in _all_tensors(model) if source(t) is not None)


def has_marks(model: onnx.ModelProto) -> bool:
    return any(True for _ in marked_tensors(model))


def _all_tensors(model: onnx.ModelProto) -> Iterable[onnx.TensorProto]:
    yield from _get_initializer_tensors(model)
    yield from _get_attribute_tensors(model)


def expected_length(tensor: onnx.TensorProto) -> int | None:
    """The byte length of ``tensor``'s raw data, from its type and dims (None: not fixed)."""
    count = math.prod(tensor.dims)  # Python ints: a hostile dim does not wrap around
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    except (KeyError, ValueError, TypeError):
        return None
    bits = _packed_bits(tensor.data_type)
    if bits:
        return (count * bits + 7) // 8
    if dtype.kind in "OUS":
        return None
    return count * dtype.itemsize


# Bytes per element a typed data field may take when serialized, at most (varints: 10).
_FIELD_BYTES = {"float_data": 4, "double_data": 8, "int32_data": 10, "int64_data": 10, "uint64_data": 10}
_SKELETON_FIELDS = ("name", "dims", "data_type", "segment", "doc_string", "data_location", "external_data",
                    "metadata_props")


def serialized_size_bound(model: onnx.ModelProto) -> int:
    """At least ``model.ByteSize()``, found without serializing its weights (upb's ByteSize
    encodes the whole model: one more copy of every weight, a MemoryError on big models).
    Each big initializer counts its type and dims, its data by its type (never read);
    everything else is sized as it is, one element at a time."""
    total = 0
    for descriptor, value in model.ListFields():
        if descriptor.name == "graph":
            total += _graph_size_bound(value) + 16
        else:
            total += _field_size(descriptor, value)
    return total


def _field_size(descriptor, value) -> int:
    """Bytes a field (one value or a repeated one) takes, with 16 for tag and length each."""
    single = isinstance(value, (str, bytes, int, float)) or hasattr(value, "ByteSize")
    return sum(_item_size(item) + 16 for item in ([value] if single else value))


def _item_size(item) -> int:
    if hasattr(item, "ByteSize"):
        return item.ByteSize()
    return len(item) if isinstance(item, bytes) else len(str(item).encode())


def _graph_size_bound(graph: onnx.GraphProto) -> int:
    total = 0
    for descriptor, value in graph.ListFields():
        if descriptor.name == "initializer":
            total += sum(_tensor_size_bound(t) + 16 for t in value)
        else:
            total += _field_size(descriptor, value)
    return total


def _tensor_size_bound(tensor: onnx.TensorProto) -> int:
    length = expected_length(tensor)
    if length is None or length < INLINE_BELOW or tensor.data_location == EXTERNAL:
        return tensor.ByteSize()
    skeleton = onnx.TensorProto()
    for name in _SKELETON_FIELDS:
        value = getattr(tensor, name)
        if name in ("dims", "external_data", "metadata_props"):
            getattr(skeleton, name).extend(value)
        elif tensor.HasField(name) if name != "data_type" else True:
            setattr(skeleton, name, value) if name != "segment" else skeleton.segment.CopyFrom(value)
    data = length + 16 if tensor.HasField("raw_data") else 0
    data += sum(len(getattr(tensor, field)) * size for field, size in _FIELD_BYTES.items())
    data += sum(len(s) + 16 for s in tensor.string_data)
    return skeleton.ByteSize() + data + 16


PACKED_BITS = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2, "FLOAT6E2M3": 6, "FLOAT6E3M2": 6}


def _packed_bits(data_type: int) -> int:
    """Bits per element of a packed sub-byte type (int4, float4...), else 0."""
    return PACKED_BITS.get(onnx.TensorProto.DataType.Name(data_type), 0)


def attach(model: onnx.ModelProto, folder: str) -> None:
    """Check each external tensor's range against its file (in ``folder``, already checked
    to be a regular file inside it); read small tensors and attribute tensors into the
    proto; mark the big initializers with ``folder``. Raises ExternalDataError."""
    folder = os.path.realpath(folder)
    stats: dict[str, os.stat_result] = {}
    tensors = [(t, True) for t in _get_initializer_tensors(model)] + [(t, False) for t in _get_attribute_tensors(model)]
    for tensor, initializer in tensors:
        if tensor.data_location != EXTERNAL:
            continue
        info = file_reference(tensor)
        location = info.get("location", "")
        path = os.path.join(folder, location)
        if path not in stats:
            stats[path] = os.stat(path)
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else stats[path].st_size - offset
        except ValueError:
            raise ExternalDataError(f"tensor '{tensor.name}' has a malformed offset or length") from None
        if offset < 0 or length < 0 or offset + length > stats[path].st_size:
            raise ExternalDataError(
                f"tensor '{tensor.name}' needs bytes {offset}..{offset + length} of '{location}', "
                f"which has {stats[path].st_size}"
            )
        want = expected_length(tensor)
        if want is not None and want != length:
            raise ExternalDataError(f"tensor '{tensor.name}' is {length} bytes in '{location}', its type and shape need {want}")
        if length < INLINE_BELOW or not initializer:
            _inline(tensor, Source(path, offset, length))
        else:
            _set_entries(tensor, [("location", location), ("offset", str(offset)), ("length", str(length)),
                                  (FOLDER_KEY, folder), (STAMP_KEY, file_stamp(stats[path]))])


def _set_entries(tensor: onnx.TensorProto, pairs: list[tuple[str, str]]) -> None:
    del tensor.external_data[:]
    for key, value in pairs:
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def read_bytes(where: Source) -> bytes:
    with open(where.path, "rb") as handle:
        check_unchanged(where, handle)
        handle.seek(where.offset)
        data = handle.read(where.length)
        check_unchanged(where, handle)
    if len(data) != where.length:
        raise ExternalDataError(f"'{where.path}' is shorter than its model says (it changed while in use?)")
    return data


def _inline(tensor: onnx.TensorProto, where: Source) -> None:
    tensor.raw_data = read_bytes(where)
    tensor.ClearField("data_location")  # as if it had always been inline
    del tensor.external_data[:]


def as_array(tensor: onnx.TensorProto) -> np.ndarray:
    """The values of a marked external tensor: a read-only memory map of its file for the
    types numpy stores as ONNX does (pages are read when touched), else a decoded copy."""
    where = source(tensor)
    if where is None:
        raise ValueError(f"tensor '{tensor.name}' is not marked external data")
    shape = tuple(tensor.dims)
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
    except (KeyError, ValueError, TypeError):
        dtype = None
    plain = dtype is not None and dtype.kind in "biufc" and dtype.type.__module__ == "numpy" and not _packed_bits(tensor.data_type)
    if plain and where.length == int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        if where.length == 0:
            return np.zeros(shape, dtype)
        with open(where.path, "rb") as handle:
            check_unchanged(where, handle)
        return np.memmap(where.path, dtype=dtype, mode="r", offset=where.offset, shape=shape)
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    _inline(copy, where)
    return onnx.numpy_helper.to_array(copy)


def inlined(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every marked tensor's bytes read into it (for consumers
    that need the whole model in memory, such as the reference executor)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in list(marked_tensors(copy)):
        _inline(tensor, source(tensor))
    return copy


def weights_as_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    """(a copy of ``model`` in which each marked initializer of the main graph is a graph input
    instead, {its name: the marked tensor}): for an engine that takes the weights as feeds (a
    memory map each) rather than reading them into the model. Marked tensors inside bodies
    are read into the copy."""
    weights = {t.name: t for t in model.graph.initializer if source(t) is not None}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    kept = [t for t in copy.graph.initializer if t.name not in weights]
    del copy.graph.initializer[:]
    copy.graph.initializer.extend(kept)
    declared = {v.name for v in copy.graph.input}
    copy.graph.input.extend(onnx.helper.make_tensor_value_info(name, t.data_type, list(t.dims))
                            for name, t in weights.items() if name not in declared)
    for tensor in list(marked_tensors(copy)):
        _inline(tensor, source(tensor))
    return copy, weights


def without_marks(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """(a copy of ``model`` whose references carry no scanopt mark, the one folder they are
    relative to or None): what onnxruntime reads. Raises ExternalDataError when the
    references point into several folders (one session reads one folder)."""
    marked = list(marked_tensors(model))
    if not marked:
        return model, None
    folders = {entries(t)[FOLDER_KEY] for t in marked}
    if len(folders) > 1:
        raise ExternalDataError(f"its external data lives in {len(folders)} folders; onnxruntime reads one")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in marked_tensors(copy):
        _set_entries(tensor, [(e.key, e.value) for e in tensor.external_data if e.key not in MARK_KEYS])
    return copy, folders.pop()


def hollow(model: onnx.ModelProto) -> None:
    """Turn every marked tensor of ``model`` (a throw-away copy) into an empty tensor of the
    same name and type, in place: for onnx.checker, which looks for a referenced file
    relative to the working directory, not the folder the reference is relative to."""
    for tensor in list(marked_tensors(model)):
        del tensor.external_data[:]
        del tensor.dims[:]
        tensor.dims.append(0)
        tensor.data_location = onnx.TensorProto.DEFAULT


def hollow_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` for onnx.checker whose top-level initializers of INLINE_BELOW
    bytes or more (inline or in a file) are empty tensors of the same name and type: the
    checker reads no weight, and a big model is not copied (the full copy and its
    serialization were two more copies of every weight). Other tensors are copied as they are."""
    light = onnx.ModelProto()
    copy_fields(model, light, skip=("graph",))
    copy_fields(model.graph, light.graph, skip=("initializer",))
    for tensor in model.graph.initializer:
        length = expected_length(tensor)
        if tensor.data_location == EXTERNAL or (length is not None and length >= INLINE_BELOW):
            light.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=[0])
        else:
            light.graph.initializer.append(tensor)
    hollow(light)  # marked tensors deeper down (in bodies)
    return light


def write_model(model: onnx.ModelProto, staged: str, location: str, *, threshold: int, folder: str | None = None) -> None:
    """Write ``model`` to ``staged`` with its initializers of ``threshold`` bytes or more in
    ``location`` (a file name beside ``staged``): a marked tensor's bytes are copied from
    its file in chunks (never whole in memory), an in-memory one's written as they are;
    then only the small proto is serialized. Converts ``model``'s tensors to references
    to ``location`` in place (as onnx.save_model does), marked with ``folder`` (where the
    staged files will be renamed to), so that ``model`` can be saved again elsewhere: an
    unmarked reference would be written as it is, into a model whose folder lacks the file."""
    data_path = os.path.join(os.path.dirname(staged), location)
    handle = None
    offset = 0
    moved = []
    try:
        for tensor in _get_initializer_tensors(model):
            where = source(tensor)
            raw = None
            if where is None:
                if tensor.data_location == EXTERNAL:
                    continue
                raw = _raw_bytes(tensor, threshold)  # one copy of a tensor that is in memory anyway
                if raw is None:
                    continue
                length = len(raw)
            else:
                length = where.length
            if handle is None:
                handle = open(data_path, "wb")
            if length >= ALIGN_FROM and offset % ALIGN:
                offset += ALIGN - offset % ALIGN
                handle.seek(offset)
            if raw is not None:
                handle.write(raw)
                _clear_values(tensor)
                raw = None
            else:
                _copy_range(where, handle)
            _set_entries(tensor, [("location", location), ("offset", str(offset)), ("length", str(length))])
            tensor.data_location = EXTERNAL
            moved.append(tensor)
            offset += length
        if handle is not None:
            handle.truncate(offset)
    finally:
        if handle is not None:
            handle.close()
    with open(staged, "wb") as out:
        out.write(model.SerializeToString())
    if folder is not None and moved:
        stamp = file_stamp(os.stat(data_path))  # a rename keeps size and mtime
        for tensor in moved:
            tensor.external_data.add(key=FOLDER_KEY, value=os.path.realpath(folder))
            tensor.external_data.add(key=STAMP_KEY, value=stamp)


def write_serialized(model: onnx.ModelProto, handle) -> None:
    """Write the serialization of ``model`` to ``handle`` (a binary file), each main-graph
    initializer of INLINE_BELOW bytes or more of raw data as one copy of its bytes at a
    time. upb serializes a whole model into its arena, then copies that into a Python
    bytes object: two more copies of every weight at once. Protobuf reads fields in any
    order, so the graph's initializers follow its other fields (same model when parsed)."""
    big = [t for t in model.graph.initializer if (expected_length(t) or 0) >= INLINE_BELOW and t.HasField("raw_data")]
    if not big:
        handle.write(model.SerializeToString())
        return
    shell = onnx.ModelProto()
    copy_fields(model, shell, skip=("graph",))
    rest = onnx.GraphProto()
    copy_fields(model.graph, rest, skip=("initializer",))
    rest_bytes = rest.SerializeToString()
    pieces = []  # per initializer: (its bytes up to its raw data, raw data length, tensor to read it from)
    for tensor in model.graph.initializer:
        if any(tensor is t for t in big):
            head = onnx.TensorProto()
            copy_fields(tensor, head, skip=("raw_data",))
            length = len(tensor.raw_data)  # a transient copy, one weight at a time
            pieces.append((head.SerializeToString() + _key(_RAW_DATA) + _varint(length), length, tensor))
        else:
            pieces.append((tensor.SerializeToString(), 0, None))
    entries = [_key(_INITIALIZER) + _varint(len(head) + length) for head, length, _ in pieces]
    graph_length = len(rest_bytes) + sum(len(e) + len(head) + length for e, (head, length, _) in zip(entries, pieces))
    handle.write(shell.SerializeToString())
    handle.write(_key(_GRAPH) + _varint(graph_length))
    handle.write(rest_bytes)
    for entry, (head, length, tensor) in zip(entries, pieces):
        handle.write(entry)
        handle.write(head)
        if tensor is not None:
            raw = tensor.raw_data
            if len(raw) != length:  # changed since measured: the lengths written above would lie
                raise ExternalDataError(f"initializer '{printable(tensor.name)}' changed while it was written")
            handle.write(raw)
            del raw


_GRAPH = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_INITIALIZER = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
_RAW_DATA = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number


def _key(field_number: int) -> bytes:
    """The wire key of a length-delimited field (wire type 2)."""
    return _varint(field_number << 3 | 2)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")


def _raw_bytes(tensor: onnx.TensorProto, threshold: int) -> bytes | None:
    """The little-endian bytes of an in-memory tensor of ``threshold`` bytes or more (its
    raw_data, or its typed field such as float_data encoded as raw_data would be), else None
    (small, or strings, which have no raw form)."""
    if tensor.HasField("raw_data"):
        return tensor.raw_data if len(tensor.raw_data) >= threshold else None
    length = expected_length(tensor)
    if length is None or length < threshold or tensor.data_type == onnx.TensorProto.STRING:
        return None
    return onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor)).raw_data


def _clear_values(tensor: onnx.TensorProto) -> None:
    tensor.ClearField("raw_data")
    for name in _TYPED_FIELDS:
        tensor.ClearField(name)


def _copy_range(where: Source, target) -> None:
    """Copy ``where``'s bytes to the current position of ``target`` in CHUNK-sized steps."""
    target.flush()
    with open(where.path, "rb") as handle:
        check_unchanged(where, handle)
        handle.seek(where.offset)
        left = where.length
        while left:
            data = handle.read(min(CHUNK, left))
            if not data:
                raise ExternalDataError(f"'{where.path}' is shorter than its model says (it changed while in use?)")
            target.write(data)
            left -= len(data)
        check_unchanged(where, handle)
