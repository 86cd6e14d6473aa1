"""Write models/fission/: PyTorch 2.13 exports of recurrences whose state is a pair, a cell
and an accumulation of its output (canonicalize's loop fission splits them so the cell
fuses and the accumulation becomes CumSum or linrec's form).

    python models/generate_fission.py [--only NAME] [--in-process]

Each ``NAME.onnx`` comes with ``NAME.expected.npz`` (inputs and torch's outputs):
- dyn_scan_rnn_sum:   dynamo ``scan`` HOP, carry (h, s): tanh RNN, s + h; outputs y, h_n, s_n
- dyn_scan_lstm_ema:  dynamo ``scan`` HOP, carry (h, c, e): nn.LSTMCell, e = 0.9 e + 0.1 h
- ts_rnn_sum_stack:   TorchScript loop over ``range(x.size(0))``, tanh RNN of two nn.Linear, a
  running sum beside h, ``torch.stack(outs)`` (loop_to_scan makes it a Scan first)
x is [T, B, I] with T and B dynamic.
"""

from __future__ import annotations

import os

from generate import HERE, run_generator, save_torch_sample

OUT = os.path.join(HERE, "fission")
T, B, I, H = 5, 3, 3, 4
NAMES = ["dyn_scan_rnn_sum", "dyn_scan_lstm_ema", "ts_rnn_sum_stack"]
OUTPUTS = {"dyn_scan_rnn_sum": ["y", "h_n", "s_n"], "dyn_scan_lstm_ema": ["y", "h_n", "c_n", "e_n"],
           "ts_rnn_sum_stack": ["y", "h_n", "s_n"]}


def _modules():
    import torch
    from torch import nn
    from torch._higher_order_ops import scan

    class RNNSum(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, H), nn.Linear(H, H)

        def forward(self, x, h0, s0):
            def step(carry, x_t):
                h, s = carry
                h = torch.tanh(self.wi(x_t) + self.wh(h))
                return (h, s + h), h.clone()
            (h_n, s_n), y = scan(step, (h0, s0), x)
            return y, h_n, s_n

    class LSTMEma(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = nn.LSTMCell(I, H)

        def forward(self, x, h0, c0, e0):
            def step(carry, x_t):
                h, c, e = carry
                h, c = self.cell(x_t, (h, c))
                return (h, c, 0.9 * e + 0.1 * h), h.clone()
            (h_n, c_n, e_n), y = scan(step, (h0, c0, e0), x)
            return y, h_n, c_n, e_n

    class ScriptedRNNSum(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, H), nn.Linear(H, H)

        def forward(self, x, h, s):
            outs = []
            for i in range(x.size(0)):
                h = torch.tanh(self.wi(x[i]) + self.wh(h))
                s = s + h
                outs.append(h)
            return torch.stack(outs), h, s

    return {"dyn_scan_rnn_sum": RNNSum, "dyn_scan_lstm_ema": LSTMEma, "ts_rnn_sum_stack": ScriptedRNNSum}


def write(name):
    import onnx
    import torch

    torch.manual_seed(0)
    states = {"dyn_scan_rnn_sum": ["h0", "s0"], "dyn_scan_lstm_ema": ["h0", "c0", "e0"],
              "ts_rnn_sum_stack": ["h0", "s0"]}[name]
    feeds = {"x": torch.randn(T, B, I), **{k: torch.randn(B, H) for k in states}}
    torch.manual_seed(1)
    module = _modules()[name]().eval()
    module.__module__ = "scanopt_samples"
    with torch.no_grad():
        got = module(*feeds.values())
    outputs = OUTPUTS[name]
    path = os.path.join(OUT, f"{name}.onnx")
    if name.startswith("ts_"):
        dynamic = {"x": {0: "T", 1: "B"}, **{k: {0: "B"} for k in states}}
        torch.onnx.export(torch.jit.script(module), tuple(feeds.values()), path, dynamo=False,
                          input_names=list(feeds), output_names=outputs, dynamic_axes=dynamic, opset_version=17)
        m = onnx.load(path)
    else:
        seq, batch = torch.export.Dim("seq", min=2), torch.export.Dim("batch", min=2)
        dynamic = tuple({0: seq, 1: batch} if k == "x" else {0: batch} for k in feeds)
        program = torch.onnx.export(module, tuple(feeds.values()), dynamo=True, input_names=list(feeds),
                                    output_names=outputs, dynamic_shapes=dynamic, verbose=False)
        m = program.model_proto
    save_torch_sample(m, path, feeds, outputs, got)


if __name__ == "__main__":
    run_generator(__file__, __doc__, NAMES, write, OUT)
