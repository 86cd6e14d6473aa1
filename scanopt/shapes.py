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
        self._derived: dict[int, tuple[gs.Tensor, int | None]] = {}  # id -> (tensor, rank) of derived_rank
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
        """The tensor's shape: gs's own when set, else inferred, else (rank known, dims
        unknown) a list of None as long as the rank :func:`derived_rank` recovers, else None."""
        if tensor.shape is not None:
            return list(tensor.shape)
        found = self._table.get(tensor.name, (None, None))[1]
        if found is None:
            rank = derived_rank(tensor, self._declared_rank, self._derived)
            return None if rank is None else [None] * rank
        return found

    def _declared_rank(self, tensor: gs.Tensor) -> int | None:
        shape = tensor.shape if tensor.shape is not None else self._table.get(tensor.name, (None, None))[1]
        return None if shape is None else len(shape)

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
    """The rank of ``tensor`` from its producer when ``declared(tensor)`` does not know it:
    ops that keep their input's rank, broadcasting ops (the largest input rank), MatMul
    (numpy rules) and Gemm (2). Looks at most 64 producers back; ``memo`` (id -> (tensor,
    rank)) keeps the answers of one table."""
    found = declared(tensor)
    if found is not None or depth > 64:
        return found
    cached = memo.get(id(tensor))
    if cached is not None and cached[0] is tensor:
        return cached[1]
    memo[id(tensor)] = (tensor, None)  # a cycle ends here
    rank = None
    node = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if node is not None and (node.domain or "") in _DOMAINS:
        def of(t):
            return derived_rank(t, declared, memo, depth + 1) if t.name else None
        if node.op in _SAME_RANK and tensor is node.outputs[0] and node.inputs:
            rank = of(node.inputs[0])
        elif node.op in ELEMENTWISE:
            ranks = [of(t) for t in node.inputs if t.name]
            rank = None if not ranks or None in ranks else max(ranks)
        elif node.op == "MatMul":
            a, b = of(node.inputs[0]), of(node.inputs[1])
            if a is not None and b is not None:
                rank = max(a, b) if min(a, b) >= 2 else a + b - 2 if min(a, b) == 1 else None
        elif node.op == "Gemm":
            rank = 2
        elif node.op == "Slice" and node.inputs:
            rank = of(node.inputs[0])
        elif node.op.startswith("Reduce") and node.inputs and tensor is node.outputs[0]:
            inner, axes = of(node.inputs[0]), constant_axes(node)
            if inner is not None and node.attrs.get("keepdims", 1):
                rank = inner
            elif inner is not None and axes is not None:
                rank = inner - len(set(a % inner for a in axes)) if inner else None
        elif node.op in ("Unsqueeze", "Squeeze") and node.inputs:
            axes = constant_axes(node)
            inner = of(node.inputs[0])
            if axes is not None and inner is not None:
                rank = inner + (len(axes) if node.op == "Unsqueeze" else -len(axes))
    memo[id(tensor)] = (tensor, rank)
    return rank


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
