"""Write models/epilogue/: PyTorch 2.13 exports of recurrences that emit, per step, a function of
the new state beside it (canonicalize computes those after the loop, so the cell fuses).

    python models/generate_epilogue.py [--only NAME] [--in-process]

Each ``NAME.onnx`` comes with ``NAME.expected.npz`` (inputs and torch's outputs):
- dyn_scan_rnn_logits:   dynamo ``scan`` HOP: tanh RNN of two nn.Linear, emits h and the logits
  ``nn.Linear(H, V)(h)`` per step (an RNN language model); outputs y, logits, h_n
- dyn_scan_gru_softmax:  dynamo ``scan`` HOP: nn.GRUCell, emits ``softmax(W h, -1)`` and h
- ts_rnn_logits:         TorchScript loop over ``range(x.size(0))``, tanh RNN, logits appended to
  a list beside h and stacked (loop_to_scan makes it a Scan first); the exporter declares
  both stacked outputs with one set of dim names, which says H = V: each output gets its
  own names here (:func:`_own_dim_names`)
x is [T, B, I] with T and B dynamic.
"""

from __future__ import annotations

import os

from generate import HERE, run_generator, save_torch_sample

OUT = os.path.join(HERE, "epilogue")
T, B, I, H, V = 5, 3, 3, 4, 7
NAMES = ["dyn_scan_rnn_logits", "dyn_scan_gru_softmax", "ts_rnn_logits"]
OUTPUTS = {"dyn_scan_rnn_logits": ["y", "logits", "h_n"], "dyn_scan_gru_softmax": ["probs", "y", "h_n"],
           "ts_rnn_logits": ["y", "logits", "h_n"]}


def _modules():
    import torch
    from torch import nn
    from torch._higher_order_ops import scan

    class RNNLogits(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh, self.out = nn.Linear(I, H), nn.Linear(H, H), nn.Linear(H, V)

        def forward(self, x, h0):
            def step(h, x_t):
                h = torch.tanh(self.wi(x_t) + self.wh(h))
                return h, (h.clone(), self.out(h))
            h_n, (y, logits) = scan(step, h0, x)
            return y, logits, h_n

    class GRUSoftmax(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell, self.out = nn.GRUCell(I, H), nn.Linear(H, V, bias=False)

        def forward(self, x, h0):
            def step(h, x_t):
                h = self.cell(x_t, h)
                return h, (torch.softmax(self.out(h), dim=-1), h.clone())
            h_n, (probs, y) = scan(step, h0, x)
            return probs, y, h_n

    class ScriptedRNNLogits(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh, self.out = nn.Linear(I, H), nn.Linear(H, H), nn.Linear(H, V)

        def forward(self, x, h):
            hs, logits = [], []
            for i in range(x.size(0)):
                h = torch.tanh(self.wi(x[i]) + self.wh(h))
                hs.append(h)
                logits.append(self.out(h))
            return torch.stack(hs), torch.stack(logits), h

    return {"dyn_scan_rnn_logits": RNNLogits, "dyn_scan_gru_softmax": GRUSoftmax, "ts_rnn_logits": ScriptedRNNLogits}


def _own_dim_names(model) -> None:
    """TorchScript's export declares every stacked list output with the first one's dim names
    (``logits`` gets ``ConcatFromSequencey_dim_2``, y's H, though its size is V): a
    declaration that says two different sizes are one. Each output gets names of its own."""
    taken = set()
    for value in model.graph.output:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in taken:
                dim.dim_param = f"{value.name}_dim_{dim.dim_param.rsplit('_', 1)[-1]}"
        taken |= {d.dim_param for d in value.type.tensor_type.shape.dim if d.dim_param}


def write(name):
    import onnx
    import torch

    torch.manual_seed(0)
    feeds = {"x": torch.randn(T, B, I), "h0": torch.randn(B, H)}
    torch.manual_seed(1)
    module = _modules()[name]().eval()
    module.__module__ = "scanopt_samples"
    with torch.no_grad():
        got = module(*feeds.values())
    outputs = OUTPUTS[name]
    path = os.path.join(OUT, f"{name}.onnx")
    if name.startswith("ts_"):
        dynamic = {"x": {0: "T", 1: "B"}, "h0": {0: "B"}}
        torch.onnx.export(torch.jit.script(module), tuple(feeds.values()), path, dynamo=False,
                          input_names=list(feeds), output_names=outputs, dynamic_axes=dynamic, opset_version=17)
        m = onnx.load(path)
        _own_dim_names(m)
    else:
        seq, batch = torch.export.Dim("seq", min=2), torch.export.Dim("batch", min=2)
        dynamic = tuple({0: seq, 1: batch} if k == "x" else {0: batch} for k in feeds)
        program = torch.onnx.export(module, tuple(feeds.values()), dynamo=True, input_names=list(feeds),
                                    output_names=outputs, dynamic_shapes=dynamic, verbose=False)
        m = program.model_proto
    save_torch_sample(m, path, feeds, outputs, got)


if __name__ == "__main__":
    run_generator(__file__, __doc__, NAMES, write, OUT)
