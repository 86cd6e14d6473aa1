"""Recurrent cells in Scan bodies: recognize RNN, GRU and LSTM by their algebra.

:func:`recognize` gets the body's scan input x and its recurrent states (input, output)
and returns a :class:`Cell` in the native op's terms (ONNX gate order, W [G·H, I],
R [G·H, H], B [2·G·H], peepholes, activations, clip, linear_before_reset), or raises
NoMatch with the reason. Every value is read through the fuse algebra, so the gates are
identified by what they compute, not by node order: which Split output feeds which
activation gives the gate order (PyTorch i, f, g, o or ONNX i, o, f, c), where ``r`` sits
gives linear_before_reset, and the state update is compared after expansion
(``(1-z)⊙h̃ + z⊙h``, ``h̃ + z⊙(h - h̃)``, ... are one polynomial).
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from scanopt.constexpr import ConstantFolder
from scanopt.passes.fuse.algebra import is_algebra, producer, resolve
from scanopt.passes.fuse.cell import Cell
from scanopt.passes.fuse.gru import GruReader
from scanopt.passes.fuse.linear import _NotCellState
from scanopt.passes.fuse.lstm import LstmReader
from scanopt.passes.fuse.native_step import native_step
from scanopt.passes.fuse.poly import NoMatch


class CellReader(GruReader, LstmReader):
    """Every cell form: RNN and the reading helpers (GateReader), GRU, LSTM."""


def recognize(x: gs.Tensor, states: list[tuple[gs.Tensor, gs.Tensor]], rank=None, body: gs.Graph | None = None,
              folder: ConstantFolder | None = None, seeds: tuple = ()) -> Cell:
    """The cell that maps (x, states) to the states' new values, or NoMatch(reason).

    ``states`` are (body input, body output) pairs of the recurrent states; one state
    is tried as RNN then GRU, two as LSTM (either one may be the cell state). With
    ``body``, values the body reads but does not compute (other than x and the states)
    may be run-time weights. ``folder`` evaluates constant subgraphs (one per pass run
    shares the work across Scans). ``seeds``: (body value, its Poly over ``x``) pairs, for
    body inputs that are projections of X computed outside (``x`` then stands for X's slice).
    """
    if folder is not None and len(states) in (1, 2):
        cell = native_step(x, states, folder)  # TorchScript's nn.*Cell: a one-step native op in the body
        if cell is not None:
            return cell
    outs = [resolve(o) for _, o in states]
    reader = CellReader(x, rank, stops=outs, body=body, varying=[x] + [i for i, _ in states], folder=folder)
    for tensor, value in seeds:
        reader.alg.seed(tensor, value)
    if len(states) == 1:
        ((h, _),), (h_out,) = states, outs
        node = producer(h_out)
        if node is not None and (not is_algebra(node) or reader.activation(h_out, scaled=True) is not None):
            cell = reader.rnn(h, h_out)
        else:
            cell = reader.affine_rnn(h, h_out) or reader.gru(h, h_out)
    elif len(states) == 2:
        errors, early = [], []
        for (c, c_out), (h, h_out) in ((states[0], states[1]), (states[1], states[0])):
            try:
                cell = reader.lstm(h, resolve(h_out), c, resolve(c_out))
                break
            except NoMatch as exc:
                (early if isinstance(exc, _NotCellState) else errors).append(f"with '{c.name}' as the cell state: {exc}")
        else:
            # An assignment that got past the cell-state update says more than one that did not.
            raise NoMatch("no LSTM cell: " + "; ".join(errors or early) + _separate_recurrences(states))
    else:
        raise NoMatch(f"{len(states)} recurrent states: RNN/GRU carry one, LSTM two")
    return cell


def _separate_recurrences(states: list[tuple[gs.Tensor, gs.Tensor]]) -> str:
    """What to add to the reason when one state's update never reads the other (TF1
    MultiRNNCell: layer 2 reads layer 1's new state, layer 1 never reads layer 2's; a running
    sum beside a cell): an LSTM's h and c each read the other, and fuse makes one native op
    per loop."""
    (a, a_out), (b, b_out) = states
    a_reads_b, b_reads_a = _reads(a_out, b), _reads(b_out, a)
    if a_reads_b == b_reads_a:
        return ""
    first, second = (a, b) if b_reads_a else (b, a)
    return (f"; the states are two separate recurrences ('{first.name}' never reads '{second.name}'), "
            "stacked in one loop; fuse reads one cell per loop")


def _reads(tensor: gs.Tensor, source: gs.Tensor) -> bool:
    """Whether ``tensor`` is computed from ``source`` in the body (a node holding a subgraph
    counts as reading everything)."""
    stack, seen = [tensor], set()
    while stack:
        t = stack.pop()
        if t is source:
            return True
        if id(t) in seen:
            continue
        seen.add(id(t))
        node = producer(t)
        if node is None:
            continue
        if any(a for a in node.attrs.values() if isinstance(a, gs.Graph)):
            return True
        stack.extend(node.inputs)
    return False
