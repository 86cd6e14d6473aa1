"""Regenerate models/heldout_4/: held-out round 4, Scan/Loop forms no other folder of models/ holds.

    python models/generate_heldout_4.py                 # every sample
    python models/generate_heldout_4.py --only NAME     # one (repeatable)

Written blind (no pass was tuned on them); tests/test_heldout_4.py runs the default command
(``scanopt optimize in.onnx out.onnx``) on each and compares original and output in onnxruntime
on normal inputs and at the edges (empty batch, zero-length sequence, NaN in one step).
Symbolic dims are ``T`` (the scanned length) and ``B`` (a batch) unless noted.

Hand-built with onnx.helper (only onnx and numpy needed):
- loop_cond_const_node:    Loop(M, true) whose body writes its condition with a Constant node (true)
                           instead of passing the condition input through; tanh RNN, scan output h
- loop_cond_nan_exit:      Loop(M, true) whose body condition is ``Not(IsNaN(ReduceSum(h)))``: a
                           data-dependent early exit (must stay a Loop)
- scan_bool_int64_carries: Scan-16 (opset 17) with a bool carry (``Or(any, x > 0)``), an int64 count carry and a
                           bool scan output
- scan_int64_cumsum_o13:   Scan-11 (opset 13), an int64 running sum over an int64 sequence, scan output the sum
- scan_scalar_state_o11_negaxis: Scan-11 reading X [B, T] on axis -1 with a scalar state
                           ``s' = 0.5 s + ReduceSum(x)`` and a scalar scan output
- scan_zero_sized_output:  a tanh RNN that also emits Slice(x, 0, 0) per step: a scan output [T, B, 0]
- scan_sequence_ops_body:  body runs SplitToSequence / SequenceAt / ConcatFromSequence on the step
- scan_body_if:            body ``If(ReduceSum(x) > 0, h + x, h * 0.5)``
- scan_output_outer_direct: a body output that is an outer-scope tensor directly (no node) and a
                           state output that is an outer value too (state after step 1 is constant)
- viterbi_crf_decode:      CRF Viterbi: ``s' = ReduceMax(s[:, :, None] + trans, 1) + x_t`` and the
                           int64 back-pointers ``ArgMax`` per step
- rnn_clip_preact_o13:     tanh RNN with ``Clip(pre, -3, 3)`` (Clip-13 min/max inputs) before Tanh:
                           the ONNX RNN ``clip`` attribute
- rnn_dropout_in_body:     tanh RNN with an inference Dropout (opset 13, no ratio input) after Tanh
- scan21_int8_io:          Scan-21: an int8 sequence Cast to float, accumulated, and cast back to int8
                           per step (int8 scan input and output)
- loop_sequence_carry:     Loop whose carry is a tensor sequence grown by SequenceInsert; the
                           outer graph stacks it with ConcatFromSequence(new_axis=1)
- scan_nested_inner_axis1_reverse: an outer Scan over T whose body runs an inner Scan over axis 1
                           of its step in reverse with its own state
- rnn_o9_ir4:              tanh RNN Scan-9 in an opset-9, IR-4 model (old converters)
- scan8_int64_step_count:  Scan-8 with sequence_lens and an int64 counter carry: the count per item
                           is its length
- map_attention_queries:   a map Scan over query rows: ``softmax(q Kᵀ / √d) V`` with K, V outer
- broken_body_output_count: a Scan whose body has one output fewer than its states + scan outputs
                           (broken: the command must exit non-zero with one line)
- loop_trip_and_cond_inputs: Loop(M, go) with the trip count and the initial condition graph inputs
- loop_min_trip_counter_cond: Loop(Shape(X)[0], true) whose body computes ``i + 1 < K`` (K an input)
- loop_trip_input_reads_x: Loop(M, true) with M a graph input reading Gather(X, i) (``range(n)``)
- keras_gru_hard_sigmoid:  Keras GRU (reset_after=False) with Keras 3's hard_sigmoid, HardSigmoid(1/6, 0.5)
- rnn_h1_i1:               a tanh RNN with H = I = B = 1 (every weight and state [1, 1])
- embedding_rnn_tokens:    a char-RNN over int64 token ids: Gather(E, tokens) in the body, then a cell
- greedy_decode_loop:      greedy decoding: Loop(8, true) feeding ArgMax of the logits back as the next
                           token, stopping when every item emitted EOS (must stay a Loop)
- scan_outputs_partly_used: an RNN Scan with three scan outputs of which the graph reads a mean over
                           time of one and the last step of another; h and the final state unused
- scalar_rnn_elementwise:  a one-unit tanh RNN on rank-0 states and steps (X [T], h [])
- rnn_f16_state_f32_compute: float16 state and sequence, the cell computed in float32 between Casts
- two_identical_scans:     two Scans with identical bodies over X and -X
- scan_f64_accumulate_f32: a float64 running sum of a float32 sequence, emitted as float32
- rnn_leaky_relu_gemm_alpha_beta: LeakyRelu(0.1) activation, input Gemm with alpha=0.5, beta=2
- broken_scan_undefined_capture: a body reading a name defined nowhere (broken)
- broken_loop_body_inputs: a Loop body without its condition input (broken)
onnxscript 0.7 (models/heldout4_onnxscript.py), top-level loops:
- os_for_ema:              ``for i in range(T)`` EMA over op.Gather(xs, i), final state only
- os_while_halving:        a ``while`` loop whose condition the body computes from the data
PyTorch 2.13 dynamo exporter (``torch._higher_order_ops.scan`` / ``while_loop``), torch_*:
- torch_online_softmax:    flash-attention style online softmax over key steps: carries (m, l, acc)
- torch_logcumsumexp:      ``h' = logaddexp(h, x_t)`` emitting h
- torch_cummax:            ``h' = maximum(h, x_t)`` emitting h
- torch_bidi_by_hand:      two tanh RNN scans (forward, ``reverse=True``), outputs concatenated
- torch_two_cells_one_step: two stacked tanh cells in one combine fn (carries h1, h2), emits h2
- torch_argmax_tracker:    carries (best value, best index int64, step int64): a running argmax
- torch_scan_dim1_two_xs_reduce: ``scan(dim=1)`` over two batch-first sequences, ys = h.sum(-1)
- torch_nested_scan:       a scan whose combine fn runs a scan over each step's rows
- torch_while_newton:      ``while_loop`` Newton iteration for sqrt until converged (data-dependent)
- torch_while_power_iter:  ``while_loop`` counter-bound power iteration (i < k with k fixed)
- torch_carries_mixed_dtypes: carries of four dtypes (float32 h, float64 sum, int64 count, bool seen),
                           ys of two (h, a bool per step)
- torch_attention_decoder: a teacher-forced GRUCell decoder attending over encoder states [B, 7, H]
                           (bmm scores, softmax, bmm context) each step
Each torch sample comes with NAME.expected.npz: the inputs and torch's outputs.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate import HERE, run_generator, save_npz, save_torch_sample  # noqa: E402
from generate_heldout import init, vi  # noqa: E402

OUT = os.path.join(HERE, "heldout_4")
F, I64, BOOL, I8 = TP.FLOAT, TP.INT64, TP.BOOL, TP.INT8
I, H = 3, 4


def model(graph, opset=17, ir=8):
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=ir,
                        producer_name="scanopt-heldout-4")


def w(seed, *shape):
    return (np.random.RandomState(seed).randn(*shape) * 0.5).astype(np.float32)


def _rnn_nodes(x, hin, hout, pre=None):
    """tanh(x Wᵀ + h Rᵀ + b) with W, R, b read from the outer graph."""
    pre = pre or hout + "_pre"
    return [h.make_node("Gemm", [x, "W", "b"], [hout + "_xw"], transB=1),
            h.make_node("Gemm", [hin, "R"], [hout + "_hr"], transB=1),
            h.make_node("Add", [hout + "_xw", hout + "_hr"], [pre])]


def _rnn_weights(seed=1):
    return [init("W", w(seed, H, I)), init("R", w(seed + 1, H, H)), init("b", w(seed + 2, H))]


# ---------------------------------------------------------------- Loops with a computed condition
def _loop_rnn(cond_nodes, cond_out, name, extra_inputs=(), extra_init=(), y_dim="T"):
    body = h.make_graph(
        [h.make_node("Gather", ["X", "i"], ["x_t"], axis=0)] + _rnn_nodes("x_t", "h", "h2")
        + [h.make_node("Tanh", ["h2_pre"], ["h2"]), h.make_node("Identity", ["h2"], ["y"])] + list(cond_nodes),
        "body", [vi("i", [], I64), vi("c", [], BOOL), vi("h", ["B", H])],
        [vi(cond_out, [], BOOL), vi("h2", ["B", H]), vi("y", ["B", H])])
    nodes = [h.make_node("Shape", ["X"], ["shp"]),
             h.make_node("Gather", ["shp", "zero"], ["M"], axis=0),
             h.make_node("Loop", ["M", "true", "h0"], ["hT", "Y"], body=body, name=name)]
    g = h.make_graph(nodes, "main", [vi("X", ["T", "B", I]), vi("h0", ["B", H])] + list(extra_inputs),
                     [vi("hT", ["B", H]), vi("Y", [y_dim, "B", H])],
                     initializer=_rnn_weights() + [init("zero", np.array(0, np.int64)),
                                                   init("true", np.array(True))] + list(extra_init))
    return model(g, 17)


def loop_cond_const_node():
    return _loop_rnn([h.make_node("Constant", [], ["c2"], value=h.make_tensor("t", BOOL, [], [True]))],
                     "c2", "loop_const_cond")


def loop_cond_nan_exit():
    return _loop_rnn([h.make_node("ReduceSum", ["h2"], ["hs"], keepdims=0),
                      h.make_node("IsNaN", ["hs"], ["isnan"]),
                      h.make_node("Not", ["isnan"], ["c2"])], "c2", "loop_nan_exit")


# ---------------------------------------------------------------- carries of several dtypes
def scan_bool_int64_carries():
    body = h.make_graph(
        [h.make_node("Greater", ["x", "zf"], ["pos"]),
         h.make_node("Or", ["any", "pos"], ["any2"]),
         h.make_node("Cast", ["pos"], ["posi"], to=I64),
         h.make_node("ReduceSum", ["posi"], ["npos"], keepdims=0),
         h.make_node("Add", ["cnt", "npos"], ["cnt2"]),
         h.make_node("Identity", ["any2"], ["any_out"])],
        "body", [vi("any", ["B", I], BOOL), vi("cnt", [], I64), vi("x", ["B", I])],
        [vi("any2", ["B", I], BOOL), vi("cnt2", [], I64), vi("any_out", ["B", I], BOOL)],
        initializer=[init("zf", np.array(0, np.float32))])
    node = h.make_node("Scan", ["any0", "cnt0", "X"], ["anyT", "cntT", "ANY"], body=body,
                       num_scan_inputs=1, name="bool_int64")
    g = h.make_graph([node], "main", [vi("any0", ["B", I], BOOL), vi("cnt0", [], I64), vi("X", ["T", "B", I])],
                     [vi("anyT", ["B", I], BOOL), vi("cntT", [], I64), vi("ANY", ["T", "B", I], BOOL)])
    return model(g, 17)


def scan_int64_cumsum_o13():
    body = h.make_graph([h.make_node("Add", ["s", "x"], ["s2"]), h.make_node("Identity", ["s2"], ["y"])],
                        "body", [vi("s", ["B"], I64), vi("x", ["B"], I64)],
                        [vi("s2", ["B"], I64), vi("y", ["B"], I64)])
    node = h.make_node("Scan", ["s0", "X"], ["sT", "Y"], body=body, num_scan_inputs=1, name="int_cumsum")
    g = h.make_graph([node], "main", [vi("s0", ["B"], I64), vi("X", ["T", "B"], I64)],
                     [vi("sT", ["B"], I64), vi("Y", ["T", "B"], I64)])
    return model(g, 13)


def scan_scalar_state_o11_negaxis():
    body = h.make_graph(
        [h.make_node("Mul", ["s", "half"], ["sh"]),
         h.make_node("ReduceSum", ["x"], ["xs"], keepdims=0),
         h.make_node("Add", ["sh", "xs"], ["s2"]),
         h.make_node("Identity", ["s2"], ["y"])],
        "body", [vi("s", []), vi("x", ["B"])], [vi("s2", []), vi("y", [])],
        initializer=[init("half", np.array(0.5, np.float32))])
    node = h.make_node("Scan", ["s0", "X"], ["sT", "Y"], body=body, num_scan_inputs=1,
                       scan_input_axes=[-1], name="scalar_negaxis")
    g = h.make_graph([node], "main", [vi("s0", []), vi("X", ["B", "T"])], [vi("sT", []), vi("Y", ["T"])])
    return model(g, 11)


def scan_zero_sized_output():
    body = h.make_graph(
        _rnn_nodes("x", "h", "h2") + [
            h.make_node("Tanh", ["h2_pre"], ["h2"]),
            h.make_node("Identity", ["h2"], ["y"]),
            h.make_node("Slice", ["x", "s0", "s0", "ax1"], ["empty"])],
        "body", [vi("h", ["B", H]), vi("x", ["B", I])],
        [vi("h2", ["B", H]), vi("y", ["B", H]), vi("empty", ["B", 0])],
        initializer=[init("s0", np.array([0], np.int64)), init("ax1", np.array([1], np.int64))])
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y", "E"], body=body, num_scan_inputs=1, name="zero_sized")
    g = h.make_graph([node], "main", [vi("h0", ["B", H]), vi("X", ["T", "B", I])],
                     [vi("hT", ["B", H]), vi("Y", ["T", "B", H]), vi("E", ["T", "B", 0])],
                     initializer=_rnn_weights(4))
    return model(g, 17)


def scan_sequence_ops_body():
    body = h.make_graph(
        [h.make_node("SplitToSequence", ["x"], ["seq"], axis=1, keepdims=1),
         h.make_node("SequenceAt", ["seq", "last"], ["xl"]),
         h.make_node("ConcatFromSequence", ["seq"], ["xc"], axis=1),
         h.make_node("Mul", ["xc", "xl"], ["prod"]),
         h.make_node("Add", ["h", "prod"], ["h2"]),
         h.make_node("Identity", ["h2"], ["y"])],
        "body", [vi("h", ["B", I]), vi("x", ["B", I])], [vi("h2", ["B", I]), vi("y", ["B", I])],
        initializer=[init("last", np.array(-1, np.int64))])
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name="seq_body")
    g = h.make_graph([node], "main", [vi("h0", ["B", I]), vi("X", ["T", "B", I])],
                     [vi("hT", ["B", I]), vi("Y", ["T", "B", I])])
    return model(g, 17)


def scan_body_if():
    then_g = h.make_graph([h.make_node("Add", ["h", "x"], ["t_out"])], "then", [], [vi("t_out", ["B", I])])
    else_g = h.make_graph([h.make_node("Mul", ["h", "half"], ["e_out"])], "else", [], [vi("e_out", ["B", I])])
    body = h.make_graph(
        [h.make_node("ReduceSum", ["x"], ["xs"], keepdims=0),
         h.make_node("Greater", ["xs", "zf"], ["c"]),
         h.make_node("If", ["c"], ["h2"], then_branch=then_g, else_branch=else_g),
         h.make_node("Identity", ["h2"], ["y"])],
        "body", [vi("h", ["B", I]), vi("x", ["B", I])], [vi("h2", ["B", I]), vi("y", ["B", I])],
        initializer=[init("zf", np.array(0, np.float32)), init("half", np.array(0.5, np.float32))])
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name="if_body")
    g = h.make_graph([node], "main", [vi("h0", ["B", I]), vi("X", ["T", "B", I])],
                     [vi("hT", ["B", I]), vi("Y", ["T", "B", I])])
    return model(g, 17)


def scan_output_outer_direct():
    """Body outputs: ``h2`` (a node), ``C`` (outer initializer, as the state output of carry c)
    and ``V`` (an outer graph input, as a scan output)."""
    body = h.make_graph([h.make_node("Add", ["h", "x"], ["h2"]), h.make_node("Mul", ["h2", "c"], ["y"])],
                        "body", [vi("h", ["B", I]), vi("c", [I]), vi("x", ["B", I])],
                        [vi("h2", ["B", I]), vi("C", [I]), vi("y", ["B", I]), vi("V", [2])])
    node = h.make_node("Scan", ["h0", "c0", "X"], ["hT", "cT", "Y", "VS"], body=body, num_scan_inputs=1,
                       name="outer_direct")
    g = h.make_graph([node], "main", [vi("h0", ["B", I]), vi("c0", [I]), vi("X", ["T", "B", I]), vi("V", [2])],
                     [vi("hT", ["B", I]), vi("cT", [I]), vi("Y", ["T", "B", I]), vi("VS", ["T", 2])],
                     initializer=[init("C", np.array([1.0, -2.0, 0.5], np.float32))])
    return model(g, 17)


def viterbi_crf_decode():
    K = 5
    body = h.make_graph(
        [h.make_node("Unsqueeze", ["s", "ax2"], ["s3"]),
         h.make_node("Add", ["s3", "trans"], ["cand"]),
         h.make_node("ReduceMax", ["cand", "ax1"], ["best"], keepdims=0),
         h.make_node("ArgMax", ["cand"], ["bp"], axis=1, keepdims=0),
         h.make_node("Add", ["best", "x"], ["s2"])],
        "body", [vi("s", ["B", K]), vi("x", ["B", K])], [vi("s2", ["B", K]), vi("bp", ["B", K], I64)],
        initializer=[init("ax2", np.array([2], np.int64)), init("ax1", np.array([1], np.int64))])
    node = h.make_node("Scan", ["s0", "E"], ["sT", "BP"], body=body, num_scan_inputs=1, name="viterbi")
    g = h.make_graph([node], "main", [vi("s0", ["B", K]), vi("E", ["T", "B", K])],
                     [vi("sT", ["B", K]), vi("BP", ["T", "B", K], I64)],
                     initializer=[init("trans", w(7, K, K))])
    return model(g, 18)


def _rnn_scan_model(extra_nodes, last, opset, name, seed=10, extra_init=()):
    body = h.make_graph(
        _rnn_nodes("x", "h", "h2") + extra_nodes + [h.make_node("Identity", [last], ["y"])],
        "body", [vi("h", ["B", H]), vi("x", ["B", I])], [vi(last, ["B", H]), vi("y", ["B", H])],
        initializer=list(extra_init))
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name=name)
    g = h.make_graph([node], "main", [vi("h0", ["B", H]), vi("X", ["T", "B", I])],
                     [vi("hT", ["B", H]), vi("Y", ["T", "B", H])], initializer=_rnn_weights(seed))
    return g


def rnn_clip_preact_o13():
    g = _rnn_scan_model([h.make_node("Clip", ["h2_pre", "lo", "hi"], ["cl"]), h.make_node("Tanh", ["cl"], ["h2"])],
                        "h2", 13, "rnn_clip", extra_init=[init("lo", np.array(-3, np.float32)),
                                                          init("hi", np.array(3, np.float32))])
    return model(g, 13)


def rnn_dropout_in_body():
    g = _rnn_scan_model([h.make_node("Tanh", ["h2_pre"], ["th"]), h.make_node("Dropout", ["th"], ["h2"])],
                        "h2", 13, "rnn_dropout")
    return model(g, 13)


def scan21_int8_io():
    body = h.make_graph(
        [h.make_node("Cast", ["x"], ["xf"], to=F),
         h.make_node("Add", ["s", "xf"], ["s2"]),
         h.make_node("Mul", ["s2", "q"], ["sq"]),
         h.make_node("Clip", ["sq", "lo", "hi"], ["sc"]),
         h.make_node("Cast", ["sc"], ["y"], to=I8)],
        "body", [vi("s", ["B"]), vi("x", ["B"], I8)], [vi("s2", ["B"]), vi("y", ["B"], I8)],
        initializer=[init("q", np.array(0.25, np.float32)), init("lo", np.array(-128, np.float32)),
                     init("hi", np.array(127, np.float32))])
    node = h.make_node("Scan", ["s0", "X"], ["sT", "Y"], body=body, num_scan_inputs=1, name="int8_io")
    g = h.make_graph([node], "main", [vi("s0", ["B"]), vi("X", ["T", "B"], I8)],
                     [vi("sT", ["B"]), vi("Y", ["T", "B"], I8)])
    return model(g, 21, ir=10)


def loop_sequence_carry():
    body = h.make_graph(
        [h.make_node("Gather", ["X", "i"], ["x_t"], axis=0)] + _rnn_nodes("x_t", "h", "h2")
        + [h.make_node("Tanh", ["h2_pre"], ["h2"]),
           h.make_node("SequenceInsert", ["seq", "h2"], ["seq2"]),
           h.make_node("Identity", ["c"], ["c2"])],
        "body", [vi("i", [], I64), vi("c", [], BOOL), vi("h", ["B", H]),
                 h.make_tensor_sequence_value_info("seq", F, ["B", H])],
        [vi("c2", [], BOOL), vi("h2", ["B", H]), h.make_tensor_sequence_value_info("seq2", F, ["B", H])])
    nodes = [h.make_node("Shape", ["X"], ["shp"]),
             h.make_node("Gather", ["shp", "zero"], ["M"], axis=0),
             h.make_node("SequenceEmpty", [], ["seq0"], dtype=F),
             h.make_node("Loop", ["M", "true", "h0", "seq0"], ["hT", "seqT"], body=body, name="loop_seq"),
             h.make_node("ConcatFromSequence", ["seqT"], ["Y"], axis=1, new_axis=1)]
    g = h.make_graph(nodes, "main", [vi("X", ["T", "B", I]), vi("h0", ["B", H])],
                     [vi("hT", ["B", H]), vi("Y", ["B", "T", H])],
                     initializer=_rnn_weights(13) + [init("zero", np.array(0, np.int64)),
                                                     init("true", np.array(True))])
    return model(g, 17)


def scan_nested_inner_axis1_reverse():
    inner = h.make_graph(
        [h.make_node("Mul", ["a", "g"], ["ag"]), h.make_node("Add", ["ag", "r"], ["a2"]),
         h.make_node("Identity", ["a2"], ["ay"])],
        "inner", [vi("a", ["B"]), vi("r", ["B"])], [vi("a2", ["B"]), vi("ay", ["B"])],
        initializer=[init("g", np.array(0.7, np.float32))])
    body = h.make_graph(
        [h.make_node("ReduceSum", ["x", "ax1"], ["xs"], keepdims=0),
         h.make_node("Add", ["xs", "s"], ["a0"]),
         h.make_node("Scan", ["a0", "x"], ["aT", "AY"], body=inner, num_scan_inputs=1,
                     scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1], name="inner"),
         h.make_node("Tanh", ["aT"], ["s2"]),
         h.make_node("Identity", ["AY"], ["y"])],
        "body", [vi("s", ["B"]), vi("x", ["B", 6])], [vi("s2", ["B"]), vi("y", ["B", 6])],
        initializer=[init("ax1", np.array([1], np.int64))])
    node = h.make_node("Scan", ["s0", "X"], ["sT", "Y"], body=body, num_scan_inputs=1, name="outer")
    g = h.make_graph([node], "main", [vi("s0", ["B"]), vi("X", ["T", "B", 6])],
                     [vi("sT", ["B"]), vi("Y", ["T", "B", 6])])
    return model(g, 17)


def rnn_o9_ir4():
    body = h.make_graph(
        [h.make_node("MatMul", ["x", "WT"], ["xw"]), h.make_node("MatMul", ["h", "RT"], ["hr"]),
         h.make_node("Add", ["xw", "hr"], ["s"]), h.make_node("Add", ["s", "b"], ["pre"]),
         h.make_node("Tanh", ["pre"], ["h2"]), h.make_node("Identity", ["h2"], ["y"])],
        "body", [vi("h", ["B", H]), vi("x", ["B", I])], [vi("h2", ["B", H]), vi("y", ["B", H])])
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name="rnn9")
    g = h.make_graph([node], "main", [vi("h0", ["B", H]), vi("X", ["T", "B", I])],
                     [vi("hT", ["B", H]), vi("Y", ["T", "B", H])],
                     initializer=[init("WT", w(21, I, H)), init("RT", w(22, H, H)), init("b", w(23, H))])
    return model(g, 9, ir=4)


def scan8_int64_step_count():
    body = h.make_graph(
        [h.make_node("Add", ["n", "one"], ["n2"]), h.make_node("Add", ["s", "x"], ["s2"]),
         h.make_node("Identity", ["s2"], ["y"])],
        "body", [vi("n", [], I64), vi("s", [2]), vi("x", [2])], [vi("n2", [], I64), vi("s2", [2]), vi("y", [2])],
        initializer=[init("one", np.array(1, np.int64))])
    node = h.make_node("Scan", ["lens", "n0", "s0", "X"], ["nT", "sT", "Y"], body=body, num_scan_inputs=1,
                       name="scan8_count")
    g = h.make_graph([node], "main", [vi("lens", ["B"], I64), vi("n0", ["B"], I64), vi("s0", ["B", 2]),
                                      vi("X", ["B", "T", 2])],
                     [vi("nT", ["B"], I64), vi("sT", ["B", 2]), vi("Y", ["B", "T", 2])])
    return model(g, 8, ir=4)


def map_attention_queries():
    D = 4
    body = h.make_graph(
        [h.make_node("MatMul", ["q", "KT"], ["sc"]),
         h.make_node("Mul", ["sc", "scale"], ["scs"]),
         h.make_node("Softmax", ["scs"], ["p"], axis=-1),
         h.make_node("MatMul", ["p", "V"], ["o"]),
         h.make_node("Identity", ["dummy"], ["dummy2"])],
        "body", [vi("dummy", [1]), vi("q", [D])], [vi("dummy2", [1]), vi("o", [D])])
    node = h.make_node("Scan", ["d0", "Q"], ["dT", "O"], body=body, num_scan_inputs=1, name="attn_map")
    g = h.make_graph([h.make_node("Transpose", ["K"], ["KT"], perm=[1, 0]), node], "main",
                     [vi("Q", ["T", D]), vi("K", ["N", D]), vi("V", ["N", D])], [vi("O", ["T", D])],
                     initializer=[init("scale", np.array(0.5, np.float32)), init("d0", np.zeros(1, np.float32))])
    return model(g, 17)


def broken_body_output_count():
    body = h.make_graph([h.make_node("Add", ["h", "x"], ["h2"])], "body",
                        [vi("h", ["B", I]), vi("x", ["B", I])], [vi("h2", ["B", I])])
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name="broken")
    g = h.make_graph([node], "main", [vi("h0", ["B", I]), vi("X", ["T", "B", I])],
                     [vi("hT", ["B", I]), vi("Y", ["T", "B", I])])
    return model(g, 17)


def loop_trip_and_cond_inputs():
    """Loop(M, go) with both the trip count and the initial condition graph inputs; the body
    passes its condition through and reads Gather(X, i): go = false runs no step."""
    body = h.make_graph(
        [h.make_node("Gather", ["X", "i"], ["x_t"], axis=0)] + _rnn_nodes("x_t", "h", "h2")
        + [h.make_node("Tanh", ["h2_pre"], ["h2"]), h.make_node("Identity", ["h2"], ["y"]),
           h.make_node("Identity", ["c"], ["c2"])],
        "body", [vi("i", [], I64), vi("c", [], BOOL), vi("h", ["B", H])],
        [vi("c2", [], BOOL), vi("h2", ["B", H]), vi("y", ["B", H])])
    g = h.make_graph([h.make_node("Loop", ["M", "go", "h0"], ["hT", "Y"], body=body, name="loop_m_go")], "main",
                     [vi("M", [], I64), vi("go", [], BOOL), vi("X", ["T", "B", I]), vi("h0", ["B", H])],
                     [vi("hT", ["B", H]), vi("Y", ["S", "B", H])], initializer=_rnn_weights(31))
    return model(g, 17)


def loop_min_trip_counter_cond():
    """Loop(Shape(X)[0], true) whose body computes ``cond = i + 1 < K`` (K an input): it runs
    min(T, max(K, 1)) steps (the condition is tested after each step)."""
    return _loop_rnn([h.make_node("Add", ["i", "one"], ["i1"]), h.make_node("Less", ["i1", "K"], ["c2"])],
                     "c2", "loop_min_k", extra_inputs=[vi("K", [], I64)],
                     extra_init=[init("one", np.array(1, np.int64))], y_dim="S")


def _hsig(x):
    return np.clip(0.2 * x + 0.5, 0, 1)


def keras_gru_hard_sigmoid():
    """Keras GRU with reset_after=False (gate order z, r, h like ONNX) and
    recurrent_activation="hard_sigmoid", which Keras 3 defines as relu6(x + 3) / 6:
    HardSigmoid(alpha=1/6, beta=0.5) gates (not ONNX's default alpha 0.2); kernels laid
    [I, 3H] / [H, 3H] and read with MatMul + Split."""
    nodes = [
        h.make_node("MatMul", ["x", "K"], ["xk"]), h.make_node("Add", ["xk", "bk"], ["xkb"]),
        h.make_node("Split", ["xkb", "split3"], ["xz", "xr", "xh"], axis=1),
        h.make_node("MatMul", ["h", "Rzr"], ["hzr"]),
        h.make_node("Split", ["hzr", "split2"], ["hz", "hr"], axis=1),
        h.make_node("Add", ["xz", "hz"], ["zp"]), h.make_node("HardSigmoid", ["zp"], ["z"], alpha=1 / 6, beta=0.5),
        h.make_node("Add", ["xr", "hr"], ["rp"]), h.make_node("HardSigmoid", ["rp"], ["r"], alpha=1 / 6, beta=0.5),
        h.make_node("Mul", ["r", "h"], ["rh"]), h.make_node("MatMul", ["rh", "Rh"], ["rhh"]),
        h.make_node("Add", ["xh", "rhh"], ["hp"]), h.make_node("Tanh", ["hp"], ["hh"]),
        h.make_node("Mul", ["z", "h"], ["zh"]), h.make_node("Sub", ["one", "z"], ["omz"]),
        h.make_node("Mul", ["omz", "hh"], ["zhh"]), h.make_node("Add", ["zh", "zhh"], ["h2"]),
        h.make_node("Identity", ["h2"], ["y"])]
    body = h.make_graph(nodes, "body", [vi("h", ["B", H]), vi("x", ["B", I])], [vi("h2", ["B", H]), vi("y", ["B", H])],
                        initializer=[init("split3", np.array([H, H, H], np.int64)),
                                     init("split2", np.array([H, H], np.int64)),
                                     init("one", np.array(1, np.float32))])
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name="keras_gru")
    g = h.make_graph([node], "main", [vi("h0", ["B", H]), vi("X", ["T", "B", I])],
                     [vi("hT", ["B", H]), vi("Y", ["T", "B", H])],
                     initializer=[init("K", w(41, I, 3 * H)), init("bk", w(42, 3 * H)),
                                  init("Rzr", w(43, H, 2 * H)), init("Rh", w(44, H, H))])
    return model(g, 13)


def rnn_h1_i1():
    """A tanh RNN with one hidden unit reading one feature (H = I = 1), batch 1 static: every
    weight [1, 1], every state [1, 1]."""
    body = h.make_graph(
        [h.make_node("MatMul", ["x", "Wt"], ["xw"]), h.make_node("MatMul", ["h", "Rt"], ["hr"]),
         h.make_node("Add", ["xw", "hr"], ["s"]), h.make_node("Add", ["s", "b1"], ["pre"]),
         h.make_node("Tanh", ["pre"], ["h2"]), h.make_node("Identity", ["h2"], ["y"])],
        "body", [vi("h", [1, 1]), vi("x", [1, 1])], [vi("h2", [1, 1]), vi("y", [1, 1])])
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name="rnn_h1")
    g = h.make_graph([node], "main", [vi("h0", [1, 1]), vi("X", ["T", 1, 1])],
                     [vi("hT", [1, 1]), vi("Y", ["T", 1, 1])],
                     initializer=[init("Wt", np.array([[0.8]], np.float32)), init("Rt", np.array([[-0.6]], np.float32)),
                                  init("b1", np.array([0.1], np.float32))])
    return model(g, 17)


def embedding_rnn_tokens():
    """A char-RNN over int64 token ids X [T, B]: the body looks each step's tokens up in an
    embedding table (Gather) and runs a tanh RNN cell on them."""
    V = 11
    body = h.make_graph(
        [h.make_node("Gather", ["E", "tok"], ["x"], axis=0)] + _rnn_nodes("x", "h", "h2")
        + [h.make_node("Tanh", ["h2_pre"], ["h2"]), h.make_node("Identity", ["h2"], ["y"])],
        "body", [vi("h", ["B", H]), vi("tok", ["B"], I64)], [vi("h2", ["B", H]), vi("y", ["B", H])])
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name="embed_rnn")
    g = h.make_graph([node], "main", [vi("h0", ["B", H]), vi("X", ["T", "B"], I64)],
                     [vi("hT", ["B", H]), vi("Y", ["T", "B", H])],
                     initializer=_rnn_weights(51) + [init("E", w(50, V, I))])
    return model(g, 17)


def greedy_decode_loop():
    """Greedy decoding as TorchScript/tf2onnx users write it: Loop(max_len, true) carrying the
    last token [B] (int64), h [B, H] and done [B] (bool); the body embeds the token, runs a tanh
    cell, takes ArgMax of the logits, marks EOS (token 0), and stops when every item is done."""
    V = 6
    body = h.make_graph(
        [h.make_node("Gather", ["E", "tok"], ["x"], axis=0)] + _rnn_nodes("x", "h", "h2")
        + [h.make_node("Tanh", ["h2_pre"], ["h2"]),
           h.make_node("MatMul", ["h2", "Wo"], ["logits"]),
           h.make_node("ArgMax", ["logits"], ["tok2"], axis=1, keepdims=0),
           h.make_node("Equal", ["tok2", "eos"], ["is_eos"]),
           h.make_node("Or", ["done", "is_eos"], ["done2"]),
           h.make_node("Cast", ["done2"], ["done_i"], to=I64),
           h.make_node("ReduceMin", ["done_i"], ["all_done"], keepdims=0),
           h.make_node("Equal", ["all_done", "zero"], ["c2"]),
           h.make_node("Identity", ["tok2"], ["y"])],
        "body", [vi("i", [], I64), vi("c", [], BOOL), vi("tok", ["B"], I64), vi("h", ["B", H]), vi("done", ["B"], BOOL)],
        [vi("c2", [], BOOL), vi("tok2", ["B"], I64), vi("h2", ["B", H]), vi("done2", ["B"], BOOL), vi("y", ["B"], I64)],
        initializer=[init("eos", np.array(0, np.int64)), init("zero", np.array(0, np.int64))])
    nodes = [h.make_node("Shape", ["h0"], ["shp"]), h.make_node("Slice", ["shp", "s0", "s1"], ["b1"]),
             h.make_node("ConstantOfShape", ["b1"], ["done0"], value=h.make_tensor("f", BOOL, [1], [False])),
             h.make_node("Loop", ["max_len", "true", "tok0", "h0", "done0"], ["tokT", "hT", "doneT", "TOKS"],
                         body=body, name="greedy")]
    g = h.make_graph(nodes, "main", [vi("tok0", ["B"], I64), vi("h0", ["B", H])],
                     [vi("hT", ["B", H]), vi("TOKS", ["S", "B"], I64)],
                     initializer=_rnn_weights(61) + [init("E", w(60, V, I)), init("Wo", w(62, H, V)),
                                                     init("max_len", np.array(8, np.int64)),
                                                     init("true", np.array(True)),
                                                     init("s0", np.array([0], np.int64)),
                                                     init("s1", np.array([1], np.int64))])
    return model(g, 17)


def scan_outputs_partly_used():
    """A tanh RNN Scan with three scan outputs (h, 2h, h²) and its final state: the graph
    outputs only the mean over time of h² and 2h at the last step; h itself and the final
    state are used by nobody."""
    body = h.make_graph(
        _rnn_nodes("x", "h", "h2") + [
            h.make_node("Tanh", ["h2_pre"], ["h2"]), h.make_node("Identity", ["h2"], ["y1"]),
            h.make_node("Add", ["h2", "h2"], ["y2"]), h.make_node("Mul", ["h2", "h2"], ["y3"])],
        "body", [vi("h", ["B", H]), vi("x", ["B", I])],
        [vi("h2", ["B", H]), vi("y1", ["B", H]), vi("y2", ["B", H]), vi("y3", ["B", H])])
    nodes = [h.make_node("Scan", ["h0", "X"], ["hT", "Y1", "Y2", "Y3"], body=body, num_scan_inputs=1, name="partly"),
             h.make_node("ReduceMean", ["Y3", "ax0"], ["M3"], keepdims=0),
             h.make_node("Gather", ["Y2", "last"], ["L2"], axis=0)]
    g = h.make_graph(nodes, "main", [vi("h0", ["B", H]), vi("X", ["T", "B", I])],
                     [vi("M3", ["B", H]), vi("L2", ["B", H])],
                     initializer=_rnn_weights(71) + [init("ax0", np.array([0], np.int64)),
                                                     init("last", np.array(-1, np.int64))])
    return model(g, 18)


def scalar_rnn_elementwise():
    """A one-unit tanh RNN written with scalars: X [T], state h [] (rank 0),
    ``h' = tanh(w x + r h + b)`` with Mul/Add on scalar constants."""
    body = h.make_graph(
        [h.make_node("Mul", ["x", "wx"], ["xw"]), h.make_node("Mul", ["h", "wh"], ["hr"]),
         h.make_node("Add", ["xw", "hr"], ["s"]), h.make_node("Add", ["s", "b0"], ["pre"]),
         h.make_node("Tanh", ["pre"], ["h2"]), h.make_node("Identity", ["h2"], ["y"])],
        "body", [vi("h", []), vi("x", [])], [vi("h2", []), vi("y", [])],
        initializer=[init("wx", np.array(0.7, np.float32)), init("wh", np.array(-0.4, np.float32)),
                     init("b0", np.array(0.05, np.float32))])
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name="scalar_rnn")
    g = h.make_graph([node], "main", [vi("h0", []), vi("X", ["T"])], [vi("hT", []), vi("Y", ["T"])])
    return model(g, 17)


def rnn_f16_state_f32_compute():
    """Mixed precision as autocast exports write it: the state and the sequence are float16, the
    body casts both to float32, runs a tanh cell and casts the new state back to float16."""
    body = h.make_graph(
        [h.make_node("Cast", ["x"], ["xf"], to=F), h.make_node("Cast", ["h"], ["hf"], to=F)]
        + _rnn_nodes("xf", "hf", "h2") + [h.make_node("Tanh", ["h2_pre"], ["h2f"]),
                                          h.make_node("Cast", ["h2f"], ["h2"], to=TP.FLOAT16),
                                          h.make_node("Identity", ["h2"], ["y"])],
        "body", [vi("h", ["B", H], TP.FLOAT16), vi("x", ["B", I], TP.FLOAT16)],
        [vi("h2", ["B", H], TP.FLOAT16), vi("y", ["B", H], TP.FLOAT16)])
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name="amp_rnn")
    g = h.make_graph([node], "main", [vi("h0", ["B", H], TP.FLOAT16), vi("X", ["T", "B", I], TP.FLOAT16)],
                     [vi("hT", ["B", H], TP.FLOAT16), vi("Y", ["T", "B", H], TP.FLOAT16)],
                     initializer=_rnn_weights(81))
    return model(g, 17)


def two_identical_scans():
    """Two Scans with identical bodies (the same captured weight names) over X and -X: the
    optimizer times identical Scans once; each must still read its own input."""
    def scan(x, hT, y, name):
        body = h.make_graph(_rnn_nodes("x", "h", "h2") + [h.make_node("Tanh", ["h2_pre"], ["h2"]),
                                                           h.make_node("Identity", ["h2"], ["y"])],
                            "body", [vi("h", ["B", H]), vi("x", ["B", I])], [vi("h2", ["B", H]), vi("y", ["B", H])])
        return h.make_node("Scan", ["h0", x], [hT, y], body=body, num_scan_inputs=1, name=name)
    nodes = [h.make_node("Neg", ["X"], ["NX"]), scan("X", "hA", "YA", "scan_a"), scan("NX", "hB", "YB", "scan_b"),
             h.make_node("Sub", ["YA", "YB"], ["D"])]
    g = h.make_graph(nodes, "main", [vi("h0", ["B", H]), vi("X", ["T", "B", I])],
                     [vi("hA", ["B", H]), vi("hB", ["B", H]), vi("D", ["T", "B", H])], initializer=_rnn_weights(91))
    return model(g, 17)


def scan_f64_accumulate_f32():
    """A float64 running sum of a float32 sequence (Cast inside the body), emitted as float32."""
    body = h.make_graph(
        [h.make_node("Cast", ["x"], ["xd"], to=TP.DOUBLE), h.make_node("Add", ["s", "xd"], ["s2"]),
         h.make_node("Cast", ["s2"], ["y"], to=F)],
        "body", [vi("s", ["B"], TP.DOUBLE), vi("x", ["B"])], [vi("s2", ["B"], TP.DOUBLE), vi("y", ["B"])])
    node = h.make_node("Scan", ["s0", "X"], ["sT", "Y"], body=body, num_scan_inputs=1, name="f64_sum")
    g = h.make_graph([node], "main", [vi("s0", ["B"], TP.DOUBLE), vi("X", ["T", "B"])],
                     [vi("sT", ["B"], TP.DOUBLE), vi("Y", ["T", "B"])])
    return model(g, 17)


def broken_scan_undefined_capture():
    """A Scan body reading 'W_missing', defined nowhere (broken: one line, non-zero exit)."""
    body = h.make_graph([h.make_node("MatMul", ["x", "W_missing"], ["xw"]), h.make_node("Add", ["h", "xw"], ["h2"]),
                         h.make_node("Identity", ["h2"], ["y"])], "body",
                        [vi("h", ["B", H]), vi("x", ["B", I])], [vi("h2", ["B", H]), vi("y", ["B", H])])
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name="undefined")
    g = h.make_graph([node], "main", [vi("h0", ["B", H]), vi("X", ["T", "B", I])],
                     [vi("hT", ["B", H]), vi("Y", ["T", "B", H])])
    return model(g, 17)


def broken_loop_body_inputs():
    """A Loop body with one input fewer than 2 + its carried values (no condition input): broken."""
    body = h.make_graph([h.make_node("Add", ["h", "one"], ["h2"]), h.make_node("Constant", [], ["c2"],
                         value=h.make_tensor("t", BOOL, [], [True]))], "body",
                        [vi("i", [], I64), vi("h", ["B"])], [vi("c2", [], BOOL), vi("h2", ["B"])],
                        initializer=[init("one", np.array(1, np.float32))])
    g = h.make_graph([h.make_node("Loop", ["M", "", "h0"], ["hT"], body=body, name="bad_loop")], "main",
                     [vi("M", [], I64), vi("h0", ["B"])], [vi("hT", ["B"])])
    return model(g, 17)


def rnn_leaky_relu_gemm_alpha_beta():
    """An RNN with LeakyRelu(alpha=0.1) as its activation and a Gemm with alpha=0.5, beta=2 on
    the input side (weights and bias scaled by the op, not stored scaled)."""
    body = h.make_graph(
        [h.make_node("Gemm", ["x", "W", "b"], ["xw"], transB=1, alpha=0.5, beta=2.0),
         h.make_node("Gemm", ["h", "R"], ["hr"], transB=1),
         h.make_node("Add", ["xw", "hr"], ["pre"]),
         h.make_node("LeakyRelu", ["pre"], ["h2"], alpha=0.1), h.make_node("Identity", ["h2"], ["y"])],
        "body", [vi("h", ["B", H]), vi("x", ["B", I])], [vi("h2", ["B", H]), vi("y", ["B", H])])
    node = h.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body, num_scan_inputs=1, name="leaky_rnn")
    g = h.make_graph([node], "main", [vi("h0", ["B", H]), vi("X", ["T", "B", I])],
                     [vi("hT", ["B", H]), vi("Y", ["T", "B", H])], initializer=_rnn_weights(101))
    return model(g, 17)


def loop_trip_input_reads_x():
    """TorchScript's ``for i in range(n)`` with n an argument, not x.size(0): Loop(M, true) with
    M a graph input, the body reading Gather(X, i). M past X's length fails in the original."""
    body = h.make_graph(
        [h.make_node("Gather", ["X", "i"], ["x_t"], axis=0)] + _rnn_nodes("x_t", "h", "h2")
        + [h.make_node("Tanh", ["h2_pre"], ["h2"]), h.make_node("Identity", ["h2"], ["y"]),
           h.make_node("Identity", ["c"], ["c2"])],
        "body", [vi("i", [], I64), vi("c", [], BOOL), vi("h", ["B", H])],
        [vi("c2", [], BOOL), vi("h2", ["B", H]), vi("y", ["B", H])])
    g = h.make_graph([h.make_node("Loop", ["M", "true", "h0"], ["hT", "Y"], body=body, name="loop_m")], "main",
                     [vi("M", [], I64), vi("X", ["T", "B", I]), vi("h0", ["B", H])],
                     [vi("hT", ["B", H]), vi("Y", ["S", "B", H])],
                     initializer=_rnn_weights(111) + [init("true", np.array(True))])
    return model(g, 17)


def _onnxscript(name):
    import heldout4_onnxscript

    m = heldout4_onnxscript.MODELS[name].to_model_proto()
    m.producer_name = "onnxscript"
    return m


HAND = {f.__name__: f for f in [
    loop_cond_const_node, loop_cond_nan_exit, scan_bool_int64_carries, scan_int64_cumsum_o13,
    scan_scalar_state_o11_negaxis, scan_zero_sized_output, scan_sequence_ops_body, scan_body_if,
    scan_output_outer_direct, viterbi_crf_decode, rnn_clip_preact_o13, rnn_dropout_in_body, scan21_int8_io,
    loop_sequence_carry, scan_nested_inner_axis1_reverse, rnn_o9_ir4, scan8_int64_step_count,
    map_attention_queries, broken_body_output_count, loop_trip_and_cond_inputs, loop_min_trip_counter_cond,
    keras_gru_hard_sigmoid, rnn_h1_i1, embedding_rnn_tokens, greedy_decode_loop, scan_outputs_partly_used,
    scalar_rnn_elementwise, rnn_f16_state_f32_compute, two_identical_scans, scan_f64_accumulate_f32,
    broken_scan_undefined_capture, broken_loop_body_inputs, rnn_leaky_relu_gemm_alpha_beta,
    loop_trip_input_reads_x]}
HAND.update({n: (lambda n=n: _onnxscript(n)) for n in ["os_for_ema", "os_while_halving"]})


# ---------------------------------------------------------------- PyTorch 2.13 dynamo exports
T_, B_ = 5, 3


def _torch_export(name, module, feeds, outputs, dims):
    """dynamo export with ``dims`` (input name -> {axis: dim name}); writes NAME.onnx/.expected.npz."""
    import torch

    with torch.no_grad():
        got = module(*feeds.values())
    got = got if isinstance(got, tuple) else (got,)
    ds = {n: torch.export.Dim(n, min=2) for d in dims.values() for n in d.values()}
    dynamic = tuple({a: ds[n] for a, n in dims.get(k, {}).items()} for k in feeds)
    program = torch.onnx.export(module, tuple(feeds.values()), dynamo=True, input_names=list(feeds),
                                output_names=outputs, dynamic_shapes=dynamic, verbose=False)
    save_torch_sample(program.model_proto, os.path.join(OUT, f"{name}.onnx"), feeds, outputs, got)


def _torch(name):
    import torch
    from torch import nn
    from torch._higher_order_ops import scan
    from torch._higher_order_ops.while_loop import while_loop

    torch.manual_seed(0)
    torch.set_grad_enabled(False)  # scan with parameters under autograd fails to trace mixed-dtype carries
    g = torch.Generator().manual_seed(4)
    TB = {0: "T", 1: "B"}

    def rnd(*s):
        return torch.randn(*s, generator=g)

    class OnlineSoftmax(nn.Module):
        def forward(self, q, k, v):  # q [B, D], k, v [T, B, D]
            def step(carry, kv):
                m, l, acc = carry
                kt, vt = kv
                s = (q * kt).sum(-1) * 0.5
                m2 = torch.maximum(m, s)
                a, p = torch.exp(m - m2), torch.exp(s - m2)
                l2 = l * a + p
                acc2 = acc * a[:, None] + p[:, None] * vt
                return (m2, l2, acc2), acc2 / l2[:, None]
            B = q.shape[0]
            init = (torch.full((B,), -1e30), torch.zeros(B), torch.zeros_like(q))
            (m, l, acc), ys = scan(step, init, (k, v))
            return acc / l[:, None], ys

    class LogCumSumExp(nn.Module):
        def forward(self, x, h0):
            def step(hh, xt):
                h2 = torch.logaddexp(hh, xt)
                return h2, h2.clone()
            return scan(step, h0, x)

    class CumMax(nn.Module):
        def forward(self, x, h0):
            def step(hh, xt):
                h2 = torch.maximum(hh, xt)
                return h2, h2.clone()
            return scan(step, h0, x)

    class BidiByHand(nn.Module):
        def __init__(self):
            super().__init__()
            self.fi, self.fh = nn.Linear(I, H), nn.Linear(H, H)
            self.bi, self.bh = nn.Linear(I, H), nn.Linear(H, H)

        def forward(self, x, h0):
            def fstep(hh, xt):
                h2 = torch.tanh(self.fi(xt) + self.fh(hh))
                return h2, h2.clone()

            def bstep(hh, xt):
                h2 = torch.tanh(self.bi(xt) + self.bh(hh))
                return h2, h2.clone()
            hf, yf = scan(fstep, h0, x)
            hb, yb = scan(bstep, h0, x, reverse=True)
            return torch.cat([yf, yb], -1), torch.stack([hf, hb])

    class TwoCells(nn.Module):
        def __init__(self):
            super().__init__()
            self.i1, self.h1, self.i2, self.h2 = nn.Linear(I, H), nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)

        def forward(self, x, h0):
            def step(carry, xt):
                a, b = carry
                a2 = torch.tanh(self.i1(xt) + self.h1(a))
                b2 = torch.tanh(self.i2(a2) + self.h2(b))
                return (a2, b2), b2.clone()
            (a, b), ys = scan(step, (h0, h0.clone()), x)
            return ys, a, b

    class ArgmaxTracker(nn.Module):
        def forward(self, x):  # x [T, B]
            def step(carry, xt):
                best, idx, t = carry
                better = xt > best
                return (torch.where(better, xt, best), torch.where(better, t, idx), t + 1), idx.clone()
            B = x.shape[1]
            init = (torch.full((B,), float("-inf")), torch.zeros(B, dtype=torch.int64),
                    torch.zeros(B, dtype=torch.int64))
            (best, idx, t), idxs = scan(step, init, x)
            return best, idx, idxs

    class Dim1TwoXs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.c = nn.Linear(I, H), nn.Linear(2, H)

        def forward(self, x, u, h0):  # x [B, T, I], u [B, T, 2]
            def step(hh, xs):
                xt, ut = xs
                h2 = torch.tanh(self.a(xt) + self.c(ut) + hh * 0.5)
                return h2, h2.sum(-1)
            return scan(step, h0, (x, u), dim=1)

    class NestedScan(nn.Module):
        def forward(self, x, h0):  # x [T, B, 6], h0 [B]
            def inner(a, r):
                a2 = a * 0.7 + r
                return a2, a2.clone()

            def outer(s, xt):  # xt [B, 6]
                aT, ay = scan(inner, s, xt, dim=1)
                return torch.tanh(aT), ay
            return scan(outer, h0, x)

    class WhileNewton(nn.Module):
        def forward(self, a):  # a [B] positive
            def cond(y, it):
                return ((y * y - a).abs().max() > 1e-6) & (it < 50)

            def body(y, it):
                return (0.5 * (y + a / y), it + 1)
            y, it = while_loop(cond, body, (a.clone() + 1.0, torch.zeros((), dtype=torch.int64)))
            return y, it

    class WhilePower(nn.Module):
        def __init__(self):
            super().__init__()
            self.A = nn.Parameter(rnd(H, H))

        def forward(self, v):  # v [B, H]
            def cond(i, vv):
                return i < 6

            def body(i, vv):
                u = vv @ self.A.T
                return (i + 1, u / u.norm(dim=-1, keepdim=True))
            i, vT = while_loop(cond, body, (torch.zeros((), dtype=torch.int64), v.clone()))
            return vT

    class MixedCarries(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(I, H)

        def forward(self, x, h0):  # x [T, B, I]
            def step(carry, xt):
                hh, acc, cnt, seen = carry
                h2 = torch.tanh(self.lin(xt) + hh)
                pos = h2.sum(-1) > 0
                return (h2, acc + h2.double(), cnt + pos.long(), seen | pos), (h2.clone(), pos.clone())
            B = x.shape[1]
            init = (h0, torch.zeros(B, H, dtype=torch.float64), torch.zeros(B, dtype=torch.int64),
                    torch.zeros(B, dtype=torch.bool))
            (hT, acc, cnt, seen), (ys, poss) = scan(step, init, x)
            return hT, acc, cnt, seen, ys, poss

    class AttnDecoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = nn.GRUCell(I + H, H)
            self.q = nn.Linear(H, H, bias=False)

        def forward(self, x, enc, h0):  # x [T, B, I] (teacher forcing), enc [B, S, H]
            def step(hh, xt):
                scores = torch.bmm(enc, self.q(hh).unsqueeze(-1)).squeeze(-1)
                ctx = torch.bmm(torch.softmax(scores, -1).unsqueeze(1), enc).squeeze(1)
                h2 = self.cell(torch.cat([xt, ctx], -1), hh)
                return h2, h2.clone()
            return scan(step, h0, x)

    if name == "torch_carries_mixed_dtypes":
        _torch_export(name, MixedCarries().eval(), {"x": rnd(T_, B_, I), "h0": rnd(B_, H)},
                      ["hT", "acc", "cnt", "seen", "ys", "poss"], {"x": TB, "h0": {0: "B"}})
        return
    if name == "torch_attention_decoder":
        _torch_export(name, AttnDecoder().eval(), {"x": rnd(T_, B_, I), "enc": rnd(B_, 7, H), "h0": rnd(B_, H)},
                      ["hT", "ys"], {"x": TB, "enc": {0: "B"}, "h0": {0: "B"}})
        return
    if name == "torch_online_softmax":
        D = 4
        _torch_export(name, OnlineSoftmax(), {"q": rnd(B_, D), "k": rnd(T_, B_, D), "v": rnd(T_, B_, D)},
                      ["o", "ys"], {"q": {0: "B"}, "k": TB, "v": TB})
    elif name == "torch_logcumsumexp":
        _torch_export(name, LogCumSumExp(), {"x": rnd(T_, B_, H), "h0": torch.full((B_, H), -1e4)},
                      ["hT", "ys"], {"x": TB, "h0": {0: "B"}})
    elif name == "torch_cummax":
        _torch_export(name, CumMax(), {"x": rnd(T_, B_, H), "h0": rnd(B_, H)}, ["hT", "ys"],
                      {"x": TB, "h0": {0: "B"}})
    elif name == "torch_bidi_by_hand":
        _torch_export(name, BidiByHand().eval(), {"x": rnd(T_, B_, I), "h0": rnd(B_, H)}, ["y", "h_n"],
                      {"x": TB, "h0": {0: "B"}})
    elif name == "torch_two_cells_one_step":
        _torch_export(name, TwoCells().eval(), {"x": rnd(T_, B_, I), "h0": rnd(B_, H)}, ["y", "h1", "h2"],
                      {"x": TB, "h0": {0: "B"}})
    elif name == "torch_argmax_tracker":
        _torch_export(name, ArgmaxTracker(), {"x": rnd(T_, B_)}, ["best", "idx", "idxs"], {"x": TB})
    elif name == "torch_scan_dim1_two_xs_reduce":
        _torch_export(name, Dim1TwoXs().eval(), {"x": rnd(B_, T_, I), "u": rnd(B_, T_, 2), "h0": rnd(B_, H)},
                      ["hT", "ys"], {"x": {0: "B", 1: "T"}, "u": {0: "B", 1: "T"}, "h0": {0: "B"}})
    elif name == "torch_nested_scan":
        _torch_export(name, NestedScan(), {"x": rnd(T_, B_, 6), "h0": rnd(B_)}, ["hT", "ys"],
                      {"x": TB, "h0": {0: "B"}})
    elif name == "torch_while_newton":
        _torch_export(name, WhileNewton(), {"a": rnd(B_).abs() + 0.5}, ["y", "iters"], {"a": {0: "B"}})
    elif name == "torch_while_power_iter":
        _torch_export(name, WhilePower().eval(), {"v": rnd(B_, H)}, ["v_out"], {"v": {0: "B"}})
    else:
        raise KeyError(name)


TORCH = ["torch_online_softmax", "torch_logcumsumexp", "torch_cummax", "torch_bidi_by_hand",
         "torch_two_cells_one_step", "torch_argmax_tracker", "torch_scan_dim1_two_xs_reduce",
         "torch_nested_scan", "torch_while_newton", "torch_while_power_iter", "torch_carries_mixed_dtypes",
         "torch_attention_decoder"]


def write(name):
    os.makedirs(OUT, exist_ok=True)
    if name in HAND:
        onnx.save(HAND[name](), os.path.join(OUT, f"{name}.onnx"))
    else:
        _torch(name)


if __name__ == "__main__":
    run_generator(__file__, __doc__, list(HAND) + TORCH, write, OUT)
