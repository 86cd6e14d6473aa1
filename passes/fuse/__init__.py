"""fuse: a Scan whose body is an RNN, GRU or LSTM cell becomes the native op.

Handles Scans at any nesting level with one scan input x, one recurrent state (RNN, GRU)
or two (LSTM: h and the cell state c) and any number of loop-invariant states; bodies
with a batch axis (x [B, I], h [B, H]) or without (x [I], h [H]); any scan axis; every
input/output direction. The cell is recognized by :mod:`scanopt.passes.fuse.recognize` (algebra, not node
order); weights come out in ONNX layout and gate order. The Scan is replaced by the
native op plus the glue around it: X to [T, B, I] (``layout=1`` for [B, T, I] only at
opset 14+ with the option ``fuse_layout=1``: onnxruntime 1.31 rejects layout=1), Y
back to each scan output's axis, reversed where the output runs against the input (an
appending output of a reverse scan lists states in processing order; the native op
aligns them with input time), Y_h / Y_c to the final states. A forward and a reverse
Scan over the same X with compatible cells merge into one bidirectional op.

Exactness details: a zero-length sequence leaves a Scan's states at their initial
values while the native ops return zeros, so a final state whose trip count is not
statically >= 1 is selected by T > 0. Scan-8 is fused at its opset (8): sequence_lens
becomes the native op's (int32) sequence_lens; final states of length-0 items, where the
native op leaves exact zeros, become ``Y_h + h0 ⊙ (len == 0)`` (opset 8 has no Where;
exact for finite initial states). A Scan-8 reverse scan output needs ReverseSequence
(opset 10) and is declined. A Scan-8 over a batch of one whose body holds the real batch
(tf2onnx's opset-8 form, no sequence_lens) is fused as the Scan-9 over its one item.

Scan inputs that are input projections ``X·W + b`` computed outside the loop (whole or cut
per gate into several scan inputs; scanopt's hoist writes them) are read through
(``projection``): the native op takes X with the projection folded into W and B. Where the
batch sizes of X and the initial states cannot be proven equal, both are expanded to their
common batch at run time, which is what the Scan computes whenever it runs.

A body that masks its steps by per-item lengths (TF1 ``dynamic_rnn`` with ``sequence_length``:
a step counter compared against an outer vector, states kept and outputs zeroed past it) is
fused with those lengths, clipped to [0, T], as the native op's sequence_lens (``lengths``).

An LSTM Scan that also emits the cell state of every step (or an activation of it, tanh(c)) is
fused too (``cell_states``): the gates are recomputed over all steps from X and Y shifted by
one step, and c's update, a linear recurrence with those coefficients, becomes a two-node Scan
(linrec makes it loop-free); peepholes on i or f, body lengths and Scan-8 are declined.

A body that runs one step of a native RNN/GRU/LSTM (TorchScript's ``nn.LSTMCell`` in a scripted
loop: Squeeze(Y_h, 0) of the op over Unsqueeze(x_t, 0) from Unsqueeze(h, 0)) is that op over the
sequence (``native_step``).

Declines (with the reason) anything else: other scan outputs, a non-float32 cell (a float16
Scan rounds each op and the state to float16 per step, which no native op reproduces),
ThresholdedRelu (the op zeroes x == alpha, the recurrent activation keeps it), linear
recurrences that read h only elementwise (EMA, running sum), unproven batch sizes where a
zero-length sequence needs its final state cut back before opset 10, reversals needing Slice
steps before opset 10.

The package: ``fuse_pass`` (the pass: match, rewrite), ``directions`` (one Scan as one
direction of the native op, bidirectional partners), ``reversal`` (X reversed outside the Scan), ``glue`` (the ops
around the native op), and the matcher: ``poly`` (polynomials), ``algebra`` (body values as
polynomials), ``cuts`` (last-axis cuts), ``layout`` (nodes that keep last-axis rows),
``recognize`` with ``reader``/``gru``/``lstm`` (cells, Affine included), ``cell`` and ``linear``
(their terms), ``stacked`` (gates stacked on a leading axis, x @ W[G, I, H], read per gate by
Gather or Split + Squeeze), ``projection`` (scan inputs computed as X·W + b outside), ``lengths`` (step masks as sequence_lens),
``cell_states`` (an LSTM's per-step cell state recomputed from Y), ``native_step`` (a one-step native op as the cell).
"""

from scanopt.passes.fuse.fuse_pass import Fuse

__all__ = ["Fuse"]
