"""Shapes and element types known at optimization time, for every value at every level.

The model's own value_info is often partial (exporters leave intermediate shapes out).
Passes consult :class:`ShapeTable`, which adds what onnx shape inference can derive
on a throw-away copy, so the model written out carries no value_info it did not have
or that a pass did not set.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.external_data import expected_length
from scanopt.graph import constant_axes, dtype_of
from scanopt.inference import bounded_inference
from scanopt.protos import walk_proto_graphs

Dim = int | str | None


class ShapeTable:
    """name -> (onnx elem type or None, shape as a list of int / symbolic str / None)."""

    def __init__(self, model: onnx.ModelProto):
        self._table: dict[str, tuple[int | None, list[Dim] | None]] = {}
        self._derived: dict[int, tuple[gs.Tensor, list | None]] = {}  # id -> (tensor, shape) of derived_shape
        inferred = inferred_model(model) or model
        self._inferred = inferred  # for dims(), on first use
        self._dims = None
        for graph in walk_proto_graphs(inferred.graph):
            for value in list(graph.input) + list(graph.output) + list(graph.value_info):
                self._table.setdefault(value.name, declared_type(value))
            for init in graph.initializer:
                self._table.setdefault(init.name, (init.data_type, list(init.dims)))

    @property
    def dims(self):
        """Which dims the model's ops prove equal (scanopt.dims.DimClasses), built on first use."""
        if self._dims is None:
            from scanopt.dims import DimClasses  # it builds on this module

            self._dims = DimClasses(self._inferred, inferred=True)
        return self._dims

    def shape(self, tensor: gs.Tensor) -> list[Dim] | None:
        """The tensor's shape: gs's own when set, else inferred, else what
        :func:`derived_shape` recovers from the producers (dims None where unknown), else None."""
        if tensor.shape is not None:
            return list(tensor.shape)
        found = self._table.get(tensor.name, (None, None))[1]
        if found is None:
            return derived_shape(tensor, self._declared_shape, self._derived)
        return found

    def _declared_shape(self, tensor: gs.Tensor) -> list[Dim] | None:
        return tensor.shape if tensor.shape is not None else self._table.get(tensor.name, (None, None))[1]

    def rank(self, tensor: gs.Tensor) -> int | None:
        shape = self.shape(tensor)
        return None if shape is None else len(shape)

    def elem_type(self, tensor: gs.Tensor) -> int | None:
        return self.elem_type_of(tensor.name)

    def dtype(self, tensor: gs.Tensor) -> np.dtype | None:
        """A value's numpy dtype: declared, else inferred, else None (np.dtype is falsy:
        test for None)."""
        dtype = dtype_of(tensor)
        if dtype is None and self.elem_type(tensor):
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.elem_type(tensor)))
        return dtype

    def elem_type_of(self, name: str) -> int | None:
        """The element type of the value called ``name`` at any level, or None."""
        return self._table.get(name, (None, None))[0]

    def type_of(self, name: str) -> tuple[int | None, list[Dim] | None]:
        """(element type, shape) of the value called ``name`` at any level, as known."""
        return self._table.get(name, (None, None))


def einsum_terms(equation) -> tuple[list[str], str] | None:
    """An Einsum equation in explicit form without an ellipsis as (operand terms, result), spaces
    dropped, or None (implicit, an ellipsis, more than one arrow, not text). The one parser
    that dims, linrec's Einsum forms and absorb share."""
    if isinstance(equation, bytes):
        equation = equation.decode(errors="replace")
    if not isinstance(equation, str):
        return None
    equation = equation.replace(" ", "")
    if equation.count("->") != 1 or "." in equation:
        return None
    left, result = equation.split("->")
    return left.split(","), result


# Ops whose output has their first input's shape.
SHAPE_PRESERVING = frozenset(
    "Identity Cast CastLike Neg Abs Relu LeakyRelu Elu Selu Sigmoid HardSigmoid Tanh Exp Log Sqrt Reciprocal "
    "Floor Ceil Round Sign Sin Cos Erf Not Softsign Softplus Clip Dropout".split()
)

# Elementwise ops with multidirectional broadcasting.
ELEMENTWISE = frozenset(
    "Add Sub Mul Div Pow Mod Max Min Sum Mean And Or Xor Equal Greater Less GreaterOrEqual LessOrEqual "
    "BitShift PRelu Where".split()
)

# Ops whose output 0 has the rank of input 0 (ai.onnx and ai.onnx.ml): a rank that shape
# inference leaves unknown (skl2onnx's Scaler has no inference function, so everything after
# it in a pipeline is unknown) follows from the producers.
_SAME_RANK = SHAPE_PRESERVING | frozenset(
    "IsNaN IsInf Softmax LogSoftmax Hardmax Celu Gelu HardSwish Mish ThresholdedRelu CumSum Transpose "
    "LpNormalization BatchNormalization LayerNormalization InstanceNormalization Tan Asin Acos Atan Sinh Cosh "
    "Asinh Acosh Atanh".split()
    + ["Scaler", "Normalizer", "Binarizer"]  # ai.onnx.ml, on [N, C]
)
_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def derived_rank(tensor: gs.Tensor, declared, memo: dict, depth: int = 0) -> int | None:
    """The rank of ``tensor`` from its producer when ``declared(tensor)`` (a rank or None) does
    not know it: :func:`derived_shape`'s length."""
    def declared_shape(t):
        rank = declared(t)
        return None if rank is None else [None] * rank

    shape = derived_shape(tensor, declared_shape, memo, depth)
    return None if shape is None else len(shape)


def derived_shape(tensor: gs.Tensor, declared, memo: dict, depth: int = 0) -> list[Dim] | None:
    """The shape of ``tensor`` from its producer when ``declared(tensor)`` (a shape or None)
    does not know it, dims None where unknown: ops that keep their input's shape, broadcasting
    ops (the largest input rank; a dim where the inputs prove it), MatMul (numpy rules) and
    Gemm (rank 2), Slice (the rank), Unsqueeze / Squeeze / Reduce* with known axes (the dims
    they insert, drop or make 1) and Einsum (each letter's dim). Onnx inference leaves these
    unknown in a body whose axes are an outer-scope Constant (onnxscript's bodies read the
    enclosing function's constants). Looks at most 64 producers back; ``memo`` (id -> (tensor,
    shape)) keeps the answers of one table."""
    found = declared(tensor)
    if found is not None or depth > 64:
        return None if found is None else list(found)
    cached = memo.get(id(tensor))
    if cached is not None and cached[0] is tensor:
        return None if cached[1] is None else list(cached[1])
    memo[id(tensor)] = (tensor, None)  # a cycle ends here
    shape = None
    node = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if node is not None and (node.domain or "") in _DOMAINS:
        def of(t):
            return derived_shape(t, declared, memo, depth + 1) if t.name else None
        first = tensor is node.outputs[0] and bool(node.inputs)
        if node.op in SHAPE_PRESERVING and first:
            shape = of(node.inputs[0])
        elif node.op in _SAME_RANK and first:
            inner = of(node.inputs[0])
            shape = None if inner is None else [None] * len(inner)
        elif node.op in ELEMENTWISE:
            shapes = [of(t) for t in node.inputs if t.name]
            shape = None if not shapes or any(x is None for x in shapes) else _broadcast(shapes)
        elif node.op == "MatMul":
            a, b = of(node.inputs[0]), of(node.inputs[1])
            if a is not None and b is not None:
                ra, rb = len(a), len(b)
                rank = max(ra, rb) if min(ra, rb) >= 2 else ra + rb - 2 if min(ra, rb) == 1 else None
                shape = None if rank is None else [None] * rank
        elif node.op == "Gemm":
            shape = [None, None]
        elif node.op == "Slice" and node.inputs:
            inner = of(node.inputs[0])
            shape = None if inner is None else [None] * len(inner)
        elif node.op.startswith("Reduce") and first:
            inner, axes = of(node.inputs[0]), constant_axes(node)
            rank = None if inner is None else len(inner)
            if rank is not None and axes is not None:
                dropped = {a % rank for a in axes} if rank else set()
                if node.attrs.get("keepdims", 1):
                    shape = [1 if i in dropped else d for i, d in enumerate(inner)]
                else:
                    shape = [d for i, d in enumerate(inner) if i not in dropped]
            elif rank is not None and node.attrs.get("keepdims", 1):
                shape = [None] * rank
        elif node.op in ("Unsqueeze", "Squeeze") and node.inputs:
            axes = constant_axes(node)
            inner = of(node.inputs[0])
            if axes is not None and inner is not None:
                if node.op == "Unsqueeze":
                    rank = len(inner) + len(axes)
                    where = {a % rank for a in axes} if rank else set()
                    rest = iter(inner)
                    shape = [1 if i in where else next(rest) for i in range(rank)]
                else:
                    where = {a % len(inner) for a in axes} if inner else set()
                    shape = [d for i, d in enumerate(inner) if i not in where]
        elif node.op == "Einsum" and first:
            terms = einsum_terms(node.attrs.get("equation"))
            shapes = [of(t) for t in node.inputs]
            if terms is not None and len(terms[0]) == len(shapes) and all(
                    x is not None and len(x) == len(term) for x, term in zip(shapes, terms[0])):
                sizes: dict[str, Dim] = {}
                for x, term in zip(shapes, terms[0]):
                    for letter, d in zip(term, x):
                        if sizes.get(letter) is None:  # a letter has one size in every operand
                            sizes[letter] = d
                shape = [sizes.get(letter) for letter in terms[1]]
    memo[id(tensor)] = (tensor, shape)
    return None if shape is None else list(shape)


def _broadcast(shapes: list[list[Dim]]) -> list[Dim]:
    """Multidirectional broadcasting of shapes whose dims may be unknown (None): a dim is a
    number other than 1 where an input has it, 1 where every input has 1, a symbolic name where
    the others have it or 1, else unknown."""
    rank = max(len(x) for x in shapes)
    out: list[Dim] = []
    for i in range(rank):
        dims = [x[i - rank + len(x)] for x in shapes if i - rank + len(x) >= 0]
        numbers = [d for d in dims if isinstance(d, (int, np.integer)) and d != 1]
        if numbers:
            out.append(int(numbers[0]))
        elif all(d == 1 for d in dims):
            out.append(1)
        elif None not in dims and len({d for d in dims if d != 1}) == 1:
            out.append(next(d for d in dims if d != 1))
        else:
            out.append(None)
    return out


# While a run holds it open (:func:`shared_inference`): the last model inferred, a cheap
# fingerprint of it (ByteSize would serialize the weights) and the result. The pipeline's ShapeTable and verification's feed synthesis ask about
# the same original proto, and inference grows faster than the model (onnx copies the
# enclosing scope's types into every body it infers).
_CACHE: list | None = None


@contextmanager
def shared_inference():
    """Within it, :func:`inferred_model` answers again for the proto it was asked about last
    (unless its top graph gained or lost nodes since: edited in place; scanopt's runs never
    edit the protos they infer, passes work on an imported copy); the answer is dropped at the
    end, so no model outlives the run through it."""
    global _CACHE
    if _CACHE is not None:  # nested: the outer run owns it
        yield
        return
    _CACHE = [None, None, None]
    try:
        yield
    finally:
        _CACHE = None


def inferred_model(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """onnx shape inference of ``model`` (lenient, with data propagation; big weights reach
    it as typed inputs), or None when inference fails: a hint, never an error."""
    cache = _CACHE
    size = (len(model.graph.node), len(model.graph.initializer))
    if cache is not None and cache[0] is model and cache[1] == size:
        return cache[2]
    try:
        inferred = bounded_inference(_without_big_weights(model))
    except Exception:  # noqa: BLE001 - inference is a hint; a failure only means fewer shapes
        inferred = None
    if cache is not None:
        cache[:] = [model, size, inferred]
    return inferred


BIG = 4096  # bytes: initializers at least this large reach inference as typed inputs only


def _without_big_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` for shape inference in which the top graph's big initializers
    are graph inputs of the same type and shape: inference serializes the model twice,
    and data propagation only needs small (shape-like) constants. The weights are not
    copied."""
    big = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL or _nbytes(t) >= BIG]
    if not big:
        return model
    light = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        if model.HasField(field):
            setattr(light, field, getattr(model, field))
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph, source = light.graph, model.graph
    graph.name = source.name
    graph.node.extend(source.node)
    graph.input.extend(source.input)
    graph.output.extend(source.output)
    graph.value_info.extend(source.value_info)
    graph.sparse_initializer.extend(source.sparse_initializer)
    names = {t.name for t in big}
    graph.initializer.extend(t for t in source.initializer if t.name not in names)
    declared = {v.name for v in source.input}
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in big if t.name not in declared)
    return light


def _nbytes(tensor: onnx.TensorProto) -> int:
    """The tensor's data size from its type and dims (ByteSize would serialize it), else its
    ByteSize (strings)."""
    length = expected_length(tensor)
    return tensor.ByteSize() if length is None else length


def declared_type(value: onnx.ValueInfoProto) -> tuple[int | None, list[Dim] | None]:
    """(elem type or None, dims as int / symbolic name / None, or None without a shape) as
    ``value`` declares them."""
    if not value.type.HasField("tensor_type"):
        return None, None
    tensor_type = value.type.tensor_type
    elem = tensor_type.elem_type or None
    if not tensor_type.HasField("shape"):
        return elem, None
    dims: list[Dim] = []
    for d in tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        else:
            dims.append(d.dim_param or None)
    return elem, dims
