"""Run a model with onnxruntime or with scanopt's reference executor.

A :class:`Runner` is built once per model and called once per set of feeds, so
verification over several seeds loads each model only once. Every failure to load or
run becomes an :class:`EngineError` with a one-line message.

Big weights left in their file (scanopt.external_data) are not read by scanopt: onnxruntime
gets the small proto and each such weight as one read-only memory map that every session
shares (see :func:`ort_source`); so does each big inline weight, one buffer for every
session whose tensor of that name is equal (verification's original and candidate).
Models over 2 GB in memory: protobuf cannot serialize them, so onnxruntime must read them
from their file. Pass ``path=`` (the file the model was
loaded from); without it such a model cannot run in onnxruntime, and "auto" falls back to
the reference executor.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import weakref
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Mapping

import numpy as np
import onnx

from scanopt.errors import ScanoptError, first_line
from scanopt.external_data import (INLINE_BELOW, ExternalDataError, as_array, expected_length, has_marks, source,
                                   weights_as_inputs, without_marks)
from scanopt.inputs import numpy_dtype
from scanopt.model_io import load_model, needs_external_data
from scanopt.protos import copy_fields, in_default_domain, walk_proto_graphs

ENGINES = ("ort", "reference")


class EngineError(ScanoptError):
    """A model could not be loaded or run by an engine."""


Feeds = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]
ModelLike = onnx.ModelProto | str | os.PathLike  # a model, or the path of its file


class Runner:
    """A model loaded into one engine; call it with feeds to get every graph output by name."""

    def __init__(self, engine: str, output_names: list[str], call: Callable[[Feeds], list[np.ndarray]]):
        self.engine = engine
        self.output_names = output_names
        self._call = call

    def __call__(self, feeds: Feeds) -> Outputs:
        try:
            values = self._call(feeds)
        except ScanoptError:
            raise
        except Exception as exc:  # engines raise anything; the user gets one line
            raise EngineError(f"{self.engine} failed to run the model: {_one_line(exc)}") from exc
        # a sequence or map output (a list or dict) stays as it is: np.asarray would stack or wrap it
        return {name: value if isinstance(value, (list, dict)) else np.asarray(value)
                for name, value in zip(self.output_names, values)}


# The provider list onnxruntime sessions are made with (scanopt run/verify --execution-provider)
_PROVIDERS: ContextVar[tuple[str, ...] | None] = ContextVar("scanopt_ort_providers", default=None)


@contextmanager
def ort_providers(providers):
    """Within the block, onnxruntime sessions this module makes use ``providers`` (a session
    provider list, scanopt.providers.run_providers) instead of the CPU provider alone."""
    token = _PROVIDERS.set(tuple(providers) if providers else None)
    try:
        yield
    finally:
        _PROVIDERS.reset(token)


def prepare(model: ModelLike, engine: str, *, path: str | os.PathLike | None = None) -> Runner:
    """Load ``model`` into ``engine`` ("ort", "reference", or "auto": ort if it can load it
    and is not known to miscompute it).

    ``model`` is a ModelProto or a file path; ``path`` is the file a ModelProto came from.
    """
    model, path = resolve_model(model, path)
    if engine == "auto":
        if ort_miscomputes(model):  # `scanopt run` would print onnxruntime's wrong numbers
            return _prepare_reference(model)
        try:
            return _prepare_ort(model, path)
        except EngineError:
            return _prepare_reference(model)
    if engine == "ort":
        return _prepare_ort(model, path)
    if engine == "reference":
        return _prepare_reference(model)
    raise ScanoptError(f"unknown engine '{engine}' (choose from auto, {', '.join(ENGINES)})")


def run(model: ModelLike, feeds: Feeds, engine: str = "ort", *, path: str | os.PathLike | None = None) -> Outputs:
    """Every graph output of ``model`` on ``feeds``; for repeated runs use :func:`prepare`."""
    return prepare(model, engine, path=path)(feeds)


def ort_miscomputes(model: onnx.ModelProto) -> str | None:
    """Why onnxruntime 1.31 would give wrong numbers for ``model`` without an error, or None.

    Known cases: a Scan body that returns one of its own inputs directly (no node in
    between) yields zeros or stale memory for that output. Verification must not
    trust onnxruntime on such a model. A Loop with an omitted (empty-named) output
    crashes onnxruntime 1.32 (segmentation fault) when run: never hand it one.
    """
    for graph in walk_proto_graphs(model.graph):
        for node in graph.node:
            if node.op_type == "Loop" and in_default_domain(node.domain) and "" in node.output:
                return f"onnxruntime crashes on Loop '{node.name or node.op_type}' (an output is omitted)"
            if node.op_type != "Scan" or not in_default_domain(node.domain):
                continue
            body = next((a.g for a in node.attribute if a.name == "body"), None)
            if body is None:
                continue
            inputs = {v.name for v in body.input}
            passed = [v.name for v in body.output if v.name in inputs]
            if passed:
                label = node.name or node.op_type
                return f"onnxruntime miscomputes Scan '{label}' (body output '{passed[0]}' is a body input)"
    return None


def ort_load_error(model: ModelLike, *, path: str | os.PathLike | None = None) -> str | None:
    """Why onnxruntime cannot load ``model`` (one line), or None when it can."""
    model, path = resolve_model(model, path)
    try:
        _prepare_ort(model, path)
    except EngineError as exc:
        return str(exc)
    return None


def resolve_model(model: ModelLike, path=None) -> tuple[onnx.ModelProto, str | os.PathLike | None]:
    """(proto, file) for a ModelProto or a path; a path is loaded and validated once."""
    if isinstance(model, (str, os.PathLike)):
        return load_model(os.fspath(model), keep_external_data=True), model
    return model, path


# -- onnxruntime ----------------------------------------------------------------------------


def _prepare_ort(model: onnx.ModelProto, path) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # errors come back as exceptions; keep stderr clean
    kept: list = []
    if path is not None:
        loaded_from = os.fspath(path)
    elif needs_external_data(model) and not has_marks(model):
        raise EngineError("onnxruntime can load a model over 2 GB only from its file; pass its path")
    else:
        loaded_from, kept = ort_source(model, options)
    try:
        session = ort.InferenceSession(loaded_from, options, providers=list(_PROVIDERS.get() or ["CPUExecutionProvider"]))
        session.scanopt_weights = kept  # the shared weights live as long as the session
    except Exception as exc:  # onnxruntime's pybind errors share no useful base class
        raise EngineError(f"onnxruntime cannot load the model: {_one_line(exc)}") from exc
    names = [o.name for o in session.get_outputs()]

    def call(feeds: Feeds) -> list[np.ndarray]:
        arrays = {name: np.asarray(value) for name, value in feeds.items()}  # numpy scalars too
        if not any(_is_extension(a.dtype) for a in arrays.values()):
            return session.run(names, arrays)
        values = {name: _to_ort_value(ort, a) for name, a in arrays.items()}
        return [_from_ort_value(v) for v in session.run_with_ort_values(names, values)]

    return Runner("ort", names, call)


def ort_source(model: onnx.ModelProto, options, *, prepack: bool = False) -> tuple[bytes, list]:
    """(the bytes onnxruntime loads ``model`` from, values the session must keep alive), with
    ``options`` (an onnxruntime.SessionOptions) set up for the weights left in their file.

    The main graph's such weights are handed over as initializers backed by one read-only
    memory map per weight, shared by every session of the process that uses it (original and
    candidate): onnxruntime uses the buffer as it is. It memory-maps the others (in bodies, or
    of types numpy cannot map) from the folder itself, once per session. Without ``prepack``
    (for checking numbers, not timing) it keeps using the mapped pages instead of a packed
    copy of each weight per session."""
    try:
        clean, folder = without_marks(model)
    except ExternalDataError as exc:
        raise EngineError(f"onnxruntime cannot load the model: {exc}") from None
    kept = []
    if folder is not None:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
        if not prepack:
            options.add_session_config_entry("session.disable_prepacking", "1")
        for tensor in model.graph.initializer:
            value = _shared_weight(tensor)
            if value is not None:
                options.add_initializer(tensor.name, value)
                kept.append(value)
    if prepack or folder is not None or _PLACEHOLDER is None:  # timing: weights as a user's session loads them
        return clean.SerializeToString(), kept
    shared = {}
    for tensor in clean.graph.initializer:
        weight = _shared_inline_weight(tensor)
        if weight is not None:
            options.add_initializer(tensor.name, weight.value)
            kept.append(weight)
            shared[tensor.name] = tensor
    if not shared:
        return clean.SerializeToString(), kept
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", _PLACEHOLDER[0])
    return _without_values(clean, shared).SerializeToString(), kept


# (file, its inode and mtime, offset, type, dims) -> array or OrtValue, while something holds it
_SHARED_MAPS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_SHARED_VALUES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _weight_key(tensor: onnx.TensorProto) -> tuple | None:
    where = source(tensor)
    if where is None:
        return None
    try:
        st = os.stat(where.path)
    except OSError:
        return None  # the engine reports the missing file itself
    return (where.path, st.st_ino, st.st_mtime_ns, where.offset, tensor.data_type, tuple(tensor.dims))


def shared_map(tensor: onnx.TensorProto) -> np.ndarray:
    """The values of a weight left in its file (a read-only memory map where numpy can map
    it), the same array for every engine alive that uses it: mapped once, resident once."""
    key = _weight_key(tensor)
    array = _SHARED_MAPS.get(key) if key is not None else None
    if array is None:
        array = as_array(tensor)
        if key is not None:
            _SHARED_MAPS[key] = array
    return array


def _shared_weight(tensor: onnx.TensorProto):
    """An OrtValue over :func:`shared_map` of a marked weight, the same object for every
    session alive that uses it; None when the weight is in memory or numpy cannot map it."""
    key = _weight_key(tensor)
    if key is None:
        return None
    value = _SHARED_VALUES.get(key)
    if value is None:
        array = shared_map(tensor)
        if not isinstance(array, np.memmap):
            return None
        import onnxruntime as ort

        value = ort.OrtValue.ortvalue_from_numpy(array)  # keeps the array alive
        _SHARED_VALUES[key] = value
    return value


class _InlineWeight:
    """One big inline weight as onnxruntime shares it: the OrtValue over a copy of its bytes,
    and the tensor it was read from (compared in place with the next session's tensor)."""

    __slots__ = ("tensor", "value", "__weakref__")

    def __init__(self, tensor: onnx.TensorProto, value):
        self.tensor = tensor
        self.value = value


# (name, type, dims) -> the _InlineWeight of that key, while a session holds it
_SHARED_INLINE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _shared_inline_weight(tensor: onnx.TensorProto) -> _InlineWeight | None:
    """The shared form of a big inline weight (raw data of a plain numeric type), the same
    object for every session alive whose weight of that name is an equal tensor: the
    original and the candidate of a verification (the passes keep the weights they do not
    change) hold it once between them. None for a small weight or one numpy cannot read
    as it is."""
    length = expected_length(tensor)
    if (length is None or length < INLINE_BELOW or tensor.data_location == onnx.TensorProto.EXTERNAL
            or not tensor.HasField("raw_data") or sys.byteorder != "little"):
        return None
    dtype = numpy_dtype(tensor.data_type)
    if _is_extension(dtype) or dtype.kind not in "biuf":
        return None
    key = (tensor.name, tensor.data_type, tuple(tensor.dims))
    shared = _SHARED_INLINE.get(key)
    if shared is not None and shared.tensor == tensor:  # upb compares in place: no copy of the bytes
        return shared
    raw = tensor.raw_data  # a copy: upb gives out no view of a message's bytes
    if len(raw) != length:
        return None  # onnxruntime reports the malformed tensor itself
    import onnxruntime as ort

    array = np.frombuffer(raw, dtype=dtype).reshape(key[2])  # read-only, over ``raw``
    shared = _InlineWeight(tensor, ort.OrtValue.ortvalue_from_numpy(array))  # the OrtValue keeps ``array``
    _SHARED_INLINE[key] = shared
    return shared


# (folder, file) of a file that always exists: onnxruntime checks that an external reference's
# file exists, then takes the values from the session's initializer of that name instead.
# An embedded tensor without values is refused (its data count must match its shape).
_PLACEHOLDER = os.path.split(os.devnull) if os.path.isabs(os.devnull) else None


def _without_values(model: onnx.ModelProto, emptied: dict) -> onnx.ModelProto:
    """A copy of ``model`` whose main-graph initializers named in ``emptied`` keep name,
    type and dims but no values, only a reference to :data:`_PLACEHOLDER` (onnxruntime
    takes the values from the session's initializers); the others are copied as they are."""
    light = onnx.ModelProto()
    copy_fields(model, light, skip=("graph",))
    copy_fields(model.graph, light.graph, skip=("initializer",))
    for tensor in model.graph.initializer:
        if tensor.name in emptied:
            stub = light.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims,
                                               data_location=onnx.TensorProto.EXTERNAL)
            stub.external_data.add(key="location", value=_PLACEHOLDER[1])
        else:
            light.graph.initializer.append(tensor)
    return light


def _is_extension(dtype: np.dtype) -> bool:
    """bfloat16, float8, int4...: ml_dtypes types, which onnxruntime's numpy bridge rejects."""
    return dtype.type.__module__.split(".")[0] == "ml_dtypes"


def _to_ort_value(ort, value: np.ndarray):
    if not _is_extension(value.dtype):
        return ort.OrtValue.ortvalue_from_numpy(value)
    raw = np.ascontiguousarray(value).view(f"u{value.dtype.itemsize}")
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, onnx.helper.np_dtype_to_tensor_dtype(value.dtype))


def _from_ort_value(value) -> np.ndarray:
    """A numpy copy of an output, reading the bytes for types onnxruntime cannot convert."""
    try:
        return value.numpy()
    except Exception:  # "No corresponding Numpy type" for bfloat16 and friends
        pass
    dtype = numpy_dtype(value.element_type())
    shape = tuple(value.shape())
    size = value.tensor_size_in_bytes()
    if size != int(np.prod(shape)) * dtype.itemsize:
        raise EngineError(f"cannot read an onnxruntime output of type {dtype} (packed sub-byte type)")
    if size == 0:
        return np.zeros(shape, dtype)
    raw = bytes((ctypes.c_uint8 * size).from_address(value.data_ptr()))
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


# -- reference executor -----------------------------------------------------------------------


def _prepare_reference(model: onnx.ModelProto) -> Runner:
    try:  # imported late: it is slower to import, and only some runs need it
        from scanopt.reference import make_evaluator
    except ImportError as exc:
        raise EngineError(f"the reference executor is not available ({_one_line(exc)})") from exc
    # weights left in their file reach the evaluator as feeds, each a shared memory map; a
    # feed for a graph input that is also such a weight (an input with a default) wins
    light, marked = weights_as_inputs(model) if has_marks(model) else (model, {})
    try:
        weights = {name: shared_map(tensor) for name, tensor in marked.items()}
        evaluator = make_evaluator(light)
    except ScanoptError:
        raise
    except Exception as exc:
        raise EngineError(f"the reference executor cannot load the model: {_one_line(exc)}") from exc
    names = [o.name for o in model.graph.output]

    def run(feeds):
        # IEEE overflow and NaN are what the model computes (onnxruntime is silent about
        # them too), not news for the user: numpy's RuntimeWarnings would only be noise
        with np.errstate(all="ignore"):
            return evaluator.run(names, {**weights, **feeds})

    return Runner("reference", names, run)


def _one_line(exc: BaseException) -> str:
    """The first meaningful line of an engine's message, without onnxruntime's prefixes."""
    line = first_line(exc).removeprefix("[ONNXRuntimeError] : ")
    line = re.sub(r"\S+\.(?:cc|cpp|h):\d+ \S.*?\) (?=\S)", "", line, count=1)  # source location
    return line.split("\x1b[")[0].strip()
