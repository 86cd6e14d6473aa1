"""Regenerate every sample model in this folder, deterministically.

    python models/generate.py               # all samples
    python models/generate.py --only scan_rnn --only scan8_sum

Hand-built models need only onnx and numpy. The exported samples need
`pip install torch==2.13.0 skl2onnx scikit-learn onnxscript`; those packages are
imported lazily here and are never needed to use or test scanopt.
Running the script twice writes byte-identical files (fixed seeds, no timestamps).
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import zipfile

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
IR_VERSION = 8  # onnxruntime 1.31 reads IR <= 13; onnx 1.23 would default to 14
PRODUCER = "scanopt-samples"
F, I64 = TP.FLOAT, TP.INT64
T, B, I, H = 5, 2, 3, 4  # sizes of the recurrent samples (seq, batch, input, hidden)


# ---------------------------------------------------------------- helpers
def vi(name, shape, elem=F):
    return h.make_tensor_value_info(name, elem, shape)


def const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def node(op, inputs, outputs, name, **attrs):
    return h.make_node(op, inputs, outputs, name=name, **attrs)


def weights(seed, *shapes):
    """Uniform(-0.5, 0.5) float32 arrays from one fixed seed (like nn.Linear's init scale)."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in shapes]


def hand_model(graph, opset):
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=IR_VERSION,
                     producer_name=PRODUCER)
    onnx.checker.check_model(m, full_check=True)  # strict shape inference must agree with us
    return m


def save_npz(path, arrays):
    """np.savez stamps the current time into the zip; write fixed timestamps instead."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for key in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue())


def scan_nodes(m):
    return [n for n in m.graph.node if n.op_type == "Scan"]


# ---------------------------------------------------------------- running sums
def sum_body():
    """ONNX backend test body: sum_out = sum_in + next; scan_out = sum_out."""
    return h.make_graph(
        [node("Add", ["sum_in", "next"], ["sum_out"], "body_add"),
         node("Identity", ["sum_out"], ["scan_out"], "body_id")],
        "scan_body",
        [vi("sum_in", [2]), vi("next", [2])],
        [vi("sum_out", [2]), vi("scan_out", [2])])


def scan8_sum(seqlens=False):
    """Scan-8 test_scan_sum (batched); optionally with a sequence_lens graph input."""
    inputs = [vi("initial", ["batch", 2]), vi("x", ["batch", "seq", 2])]
    if seqlens:
        inputs.insert(0, vi("sequence_lens", ["batch"], I64))
    scan = node("Scan", ["sequence_lens" if seqlens else "", "initial", "x"], ["y", "z"],
                "scan_sum", num_scan_inputs=1, body=sum_body())
    g = h.make_graph([scan], "scan8_sum", inputs,
                     [vi("y", ["batch", 2]), vi("z", ["batch", "seq", 2])])
    return hand_model(g, 8)


def scan8_reverse_seqlens():
    """Scan-8 with sequence_lens reading x forward and x reversed (directions [0, 1]).

    Reverse starts at len[b]-1 per item; both outputs are written in processing order.
    """
    body = h.make_graph(
        [node("Add", ["fwd_in", "x_fwd"], ["fwd_out"], "body_add_fwd"),
         node("Add", ["bwd_in", "x_bwd"], ["bwd_out"], "body_add_bwd"),
         node("Identity", ["fwd_out"], ["z_fwd_t"], "body_id_fwd"),
         node("Identity", ["bwd_out"], ["z_bwd_t"], "body_id_bwd")],
        "scan_body",
        [vi("fwd_in", [2]), vi("bwd_in", [2]), vi("x_fwd", [2]), vi("x_bwd", [2])],
        [vi("fwd_out", [2]), vi("bwd_out", [2]), vi("z_fwd_t", [2]), vi("z_bwd_t", [2])])
    scan = node("Scan", ["sequence_lens", "init_fwd", "init_bwd", "x", "x"],
                ["y_fwd", "y_bwd", "z_fwd", "z_bwd"], "scan_bidir_sum",
                num_scan_inputs=2, directions=[0, 1], body=body)
    g = h.make_graph(
        [scan], "scan8_reverse_seqlens",
        [vi("sequence_lens", ["batch"], I64), vi("init_fwd", ["batch", 2]),
         vi("init_bwd", ["batch", 2]), vi("x", ["batch", "seq", 2])],
        [vi("y_fwd", ["batch", 2]), vi("y_bwd", ["batch", 2]),
         vi("z_fwd", ["batch", "seq", 2]), vi("z_bwd", ["batch", "seq", 2])])
    return hand_model(g, 8)


def scan9_sum():
    """Scan-9 test_scan9_sum: no batch axis, no sequence_lens."""
    scan = node("Scan", ["initial", "x"], ["y", "z"], "scan_sum", num_scan_inputs=1,
                body=sum_body())
    g = h.make_graph([scan], "scan9_sum", [vi("initial", [2]), vi("x", ["seq", 2])],
                     [vi("y", [2]), vi("z", ["seq", 2])])
    return hand_model(g, 9)


def scan_axes_directions():
    """Scan-16, two scan inputs and outputs, every axis/direction attribute non-default.

    a [2, seq, 3] scanned on axis 1 forward; b [2, 3, seq] on axis -1 in reverse.
    s_t = s_{t-1} + a_t * b_t.  o1 = s_t stacked on axis -1 by prepending ([2, 3, seq]);
    o2 = a_t - b_t stacked on axis 1 by appending ([2, seq, 3]).
    """
    body = h.make_graph(
        [node("Mul", ["a_t", "b_t"], ["prod"], "body_mul"),
         node("Add", ["s_in", "prod"], ["s_out"], "body_add"),
         node("Identity", ["s_out"], ["o1_t"], "body_id"),
         node("Sub", ["a_t", "b_t"], ["o2_t"], "body_sub")],
        "scan_body",
        [vi("s_in", [2, 3]), vi("a_t", [2, 3]), vi("b_t", [2, 3])],
        [vi("s_out", [2, 3]), vi("o1_t", [2, 3]), vi("o2_t", [2, 3])])
    scan = node("Scan", ["s0", "a", "b"], ["s_final", "o1", "o2"], "scan_axes",
                num_scan_inputs=2, scan_input_axes=[1, -1], scan_input_directions=[0, 1],
                scan_output_axes=[-1, 1], scan_output_directions=[1, 0], body=body)
    g = h.make_graph(
        [scan], "scan_axes_directions",
        [vi("s0", [2, 3]), vi("a", [2, "seq", 3]), vi("b", [2, 3, "seq"])],
        [vi("s_final", [2, 3]), vi("o1", [2, 3, "seq"]), vi("o2", [2, "seq", 3])])
    return hand_model(g, 16)


def scan_short_static():
    """Static trip count 4, all shapes static: h_t = tanh(x_t @ W + h_{t-1}); W in the body."""
    (w,) = weights(4, (3, 3))
    body = h.make_graph(
        [node("MatMul", ["x_t", "W"], ["xw"], "body_matmul"),
         node("Add", ["xw", "h_in"], ["pre"], "body_add"),
         node("Tanh", ["pre"], ["h_out"], "body_tanh"),
         node("Identity", ["h_out"], ["y_t"], "body_id")],
        "scan_body",
        [vi("h_in", [2, 3]), vi("x_t", [2, 3])],
        [vi("h_out", [2, 3]), vi("y_t", [2, 3])],
        initializer=[const("W", w)])
    scan = node("Scan", ["h0", "x"], ["h_final", "y"], "scan_short", num_scan_inputs=1, body=body)
    g = h.make_graph([scan], "scan_short_static", [vi("h0", [2, 3]), vi("x", [4, 2, 3])],
                     [vi("y", [4, 2, 3]), vi("h_final", [2, 3])])
    return hand_model(g, 16)


# ---------------------------------------------------------------- recurrent cells
def recurrent_graph(name, body, state_names, outer_init):
    """Outer graph X [seq, batch, I], initial states [batch, H] -> Y [seq, batch, H], finals."""
    scan = node("Scan", [f"{s}_0" for s in state_names] + ["X"],
                [f"{s}_n" for s in state_names] + ["Y"], name,
                num_scan_inputs=1, body=body)
    return h.make_graph(
        [scan], name,
        [vi("X", ["seq", "batch", I])] + [vi(f"{s}_0", ["batch", H]) for s in state_names],
        [vi("Y", ["seq", "batch", H])] + [vi(f"{s}_n", ["batch", H]) for s in state_names],
        initializer=outer_init)


def scan_rnn():
    """ONNX RNN (Tanh): H_t = tanh(X_t W^T + H_{t-1} R^T + Wb + Rb).

    Weights are OUTER-scope initializers in the native layouts W [H, I], R [H, H], read by
    Gemm(transB=1) in the body -- the form PyTorch's exporter produces.
    """
    w, r, wb, rb = weights(10, (H, I), (H, H), (H,), (H,))
    body = h.make_graph(
        [node("Gemm", ["x_t", "W", "Wb"], ["xw"], "body_gemm_x", transB=1),
         node("Gemm", ["h_in", "R", "Rb"], ["hr"], "body_gemm_h", transB=1),
         node("Add", ["xw", "hr"], ["pre"], "body_add"),
         node("Tanh", ["pre"], ["h_out"], "body_tanh"),
         node("Identity", ["h_out"], ["y_t"], "body_id")],
        "rnn_body",
        [vi("h_in", ["batch", H]), vi("x_t", ["batch", I])],
        [vi("h_out", ["batch", H]), vi("y_t", ["batch", H])])
    inits = [const("W", w), const("R", r), const("Wb", wb), const("Rb", rb)]
    return hand_model(recurrent_graph("scan_rnn", body, ["h"], inits), 16)


def scan_gru(linear_before_reset=0):
    """ONNX GRU, gate order z, r, h; f = Sigmoid, g = Tanh.

    z = f(X Wz^T + H Rz^T + Wbz + Rbz), r = f(X Wr^T + H Rr^T + Wbr + Rbr)
    lbr=0: h~ = g(X Wh^T + (r*H) Rh^T + Rbh + Wbh);  lbr=1: h~ = g(X Wh^T + r*(H Rh^T + Rbh) + Wbh)
    H' = (1 - z) * h~ + z * H
    Weights are BODY initializers, pre-transposed for MatMul like a Keras export:
    W_T = W^T [I, 3H] and Wb [3H]; lbr=1 keeps R_T = R^T [H, 3H] and Rb [3H] whole, lbr=0 needs
    the candidate's recurrent weight apart: R_zr_T [H, 2H], Rb_zr [2H], R_h_T [H, H], Rb_h [H].
    """
    w, r, wb, rb = weights(20 + linear_before_reset, (3 * H, I), (3 * H, H), (3 * H,), (3 * H,))
    n = [
        node("MatMul", ["x_t", "W_T"], ["xw0"], "body_matmul_x"),
        node("Add", ["xw0", "Wb"], ["xw"], "body_add_wb"),
        node("Split", ["xw", "split3"], ["xw_z", "xw_r", "xw_h"], "body_split_x", axis=1),
    ]
    inits = [const("W_T", w.T.copy()), const("Wb", wb), const("one", np.float32(1.0)),
             const("split3", np.array([H] * 3, np.int64))]
    if linear_before_reset:
        n += [node("MatMul", ["h_in", "R_T"], ["hr0"], "body_matmul_h"),
              node("Add", ["hr0", "Rb"], ["hr"], "body_add_rb"),
              node("Split", ["hr", "split3"], ["hr_z", "hr_r", "hr_h"], "body_split_h", axis=1)]
        inits += [const("R_T", r.T.copy()), const("Rb", rb)]
    else:
        n += [node("MatMul", ["h_in", "R_zr_T"], ["hr0"], "body_matmul_h"),
              node("Add", ["hr0", "Rb_zr"], ["hr"], "body_add_rb"),
              node("Split", ["hr", "split2"], ["hr_z", "hr_r"], "body_split_h", axis=1)]
        inits += [const("R_zr_T", r[:2 * H].T.copy()), const("Rb_zr", rb[:2 * H]),
                  const("R_h_T", r[2 * H:].T.copy()), const("Rb_h", rb[2 * H:]),
                  const("split2", np.array([H] * 2, np.int64))]
    n += [
        node("Add", ["xw_z", "hr_z"], ["z_pre"], "body_add_z"),
        node("Sigmoid", ["z_pre"], ["z"], "body_sigmoid_z"),
        node("Add", ["xw_r", "hr_r"], ["r_pre"], "body_add_r"),
        node("Sigmoid", ["r_pre"], ["r"], "body_sigmoid_r"),
    ]
    if linear_before_reset:
        n += [node("Mul", ["r", "hr_h"], ["rhh"], "body_mul_r")]
    else:
        n += [node("Mul", ["r", "h_in"], ["rh"], "body_mul_r"),
              node("MatMul", ["rh", "R_h_T"], ["rhh0"], "body_matmul_rh"),
              node("Add", ["rhh0", "Rb_h"], ["rhh"], "body_add_rbh")]
    n += [
        node("Add", ["xw_h", "rhh"], ["h_pre"], "body_add_h"),
        node("Tanh", ["h_pre"], ["h_tilde"], "body_tanh"),
        node("Sub", ["one", "z"], ["one_minus_z"], "body_one_minus_z"),
        node("Mul", ["one_minus_z", "h_tilde"], ["new_part"], "body_mul_new"),
        node("Mul", ["z", "h_in"], ["old_part"], "body_mul_old"),
        node("Add", ["new_part", "old_part"], ["h_out"], "body_add_out"),
        node("Identity", ["h_out"], ["y_t"], "body_id"),
    ]
    body = h.make_graph(n, "gru_body", [vi("h_in", ["batch", H]), vi("x_t", ["batch", I])],
                        [vi("h_out", ["batch", H]), vi("y_t", ["batch", H])], initializer=inits)
    name = "scan_gru" if linear_before_reset == 0 else "scan_gru_lbr1"
    g = recurrent_graph(name, body, ["h"], [])
    g.doc_string = f"ONNX GRU as a Scan body, linear_before_reset={linear_before_reset}"
    return hand_model(g, 16)


def scan_lstm():
    """ONNX LSTM, gate order i, o, f, c; f = Sigmoid, g = h = Tanh; no peepholes.

    gates = X W^T + Wb + H R^T + Rb, split into i, o, f, c;
    C' = sig(f) * C + sig(i) * tanh(c);  H' = sig(o) * tanh(C').
    W [4H, I] and R [4H, H] are OUTER-scope initializers (Gemm transB=1); the biases
    Wb, Rb [4H] are BODY initializers: one model mixing both kinds of capture.
    """
    w, r, wb, rb = weights(30, (4 * H, I), (4 * H, H), (4 * H,), (4 * H,))
    body = h.make_graph(
        [node("Gemm", ["x_t", "W", "Wb"], ["xw"], "body_gemm_x", transB=1),
         node("Gemm", ["h_in", "R", "Rb"], ["hr"], "body_gemm_h", transB=1),
         node("Add", ["xw", "hr"], ["gates"], "body_add_gates"),
         node("Split", ["gates", "split4"], ["i_pre", "o_pre", "f_pre", "c_pre"], "body_split",
              axis=1),
         node("Sigmoid", ["i_pre"], ["i"], "body_sigmoid_i"),
         node("Sigmoid", ["o_pre"], ["o"], "body_sigmoid_o"),
         node("Sigmoid", ["f_pre"], ["f"], "body_sigmoid_f"),
         node("Tanh", ["c_pre"], ["c_tilde"], "body_tanh_c"),
         node("Mul", ["f", "c_in"], ["c_keep"], "body_mul_f"),
         node("Mul", ["i", "c_tilde"], ["c_new"], "body_mul_i"),
         node("Add", ["c_keep", "c_new"], ["c_out"], "body_add_c"),
         node("Tanh", ["c_out"], ["c_act"], "body_tanh_h"),
         node("Mul", ["o", "c_act"], ["h_out"], "body_mul_o"),
         node("Identity", ["h_out"], ["y_t"], "body_id")],
        "lstm_body",
        [vi("h_in", ["batch", H]), vi("c_in", ["batch", H]), vi("x_t", ["batch", I])],
        [vi("h_out", ["batch", H]), vi("c_out", ["batch", H]), vi("y_t", ["batch", H])],
        initializer=[const("Wb", wb), const("Rb", rb),
                     const("split4", np.array([H] * 4, np.int64))])
    inits = [const("W", w), const("R", r)]
    return hand_model(recurrent_graph("scan_lstm", body, ["h", "c"], inits), 16)


def scan_nested():
    """Scan inside a Scan body, with a value captured from two graph levels up.

    x [seq, 3]; the inner Scan runs over one row's elements (scalars) carrying a running
    total that starts at the outer state: y = (cumsum(x.ravel() * scale) + s0).reshape(x.shape),
    total = s0 + sum(x * scale). `scale` is an outer-graph initializer read by the inner body.
    """
    inner = h.make_graph(
        [node("Mul", ["e", "scale"], ["e_scaled"], "inner_mul"),
         node("Add", ["acc_in", "e_scaled"], ["acc_out"], "inner_add"),
         node("Identity", ["acc_out"], ["acc_t"], "inner_id")],
        "inner_body", [vi("acc_in", []), vi("e", [])], [vi("acc_out", []), vi("acc_t", [])])
    outer = h.make_graph(
        [node("Scan", ["total_in", "row"], ["total_out", "row_cumsum"], "scan_inner",
              num_scan_inputs=1, body=inner)],
        "outer_body", [vi("total_in", []), vi("row", [3])],
        [vi("total_out", []), vi("row_cumsum", [3])])
    scan = node("Scan", ["s0", "x"], ["total", "y"], "scan_outer", num_scan_inputs=1, body=outer)
    g = h.make_graph([scan], "scan_nested", [vi("s0", []), vi("x", ["seq", 3])],
                     [vi("y", ["seq", 3]), vi("total", [])],
                     initializer=[const("scale", np.float32(0.5))])
    return hand_model(g, 16)


# ---------------------------------------------------------------- exported samples
def torch_scan_rnn(reverse_dim1=False):
    """PyTorch dynamo export of torch._higher_order_ops.scan: h = tanh(ih(x_t) + hh(h)).

    Default: scan over dim 0 of x [seq, batch, 3]. reverse_dim1: x [batch, seq, 3] scanned
    with dim=1, reverse=True, which the exporter lowers to Transpose + Slice(flip) around a
    plain forward axis-0 Scan. Returns (model, expected arrays computed by torch).
    """
    import torch
    from torch._higher_order_ops import scan

    class TorchScanRNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ih = torch.nn.Linear(I, H)
            self.hh = torch.nn.Linear(H, H)

        def forward(self, x, h0):
            def step(h_prev, x_t):
                h_next = torch.tanh(self.ih(x_t) + self.hh(h_prev))
                return h_next, h_next.clone()  # scan forbids output aliasing
            kw = {"dim": 1, "reverse": True} if reverse_dim1 else {}
            h_n, y = scan(step, h0, x, **kw)
            return y, h_n

    TorchScanRNN.__module__ = "scanopt_samples"  # exporter metadata names the class
    torch.manual_seed(0)
    model = TorchScanRNN().eval()
    x = torch.randn((B, T, I) if reverse_dim1 else (T, B, I))
    h0 = torch.randn(B, H)
    seq, batch = torch.export.Dim("seq"), torch.export.Dim("batch")
    x_dims = {0: batch, 1: seq} if reverse_dim1 else {0: seq, 1: batch}
    program = torch.onnx.export(
        model, (x, h0), dynamo=True, input_names=["x", "h0"], output_names=["y", "h_n"],
        dynamic_shapes={"x": x_dims, "h0": {0: batch}}, verbose=False)
    m = program.model_proto
    strip_stack_traces(m)
    with torch.no_grad():
        y, h_n = model(x, h0)
    expected = {"x": x.numpy(), "h0": h0.numpy(), "y": y.numpy(), "h_n": h_n.numpy()}
    return m, expected


def export_torch_sample(module, feeds: dict, outputs: list[str], path: str, *, scripted: bool,
                        axes: dict[str, dict[int, str]]) -> None:
    """Export ``module`` run at ``feeds`` (name -> tensor, in forward's order) to ``path`` and
    write ``<name>.expected.npz`` beside it (the feeds and the module's outputs). ``axes``
    names each input's dynamic axes: TorchScript (``torch.jit.script``, ``dynamo=False``,
    opset 17) takes the names as they are, the dynamo exporter one ``torch.export.Dim(name,
    min=2)`` per name. Stack traces are stripped and the producer stamped."""
    import torch

    with torch.no_grad():
        got = module(*feeds.values())
    got = got if isinstance(got, tuple) else (got,)
    if scripted:
        torch.onnx.export(torch.jit.script(module), tuple(feeds.values()), path, dynamo=False,
                          input_names=list(feeds), output_names=outputs, dynamic_axes=axes, opset_version=17)
        m = onnx.load(path)
    else:
        dims = {n: torch.export.Dim(n, min=2) for named in axes.values() for n in named.values()}
        dynamic = tuple({axis: dims[n] for axis, n in axes.get(k, {}).items()} for k in feeds)
        program = torch.onnx.export(module, tuple(feeds.values()), dynamo=True, input_names=list(feeds),
                                    output_names=outputs, dynamic_shapes=dynamic, verbose=False)
        m = program.model_proto
    save_torch_sample(m, path, feeds, outputs, got)


def save_torch_sample(m, path: str, feeds: dict, outputs: list[str], got) -> None:
    """Write an exported model to ``path`` (stack traces stripped, producer stamped) and
    ``<name>.expected.npz`` beside it: the feeds and the module's outputs ``got``."""
    import torch

    strip_stack_traces(m)
    m.producer_name, m.producer_version = m.producer_name or "pytorch", torch.__version__.split("+")[0]
    onnx.save(m, path)
    expected = {k: v.numpy() for k, v in feeds.items()}
    expected.update({n: v.numpy() for n, v in zip(outputs, got)})
    save_npz(path[: -len(".onnx")] + ".expected.npz", expected)


def export_tf1_sample(graph, feeds: dict, outputs: list[str], path: str, *, opset: int = 13) -> None:
    """Run a TF1 ``graph`` at ``feeds`` (placeholder tensor name -> array), freeze its variables
    into constants, convert it with tf2onnx and save ``path`` plus ``<name>.expected.npz`` (the
    feeds and the session's values of ``outputs``, op names whose ``:0`` tensors are the
    model's outputs)."""
    import tensorflow as tf
    import tf2onnx

    v1 = tf.compat.v1
    tensors = [f"{o}:0" for o in outputs]
    with v1.Session(graph=graph) as sess:
        sess.run(v1.global_variables_initializer())
        got = sess.run(tensors, feeds)
        frozen = v1.graph_util.convert_variables_to_constants(sess, graph.as_graph_def(), outputs)
    model, _ = tf2onnx.convert.from_graph_def(frozen, input_names=list(feeds), output_names=tensors, opset=opset)
    model.producer_version = tf2onnx.__version__
    onnx.save(model, path)
    save_npz(path[: -len(".onnx")] + ".expected.npz", {**feeds, **dict(zip(tensors, got))})


def export_tf_function_sample(fn, feeds: dict, spec: list, path: str, *, opset: int = 17) -> None:
    """Convert the ``tf.function`` ``fn`` (input signature ``spec``) with tf2onnx, save ``path``
    and ``<name>.expected.npz``: the feeds and ``fn``'s eager outputs, named as the model's."""
    import tf2onnx

    model, _ = tf2onnx.convert.from_function(fn, input_signature=tuple(spec), opset=opset)
    model.producer_version = tf2onnx.__version__
    onnx.save(model, path)
    got = fn(*feeds.values())
    got = got if isinstance(got, (tuple, list)) else (got,)
    save_npz(path[: -len(".onnx")] + ".expected.npz",
             {**feeds, **{o.name: g.numpy() for o, g in zip(model.graph.output, got)}})


def strip_stack_traces(m):
    """The exporter stores Python stack traces (absolute paths of this script) per node;
    drop them so the files do not depend on where the repository is checked out."""
    def walk(graph):
        for n in graph.node:
            keep = [p for p in n.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
            del n.metadata_props[:]
            n.metadata_props.extend(keep)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
    walk(m.graph)


def skl_knn_regressor():
    """skl2onnx KNeighborsRegressor: pairwise distances as a Scan with a loop-invariant state."""
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.neighbors import KNeighborsRegressor

    rng = np.random.RandomState(0)
    x_train = rng.randn(20, 3).astype(np.float32)
    y_train = (x_train @ np.array([1.0, -2.0, 0.5], np.float32)).astype(np.float32)
    knn = KNeighborsRegressor(n_neighbors=3).fit(x_train, y_train)
    m = to_onnx(knn, initial_types=[("X", FloatTensorType([None, 3]))], target_opset=17)
    x = rng.randn(6, 3).astype(np.float32)
    expected = {"X": x, "variable": knn.predict(x).astype(np.float32).reshape(-1, 1)}
    return m, expected


EXPORTED = {
    "torch_scan_rnn": torch_scan_rnn,
    "torch_scan_rnn_rev_dim1": lambda: torch_scan_rnn(reverse_dim1=True),
    "skl_knn_regressor": skl_knn_regressor,
}
HAND_BUILT = {
    "scan8_sum": scan8_sum,
    "scan8_sum_seqlens": lambda: scan8_sum(seqlens=True),
    "scan8_reverse_seqlens": scan8_reverse_seqlens,
    "scan9_sum": scan9_sum,
    "scan_axes_directions": scan_axes_directions,
    "scan_short_static": scan_short_static,
    "scan_rnn": scan_rnn,
    "scan_gru": scan_gru,
    "scan_gru_lbr1": lambda: scan_gru(linear_before_reset=1),
    "scan_lstm": scan_lstm,
    "scan_nested": scan_nested,
}


def write(name):
    """Build one sample in this process and save it (plus expected outputs if exported)."""
    if name in HAND_BUILT:
        m = HAND_BUILT[name]()
    else:
        m, expected = EXPORTED[name]()
        assert scan_nodes(m), f"{name}: the exporter emitted no top-level Scan node"
        save_npz(os.path.join(HERE, f"{name}.expected.npz"), expected)
    path = os.path.join(HERE, f"{name}.onnx")
    onnx.save_model(m, path)
    print(f"{name}.onnx  opset {[(o.domain or 'ai.onnx', o.version) for o in m.opset_import]}"
          f"  IR {m.ir_version}  {os.path.getsize(path)} bytes", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append", choices=sorted({**HAND_BUILT, **EXPORTED}),
                   help="regenerate just this sample (repeatable)")
    p.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in args.only or list(HAND_BUILT) + list(EXPORTED):
        if name in HAND_BUILT or args.in_process:
            write(name)
        else:
            export_in_fresh_process(__file__, name)


def export_in_fresh_process(script: str, name: str) -> None:
    """Run ``script --in-process --only name``. Exporters name values from process-wide
    counters (torch: val_N, s27) and order sets by string hash (skl2onnx: opset_import): a
    fresh, hash-seeded process per export makes the file independent of what ran before it."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run([sys.executable, os.path.abspath(script), "--in-process", "--only", name], env=env, check=True)


def run_generator(script, doc, names, write_one, out=None, argv=None):
    """The command line of an exported-sample generator: every sample (or --only ones), each
    exported in a fresh process (:func:`export_in_fresh_process`) unless --in-process."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--only", action="append", choices=names)
    p.add_argument("--in-process", action="store_true", help="export here (default: a fresh process per sample)")
    args = p.parse_args(argv)
    if out:
        os.makedirs(out, exist_ok=True)
    for name in args.only or names:
        if args.in_process:
            write_one(name)
        else:
            export_in_fresh_process(script, name)


def run_producer_generator(script, doc, writers: dict, out: str, tf_names, tf1_names=()) -> None:
    """The command line of a held-out producer generator; ``writers`` maps each sample name to
    the function that writes it. Without --only, a TensorFlow interpreter writes the samples in
    ``tf_names`` and any other interpreter the rest, each in a fresh process. TF1 rnn_cell
    classes live in tf-keras and Keras 3 layers need keras 3: a sample in ``tf1_names`` gets
    TF_USE_LEGACY_KERAS=1, any other 0, set before TensorFlow loads."""
    import importlib.util

    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    os.environ["TF_USE_LEGACY_KERAS"] = "1" if only in tf1_names else "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    tf_found = importlib.util.find_spec("tensorflow") is not None
    group = [n for n in writers if (n in tf_names) == tf_found]
    run_generator(script, doc, list(writers), lambda name: writers[name](name), out,
                  argv=None if "--only" in sys.argv else sys.argv[1:] + [a for n in group for a in ("--only", n)])


if __name__ == "__main__":
    main()
