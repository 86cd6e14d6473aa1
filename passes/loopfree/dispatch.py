"""linrec's run-time dispatch: for a symbolic length, the loop below a threshold, the chunked form from it.

The chunked forms with a symbolic length (padding, run-time chunk counts, Loops over positions
and chunks) cost a fixed overhead that the loop does not: at 16 steps they measured 0.4-0.9x
the loop, at 1024 2.6-5x. With the length unknown when optimizing, neither form is right at
every length, so both are written::

    T = Gather(Shape(x), axis)          # once, from the first scan input
    If(Less(T, threshold))
      then: the Scan as it was (later passes may hoist it; linrec does not rewrite it again)
      else: the chunked form

States wider than the measurements had (MEASURED_STATE elements per batch row) stay with the
loop: where a width is symbolic, the If tests it too, at run time.

The threshold is the measured crossover (benchmarks/bench_symbolic_t.py --crossover): the
smallest length at which the chunked form beat the loop (as the pipeline leaves it: hoisted)
for EMA and minGRU at the widths measured. Both branches compute the same recurrence, so the
If changes no value; verification runs both (the seeds' short lengths the loop, the
1024-step weak spot the chunked form).

Handled: any Scan linrec rewrites with its chunked forms on a symbolic length (not sums or
products that CumSum/CumProd compute, which beat the loop at every length). The Scan moves
into the then branch whole (its name kept), so outer-scope reads of its body still resolve.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.emit import Emitter
from scanopt.rewrite import Builder, loop_where

# The smallest symbolic length given the chunked form (below it: the loop). Measured with
#   python benchmarks/bench_symbolic_t.py --crossover --seconds 0.4
# (onnxruntime 1.32, one thread, thread CPU time; the chunked form C=32 with the If's overhead
# against the hoisted loop; re-measured with the steps read by position and EMA's two passes):
# chunked faster from T=96 for EMA H=64/128/256 (1.21-1.33x there) and minGRU I=H=32, from
# T=128 for minGRU I=H=64/128 (0.98x at 96, 1.18-1.25x at 128); at T=64 0.81-0.98x, at 16
# 0.32-0.37x.
THRESHOLD = 128
# The widest state per batch row those measurements had (EMA H=256); a wider or symbolic one
# is not dispatched blind: Mamba's [B, D=64, N=16] measured slower in the chunked form at T=1024
# (models/heldout_mamba: einsum_outside_os 0.59x, hf_mixer_dyn 0.68x the loop, declared).
MEASURED_STATE = 256


def wrap(node: gs.Node, values: list, graph: gs.Graph, start: int, threshold: int, scanned: gs.Tensor, axis: int,
         opset: int, names, dtype_of, widths: list[tuple[gs.Tensor, int]] = ()) -> None:
    """Put the nodes appended to ``graph`` from ``start`` on (the chunked form, computing
    ``values``, one per output of ``node``) into the else branch of ``If(length < threshold)``
    and ``node`` itself into the then branch; the If writes ``node``'s output tensors.
    ``scanned``: the first scan input, ``axis`` its scan axis (non-negative); ``dtype_of``:
    a tensor's element type where known. ``widths``: (initial state, its rank) for states whose
    width is symbolic: the loop also where one holds more than MEASURED_STATE elements per
    batch row (its leading dim; a rank-1 state is one row)."""

    def short() -> gs.Tensor:
        e = Emitter(Builder(graph, names, prefix=f"{node.name}_" if node.name else ""), opset)
        length = e.op("Gather", [e.op("Shape", [scanned], dtype=np.int64), e.const("axis", np.int64(axis))], axis=0,
                      dtype=np.int64, shape=[])
        loop = e.op("Less", [length, e.const("threshold", np.int64(threshold))], dtype=np.bool_, shape=[])
        widest = e.const("widest", np.int64(MEASURED_STATE))
        for state, rank in widths:
            bound = widest
            if rank > 1:
                rows = e.op("Gather", [e.op("Shape", [state], dtype=np.int64), e.const("zero", np.int64(0))], axis=0,
                            dtype=np.int64, shape=[])
                bound = e.op("Mul", [rows, widest], dtype=np.int64, shape=[])
            wide = e.op("Greater", [e.op("Size", [state], dtype=np.int64, shape=[]), bound], dtype=np.bool_, shape=[])
            loop = e.op("Or", [loop, wide], dtype=np.bool_, shape=[])
        return loop

    loop_where(node, values, graph, start, names, short, "chunked", dtype_of)
