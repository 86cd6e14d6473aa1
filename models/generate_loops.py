"""Regenerate the Loop samples in models/loops/ (the loop_to_scan pass's), deterministically.

    python models/generate_loops.py                  # all of them
    python models/generate_loops.py --only ts_rnn_stack

PyTorch exports (need `pip install torch==2.13.0 onnxscript`; imported lazily, the tests
never import torch). TorchScript exporter (``torch.onnx.export(torch.jit.script(m), ...,
dynamo=False)``) of scripted for-loops over ``range(x.size(0))`` reading ``x[i]``:
- ts_rnn_stack:     tanh RNN, ``outs.append(h)`` + ``torch.stack(outs)`` (SequenceInsert +
                    ConcatFromSequence new_axis=1)
- ts_rnn_cat:       tanh RNN, ``y = torch.cat([y, h.unsqueeze(0)])`` from ``torch.zeros(0, B, H)``
- ts_gru_stack:     GRU written as nn.GRUCell computes it (chunk(3) of two Linear)
- ts_lstm_stack:    LSTM with an (h, c) carry, chunk(4) of two Linear
- ts_rnn_reverse:   ``x[x.size(0) - 1 - i]`` (a reversed read)
- ts_rnn_batch_first: ``x[:, i]`` and ``torch.stack(outs, 1)`` (scan and stack along axis 1)
- ts_map_stack:     a per-step MLP, no carry (a map)
- ts_nested_map:    a for-loop over x.size(0) with a for-loop over x.size(1) inside (a map)
- ts_counter_arith: ``h = tanh(W x[i] + h) * i``: the counter in arithmetic (stays a Loop)
- ts_rnn_iter, ts_rnn_enumerate: ``for x_t in x`` / ``for i, x_t in enumerate(x)``
- ts_rnn_unbind:    ``for x_t in x.unbind(0)`` (SplitToSequence + SequenceAt: stays a Loop,
                    onnxruntime and the spec disagree on the rows' rank)
- ts_rnn_final:     only the final h, no stacked outputs
- ts_rnn_stack_last: ``torch.stack(outs, -1)``
- ts_rnn_cat_list:  ``torch.cat(outs, 1)`` (ConcatFromSequence new_axis=0: [B, T*H])
Dynamo exporter of ``torch._higher_order_ops.while_loop`` (condition ``i < x.size(0)``,
a counter of its own, ``x.index_select(0, i)``):
- dyn_while_rnn:    tanh RNN carrying h
- dyn_while_rnn_sum: tanh RNN carrying h and a running sum of h
Each comes with <name>.expected.npz: inputs and the outputs torch computed.
"""

from __future__ import annotations

import os

from generate import HERE, run_generator, save_torch_sample

OUT = os.path.join(HERE, "loops")
T, B, I, H = 5, 2, 3, 4


def _modules():
    import torch
    from torch import nn

    class RNNStack(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, H), nn.Linear(H, H)

        def forward(self, x, h):
            outs = []
            for i in range(x.size(0)):
                h = torch.tanh(self.wi(x[i]) + self.wh(h))
                outs.append(h)
            return torch.stack(outs), h

    class RNNCat(RNNStack):
        def forward(self, x, h):
            y = torch.zeros(0, h.size(0), h.size(1))
            for i in range(x.size(0)):
                h = torch.tanh(self.wi(x[i]) + self.wh(h))
                y = torch.cat([y, h.unsqueeze(0)], 0)
            return y, h

    class GRUStack(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, 3 * H), nn.Linear(H, 3 * H)

        def forward(self, x, h):
            outs = []
            for i in range(x.size(0)):
                i_r, i_z, i_n = self.wi(x[i]).chunk(3, 1)
                h_r, h_z, h_n = self.wh(h).chunk(3, 1)
                r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
                n = torch.tanh(i_n + r * h_n)
                h = (1 - z) * n + z * h
                outs.append(h)
            return torch.stack(outs), h

    class LSTMStack(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, 4 * H), nn.Linear(H, 4 * H)

        def forward(self, x, h, c):
            outs = []
            for i in range(x.size(0)):
                g_i, g_f, g_g, g_o = (self.wi(x[i]) + self.wh(h)).chunk(4, 1)
                c = torch.sigmoid(g_f) * c + torch.sigmoid(g_i) * torch.tanh(g_g)
                h = torch.sigmoid(g_o) * torch.tanh(c)
                outs.append(h)
            return torch.stack(outs), h, c

    class RNNReverse(RNNStack):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0)):
                h = torch.tanh(self.wi(x[x.size(0) - 1 - i]) + self.wh(h))
                outs.append(h)
            return torch.stack(outs), h

    class RNNBatchFirst(RNNStack):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(1)):
                h = torch.tanh(self.wi(x[:, i]) + self.wh(h))
                outs.append(h)
            return torch.stack(outs, 1), h

    class MapStack(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(I, H), nn.Linear(H, H)

        def forward(self, x):
            outs = []
            for i in range(x.size(0)):
                outs.append(self.b(torch.relu(self.a(x[i]))))
            return torch.stack(outs)

    class NestedMap(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(I, H)

        def forward(self, x):
            rows = []
            for i in range(x.size(0)):
                cols = []
                for j in range(x.size(1)):
                    cols.append(torch.tanh(self.a(x[i][j])) * 2.0)
                rows.append(torch.stack(cols))
            return torch.stack(rows)

    class CounterArith(RNNStack):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0)):
                h = torch.tanh(self.wi(x[i]) + self.wh(h)) * float(i)
                outs.append(h)
            return torch.stack(outs), h

    class RNNIter(RNNStack):
        def forward(self, x, h):
            outs = []
            for x_t in x:
                h = torch.tanh(self.wi(x_t) + self.wh(h))
                outs.append(h)
            return torch.stack(outs), h

    class RNNEnumerate(RNNStack):
        def forward(self, x, h):
            outs = []
            for i, x_t in enumerate(x):
                h = torch.tanh(self.wi(x_t) + self.wh(h))
                outs.append(h)
            return torch.stack(outs), h

    class RNNUnbind(RNNStack):
        def forward(self, x, h):
            outs = []
            for x_t in x.unbind(0):
                h = torch.tanh(self.wi(x_t) + self.wh(h))
                outs.append(h)
            return torch.stack(outs), h

    class RNNFinal(RNNStack):
        def forward(self, x, h):
            for i in range(x.size(0)):
                h = torch.tanh(self.wi(x[i]) + self.wh(h))
            return (h,)

    class RNNStackLast(RNNStack):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0)):
                h = torch.tanh(self.wi(x[i]) + self.wh(h))
                outs.append(h)
            return torch.stack(outs, -1), h

    class RNNCatList(RNNStack):
        def forward(self, x, h):
            outs = []
            for i in range(x.size(0)):
                h = torch.tanh(self.wi(x[i]) + self.wh(h))
                outs.append(h)
            return torch.cat(outs, 1), h

    return dict(ts_rnn_cat_list=RNNCatList, ts_rnn_iter=RNNIter, ts_rnn_enumerate=RNNEnumerate, ts_rnn_unbind=RNNUnbind, ts_rnn_final=RNNFinal,
                ts_rnn_stack_last=RNNStackLast, ts_rnn_stack=RNNStack, ts_rnn_cat=RNNCat, ts_gru_stack=GRUStack, ts_lstm_stack=LSTMStack,
                ts_rnn_reverse=RNNReverse, ts_rnn_batch_first=RNNBatchFirst, ts_map_stack=MapStack,
                ts_nested_map=NestedMap, ts_counter_arith=CounterArith)


def _while_modules():
    import torch
    from torch import nn
    from torch._higher_order_ops.while_loop import while_loop

    class WhileRNN(nn.Module):
        def __init__(self, accumulate):
            super().__init__()
            self.wi, self.wh = nn.Linear(I, H), nn.Linear(H, H)
            self.accumulate = accumulate

        def forward(self, x, h):
            def step(i, h):
                x_t = x.index_select(0, i.reshape(1)).squeeze(0)
                return i + 1, torch.tanh(self.wi(x_t) + self.wh(h))

            if not self.accumulate:
                _, h = while_loop(lambda i, h: i < x.size(0), step, (torch.tensor(0), h))
                return (h,)

            def body(i, h, s):
                i, h = step(i, h)
                return i, h, s + h

            _, h, s = while_loop(lambda i, h, s: i < x.size(0), body, (torch.tensor(0), h, torch.zeros_like(h)))
            return h, s

    return dict(dyn_while_rnn=lambda: WhileRNN(False), dyn_while_rnn_sum=lambda: WhileRNN(True))


def _inputs(name):
    import torch

    torch.manual_seed(0)
    x = torch.randn(B, T, I) if name == "ts_rnn_batch_first" else torch.randn(T, B, I)
    if name in ("ts_map_stack", "ts_nested_map"):
        return {"x": x}
    states = {"h0": torch.randn(B, H)}
    if name == "ts_lstm_stack":
        states["c0"] = torch.randn(B, H)
    return {"x": x, **states}


def write(name):
    import onnx
    import torch

    feeds = _inputs(name)
    torch.manual_seed(1)
    scripted = name.startswith("ts_")
    module = (_modules() if scripted else _while_modules())[name]()
    module.__module__ = "scanopt_samples"
    with torch.no_grad():
        got = module(*feeds.values())
    got = got if isinstance(got, tuple) else (got,)
    outputs = {"dyn_while_rnn": ["h_n"], "dyn_while_rnn_sum": ["h_n", "h_sum"],
               "ts_rnn_final": ["h_n"]}.get(name, ["y", "h_n", "c_n"][: len(got)])
    path = os.path.join(OUT, f"{name}.onnx")
    if scripted:
        batch_axis = 0 if name == "ts_rnn_batch_first" else 1
        seq_axis = 1 - batch_axis
        dynamic = {"x": {seq_axis: "T", batch_axis: "B"}}
        dynamic.update({k: {0: "B"} for k in feeds if k != "x"})
        torch.onnx.export(torch.jit.script(module), tuple(feeds.values()), path, dynamo=False,
                          input_names=list(feeds), output_names=outputs, dynamic_axes=dynamic, opset_version=17)
        m = onnx.load(path)
    else:
        program = torch.onnx.export(module, tuple(feeds.values()), dynamo=True, input_names=list(feeds),
                                    output_names=outputs, verbose=False)
        m = program.model_proto
    save_torch_sample(m, path, feeds, outputs, got)


NAMES = ["ts_rnn_cat_list", "ts_rnn_iter", "ts_rnn_enumerate", "ts_rnn_unbind", "ts_rnn_final", "ts_rnn_stack_last", "ts_rnn_stack",
         "ts_rnn_cat", "ts_gru_stack", "ts_lstm_stack", "ts_rnn_reverse", "ts_rnn_batch_first", "ts_map_stack",
         "ts_nested_map", "ts_counter_arith", "dyn_while_rnn", "dyn_while_rnn_sum"]


if __name__ == "__main__":
    run_generator(__file__, __doc__, NAMES, write, OUT)
