"""Regenerate the recurrent-cell samples in models/cells/ (the fuse pass's), deterministically.

    python models/generate_cells.py                  # all of them
    python models/generate_cells.py --only torch_scan_gru

PyTorch exports (need `pip install torch==2.13.0 onnxscript`, imported lazily; the
tests never import torch) of ``torch._higher_order_ops.scan`` over:
- torch_scan_gru:            nn.GRUCell, x [seq, batch, 3]  (one Gemm per source + Split into r, z, n)
- torch_scan_lstm:           nn.LSTMCell with an (h, c) carry (Gemm + Add + Split into i, f, g, o)
- torch_scan_gru_unbatched:  nn.GRUCell on x [seq, 3], h [4] (Unsqueeze/Squeeze around the cell)
- torch_scan_gru_manual_rev: a GRU written with six nn.Linear, (r*h) inside the candidate
                             (linear_before_reset=0), scanned with dim=1, reverse=True
Each comes with <name>.expected.npz: inputs and the outputs torch computed.
- torch_{gru,lstm}_cell_noopt: nn.GRUCell / nn.LSTMCell exported with optimize=False
                             (SplitToSequence + SequenceAt chunks, biases in Gemm C)
- torch_rnn_half[_noopt]:    a hand-written tanh RNN with float16 weights cast in the step
- torch_lstm_{concat,coupled}_noopt: cat([x, h]) @ K chunked into gates; the coupled one
                             computes c' = f⊙c + (1-f)⊙g (input_forget=1)
- torch_bigru[_noopt]:       two GRUCells, scan(...) and scan(..., reverse=True) over one x
                             (the exporter reverses x with Slice step -1: a bidirectional pair)
The issue-12 samples are exported at T=16, B=4 (dynamic seq/batch).
- torch_scan_lstm_hc:         nn.LSTMCell scanned over x [seq, batch, 3], returning (h, c) per step
- torch_scan_lstm_hc_flip:    the same batch-first, scanned with dim=1 over flip(x) and flipped
                              back, also returning tanh(c) per step
- torch_script_lstm_hc_stack: TorchScript (dynamo=False) for-loop appending h and c, stacked
- torch_script_lstmcell_hc:   TorchScript loop over nn.LSTMCell stacking h and c: the cell is a
                              one-step native LSTM inside the Loop
(issue 20: the per-step cell state; T=16, B=4, dynamic seq/batch.)
Hand-built (onnx only):
- keras_concat_lstm: Keras/TF BasicLSTMCell style: one MatMul of Concat([x, h]) by a kernel
  [I+H, 4H], gates i, c, f, o, forget bias 1.0 added to f, no batch size declared.
- keras_gru_reset_after, tf1_gru_cell, tf1_basic_rnn_cell, coupled_lstm,
  gru_weights_transposed_outer, lstm_fp16_weights, rnn_packed_slice_leakyrelu_clip,
  rnn_bias_gemm_c_adds: the forms of tests/cell_builders.py (see HAND_BUILT).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h

from generate import HERE, IR_VERSION, PRODUCER, export_in_fresh_process, save_npz, strip_stack_traces, weights

OUT = os.path.join(HERE, "cells")

T, B, I, H = 5, 2, 3, 4


def _export(module, args, names, dynamic, outputs, optimize=True):
    import torch

    program = torch.onnx.export(module, args, dynamo=True, input_names=names, output_names=outputs,
                                dynamic_shapes=dynamic, verbose=False, optimize=optimize)
    m = program.model_proto
    strip_stack_traces(m)
    with torch.no_grad():
        got = module(*args)
    expected = {n: a.numpy() for n, a in zip(names, args)}
    expected.update({n: v.numpy() for n, v in zip(outputs, got)})
    return m, expected


def torch_scan_gru(unbatched=False):
    import torch
    from torch._higher_order_ops import scan

    class ScanGRU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = torch.nn.GRUCell(I, H)

        def forward(self, x, h0):
            def step(h_prev, x_t):
                h_next = self.cell(x_t, h_prev)
                return h_next, h_next.clone()

            h_n, y = scan(step, h0, x)
            return y, h_n

    ScanGRU.__module__ = "scanopt_samples"
    torch.manual_seed(1)
    model = ScanGRU().eval()
    seq, batch = torch.export.Dim("seq"), torch.export.Dim("batch")
    if unbatched:
        x, h0 = torch.randn(T, I), torch.randn(H)
        dynamic = {"x": {0: seq}, "h0": {}}
    else:
        x, h0 = torch.randn(T, B, I), torch.randn(B, H)
        dynamic = {"x": {0: seq, 1: batch}, "h0": {0: batch}}
    return _export(model, (x, h0), ["x", "h0"], dynamic, ["y", "h_n"])


def torch_scan_lstm():
    import torch
    from torch._higher_order_ops import scan

    class ScanLSTM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = torch.nn.LSTMCell(I, H)

        def forward(self, x, h0, c0):
            def step(carry, x_t):
                h_next, c_next = self.cell(x_t, carry)
                return (h_next, c_next), h_next.clone()

            (h_n, c_n), y = scan(step, (h0, c0), x)
            return y, h_n, c_n

    ScanLSTM.__module__ = "scanopt_samples"
    torch.manual_seed(2)
    model = ScanLSTM().eval()
    x, h0, c0 = torch.randn(T, B, I), torch.randn(B, H), torch.randn(B, H)
    seq, batch = torch.export.Dim("seq"), torch.export.Dim("batch")
    dynamic = {"x": {0: seq, 1: batch}, "h0": {0: batch}, "c0": {0: batch}}
    return _export(model, (x, h0, c0), ["x", "h0", "c0"], dynamic, ["y", "h_n", "c_n"])


def torch_scan_gru_manual_rev():
    import torch
    from torch._higher_order_ops import scan

    class ManualGRU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            lin = torch.nn.Linear
            self.xz, self.xr, self.xn = lin(I, H), lin(I, H), lin(I, H)
            self.hz, self.hr, self.hn = lin(H, H, bias=False), lin(H, H, bias=False), lin(H, H)

        def forward(self, x, h0):
            def step(h_prev, x_t):
                z = torch.sigmoid(self.xz(x_t) + self.hz(h_prev))
                r = torch.sigmoid(self.xr(x_t) + self.hr(h_prev))
                n = torch.tanh(self.xn(x_t) + self.hn(r * h_prev))
                h_next = (1 - z) * n + z * h_prev
                return h_next, h_next.clone()

            h_n, y = scan(step, h0, x, dim=1, reverse=True)
            return y, h_n

    ManualGRU.__module__ = "scanopt_samples"
    torch.manual_seed(3)
    model = ManualGRU().eval()
    x, h0 = torch.randn(B, T, I), torch.randn(B, H)
    seq, batch = torch.export.Dim("seq"), torch.export.Dim("batch")
    return _export(model, (x, h0), ["x", "h0"], {"x": {0: batch, 1: seq}, "h0": {0: batch}}, ["y", "h_n"])


TB = 16, 4  # seq, batch of the issue-12 PyTorch samples' expected outputs (tests run T = 16 ... 200, B = 1, 4)


def _torch_cells(kind):
    """Recurrent step functions as people write them in PyTorch, for ``torch._higher_order_ops.scan``."""
    import torch

    nn = torch.nn

    class Cells(nn.Module):
        def __init__(self):
            super().__init__()
            if kind == "gru_cell":
                self.cell = nn.GRUCell(I, H)
            elif kind == "lstm_cell":
                self.cell = nn.LSTMCell(I, H)
            elif kind == "rnn_manual_half":  # weights kept in float16, cast to float32 in the step
                self.W = nn.Parameter(torch.randn(H, I).half() * 0.5)
                self.R = nn.Parameter(torch.randn(H, H).half() * 0.5)
                self.b = nn.Parameter(torch.randn(H) * 0.1)
            elif kind in ("lstm_concat", "lstm_coupled"):
                self.K = nn.Parameter(torch.randn(I + H, 4 * H if kind == "lstm_concat" else 3 * H) * 0.4)
                self.b = nn.Parameter(torch.randn(self.K.shape[1]) * 0.1)
            elif kind == "bigru":
                self.fwd, self.bwd = nn.GRUCell(I, H), nn.GRUCell(I, H)

        def step(self, carry, x_t):
            if kind in ("gru_cell", "bigru"):
                raise AssertionError
            if kind == "lstm_cell":
                h, c = self.cell(x_t, carry)
                return (h, c), h.clone()
            if kind == "rnn_manual_half":
                h = torch.tanh(x_t @ self.W.float().t() + carry @ self.R.float().t() + self.b)
                return h, h.clone()
            h, c = carry
            gates = torch.cat([x_t, h], dim=-1) @ self.K + self.b
            if kind == "lstm_concat":
                i, f, g, o = gates.chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            else:  # coupled input-forget gate: c' = f⊙c + (1 - f)⊙g
                f, g, o = gates.chunk(3, dim=-1)
                f = torch.sigmoid(f)
                c = f * c + (1 - f) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            return (h, c), h.clone()

        def forward(self, x, h0, *rest):
            from torch._higher_order_ops import scan

            def gru_step(cell):
                def step(h, x_t):
                    h = cell(x_t, h)
                    return h, h.clone()
                return step

            if kind == "gru_cell":
                h_n, y = scan(gru_step(self.cell), h0, x)
                return y, h_n
            if kind == "bigru":
                hf, yf = scan(gru_step(self.fwd), h0, x)
                hb, yb = scan(gru_step(self.bwd), rest[0], x, reverse=True)
                return yf, yb, hf, hb
            if rest:
                (h_n, c_n), y = scan(self.step, (h0, rest[0]), x)
                return y, h_n, c_n
            h_n, y = scan(self.step, h0, x)
            return y, h_n

    Cells.__module__ = "scanopt_samples"
    return Cells


def torch_cell_sample(kind, optimize):
    """A PyTorch cell scanned over x [seq, batch, I], exported by the dynamo exporter."""
    import torch

    torch.manual_seed(12)
    model = _torch_cells(kind)().eval()
    T_, B_ = TB
    x, h0 = torch.randn(T_, B_, I), torch.randn(B_, H)
    seq, batch = torch.export.Dim("seq"), torch.export.Dim("batch")
    args, names, dynamic = (x, h0), ["x", "h0"], {"x": {0: seq, 1: batch}, "h0": {0: batch}}
    outputs = ["y", "h_n"]
    if kind.startswith("lstm"):
        args, names, outputs = args + (torch.randn(B_, H),), names + ["c0"], outputs + ["c_n"]
        dynamic["c0"] = {0: batch}
    if kind == "bigru":
        args, names, outputs = args + (torch.randn(B_, H),), names + ["h0_b"], ["y_f", "y_b", "h_f", "h_b"]
        dynamic["h0_b"] = {0: batch}
    dynamic = tuple(dynamic[n] for n in names[:2]) + ((tuple(dynamic[n] for n in names[2:]),) if names[2:] else ())
    return _export(model, args, names, dynamic, outputs, optimize=optimize)


def keras_concat_lstm():
    """gates = [x, h]·K + b split into i, c, f, o; c' = σ(f + 1)⊙c + σ(i)⊙tanh(c~); h' = σ(o)⊙tanh(c')."""
    kernel, bias = weights(40, (I + H, 4 * H), (4 * H,))
    vi = h.make_tensor_value_info
    n = h.make_node
    body = h.make_graph(
        [n("Concat", ["x_t", "h_in"], ["xh"], "body_concat", axis=-1),
         n("MatMul", ["xh", "kernel"], ["xk"], "body_matmul"),
         n("Add", ["xk", "bias"], ["gates"], "body_bias"),
         n("Split", ["gates", "split4"], ["i_pre", "c_pre", "f_pre", "o_pre"], "body_split", axis=-1),
         n("Add", ["f_pre", "forget_bias"], ["f_biased"], "body_forget_bias"),
         n("Sigmoid", ["i_pre"], ["i"], "body_i"),
         n("Tanh", ["c_pre"], ["c_tilde"], "body_c"),
         n("Sigmoid", ["f_biased"], ["f"], "body_f"),
         n("Sigmoid", ["o_pre"], ["o"], "body_o"),
         n("Mul", ["c_in", "f"], ["c_keep"], "body_keep"),
         n("Mul", ["i", "c_tilde"], ["c_add"], "body_add_in"),
         n("Add", ["c_keep", "c_add"], ["c_out"], "body_c_out"),
         n("Tanh", ["c_out"], ["c_act"], "body_c_act"),
         n("Mul", ["o", "c_act"], ["h_out"], "body_h_out"),
         n("Identity", ["h_out"], ["y_t"], "body_y")],
        "keras_lstm_body",
        [vi("c_in", TP.FLOAT, [None, H]), vi("h_in", TP.FLOAT, [None, H]), vi("x_t", TP.FLOAT, [None, I])],
        [vi("c_out", TP.FLOAT, [None, H]), vi("h_out", TP.FLOAT, [None, H]), vi("y_t", TP.FLOAT, [None, H])],
        initializer=[onnx.numpy_helper.from_array(np.array([H] * 4, np.int64), "split4"),
                     onnx.numpy_helper.from_array(np.float32(1.0), "forget_bias")])
    scan = n("Scan", ["c0", "h0", "X"], ["c_n", "h_n", "Y"], "keras_lstm", num_scan_inputs=1,
             scan_input_axes=[1], scan_output_axes=[1], body=body)
    g = h.make_graph(
        [scan], "keras_concat_lstm",
        [vi("X", TP.FLOAT, ["batch", "seq", I]), vi("c0", TP.FLOAT, ["batch", H]), vi("h0", TP.FLOAT, ["batch", H])],
        [vi("Y", TP.FLOAT, ["batch", "seq", H]), vi("h_n", TP.FLOAT, ["batch", H]), vi("c_n", TP.FLOAT, ["batch", H])],
        initializer=[onnx.numpy_helper.from_array(kernel, "kernel"), onnx.numpy_helper.from_array(bias, "bias")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=IR_VERSION, producer_name=PRODUCER)
    onnx.checker.check_model(m, full_check=True)
    return m


def _lstm_hc_modules():
    """LSTMCell recurrences that return the cell state of every step beside h (issue 20)."""
    import torch
    from torch import nn
    from torch._higher_order_ops import scan

    class ScanHC(nn.Module):  # time-major x [T, B, I]; y, cs = every h, every c
        def __init__(self):
            super().__init__()
            self.cell = nn.LSTMCell(I, H)

        def forward(self, x, h0, c0):
            def step(carry, x_t):
                h, c = self.cell(x_t, carry)
                return (h, c), (h.clone(), c.clone())

            (h_n, c_n), (y, cs) = scan(step, (h0, c0), x)
            return y, cs, h_n, c_n

    class ScanHCFlip(ScanHC):  # batch-first x [B, T, I] read backwards by flip; tanh(c) per step too
        def forward(self, x, h0, c0):
            def step(carry, x_t):
                h, c = self.cell(x_t, carry)
                return (h, c), (h.clone(), c.clone(), torch.tanh(c))

            (h_n, c_n), (y, cs, ts) = scan(step, (h0, c0), torch.flip(x, [1]), dim=1)
            return torch.flip(y, [1]), torch.flip(cs, [1]), ts, h_n, c_n

    class ScriptHCStack(nn.Module):  # TorchScript for-loop appending h and c to lists, stacked
        # (gates written out: TorchScript exports nn.LSTMCell as a one-step LSTM op in the Loop)
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, 4 * H), nn.Linear(H, 4 * H)

        def forward(self, x, h, c):
            hs, cs = [], []
            for i in range(x.size(0)):
                g_i, g_f, g_g, g_o = (self.wi(x[i]) + self.wh(h)).chunk(4, 1)
                c = torch.sigmoid(g_f) * c + torch.sigmoid(g_i) * torch.tanh(g_g)
                h = torch.sigmoid(g_o) * torch.tanh(c)
                hs.append(h)
                cs.append(c)
            return torch.stack(hs), torch.stack(cs), h, c

    return {"torch_scan_lstm_hc": ScanHC, "torch_scan_lstm_hc_flip": ScanHCFlip,
            "torch_script_lstm_hc_stack": ScriptHCStack}


def torch_lstm_hc(name):
    """Export one of :func:`_lstm_hc_modules` at T=16, B=4 (dynamic seq and batch)."""
    import torch

    from generate import export_torch_sample

    torch.manual_seed(20)
    modules = {**_lstm_hc_modules(), **_script_cell_modules()}
    module = modules[name]().eval()
    module.__module__ = "scanopt_samples"
    T_, B_ = TB
    first = name == "torch_scan_lstm_hc_flip"
    x = torch.randn(B_, T_, I) if first else torch.randn(T_, B_, I)
    feeds = {"x": x, "h0": torch.randn(B_, H), "c0": torch.randn(B_, H)}
    scripted = name.startswith("torch_script")
    seq, batch = ("T", "B") if scripted else ("seq", "batch")
    axes = {"x": {1: seq, 0: batch} if first else {0: seq, 1: batch}, "h0": {0: batch}, "c0": {0: batch}}
    outputs = ["y", "c_seq", "tanh_c_seq", "h_n", "c_n"] if first else ["y", "c_seq", "h_n", "c_n"]

    export_torch_sample(module, feeds, outputs, os.path.join(OUT, f"{name}.onnx"), scripted=scripted, axes=axes)


def _script_cell_modules():
    """A TorchScript for-loop over ``nn.LSTMCell``: the cell is exported as a one-step native
    LSTM inside the Loop. (``nn.GRUCell`` in a scripted loop does not export with torch 2.13:
    "ONNX symbolic expected node type prim::ListConstruct".)"""
    import torch
    from torch import nn

    class LSTMCellHC(nn.Module):  # h and c of every step stacked
        def __init__(self):
            super().__init__()
            self.cell = nn.LSTMCell(I, H)

        def forward(self, x, h, c):
            hs, cs = [], []
            for i in range(x.size(0)):
                h, c = self.cell(x[i], (h, c))
                hs.append(h)
                cs.append(c)
            return torch.stack(hs), torch.stack(cs), h, c

    return {"torch_script_lstmcell_hc": LSTMCellHC}


LSTM_HC = ("torch_scan_lstm_hc", "torch_scan_lstm_hc_flip", "torch_script_lstm_hc_stack", "torch_script_lstmcell_hc")

EXPORTED = {
    "torch_scan_gru": torch_scan_gru,
    "torch_scan_gru_unbatched": lambda: torch_scan_gru(unbatched=True),
    "torch_scan_lstm": torch_scan_lstm,
    "torch_scan_gru_manual_rev": torch_scan_gru_manual_rev,
    "torch_gru_cell_noopt": lambda: torch_cell_sample("gru_cell", False),
    "torch_lstm_cell_noopt": lambda: torch_cell_sample("lstm_cell", False),
    "torch_rnn_half_noopt": lambda: torch_cell_sample("rnn_manual_half", False),
    "torch_rnn_half": lambda: torch_cell_sample("rnn_manual_half", True),
    "torch_lstm_concat_noopt": lambda: torch_cell_sample("lstm_concat", False),
    "torch_lstm_coupled_noopt": lambda: torch_cell_sample("lstm_coupled", False),
    "torch_bigru": lambda: torch_cell_sample("bigru", True),
    "torch_bigru_noopt": lambda: torch_cell_sample("bigru", False),
}
def _builder_sample(build, kind, **body_kw):
    """A cell written by tests/cell_builders.py (onnx.helper only) in one of the forms of issue 12."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import cell_builders as cb

    body = cb.Body(**body_kw)
    res = build(cb, body)
    states = [("h", res[0], body.H), ("c", res[1], body.H)] if kind == "LSTM" else [("h", res, body.H)]
    m = cb.scan_model(body, states, ys=[states[0][1]])
    m.producer_name = PRODUCER
    onnx.checker.check_model(m, full_check=True)
    return m


HAND_BUILT = {
    "keras_concat_lstm": keras_concat_lstm,
    # Keras GRU(reset_after=True): kernel/recurrent_kernel in gate order z, r, h, bias [2, 3H] packed
    "keras_gru_reset_after": lambda: _builder_sample(lambda cb, b: cb.keras_gru(b, "x", "h"), "GRU"),
    # TF1 GRUCell: σ(Concat([x, h])·Kg) split into r, u; tanh(Concat([x, r⊙h])·Kc); u⊙h + (1-u)⊙c
    "tf1_gru_cell": lambda: _builder_sample(lambda cb, b: cb.concat_gru(b, "x", "h"), "GRU"),
    "tf1_basic_rnn_cell": lambda: _builder_sample(lambda cb, b: cb.concat_rnn(b, "x", "h"), "RNN"),
    # c' = (1-i)⊙c + i⊙g: the native LSTM's input_forget=1
    "coupled_lstm": lambda: _builder_sample(lambda cb, b: cb.coupled_lstm(b, "x", "h", "c", write="input"), "LSTM"),
    # weights stored transposed and Transposed back in the main graph
    "gru_weights_transposed_outer": lambda: _builder_sample(lambda cb, b: cb.gru(b, "x", "h", lbr=1), "GRU",
                                                            wrap="transpose", wrap_where="outer"),
    # float16 initializers Cast to float32 in the body
    "lstm_fp16_weights": lambda: _builder_sample(lambda cb, b: cb.lstm(b, "x", "h", "c"), "LSTM", wrap="cast16"),
    # weights Sliced out of packed initializers; LeakyRelu(0.2) with a Clip(±0.8) on the pre-activation
    "rnn_packed_slice_leakyrelu_clip": lambda: _builder_sample(
        lambda cb, b: cb.rnn(b, "x", "h", act="LeakyRelu", act_attrs={"alpha": 0.2}, clip=0.8), "RNN", wrap="slice"),
    # the bias in a Gemm's C (beta 0.5) and two more Adds
    "rnn_bias_gemm_c_adds": lambda: _builder_sample(lambda cb, b: cb.many_bias_rnn(b, "x", "h"), "RNN"),
}


def write(name):
    if name in LSTM_HC:  # export_torch_sample writes the model and its expected outputs
        torch_lstm_hc(name)
        return
    if name in HAND_BUILT:
        m = HAND_BUILT[name]()
    else:
        m, expected = EXPORTED[name]()
        assert any(nd.op_type == "Scan" for nd in m.graph.node), f"{name}: no top-level Scan"
        save_npz(os.path.join(OUT, f"{name}.expected.npz"), expected)
    path = os.path.join(OUT, f"{name}.onnx")
    onnx.save_model(m, path)
    print(f"{name}.onnx  opset {[(o.domain or 'ai.onnx', o.version) for o in m.opset_import]}"
          f"  IR {m.ir_version}  {os.path.getsize(path)} bytes", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append", choices=sorted({**HAND_BUILT, **EXPORTED, **dict.fromkeys(LSTM_HC)}))
    p.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in args.only or list(HAND_BUILT) + list(EXPORTED) + list(LSTM_HC):
        if name in HAND_BUILT or args.in_process:
            write(name)
        else:
            export_in_fresh_process(__file__, name)


if __name__ == "__main__":
    main()
