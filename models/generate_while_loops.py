"""Regenerate the while-loop samples in models/while_loops/ (loop_to_scan's counter tests), deterministically.

    python models/generate_while_loops.py                  # all of them
    python models/generate_while_loops.py --only ts_while_lt_size

PyTorch 2.13 exports (imported lazily, the tests never import torch). TorchScript exporter
(``torch.onnx.export(torch.jit.script(m), ..., dynamo=False)``) of scripted ``while`` loops
over a tanh RNN stacked by ``outs.append(h)`` + ``torch.stack(outs)``; TorchScript writes a
trip count of INT64_MAX *and* a counter test ``i + 1 < n`` recomputed each step:
- ts_while_lt_size:     ``i = 0; while i < x.size(0)``
- ts_while_from_1:      ``i = 1; while i < x.size(0)`` reading ``x[i]`` (skips the first row)
- ts_while_le:          ``i = 0; while i <= x.size(0) - 1`` (an inclusive bound)
- ts_while_from_1_le:   ``i = 1; while i <= x.size(0) - 1``, reading ``x[i - 1]``
- ts_while_bound_input: ``i = 0; while i < n`` with n an int64 input (n <= x.size(0))
- ts_while_counter_out: ``i = 0; while i < x.size(0)``, the final i returned too
- ts_while_gt:          ``n = x.size(0); while n > i`` (Greater, the bound first)
- ts_while_reverse:     ``while i < n`` reading ``x[n - 1 - i]`` (a reversed read)
- ts_while_data_exit:   ``while i < x.size(0) and bool(h.sum() < 100.0)`` (stays: an early exit)
- ts_while_step2:       ``i += 2`` (stays: a counter step other than 1)
- ts_while_bound_moves: ``n -= 1`` in the body as well (stays: the bound changes)
Dynamo exporter of ``torch._higher_order_ops.while_loop`` (``x.index_select(0, i)``):
- dyn_while_from_1:     the counter starts at 1
Each comes with <name>.expected.npz: inputs and the outputs torch computed.
"""

from __future__ import annotations

import os

from generate import HERE, export_torch_sample, run_generator

OUT = os.path.join(HERE, "while_loops")
T, B, I, H = 6, 2, 3, 4


def _modules():
    import torch
    from torch import nn

    class Cell(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, H), nn.Linear(H, H)

        def step(self, x_t, h):
            return torch.tanh(self.wi(x_t) + self.wh(h))

    class LtSize(Cell):
        def forward(self, x, h):
            outs = []
            i = 0
            while i < x.size(0):
                h = self.step(x[i], h)
                outs.append(h)
                i += 1
            return torch.stack(outs), h

    class From1(Cell):
        def forward(self, x, h):
            outs = []
            i = 1
            while i < x.size(0):
                h = self.step(x[i], h)
                outs.append(h)
                i += 1
            return torch.stack(outs), h

    class Le(Cell):
        def forward(self, x, h):
            outs = []
            i = 0
            while i <= x.size(0) - 1:
                h = self.step(x[i], h)
                outs.append(h)
                i += 1
            return torch.stack(outs), h

    class From1Le(Cell):
        def forward(self, x, h):
            outs = []
            i = 1
            while i <= x.size(0) - 1:
                h = self.step(x[i - 1], h)
                outs.append(h)
                i += 1
            return torch.stack(outs), h

    class BoundInput(Cell):
        def forward(self, x, h, n):
            outs = []
            i = 0
            steps = int(n)
            while i < steps:
                h = self.step(x[i], h)
                outs.append(h)
                i += 1
            return torch.stack(outs), h

    class CounterOut(Cell):
        def forward(self, x, h):
            outs = []
            i = 0
            while i < x.size(0):
                h = self.step(x[i], h)
                outs.append(h)
                i += 1
            return torch.stack(outs), h, torch.tensor(i)

    class Step2(Cell):
        def forward(self, x, h):
            outs = []
            i = 0
            while i < x.size(0):
                h = self.step(x[i], h)
                outs.append(h)
                i += 2
            return torch.stack(outs), h

    class BoundMoves(Cell):
        def forward(self, x, h):
            outs = []
            i = 0
            n = x.size(0)
            while i < n:
                h = self.step(x[i], h)
                outs.append(h)
                i += 1
                n -= 1
            return torch.stack(outs), h

    class Gt(Cell):
        def forward(self, x, h):
            outs = []
            i = 0
            n = x.size(0)
            while n > i:
                h = self.step(x[i], h)
                outs.append(h)
                i = i + 1
            return torch.stack(outs), h

    class Reverse(Cell):
        def forward(self, x, h):
            outs = []
            i = 0
            n = x.size(0)
            while i < n:
                h = self.step(x[n - 1 - i], h)
                outs.append(h)
                i += 1
            return torch.stack(outs), h

    class DataExit(Cell):
        def forward(self, x, h):
            outs = []
            i = 0
            while i < x.size(0) and bool(h.sum() < 100.0):
                h = self.step(x[i], h)
                outs.append(h)
                i += 1
            return torch.stack(outs), h

    return dict(ts_while_gt=Gt, ts_while_reverse=Reverse, ts_while_data_exit=DataExit, ts_while_lt_size=LtSize, ts_while_from_1=From1, ts_while_le=Le, ts_while_from_1_le=From1Le,
                ts_while_bound_input=BoundInput, ts_while_counter_out=CounterOut, ts_while_step2=Step2,
                ts_while_bound_moves=BoundMoves)


def _dynamo_modules():
    import torch
    from torch import nn
    from torch._higher_order_ops.while_loop import while_loop

    class WhileFrom1(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, H), nn.Linear(H, H)

        def forward(self, x, h):
            def step(i, h):
                x_t = x.index_select(0, i.reshape(1)).squeeze(0)
                return i + 1, torch.tanh(self.wi(x_t) + self.wh(h))

            _, h = while_loop(lambda i, h: i < x.size(0), step, (torch.tensor(1), h))
            return (h,)

    return dict(dyn_while_from_1=WhileFrom1)


def write(name):
    import torch

    torch.manual_seed(0)
    feeds = {"x": torch.randn(T, B, I), "h0": torch.randn(B, H)}
    if name == "ts_while_bound_input":
        feeds["n"] = torch.tensor(T - 2)
    torch.manual_seed(1)
    scripted = name.startswith("ts_")
    module = (_modules() if scripted else _dynamo_modules())[name]()
    module.__module__ = "scanopt_samples"
    outputs = {"dyn_while_from_1": ["h_n"], "ts_while_counter_out": ["y", "h_n", "i_n"]}.get(name, ["y", "h_n"])
    axes = {"x": {0: "T", 1: "B"}, "h0": {0: "B"}}
    export_torch_sample(module, feeds, outputs, os.path.join(OUT, f"{name}.onnx"), scripted=scripted, axes=axes)


NAMES = ["ts_while_lt_size", "ts_while_from_1", "ts_while_le", "ts_while_from_1_le", "ts_while_bound_input",
         "ts_while_counter_out", "ts_while_step2", "ts_while_bound_moves", "dyn_while_from_1", "ts_while_gt",
         "ts_while_reverse", "ts_while_data_exit"]


if __name__ == "__main__":
    run_generator(__file__, __doc__, NAMES, write, OUT)
