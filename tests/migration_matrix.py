"""The opset-migration matrix: op families whose signature changed between opsets 8 and 26,
each placed at every nesting level (main graph, Scan/Loop/If bodies, two deep, Scan-8 in a
Loop body), written at its source opset. tests/test_upgrade_matrix.py migrates each model
to each target and compares outputs with the original in onnxruntime.

An op family is a function returning (nodes, initializers) that read the float input ``x``
[2, 3, 4] and write ``y``; the initializers sit in the main graph, so a body captures them
from the outer scope (the converter sees them only through scanopt's lifting)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

F = TP.FLOAT
X_SHAPE = [2, 3, 4]
_RNG = np.random.default_rng(3)


def _init(name, array, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(array, dtype=dtype), name)


def _w(name, shape):
    return _init(name, _RNG.standard_normal(shape))


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[], tuple[list, list]]
    source: int = 8
    min_target: int = 9  # a family whose forms exist only from some target on

    def __str__(self):
        return self.name


N = h.make_node
FAMILIES: list[Family] = []


def family(source: int = 8, min_target: int = 9):
    def register(fn):
        FAMILIES.append(Family(fn.__name__, fn, source, min_target))
        return fn
    return register


# -- opset-8 families ---------------------------------------------------------------------


@family()
def squeeze_unsqueeze():  # axes attribute -> input at 13
    return [N("Unsqueeze", ["x"], ["u"], axes=[0, 3]), N("Squeeze", ["u"], ["s"], axes=[3]),
            N("Squeeze", ["s"], ["y"])], []


@family()
def reduce_sum():  # axes attribute -> input at 13
    return [N("ReduceSum", ["x"], ["a"], axes=[1], keepdims=0), N("ReduceSum", ["x"], ["b"], axes=[-1]),
            N("ReduceSum", ["b"], ["c"], keepdims=0), N("Mul", ["a", "c"], ["y"])], []


@family()
def reduce_others():  # axes attribute -> input at 18
    nodes = [N("Abs", ["x"], ["ax"]), N("Add", ["ax", "one"], ["p"])]
    outs = []
    for i, op in enumerate(["ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                            "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]):
        axes = [[1], [0, 2], [-1]][i % 3]
        nodes.append(N(op, ["p"], [f"r{i}"], axes=axes, keepdims=1))
        nodes.append(N("ReduceMean", [f"r{i}"], [f"m{i}"], keepdims=1))  # no axes: over all
        outs.append(f"m{i}")
    nodes.append(N("Concat", outs, ["y"], axis=0))
    return nodes, [_init("one", 1.0)]


@family()
def split():  # split attribute -> input at 13, num_outputs at 18
    return [N("Split", ["x"], ["a", "b"], axis=1, split=[1, 2]), N("Split", ["x"], ["c", "d"], axis=2),
            N("ReduceSum", ["a"], ["sa"], axes=[1]), N("Mul", ["b", "sa"], ["e"]),
            N("Concat", ["d", "c"], ["f"], axis=2), N("Split", ["f"], ["g", "k"], axis=-1, split=[3, 1]),
            N("Concat", ["k", "g"], ["f2"], axis=2), N("Concat", ["e", "f2"], ["y"], axis=1)], []


@family()
def slice_():  # starts/ends/axes attributes -> inputs at 10
    return [N("Slice", ["x"], ["a"], starts=[1, -3], ends=[2**62, -1], axes=[1, 2]),
            N("Slice", ["x"], ["b"], starts=[0, 0, 1], ends=[1, 1, 3]),
            N("Add", ["a", "b"], ["y"])], []


@family()
def pad():  # pads/value attributes -> inputs at 11
    return [N("Pad", ["x"], ["a"], pads=[0, 1, 0, 0, 0, 2], value=1.5),
            N("Pad", ["a"], ["b"], mode="reflect", pads=[0, 0, 1, 0, 0, 1]),
            N("Pad", ["b"], ["y"], mode="edge", pads=[1, 0, 0, 0, 0, 0])], []


@family()
def clip():  # min/max attributes -> inputs at 11
    return [N("Clip", ["x"], ["a"], min=-0.5, max=0.7), N("Clip", ["x"], ["b"], max=0.2),
            N("Clip", ["x"], ["c"], min=-0.1), N("Clip", ["x"], ["d"]),
            N("Sum", ["a", "b", "c", "d"], ["y"])], []


@family()
def topk():  # k attribute -> input at 10, largest/sorted at 11
    return [N("TopK", ["x"], ["v", "i"], k=2), N("TopK", ["x"], ["v1", "i1"], k=1, axis=1),
            N("Cast", ["i"], ["fi"], to=F), N("Cast", ["i1"], ["fi1"], to=F),
            N("ReduceSum", ["v1"], ["s1"], axes=[2]), N("ReduceSum", ["fi1"], ["s2"], axes=[2]),
            N("Add", ["v", "fi"], ["a"]), N("Add", ["a", "s1"], ["b"]), N("Add", ["b", "s2"], ["y"])], []


@family()
def upsample():  # scales attribute -> input at 9, Upsample -> Resize at 10
    return [N("Upsample", ["x"], ["a"], scales=[1.0, 2.0, 2.0], mode="nearest"),
            N("Upsample", ["x"], ["b"], scales=[1.0, 1.0, 2.0], mode="linear"),
            N("ReduceSum", ["a"], ["c"], axes=[1]), N("Concat", ["c", "b"], ["y"], axis=1)], []


@family()
def dropout():  # ratio attribute -> input at 12 (the mask of an inference Dropout-7 is left out:
    # the spec leaves it undefined, onnxruntime writes zeros before opset 10 and ones after)
    return [N("Dropout", ["x"], ["a"], ratio=0.3), N("Dropout", ["a"], ["y"], ratio=0.5)], []


@family()
def batch_norm():  # spatial gone at 9, training_mode at 14, types split at 15
    c = X_SHAPE[1]
    return [N("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"], epsilon=1e-3)], [
        _w("scale", [c]), _w("bias", [c]), _w("mean", [c]), _init("var", [0.5, 1.0, 2.0])]


@family()
def gather():  # negative indices allowed from 11; GatherElements/GatherND appear later
    return [N("Gather", ["x", "idx"], ["a"], axis=1),
            N("Gather", ["x", "idx0"], ["b"]), N("ReduceSum", ["b"], ["c"], axes=[0], keepdims=0),
            N("Gather", ["c", "idx"], ["d"], axis=0), N("Add", ["a", "d"], ["y"])], [
        _init("idx", [2, 0], np.int64), _init("idx0", [1], np.int64)]


@family()
def cast_likes():  # Cast gains types (9, 13, 19, 21, 23...), saturate at 19
    return [N("Cast", ["x"], ["d"], to=TP.DOUBLE), N("Cast", ["x"], ["i"], to=TP.INT32),
            N("Cast", ["i"], ["i64"], to=TP.INT64), N("Cast", ["i64"], ["fi"], to=F),
            N("Cast", ["d"], ["f16"], to=TP.FLOAT16), N("Cast", ["f16"], ["fd"], to=F),
            N("Cast", ["x"], ["bl"], to=TP.BOOL), N("Cast", ["bl"], ["fb"], to=F),
            N("Sum", ["fi", "fd", "fb"], ["y"])], []


@family()
def softmax_axes():  # coerce-to-2D before 13, one axis from 13
    return [N("Softmax", ["x"], ["a"], axis=1), N("LogSoftmax", ["x"], ["b"], axis=0),
            N("Hardmax", ["x"], ["c"], axis=1), N("Softmax", ["x"], ["d"]), N("Hardmax", ["x"], ["e"]),
            N("LogSoftmax", ["x"], ["f"], axis=2), N("Sum", ["a", "b", "c", "d", "e", "f"], ["y"])], []


@family()
def matmul_gemm():  # Gemm broadcast attr gone at 7, C optional at 11, Flatten at 9/11/13
    return [N("Flatten", ["x"], ["f"], axis=2), N("Gemm", ["f", "w", "c"], ["g"], transB=1, alpha=0.5, beta=2.0),
            N("Flatten", ["x"], ["f1"]), N("MatMul", ["f1", "w2"], ["m"]), N("Concat", ["g", "m"], ["y"], axis=0)], [
        _w("w", [5, 4]), _w("c", [5]), _w("w2", [12, 5])]


@family()
def shape_ops():  # Reshape/Expand/Tile/Transpose/Concat/Shape/Size/Constant gain forms from 13 on
    return [N("Reshape", ["x", "rshape"], ["r"]), N("Transpose", ["r"], ["t"], perm=[1, 0]),
            N("Shape", ["t"], ["sh"]), N("Size", ["x"], ["sz"]), N("Cast", ["sh"], ["fsh"], to=F),
            N("Cast", ["sz"], ["fsz"], to=F), N("Tile", ["t", "reps"], ["ti"]),
            N("Expand", ["k", "eshape"], ["e"]), N("Constant", [], ["k0"], value=_init("kv", np.arange(6).reshape(6, 1) * 0.5)),
            N("Mul", ["ti", "k0"], ["a"]), N("Add", ["a", "fsz"], ["b0"]), N("Add", ["b0", "e"], ["b"]), N("ReduceSum", ["fsh"], ["s"]),
            N("Add", ["b", "s"], ["c"]), N("Concat", ["c", "c"], ["y"], axis=0)], [
        _init("reps", [1, 2], np.int64), _init("k", [1.0]), _init("rshape", [-1, 6], np.int64),
        _init("eshape", [6, 1], np.int64)]


@family()
def elementwise():  # broadcasting binaries, variadics, comparisons, unary activations
    nodes = [N("Add", ["x", "b"], ["a0"]), N("Sub", ["a0", "x"], ["a1"]), N("Mul", ["a1", "x"], ["a2"]),
             N("Div", ["a2", "two"], ["a3"]), N("Max", ["a3", "x", "b"], ["a4"]), N("Min", ["a4", "two"], ["a5"]),
             N("Mean", ["a5", "x"], ["a6"]), N("Abs", ["x"], ["ab"]), N("Pow", ["ab", "two"], ["pw"]),
             N("Greater", ["x", "b"], ["gt"]), N("Less", ["x", "b"], ["lt"]), N("Equal", ["gt", "lt"], ["eq"]),
             N("Not", ["eq"], ["ne"]), N("And", ["ne", "gt"], ["an"]), N("Or", ["an", "lt"], ["orr"]),
             N("Xor", ["orr", "gt"], ["xo"]), N("Cast", ["xo"], ["fx"], to=F)]
    chain, prev = [], "x"
    for i, (op, attrs) in enumerate([("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Elu", {"alpha": 0.7}),
                                     ("Selu", {}), ("Sigmoid", {}), ("HardSigmoid", {}), ("Softplus", {}),
                                     ("Softsign", {}), ("Tanh", {}), ("Neg", {}), ("Exp", {}), ("Log", {}),
                                     ("Sqrt", {}), ("Reciprocal", {}), ("Floor", {}), ("Ceil", {})]):
        chain.append(N(op, [prev], [f"u{i}"], **attrs))
        prev = f"u{i}"
    nodes += chain + [N("PRelu", ["x", "slope"], ["pr"]), N("Sum", ["a6", "pw", "fx", prev, "pr"], ["y"])]
    return nodes, [_w("b", [4]), _init("two", [2.0]), _init("slope", [0.1, 0.2, 0.3, 0.4])]


@family()
def arg_and_norm():  # ArgMax/ArgMin gain select_last_index at 12, normalizations
    return [N("ArgMax", ["x"], ["am"], axis=1), N("ArgMin", ["x"], ["an"], axis=-1, keepdims=0),
            N("Cast", ["am"], ["fam"], to=F), N("Cast", ["an"], ["fan"], to=F),
            N("Unsqueeze", ["fan"], ["uan"], axes=[2]), N("InstanceNormalization", ["x", "sc", "bi"], ["inn"]),
            N("LpNormalization", ["x"], ["lp"], axis=1), N("Unsqueeze", ["x"], ["x4"], axes=[3]), N("LRN", ["x4"], ["lrn4"], size=3),
            N("Squeeze", ["lrn4"], ["lrn"], axes=[3]),
            N("Sum", ["fam", "uan", "inn", "lp", "lrn"], ["y"])], [_w("sc", [3]), _w("bi", [3])]


@family()
def pool_conv():  # MaxPool gains dilations/ceil_mode at 10, AveragePool at 10/19, Conv at 11
    return [N("MaxPool", ["x"], ["m"], kernel_shape=[2], pads=[1, 0]),
            N("AveragePool", ["x"], ["a"], kernel_shape=[2], pads=[0, 1], count_include_pad=1),
            N("Conv", ["x", "cw", "cb"], ["c"], kernel_shape=[2], pads=[1, 0]),
            N("GlobalAveragePool", ["x"], ["g"]), N("Sum", ["m", "a", "g"], ["s"]),
            N("Concat", ["s", "c"], ["y"], axis=1)], [_w("cw", [2, 3, 2]), _w("cb", [2])]


@family()
def recurrent():  # RNN/GRU/LSTM gain layout at 14
    hs = 2
    return [N("GRU", ["x", "gw", "gr", "gb"], ["gy", "gh"], hidden_size=hs, linear_before_reset=1),
            N("LSTM", ["x", "lw", "lr"], ["ly"], hidden_size=hs),
            N("RNN", ["x", "rw", "rr"], ["", "rh"], hidden_size=hs),
            N("Add", ["gy", "ly"], ["a"]), N("Add", ["a", "rh"], ["y"])], [
        _w("gw", [1, 3 * hs, 4]), _w("gr", [1, 3 * hs, hs]), _w("gb", [1, 6 * hs]),
        _w("lw", [1, 4 * hs, 4]), _w("lr", [1, 4 * hs, hs]), _w("rw", [1, hs, 4]), _w("rr", [1, hs, hs])]


@family()
def trig_and_pools():  # type widening at 22 (Sin..Atanh, pools, ConvTranspose), DepthToSpace 11/13
    nodes = [N("Tanh", ["x"], ["t"])]
    outs = []
    for i, op in enumerate(["Sin", "Cos", "Tan", "Asin", "Acos", "Atan"]):
        nodes.append(N(op, ["t"], [f"g{i}"]))
        outs.append(f"g{i}")
    nodes += [N("Sum", outs, ["tr"]), N("GlobalMaxPool", ["x"], ["gm"]), N("ReduceL2", ["x"], ["gl"], axes=[2]),
              N("LpPool", ["x"], ["lp"], kernel_shape=[2], strides=[2]), N("Sum", ["gm", "gl", "lp"], ["pl"]),
              N("ConvTranspose", ["x", "tw"], ["ct"], kernel_shape=[2], strides=[2]),
              N("Unsqueeze", ["x"], ["x4"], axes=[3]), N("Concat", ["x4", "x4", "x4", "x4"], ["x44"], axis=3),
              N("SpaceToDepth", ["x44"], ["sd"], blocksize=2), N("DepthToSpace", ["sd"], ["ds"], blocksize=2),
              N("ReduceMean", ["ds"], ["dm"], axes=[3], keepdims=0), N("Add", ["tr", "dm"], ["a"]),
              N("Concat", ["a", "pl", "ct"], ["y"], axis=2)]
    return nodes, [_w("tw", [3, 3, 2])]


@family(source=9, min_target=9)
def ops_9_10():  # Sinh.., MeanVarianceNormalization 13, NonZero 13, IsNaN/IsInf 20, Compress 11, OneHot 11,
    # EyeLike 22, ThresholdedRelu 10, Mod 10->13, ReverseSequence 10
    return [N("Sinh", ["x"], ["a"]), N("Cosh", ["x"], ["b"]), N("Asinh", ["x"], ["c"]), N("Abs", ["x"], ["ab"]),
            N("Add", ["ab", "one"], ["ab1"]), N("Acosh", ["ab1"], ["d"]), N("Tanh", ["x"], ["th"]),
            N("Atanh", ["th"], ["e"]), N("MeanVarianceNormalization", ["x"], ["mv"]),
            N("IsNaN", ["x"], ["nan"]), N("Not", ["nan"], ["ok"]), N("Compress", ["x", "keep"], ["cp"], axis=2),
            N("OneHot", ["oh_idx", "depth", "oh_val"], ["oh"], axis=-1), N("EyeLike", ["eye_in"], ["eye"]),
            N("Greater", ["x", "zero"], ["pos"]), N("NonZero", ["pos"], ["nz"]), N("Shape", ["nz"], ["nzs"]),
            N("Cast", ["ok"], ["fok"], to=F), N("Sum", ["a", "b", "c", "d", "e", "mv", "fok"], ["s"]),
            N("Concat", ["s", "cp"], ["s2"], axis=2), N("Add", ["oh", "eye"], ["o2"]), N("Mul", ["s2", "o2"], ["y"])], [
        _init("one", [1.0]), _init("zero", [0.0]), _init("keep", [True, False, True, True], np.bool_),
        _init("oh_idx", [0, 2, 1], np.int64), _init("depth", [7], np.int64), _init("oh_val", [0.0, 1.0]),
        _init("eye_in", np.zeros([3, 7]))]


@family(source=11, min_target=11)
def ops_11_12():  # Round 22, Det 22, Range 11, ThresholdedRelu 22, Celu 12, GreaterOrEqual 12->16,
    # Einsum 12, ScatterND 11->13->16->18, Unique 11, ArgMax select_last_index 12, Mod
    return [N("Round", ["x"], ["r"]), N("ThresholdedRelu", ["x"], ["tr"], alpha=0.3),
            N("Celu", ["x"], ["ce"]) if False else N("Elu", ["x"], ["ce"]),
            N("Einsum", ["x", "x"], ["ei"], equation="bij,bkj->bik") if False else N("Identity", ["x"], ["ei0"]),
            N("ScatterND", ["x", "snd_i", "snd_u"], ["snd"]), N("Mod", ["x", "two"], ["md"], fmod=1),
            N("Sum", ["r", "tr", "ce", "snd", "md"], ["y"])], [
        _init("snd_i", [[0, 1], [1, 2]], np.int64), _w("snd_u", [2, 4]), _init("two", [2.0])]


@family(source=12, min_target=12)
def ops_12():  # Celu, GreaterOrEqual/LessOrEqual 16, Einsum, ArgMax select_last_index, Det
    return [N("Celu", ["x"], ["ce"], alpha=0.5), N("GreaterOrEqual", ["x", "ce"], ["ge"]),
            N("LessOrEqual", ["x", "ce"], ["le"]), N("And", ["ge", "le"], ["eq"]), N("Cast", ["eq"], ["feq"], to=F),
            N("Einsum", ["x", "x"], ["ei"], equation="bij,bkj->bik"), N("Det", ["ei"], ["det"]),
            N("ArgMax", ["x"], ["am"], axis=2, select_last_index=1), N("Cast", ["am"], ["fam"], to=F),
            N("Unsqueeze", ["det"], ["d2"], axes=[1, 2]), N("Sum", ["ce", "feq", "fam", "d2"], ["y"])], []


@family(source=17, min_target=17)
def ops_17():  # HardSwish 22, Trilu, CastLike 19/21, LayerNormalization, Mish 22, CenterCropPad,
    # GroupNormalization 18 -> 21 (scale/bias per group -> per channel), GridSample 16 -> 20
    return [N("HardSwish", ["x"], ["hs"]), N("Trilu", ["x"], ["tl"]), N("CastLike", ["hs", "x"], ["cl"]),
            N("LayerNormalization", ["x", "ln_s", "ln_b"], ["ln"]), N("Mish", ["x"], ["mi"]) if False else
            N("Softplus", ["x"], ["mi"]), N("Sum", ["hs", "tl", "cl", "ln", "mi"], ["y"])], [
        _w("ln_s", [4]), _w("ln_b", [4])]


@family(source=18, min_target=18)
def ops_18():  # Mish 22, GroupNormalization 18 -> 21, CenterCropPad, Col2Im, BitwiseNot, Pad axes input
    return [N("Mish", ["x"], ["mi"]), N("GroupNormalization", ["x", "gn_s", "gn_b"], ["gn"], num_groups=3),
            N("CenterCropPad", ["x", "ccp"], ["cc"], axes=[2]), N("Pad", ["x", "pads", "", "pax"], ["pd"]),
            N("Slice", ["pd", "s0", "s1", "s2"], ["ps"]), N("ReduceSum", ["x", "rax"], ["rs"], keepdims=1),
            N("Sum", ["mi", "gn", "cc", "ps", "rs"], ["y"])], [
        _w("gn_s", [3]), _w("gn_b", [3]), _init("ccp", [4], np.int64), _init("pads", [1, 2], np.int64),
        _init("pax", [2], np.int64), _init("s0", [1], np.int64), _init("s1", [5], np.int64),
        _init("s2", [2], np.int64), _init("rax", [1], np.int64)]


# -- families whose old forms start after opset 8 (the model is written at ``source``) ------


@family(source=9, min_target=9)
def scatter_and_9():  # Scatter-9 deprecated at 11 (-> ScatterElements); Upsample-9 scales input; Where
    return [N("Scatter", ["x", "sidx", "upd"], ["s"], axis=1), N("Upsample", ["s", "scales"], ["u"]),
            N("Greater", ["x", "s"], ["c"]), N("Where", ["c", "x", "s"], ["w"]),
            N("ReduceMax", ["u"], ["r"], axes=[2], keepdims=1), N("Sign", ["x"], ["sg"]), N("Erf", ["x"], ["er"]),
            N("Shrink", ["x"], ["sh"], lambd=0.3), N("Sum", ["r", "w", "sg", "er", "sh"], ["y"])], [
        _init("sidx", np.tile([[1, 0, 2, 1]], (2, 1, 1)), np.int64), _w("upd", [2, 1, 4]),
        _init("scales", [1.0, 1.0, 2.0])]


@family(source=10, min_target=10)
def resize_10():  # Resize-10 (asymmetric nearest) -> 11 coordinate modes, 13, 18, 19
    return [N("Resize", ["x", "scales"], ["r"], mode="nearest"), N("Resize", ["x", "scales"], ["l"], mode="linear"),
            N("Slice", ["r", "st", "en", "ax"], ["s"]), N("TopK", ["s", "k"], ["v", "_"]),
            N("Dropout", ["l"], ["d"]), N("Add", ["v", "d"], ["y"])], [
        _init("scales", [1.0, 1.0, 2.0]), _init("st", [0], np.int64), _init("en", [8], np.int64),
        _init("ax", [2], np.int64), _init("k", [8], np.int64)]


@family(source=11, min_target=11)
def ops_11():  # Pad/Clip/Split-11, ScatterElements, GatherElements/ND, Range, CumSum, Unique-free
    return [N("Pad", ["x", "pads", "pv"], ["p"]), N("Clip", ["p", "lo", "hi"], ["c"]),
            N("Split", ["c"], ["a", "b"], axis=-1, split=[2, 4]), N("CumSum", ["b", "cax"], ["cs"]),
            N("Slice", ["cs", "s0", "s1", "s2"], ["cs2"]),
            N("ScatterElements", ["cs2", "ei", "eu"], ["se"], axis=-1),
            N("GatherElements", ["se", "ei"], ["ge"], axis=-1), N("GatherND", ["x", "nd"], ["gn"]),
            N("ReduceSum", ["gn"], ["rs"], axes=[-1], keepdims=1), N("Softmax", ["a"], ["sm"], axis=1),
            N("Sum", ["sm", "ge", "rs"], ["y"])], [
        _init("pads", [0, 0, 1, 0, 0, 1], np.int64), _init("pv", 0.5), _init("lo", -0.6), _init("hi", 0.8),
        _init("cax", 2, np.int64), _init("s0", [0], np.int64), _init("s1", [2], np.int64),
        _init("s2", [2], np.int64), _init("ei", np.zeros([2, 3, 2]) + [[[1, 0]]], np.int64),
        _w("eu", [2, 3, 2]), _init("nd", [[[0, 1]], [[1, 2]]], np.int64)]


@family(source=13, min_target=13)
def ops_13():  # Reduce*/Split/Pad-13 -> 18 (axes, num_outputs), Resize-13 -> 18/19
    return [N("ReduceMean", ["x"], ["m"], axes=[1, 2]), N("ReduceSum", ["x", "rax"], ["s"]),
            N("Split", ["x", "sp"], ["a", "b"], axis=2), N("Pad", ["a", "pads"], ["pa"], mode="reflect"),
            N("Resize", ["b", "", "scales"], ["rb"], mode="linear", coordinate_transformation_mode="half_pixel"),
            N("ReduceMax", ["pa"], ["mx"], axes=[2], keepdims=0), N("Unsqueeze", ["mx", "uax"], ["umx"]),
            N("Add", ["rb", "umx"], ["t"]), N("Add", ["t", "m"], ["t2"]), N("Add", ["t2", "s"], ["y"])], [
        _init("rax", [2], np.int64), _init("sp", [3, 1], np.int64), _init("pads", [0, 0, 1, 0, 0, 1], np.int64),
        _init("scales", [1.0, 1.0, 2.0]), _init("uax", [2], np.int64)]


# -- nesting levels -----------------------------------------------------------------------

LEVELS = ["main", "scan", "scan_lens_reverse", "loop", "if", "scan_in_loop", "loop_in_if", "if_in_scan", "scan_in_scan"]


def _renamed(nodes, prefix, keep):
    """``nodes`` with every value they define (and its readers) prefixed, so one family can
    appear twice in a model without breaking SSA."""
    defined = {o for n in nodes for o in n.output if o}
    out = []
    for n in nodes:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        m.input[:] = [prefix + i if i in defined else keep.get(i, i) for i in n.input]
        m.output[:] = [prefix + o if o else o for o in n.output]
        out.append(m)
    return out


def _vi(name, elem, shape):
    return h.make_tensor_value_info(name, elem, shape)


def _y_type(fam: Family) -> tuple[int, list]:
    """Element type and shape of the family's ``y``, from onnxruntime at the source opset."""
    import onnxruntime as ort

    nodes, inits = fam.build()
    g = h.make_graph(nodes, "g", [_vi("x", F, X_SHAPE)], [onnx.ValueInfoProto(name="y")], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", fam.source)], ir_version=7)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    y = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, {"x": np.zeros(X_SHAPE, np.float32)})[0]
    return h.np_dtype_to_tensor_dtype(y.dtype), list(y.shape)


def _scan(source, body_nodes, x_in, x_shape, y_out, y_elem, y_shape, x_outer, y_outer, batch, name):
    """A Scan over ``x_outer`` whose body runs ``body_nodes`` (``x_in`` -> ``y_out``) per
    step; Scan-8 with a batch axis at opset 8, Scan-9+ otherwise. Returns (node, outer y shape)."""
    body = h.make_graph(body_nodes, f"{name}_body", [_vi(x_in, F, x_shape)], [_vi(y_out, y_elem, y_shape)])
    if source == 8:
        node = N("Scan", ["", x_outer], [y_outer], name=name, body=body, num_scan_inputs=1)
        return node, [batch, 2, *y_shape]
    node = N("Scan", [x_outer], [y_outer], name=name, body=body, num_scan_inputs=1)
    return node, [2, *y_shape]


def _scan_input_shape(source, inner, batch):
    return [batch, 2, *inner] if source == 8 else [2, *inner]


def _loop(body_nodes, y_in, y_elem, y_shape, y_outer, name):
    """A Loop of 2 iterations whose body reads outer values and stacks its ``y_in``."""
    p = f"{name}__"
    body = h.make_graph(
        body_nodes + [N("Identity", [p + "cond_in"], [p + "cond_out"]), N("Identity", [p + "s_in"], [p + "s_out"])],
        f"{name}_body", [_vi(p + "iter", TP.INT64, []), _vi(p + "cond_in", TP.BOOL, []), _vi(p + "s_in", F, [])],
        [_vi(p + "cond_out", TP.BOOL, []), _vi(p + "s_out", F, []), _vi(y_in, y_elem, y_shape)])
    node = N("Loop", ["trips__", "", "zero__"], [p + "s_final", y_outer], name=name, body=body)
    return node, [2, *y_shape]


def _if(then_nodes, then_out, else_nodes, else_out, elem, shape, out, name):
    then_g = h.make_graph(then_nodes, f"{name}_then", [], [_vi(then_out, elem, shape)])
    else_g = h.make_graph(else_nodes, f"{name}_else", [], [_vi(else_out, elem, shape)])
    return N("If", ["cond__"], [out], name=name, then_branch=then_g, else_branch=else_g)


@functools.lru_cache(maxsize=None)
def build(fam: Family, level: str) -> onnx.ModelProto:
    """``fam`` placed at ``level``, as an opset-``fam.source`` model with inputs ``x`` (or
    ``X``) and, for If levels, ``c``."""
    nodes, inits = fam.build()
    elem, shape = _y_type(fam)
    source = fam.source
    inputs = [_vi("x", F, X_SHAPE)]
    extra = []
    if level == "main":
        graph_nodes, out_shape = nodes, shape
    elif level == "scan":
        node, out_shape = _scan(source, nodes, "x", X_SHAPE, "y", elem, shape, "X__", "Y__", 2, "scan")
        inputs, graph_nodes = [_vi("X__", F, _scan_input_shape(source, X_SHAPE, 2))], [node]
    elif level == "scan_lens_reverse":  # Scan-8: batch 2, sequence_lens, reverse; Scan-9+: reverse
        node, out_shape = _scan(source, nodes, "x", X_SHAPE, "y", elem, shape, "X__", "Y__", 2, "scan")
        inputs = [_vi("X__", F, _scan_input_shape(source, X_SHAPE, 2))]
        if source == 8:
            node.input[0] = "lens__"
            node.attribute.append(h.make_attribute("directions", [1]))
            inputs.insert(0, _vi("lens__", TP.INT64, [2]))
        else:
            node.attribute.append(h.make_attribute("scan_input_directions", [1]))
        graph_nodes = [node]
    elif level == "loop":
        node, out_shape = _loop(nodes, "y", elem, shape, "Y__", "loop")
        graph_nodes, extra = [node], [_init("trips__", 2, np.int64), _init("zero__", 0.0)]
    elif level == "if":
        neg = [N("Neg", ["x"], ["e_x"])] + _renamed(nodes, "e_", {"x": "e_x"})
        graph_nodes, out_shape = [_if(nodes, "y", neg, "e_y", elem, shape, "Y__", "if")], shape
        inputs.append(_vi("cond__", TP.BOOL, []))
    elif level == "scan_in_loop":  # the Scan reads the outer X from inside the Loop body
        scan, scan_shape = _scan(source, nodes, "x", X_SHAPE, "y", elem, shape, "X__", "ys__", 1, "inner_scan")
        node, out_shape = _loop([scan], "ys__", elem, scan_shape, "Y__", "loop")
        inputs = [_vi("X__", F, _scan_input_shape(source, X_SHAPE, 1))]
        graph_nodes, extra = [node], [_init("trips__", 2, np.int64), _init("zero__", 0.0)]
    elif level == "loop_in_if":
        then_loop, loop_shape = _loop(nodes, "y", elem, shape, "yl__", "then_loop")
        else_nodes = [N("Neg", ["x"], ["e_x"])] + _renamed(nodes, "e_", {"x": "e_x"})
        else_loop, _ = _loop(else_nodes, "e_y", elem, shape, "e_yl__", "else_loop")
        node = _if([then_loop], "yl__", [else_loop], "e_yl__", elem, loop_shape, "Y__", "if")
        graph_nodes, out_shape = [node], loop_shape
        inputs.append(_vi("cond__", TP.BOOL, []))
        extra = [_init("trips__", 2, np.int64), _init("zero__", 0.0)]
    elif level == "if_in_scan":  # an If inside the Scan body, its condition read from the main graph
        neg = [N("Neg", ["x"], ["e_x"])] + _renamed(nodes, "e_", {"x": "e_x"})
        branch = _if(nodes, "y", neg, "e_y", elem, shape, "yi__", "if")
        node, out_shape = _scan(source, [branch], "x", X_SHAPE, "yi__", elem, shape, "X__", "Y__", 2, "scan")
        inputs = [_vi("X__", F, _scan_input_shape(source, X_SHAPE, 2)), _vi("cond__", TP.BOOL, [])]
        graph_nodes = [node]
    elif level == "scan_in_scan":
        outer_x = _scan_input_shape(source, X_SHAPE, 1)  # what the outer body sees per step
        inner, inner_shape = _scan(source, nodes, "x", X_SHAPE, "y", elem, shape, "xo__", "yo__", 1, "inner_scan")
        outer, out_shape = _scan(source, [inner], "xo__", outer_x, "yo__", elem, inner_shape, "X__", "Y__", 1, "outer_scan")
        inputs, graph_nodes = [_vi("X__", F, _scan_input_shape(source, outer_x, 1))], [outer]
    else:
        raise ValueError(level)
    out = "y" if level == "main" else "Y__"
    inits = inits + extra
    if source == 8:  # IR 3, as onnx's backend test models: every initializer is a graph input too
        inputs += [_vi(t.name, t.data_type, list(t.dims)) for t in inits]
    graph = h.make_graph(graph_nodes, f"{fam.name}_{level}", inputs, [_vi(out, elem, out_shape)], initializer=inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", source)], ir_version=3 if source == 8 else 7)


def feeds(model: onnx.ModelProto, seed: int = 0) -> list[dict]:
    """Input sets for ``model``: normal floats (both branches for a model with an If)."""
    rng = np.random.default_rng(seed)
    base, weights = {}, {t.name for t in model.graph.initializer}
    for v in model.graph.input:
        if v.type.tensor_type.elem_type == F and v.name not in weights:
            shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
            base[v.name] = rng.standard_normal(shape).astype(np.float32)
    if any(v.name == "lens__" for v in model.graph.input):
        base["lens__"] = np.array([1, 2], np.int64)  # item 0 stops after one of its two steps
    if any(v.name == "cond__" for v in model.graph.input):
        return [{**base, "cond__": np.array(True)}, {**base, "cond__": np.array(False)}]
    return [base]
