"""Feeds for running a model: synthesized from its signature, or loaded from the user's files.

Synthesized feeds must be inputs the model accepts, or verification proves nothing:
dims are bound by everything the model declares (scanopt.feed_shapes), Scan-8
``sequence_lens`` stay inside the sequence length, and integer indices stay inside the
axis they index. Sizes change from seed to seed (1 included, seed 0's trip counts 64), so a
rewrite that hard-codes a size, mishandles a single step or breaks past a threshold is
caught; float values reach the saturated regions of the activations. Feeds are bounded
in memory (FEED_BUDGET_BYTES).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np
import onnx

from scanopt.errors import ScanoptError, first_line
from scanopt.feed_shapes import Attempt, InputShapes
from scanopt.protos import in_default_domain, walk_proto_graphs
from scanopt.scan_view import scan_version
from scanopt.validate import default_opset

Dim = int | str | None  # a fixed size, a symbolic name, or unknown

# Ops whose ``indices`` input (position 1) indexes ``data`` (position 0) along ``axis``.
AXIS_INDEX_OPS = ("Gather", "GatherElements", "ScatterElements", "Scatter")
# Ops whose ``indices`` input's last axis holds coordinates into data's leading axes.
ND_INDEX_OPS = ("GatherND", "ScatterND")


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output as the model declares it."""

    name: str
    elem_type: int
    shape: tuple[Dim, ...] | None  # None when the rank is unknown
    required: bool = True  # False for an input that an initializer of the same name defaults

    @property
    def dtype(self) -> np.dtype:
        return numpy_dtype(self.elem_type, self.name)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)


def numpy_dtype(elem_type: int, name: str = "value") -> np.dtype:
    """The numpy dtype of an ONNX element type (ml_dtypes types for bfloat16, float8, int4)."""
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        raise ScanoptError(f"'{name}' has element type {elem_type}, which scanopt cannot feed or compare") from None


def _spec(value: onnx.ValueInfoProto, required: bool = True) -> TensorSpec:
    if not value.type.HasField("tensor_type"):
        kind = value.type.WhichOneof("value") or "no"
        raise ScanoptError(f"'{value.name}' has {kind} type; scanopt only feeds and compares tensors")
    tensor_type = value.type.tensor_type
    shape = None
    if tensor_type.HasField("shape"):
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim
        )
    return TensorSpec(value.name, tensor_type.elem_type, shape, required)


def input_specs(model: onnx.ModelProto) -> list[TensorSpec]:
    """The graph inputs; those with a same-named initializer are optional."""
    defaults = {init.name for init in model.graph.initializer}
    return [_spec(v, v.name not in defaults) for v in model.graph.input]


def output_specs(model: onnx.ModelProto) -> list[TensorSpec]:
    """The graph outputs; one declared without a type (onnxscript writes them so) or with a
    sequence, map or optional type (skl2onnx's ZipMap) has elem_type UNDEFINED and no shape:
    its outputs are compared as they come (element by element, see verify.compare_values)."""
    return [
        _spec(v) if v.type.HasField("tensor_type") else TensorSpec(v.name, onnx.TensorProto.UNDEFINED, None)
        for v in model.graph.output
    ]


# -- synthesis ----------------------------------------------------------------------------

# Synthesized feeds of one input set may take at most this many bytes in total; a model
# whose declared inputs need more cannot be verified on synthesized inputs (pass --inputs).
FEED_BUDGET_BYTES = 256 * 2**20
# A long trip count is shortened to fit the budget, but not below this (the other seeds' sizes).
MIN_FITTED_TRIP = 12


@dataclass(frozen=True)
class _IndexUse:
    """A graph input used as indices into ``data``: along ``axis``, or (ND ops) into the
    axes after ``batch_dims``. Sizes are looked up per seed."""

    data: str
    axis: int | None  # axis-style ops
    batch_dims: int | None  # ND-style ops


class InputSynthesizer:
    """Analyses a model once, then draws feeds for any seed (cheap to call per seed).

    Shapes come from :class:`scanopt.feed_shapes.InputShapes` (everything the model
    declares, Scan bodies included); :meth:`attempts` lists the sizes to try for a seed,
    best first, and :meth:`feeds` draws values for one of them. ``engine`` decides the
    range of ``sequence_lens``: onnxruntime rejects a length of 0, so it gets [1, T];
    the reference engine handles empty sequences and gets [0, T].
    """

    def __init__(self, model: onnx.ModelProto, *, engine: str = "ort", input_ranges: dict | None = None):
        self.model = model
        self.min_len = 0 if engine == "reference" else 1
        self.specs = [s for s in input_specs(model) if s.required]
        for spec in self.specs:
            numpy_dtype(spec.elem_type, spec.name)  # an unsupported type fails here, named
        self.input_shapes = InputShapes(model, [s.name for s in self.specs])
        unknown = self.input_shapes.unknown_rank()
        if unknown:
            raise ScanoptError(
                f"input '{unknown[0]}' has no shape in the model and none follows from its uses; "
                "pass it with --inputs"
            )
        names = {s.name for s in self.specs}
        self.lens_uses, self.index_uses = _input_uses(model, names)
        self._initializer_dims = {i.name: tuple(i.dims) for i in model.graph.initializer}
        # float inputs a rewrite named with the range the model is meant for (PassContext.input_ranges)
        floats = {s.name for s in self.specs if s.dtype.kind == "f"}
        self.input_ranges = {k: v for k, v in (input_ranges or {}).items() if k in floats}
        self.range_notes = [f"'{k}' drawn in [{_bound(lo, '-inf')}, {_bound(hi, 'inf')}]: {why}"
                            for k, (lo, hi, why) in sorted(self.input_ranges.items())]

    def attempts(self, seed: int) -> list[Attempt]:
        """Sizes to try for ``seed``: its preferred ones first, then all-ones and a few others.

        A long trip count (seed 0) whose feeds would not fit FEED_BUDGET_BYTES is halved until
        they do (down to MIN_FITTED_TRIP); the budget error is then left to :meth:`feeds`.
        """
        trip = self.input_shapes.trip_size(seed)
        while trip is not None and trip > MIN_FITTED_TRIP:
            preferred = next(iter(self.input_shapes.attempts(seed, trip=trip)))
            if not over_feed_budget({spec.name: (spec.dtype, preferred.shapes[spec.name]) for spec in self.specs}):
                break
            trip //= 2
        return list(self.input_shapes.attempts(seed, trip=trip))

    def shapes(self, seed: int) -> dict[str, tuple[int, ...]]:
        """The preferred shape of every required input for ``seed``."""
        return self.attempts(seed)[0].shapes

    def feeds(self, seed: int, attempt: Attempt | None = None, *, min_len: int | None = None) -> dict[str, np.ndarray]:
        """Deterministic feeds for ``seed`` (sizes from ``attempt``, default the preferred), in
        graph-input order. Raises ScanoptError before allocating beyond FEED_BUDGET_BYTES."""
        shapes = (attempt or self.attempts(seed)[0]).shapes
        self._check_budget(shapes)
        rng = np.random.default_rng(seed)
        known = _ShapeLookup(self.model, shapes, self._initializer_dims)
        low = self.min_len if min_len is None else min_len
        feeds = {}
        for spec in self.specs:
            shape = shapes[spec.name]
            if spec.name in self.lens_uses:
                feeds[spec.name] = self._lengths(rng, shape, self.lens_uses[spec.name], known, low)
            elif spec.name in self.index_uses and spec.dtype.kind in "iu":
                high = self._index_bound(shape, self.index_uses[spec.name], known)
                feeds[spec.name] = rng.integers(0, high, size=shape).astype(spec.dtype)
            else:
                feeds[spec.name] = random_array(rng, spec.dtype, shape, wide=seed != 1)
            if spec.name in self.input_ranges:
                feeds[spec.name] = _reflected(feeds[spec.name], *self.input_ranges[spec.name][:2])
        return feeds

    def _check_budget(self, shapes: dict[str, tuple[int, ...]]) -> None:
        reason = over_feed_budget({spec.name: (spec.dtype, shapes[spec.name]) for spec in self.specs})
        if reason:
            raise FeedBudgetError(f"{reason} for synthesized inputs; pass --inputs")

    def _lengths(self, rng, shape, uses: list[tuple[str, ...]], known: "_ShapeLookup", min_len: int) -> np.ndarray:
        """Lengths in [min_len, T], shaped [B]; B and T come from the Scan's scan inputs."""
        batch, steps = None, []
        for scan_inputs in uses:
            for name in scan_inputs:
                dims = known.shape(name)
                if dims is not None and len(dims) >= 2:
                    batch = dims[0] if batch is None else batch
                    steps.append(dims[1])
                    break
        if batch is not None:
            shape = (batch,)
        # With no known length, 1 is inside [1, T] for every T >= 1.
        t = min(steps) if steps else 1
        low = min(min_len, t)
        lengths = rng.integers(low, t + 1, size=shape).astype(np.int64)
        if lengths.size and t > 1:
            lengths.flat[int(rng.integers(lengths.size))] = t  # the full length is always among them
        return lengths

    def _index_bound(self, shape, uses: list[_IndexUse], known: "_ShapeLookup") -> int:
        """The smallest size among the axes the input indexes (at least 1: an empty axis gets 0s)."""
        bounds = []
        for use in uses:
            data = known.shape(use.data)
            if data is None:
                continue
            if use.axis is not None:
                axis = use.axis + len(data) if use.axis < 0 else use.axis
                if 0 <= axis < len(data):
                    bounds.append(data[axis])
            elif shape:
                bounds.extend(data[use.batch_dims : use.batch_dims + shape[-1]])
        return max(min(bounds), 1) if bounds else 1


def _bound(value, otherwise: str) -> str:
    return otherwise if value is None else f"{value:g}"


def _reflected(x: np.ndarray, low, high) -> np.ndarray:
    """``x`` mirrored into [low, high] at the bound it passes (a random draw keeps its spread:
    g <= 0 gets -|g|); where both bounds are given, clipped after."""
    x = np.array(x, copy=True)
    if high is not None:
        x = np.where(x > high, 2 * high - x, x).astype(x.dtype)
    if low is not None:
        x = np.where(x < low, 2 * low - x, x).astype(x.dtype)
    if low is not None and high is not None:
        x = np.clip(x, low, high).astype(x.dtype)
    return x


class FeedBudgetError(ScanoptError):
    """The declared inputs are too large to synthesize (the user must pass inputs).

    Exit code 1, like a failed verification: the file is fine, it just cannot be checked.
    """

    exit_code = 1


def synthesize_inputs(model: onnx.ModelProto, seed: int = 0, *, engine: str = "ort") -> dict[str, np.ndarray]:
    """Feeds for every required input of ``model`` at the seed's preferred sizes (see
    :class:`InputSynthesizer`)."""
    return InputSynthesizer(model, engine=engine).feeds(seed)


# Floats: mostly standard normal, plus outliers in the saturated regions of tanh/sigmoid
# (|x| in [SATURATED_LOW, SATURATED_HIGH], both signs), a signed zero, and on "wide" seeds
# (every seed but 1: the default two seeds have one wide, one narrow) outliers up to
# DEEP_SATURATION with at least one beyond DEEP_SATURATION_LOW (issue 19: a candidate wrong
# only for |x| > 12 must be caught) and one of magnitude LARGE. Never NaN or inf: they would
# spread to every output of both models and make the comparison vacuous.
SATURATED_LOW, SATURATED_HIGH = 5.5, 12.0
DEEP_SATURATION_LOW, DEEP_SATURATION = 20.0, 30.0
LARGE = 60.0
OUTLIER_SHARE = 6  # one element in this many is an outlier (at least one per array)


def random_array(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...], *, wide: bool = False) -> np.ndarray:
    """Values any op accepts: floats with saturating outliers, booleans, small non-negative integers.

    Integers stay in [0, 5) because integer inputs are often sizes, counts or repeats,
    where a negative value is an error rather than data.
    """
    if dtype == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)  # a comparison of 0-d arrays gives a scalar
    if dtype.kind in "iu" or (dtype.kind == "V" and "int" in dtype.name):
        return rng.integers(0, 5, size=shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.kind == "O":
        return np.array([f"s{v}" for v in rng.integers(0, 10, size=shape).ravel()], dtype=object).reshape(shape)
    values = rng.standard_normal(shape)
    flat = values.reshape(-1)
    if flat.size:
        count = max(1, flat.size // OUTLIER_SHARE)
        where = rng.permutation(flat.size)
        signs = np.where(np.arange(count) % 2 == 0, 1.0, -1.0) * rng.choice([1.0, -1.0])
        high = DEEP_SATURATION if wide else SATURATED_HIGH
        flat[where[:count]] = signs * rng.uniform(SATURATED_LOW, high, count)
        if wide:  # at least one deep in saturation, whatever the draw
            flat[where[0]] = signs[0] * rng.uniform(DEEP_SATURATION_LOW, DEEP_SATURATION)
        if flat.size > count:
            flat[where[count]] = -0.0 if rng.random() < 0.5 else 0.0
        if wide and flat.size > count + 1:
            flat[where[count + 1]] = LARGE * rng.choice([1.0, -1.0])
    return values.astype(dtype)


def over_feed_budget(shapes: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> str | None:
    """Why feeds of these (dtype, shape)s must not be drawn (over FEED_BUDGET_BYTES:
    a model may declare [10**12]), or None when they fit; checked before allocating."""
    total, biggest = 0, None
    for name, (dtype, shape) in shapes.items():
        size = math.prod(shape) * max(dtype.itemsize, 8 if dtype.kind == "O" else 1)
        total += size
        if biggest is None or size > biggest[0]:
            biggest = (size, name, shape)
    if total <= FEED_BUDGET_BYTES:
        return None
    _, name, shape = biggest
    return (f"the declared inputs need {_bytes(total)} (input '{name}' is {list(shape)}), over the "
            f"{_bytes(FEED_BUDGET_BYTES)} budget")


def _bytes(count: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def _input_uses(model: onnx.ModelProto, input_names: set[str]):
    """Find graph inputs used as Scan-8 sequence_lens or as indices, at any nesting level."""
    opset = default_opset(model)
    scan8 = opset is not None and opset >= 8 and scan_version(opset) == 8
    lens: dict[str, list[tuple[str, ...]]] = {}  # input -> scan inputs of each Scan-8 using it
    index: dict[str, list[_IndexUse]] = {}
    for graph in walk_proto_graphs(model.graph):
        for node in graph.node:
            if not in_default_domain(node.domain):
                continue
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            inputs = list(node.input)
            if node.op_type == "Scan" and scan8 and inputs and inputs[0] in input_names:
                m = attrs.get("num_scan_inputs", 0)
                scans = tuple(n for n in inputs[len(inputs) - m :] if n) if m else ()
                lens.setdefault(inputs[0], []).append(scans)
            elif len(inputs) > 1 and inputs[1] in input_names:
                if node.op_type in AXIS_INDEX_OPS:
                    use = _IndexUse(inputs[0], attrs.get("axis", 0), None)
                elif node.op_type in ND_INDEX_OPS:
                    use = _IndexUse(inputs[0], None, attrs.get("batch_dims", 0))
                else:
                    continue
                index.setdefault(inputs[1], []).append(use)
    return lens, index


class _ShapeLookup:
    """Concrete shapes of values for one seed: graph inputs, initializers, then shape inference.

    Shape inference runs only when a value is neither an input nor an initializer, and
    only once per seed.
    """

    def __init__(self, model, input_shapes, initializer_dims):
        self.model = model
        self.known: dict[str, tuple] = {**initializer_dims, **input_shapes}
        self._inferred: dict[str, tuple] | None = None

    def shape(self, name: str) -> tuple[int, ...] | None:
        if name in self.known:
            return self.known[name]
        if self._inferred is None:
            self._inferred = self._infer()
        return self._inferred.get(name)

    def _infer(self) -> dict[str, tuple[int, ...]]:
        fixed = onnx.ModelProto()
        fixed.CopyFrom(self.model)
        for value in fixed.graph.input:
            if value.name in self.known and value.type.HasField("tensor_type"):
                dims = value.type.tensor_type.shape.dim
                for dim, size in zip(dims, self.known[value.name]):
                    dim.Clear()
                    dim.dim_value = size
        try:
            inferred = onnx.shape_inference.infer_shapes(fixed)
        except Exception:  # inference is a best effort; a failure leaves shapes unknown
            return {}
        shapes = {}
        for graph in walk_proto_graphs(inferred.graph):
            for value in list(graph.value_info) + list(graph.output):
                if not value.type.HasField("tensor_type"):
                    continue
                shape = _spec(value).shape
                if shape is not None and all(isinstance(d, int) for d in shape):
                    shapes[value.name] = shape
        return shapes


# -- user inputs --------------------------------------------------------------------------


def parse_input_assignment(text: str) -> tuple[str, str]:
    """Split ``name=file.npy`` (the name may itself contain '=': the last one splits)."""
    name, sep, path = text.rpartition("=")
    if not sep or not name or not path:
        raise ScanoptError(f"--input '{text}': expected NAME=FILE.npy")
    return name, path


def load_feeds(
    model: onnx.ModelProto, *, npz: str | None = None, arrays: Iterable[str] = ()
) -> dict[str, np.ndarray] | None:
    """The user's feeds (see :func:`read_feeds`), checked against ``model``; None if none given."""
    feeds = read_feeds(npz=npz, arrays=arrays)
    return None if feeds is None else check_feeds(model, feeds)


def read_feeds(*, npz: str | None = None, arrays: Iterable[str] = ()) -> dict[str, np.ndarray] | None:
    """Arrays from ``--inputs file.npz`` and ``--input name=file.npy`` (which wins), unchecked.

    Returns None when neither is given, so the caller synthesizes.
    """
    assignments = [parse_input_assignment(a) for a in arrays]
    if npz is None and not assignments:
        return None
    feeds: dict[str, np.ndarray] = {}
    if npz is not None:
        try:
            archive = np.load(npz, allow_pickle=False)
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise ScanoptError(f"--inputs {npz}: not an .npz archive (for one .npy use --input NAME={npz})")
            with archive:
                feeds.update({key: archive[key] for key in archive.files})
        except (OSError, ValueError) as exc:
            raise ScanoptError(f"--inputs {npz}: cannot read ({first_line(exc)})") from None
    for name, path in assignments:
        try:
            value = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ScanoptError(f"--input {name}={path}: cannot read ({first_line(exc)})") from None
        if not isinstance(value, np.ndarray):
            value.close()
            raise ScanoptError(f"--input {name}={path}: not a single .npy array (for an .npz use --inputs)")
        feeds[name] = value
    return feeds


def check_feeds(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Check names, dtypes and shapes of the user's feeds; return them ready to run.

    Adjusts representation only, never values: text arrays become the object arrays
    onnxruntime wants, and raw 2-byte records (how .npy stores bfloat16) are viewed as
    bfloat16.
    """
    specs = {s.name: s for s in input_specs(model)}
    unknown = [n for n in feeds if n not in specs]
    if unknown:
        raise ScanoptError(f"unknown input name(s) {_names(unknown)}; the model's inputs are {_names(specs)}")
    missing = [n for n, s in specs.items() if s.required and n not in feeds]
    if missing:
        raise ScanoptError(f"missing required input(s) {_names(missing)}")
    checked, bound = {}, {}
    for name, value in feeds.items():
        spec = specs[name]
        value = _as_dtype(np.asarray(value), spec.dtype, name)
        if spec.shape is not None:
            if value.ndim != len(spec.shape):
                raise ScanoptError(f"input '{name}' has rank {value.ndim}; the model wants {_shape_text(spec.shape)}")
            for axis, (want, got) in enumerate(zip(spec.shape, value.shape)):
                if isinstance(want, int) and want != got:
                    raise ScanoptError(
                        f"input '{name}' has shape {value.shape}; axis {axis} must be {want} "
                        f"({_shape_text(spec.shape)})"
                    )
                if isinstance(want, str):
                    first = bound.setdefault(want, (got, name))
                    if first[0] != got:
                        raise ScanoptError(
                            f"dim '{want}' is {first[0]} in input '{first[1]}' but {got} in input '{name}'"
                        )
        checked[name] = value
    return {s: checked[s] for s in specs if s in checked}


def _as_dtype(value: np.ndarray, want: np.dtype, name: str) -> np.ndarray:
    if value.dtype == want:
        return value
    if want.kind == "O" and value.dtype.kind == "U":
        return value.astype(object)
    if want.kind == "V" and value.dtype.kind == "V" and value.dtype.itemsize == want.itemsize and not value.dtype.names:
        return value.view(want)
    raise ScanoptError(f"input '{name}' is {value.dtype}; the model wants {want}")


def _shape_text(shape: tuple[Dim, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _names(names: Iterable[str]) -> str:
    return ", ".join(f"'{n}'" for n in names)
