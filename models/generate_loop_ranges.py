"""Regenerate models/loop_ranges/: TorchScript loops over every ``range`` form, deterministically.

    python models/generate_loop_ranges.py                  # all of them
    python models/generate_loop_ranges.py --only ts_range_reverse

PyTorch 2.13 TorchScript exporter (``torch.onnx.export(torch.jit.script(m), ...,
dynamo=False)``; torch imported lazily, the tests never import torch) of a tanh RNN step
``h = tanh(wi(x[j]) + wh(h))`` in a scripted for-loop, with n = x.size(0). TorchScript
writes ``range(a, b, s)`` as the trip count ``Cast(Ceil(Div(Cast(b - a), s)))`` (float32)
or ``b - a`` and the index as ``a + i·s``. The forms (loop range: row read, how outputs stack):
- ts_range_n:          range(n): x[i], list + stack
- ts_range_0_n_1:      range(0, n, 1): x[i], list + stack
- ts_range_reverse:    range(n-1, -1, -1): x[i], list + stack
- ts_range_reverse_cat: range(n-1, -1, -1): x[i], ``torch.cat([y, h.unsqueeze(0)])``
- ts_range_1_n:        range(1, n): x[i], list + stack (reads rows 1 .. n-1)
- ts_range_1_n_prev:   range(1, n): x[i-1], list + stack (rows 0 .. n-2)
- ts_read_last_minus:  range(n): x[-1-i], list + stack (rows n-1 .. 0 by negative indices)
- ts_read_prev:        range(n): x[i-1], list + stack (rows n-1, 0, 1, .. n-2: wraps at i=0)
- ts_read_n_minus:     range(n): x[n-1-i], list + torch.cat of unsqueezed rows
- ts_range_bf_reverse: batch-first x [B, T, I], range(x.size(1)-1, -1, -1): x[:, i], stack(outs, 1)
- ts_read_diff:        range(n-1): x[i+1] - x[i] (two reads of x, one cut, one gathered)
- ts_read_n_minus_i_minus_1: range(n): x[n-i-1] (the reversed read, spelt (n-i)-1)
- ts_range_half:       range(n // 2, n): x[i] (a start computed from n)
- ts_range_rev_offset: range(n-2, -1, -1): x[i+1]
- ts_range_reverse_cat_list: range(n-1, -1, -1): x[i], ``torch.cat(outs, 1)`` ([B, n·H])
Not scans (they stay Loops, with a reason):
- ts_range_step2:      range(0, n, 2): x[i], every second row
- ts_range_neg_step2:  range(n-1, -1, -2): x[i], every second row backwards
- ts_break:            range(n) with ``if h.sum() > 100: break`` (a data-dependent exit)
Each comes with <name>.expected.npz: inputs and the outputs torch computed.
"""

from __future__ import annotations

import os

from generate import HERE, run_generator, save_torch_sample

OUT = os.path.join(HERE, "loop_ranges")
T, B, I, H = 5, 2, 3, 4


def _modules():
    import torch
    from torch import nn

    class Base(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, H), nn.Linear(H, H)

        def step(self, x_t, h):
            return torch.tanh(self.wi(x_t) + self.wh(h))

    class RangeN(Base):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0)):
                h = self.step(x[i], h)
                outs.append(h)
            return torch.stack(outs), h

    class Range0N1(Base):
        def forward(self, x, h):
            outs = []
            for i in range(0, x.size(0), 1):
                h = self.step(x[i], h)
                outs.append(h)
            return torch.stack(outs), h

    class RangeReverse(Base):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0) - 1, -1, -1):
                h = self.step(x[i], h)
                outs.append(h)
            return torch.stack(outs), h

    class RangeReverseCat(Base):
        def forward(self, x, h):
            y = torch.zeros(0, h.size(0), h.size(1))
            for i in range(x.size(0) - 1, -1, -1):
                h = self.step(x[i], h)
                y = torch.cat([y, h.unsqueeze(0)], 0)
            return y, h

    class Range1N(Base):
        def forward(self, x, h):
            outs = []
            for i in range(1, x.size(0)):
                h = self.step(x[i], h)
                outs.append(h)
            return torch.stack(outs), h

    class Range1NPrev(Base):
        def forward(self, x, h):
            outs = []
            for i in range(1, x.size(0)):
                h = self.step(x[i - 1], h)
                outs.append(h)
            return torch.stack(outs), h

    class ReadLastMinus(Base):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0)):
                h = self.step(x[-1 - i], h)
                outs.append(h)
            return torch.stack(outs), h

    class ReadPrev(Base):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0)):
                h = self.step(x[i - 1], h)
                outs.append(h)
            return torch.stack(outs), h

    class ReadNMinus(Base):
        def forward(self, x, h):
            y = torch.zeros(0, h.size(0), h.size(1))
            for i in range(x.size(0)):
                h = self.step(x[x.size(0) - 1 - i], h)
                y = torch.cat([y, h.unsqueeze(0)], 0)
            return y, h

    class RangeStep2(Base):
        def forward(self, x, h):
            outs = []
            for i in range(0, x.size(0), 2):
                h = self.step(x[i], h)
                outs.append(h)
            return torch.stack(outs), h

    class Break(Base):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0)):
                h = self.step(x[i], h)
                outs.append(h)
                if bool(h.sum() > 100.0):
                    break
            return torch.stack(outs), h

    class BatchFirstReverse(Base):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(1) - 1, -1, -1):
                h = self.step(x[:, i], h)
                outs.append(h)
            return torch.stack(outs, 1), h

    class ReadDiff(Base):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0) - 1):
                h = self.step(x[i + 1] - x[i], h)
                outs.append(h)
            return torch.stack(outs), h

    class ReadNMinusIMinus1(Base):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0)):
                h = self.step(x[x.size(0) - i - 1], h)
                outs.append(h)
            return torch.stack(outs), h

    class RangeHalf(Base):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0) // 2, x.size(0)):
                h = self.step(x[i], h)
                outs.append(h)
            return torch.stack(outs), h

    class RangeRevOffset(Base):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0) - 2, -1, -1):
                h = self.step(x[i + 1], h)
                outs.append(h)
            return torch.stack(outs), h

    class RangeReverseCatList(Base):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0) - 1, -1, -1):
                h = self.step(x[i], h)
                outs.append(h)
            return torch.cat(outs, 1), h

    class RangeNegStep2(Base):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0) - 1, -1, -2):
                h = self.step(x[i], h)
                outs.append(h)
            return torch.stack(outs), h

    return dict(ts_range_bf_reverse=BatchFirstReverse, ts_read_diff=ReadDiff, ts_read_n_minus_i_minus_1=ReadNMinusIMinus1,
                ts_range_half=RangeHalf, ts_range_rev_offset=RangeRevOffset, ts_range_neg_step2=RangeNegStep2,
                ts_range_reverse_cat_list=RangeReverseCatList,
                ts_range_n=RangeN, ts_range_0_n_1=Range0N1, ts_range_reverse=RangeReverse,
                ts_range_reverse_cat=RangeReverseCat, ts_range_1_n=Range1N, ts_range_1_n_prev=Range1NPrev,
                ts_read_last_minus=ReadLastMinus, ts_read_prev=ReadPrev, ts_read_n_minus=ReadNMinus,
                ts_range_step2=RangeStep2, ts_break=Break)


NAMES = ["ts_range_n", "ts_range_0_n_1", "ts_range_reverse", "ts_range_reverse_cat", "ts_range_1_n", "ts_range_1_n_prev",
         "ts_read_last_minus", "ts_read_prev", "ts_read_n_minus", "ts_range_bf_reverse", "ts_read_diff",
         "ts_read_n_minus_i_minus_1", "ts_range_half", "ts_range_rev_offset", "ts_range_reverse_cat_list",
         "ts_range_step2", "ts_range_neg_step2",
         "ts_break"]
BATCH_FIRST = ("ts_range_bf_reverse",)


def write(name):
    import onnx
    import torch

    torch.manual_seed(0)
    feeds = {"x": torch.randn(B, T, I) if name in BATCH_FIRST else torch.randn(T, B, I), "h0": torch.randn(B, H)}
    torch.manual_seed(1)
    module = _modules()[name]()
    module.__module__ = "scanopt_samples"
    with torch.no_grad():
        got = module(*feeds.values())
    outputs = ["y", "h_n"]
    path = os.path.join(OUT, f"{name}.onnx")
    dynamic = {"x": {0: "B", 1: "T"} if name in BATCH_FIRST else {0: "T", 1: "B"}, "h0": {0: "B"}}
    torch.onnx.export(torch.jit.script(module), tuple(feeds.values()), path, dynamo=False,
                      input_names=list(feeds), output_names=outputs, dynamic_axes=dynamic, opset_version=17)
    m = onnx.load(path)
    save_torch_sample(m, path, feeds, outputs, got)


if __name__ == "__main__":
    run_generator(__file__, __doc__, NAMES, write, OUT)
