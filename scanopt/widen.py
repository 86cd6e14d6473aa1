"""A model's float64 twin: the same graph with every float32/float16/bfloat16 tensor widened.

Verification judges a rewrite by its distance from the truth, not from the original's own
rounding: the twin, run on the same (widened) feeds, is that truth up to float64 rounding.
Widened are the types of graph inputs, outputs and value_info (at every nesting level, in
functions too), initializers and Constant values, and the attributes that name a float type
(Cast's ``to``, ConstantOfShape's value, the ``dtype`` of EyeLike, Random*, ..., written out
where a float32 default stood for it). Integers,
booleans and strings stay as they are.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from scanopt.external_data import as_array, source
from scanopt.protos import function_graphs, walk_proto_graphs

NARROW_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
WIDE = TensorProto.DOUBLE
# Attributes that hold a data type (an int) naming the type of an output.
_TYPE_ATTRIBUTES = {"to", "dtype", "output_dtype"}


def widened(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` computing in float64 wherever it computed in a narrower float."""
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    graphs = list(walk_proto_graphs(wide.graph))
    for function in wide.functions:
        for info in function.value_info:
            _widen_type(info.type)
        _widen_attributes(function.node)
        graphs.extend(function_graphs(function))
    for graph in graphs:
        for info in (*graph.input, *graph.output, *graph.value_info):
            _widen_type(info.type)
        for tensor in graph.initializer:
            _widen_tensor(tensor)
        for sparse in graph.sparse_initializer:
            _widen_tensor(sparse.values)
        _widen_attributes(graph.node)
    return wide


def widened_feeds(feeds) -> dict[str, np.ndarray]:
    """``feeds`` with every narrow float array as float64 (exactly: widening loses nothing)."""
    return {name: np.asarray(value, np.float64) if _narrow(np.asarray(value).dtype) else value
            for name, value in feeds.items()}


def _narrow(dtype: np.dtype) -> bool:
    return (dtype.kind == "f" and dtype.itemsize < 8) or dtype.name == "bfloat16"


# Ops whose output is float32 where an attribute is left out: the attribute is written out wide.
_FLOAT_DEFAULTS = {
    "ConstantOfShape": lambda: onnx.helper.make_attribute("value", numpy_helper.from_array(np.zeros(1, np.float64))),
    "RandomNormal": lambda: onnx.helper.make_attribute("dtype", WIDE),
    "RandomUniform": lambda: onnx.helper.make_attribute("dtype", WIDE),
}


def _widen_attributes(nodes) -> None:
    for node in nodes:
        if node.domain in ("", "ai.onnx") and node.op_type == "Constant":
            _widen_constant_floats(node)
        elif node.domain in ("", "ai.onnx") and node.op_type in _FLOAT_DEFAULTS:  # PyTorch's new_zeros
            named = _FLOAT_DEFAULTS[node.op_type]()
            if not any(a.name == named.name for a in node.attribute):
                node.attribute.append(named)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                _widen_tensor(attribute.t)
            elif attribute.type == onnx.AttributeProto.INT and attribute.name in _TYPE_ATTRIBUTES:
                if attribute.i in NARROW_FLOATS:
                    attribute.i = WIDE


def _widen_constant_floats(node: onnx.NodeProto) -> None:
    """A Constant's ``value_float``/``value_floats`` (always float32: onnxscript writes its
    literals so) become a float64 ``value`` tensor."""
    for index, attribute in enumerate(node.attribute):
        if attribute.name == "value_float":
            value = np.array(attribute.f, np.float64)
        elif attribute.name == "value_floats":
            value = np.array(list(attribute.floats), np.float64)
        else:
            continue
        del node.attribute[index]
        node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(value)))
        return


def _widen_type(type_proto: onnx.TypeProto) -> None:
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        inner = getattr(type_proto, kind)
        if inner.elem_type in NARROW_FLOATS:
            inner.elem_type = WIDE
    elif kind == "sequence_type":
        _widen_type(type_proto.sequence_type.elem_type)
    elif kind == "optional_type":
        _widen_type(type_proto.optional_type.elem_type)
    # a map stays: ZipMap writes map(int64 | string, float) whatever its input (its twin's output
    # declared double failed inference), and a map fed to the model comes as it is


def _widen_tensor(tensor: TensorProto) -> None:
    if tensor.data_type not in NARROW_FLOATS:
        return
    value = (as_array(tensor) if source(tensor) else numpy_helper.to_array(tensor)).astype(np.float64)
    tensor.ClearField("float_data")
    tensor.ClearField("int32_data")
    tensor.ClearField("raw_data")
    tensor.ClearField("data_location")
    del tensor.external_data[:]
    tensor.data_type = WIDE
    tensor.raw_data = np.ascontiguousarray(value, "<f8").tobytes()
