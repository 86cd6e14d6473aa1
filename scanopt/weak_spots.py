"""Inputs where rewrites are weak, drawn from the model itself.

Random feeds miss the inputs a model meets most: a fitted distance model (KNN, a Gaussian
process, kernel PCA) is queried at and near its own training rows, where the exact distance
is 0 or tiny and any cancelling form of it loses every digit; and its rows may sit far from
the origin. Those rows are in the model, as a float initializer [R, F] beside a graph input
[N, F] of the same width: :func:`row_queries` builds feed sets whose queries are those rows
exactly, within 1e-3 and 1e-5 of them (relative to the rows' spread), and a spread away, at
the rows' own offset. Where the table is the rows a top-level Scan scans (a distance map's
reference points: skl2onnx's training rows, maybe scaled by a constant), the set is a
:class:`RowQueries` with ``reference`` set: verification judges the candidate there by the
original's own outputs (scanopt.verify, beside TOLERANCES). And a Loop whose trip count is
a graph input ran 0-4 steps on random integers: :func:`long_trip_counts` runs it LONG_LOOP
steps (a converted Loop's Scan, with its Slice of the sequence, past the first few
positions). And a Scan whose length is a named dim ran at a few dozen steps, where a
loop-free form's reordered accumulation has not yet drifted: :func:`long_sequences` runs it
LONG_SEQUENCE steps; and its batch, a named dim, ran at the seeds' small sizes, below the
batch from which fuse's run-time dispatch runs the Scan (and what later forms made of it):
:func:`wide_batches` runs it at WIDE_BATCH. Both also stretch the sequences a top-level Loop
reads one slice of per iteration, where the pipeline names them (``loop_reads``: the Loops
loop_to_scan made Scans). Verification adds these sets to the synthesized
ones (scanopt.verify); a set the original refuses is dropped.
"""

from __future__ import annotations

from typing import Iterator, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from scanopt.external_data import as_array, source
from scanopt.protos import fed_inputs

MAX_TABLES = 2  # initializers tried per model (the largest that fit): verification stays cheap
MAX_QUERIES = 24  # rows per probing feed set when the query count is free
NEAR = (1e-3, 1e-5)  # distances of the near queries, relative to the rows' spread
LONG_LOOP = 64  # steps of a Loop whose trip count is fed
TABLE_BYTES = 2**24  # a larger table is not probed: reading it costs a copy beside the model's own
SPREAD_ROWS = 4096  # rows read to estimate a table's spread
_PLAIN = {onnx.TensorProto.FLOAT: np.dtype("<f4"), onnx.TensorProto.DOUBLE: np.dtype("<f8"), onnx.TensorProto.FLOAT16: np.dtype("<f2")}
LONG_SEQUENCE = 1024  # steps of a Scan whose length is a named dim
LONG_ELEMENTS = 1 << 20  # feed elements a long-sequence set may hold: verification stays cheap
# a batch at which fuse's run-time dispatch on an unknown batch runs its loop branch: at least the
# largest threshold it sets (scanopt.cost.DISPATCH_BATCHES)
WIDE_BATCH = 32


class RowQueries(dict):
    """A feed set of :func:`row_queries`. ``reference``: its table holds the rows a top-level
    Scan scans (a distance map's reference points), so the queries sit on the map's own
    zeros."""

    reference: bool = False


def row_queries(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> Iterator[tuple[str, RowQueries]]:
    """(label, feeds) for each float graph input [N, F] and each float initializer [R, F]
    (R >= 2) of the top graph: ``feeds`` with that input's rows replaced by the initializer's
    rows, near copies of them and points between them. N keeps its size in ``feeds``
    unless it is a named dim of that input alone, or an unnamed one of the only fed input."""
    declared = {v.name: v for v in fed_inputs(model.graph)}
    scanned = None
    for name, value in feeds.items():
        value = np.asarray(value)
        if name not in declared or value.ndim != 2 or value.dtype.kind != "f" or value.shape[0] < 1:
            continue
        for table_name, rows in _tables(model, value.shape[1]):
            free = _free_rows(declared[name], declared.values())
            queries = _queries(rows, None if free else value.shape[0])
            probe = RowQueries(feeds)
            probe[name] = queries.astype(value.dtype)
            scanned = _scanned_tables(model) if scanned is None else scanned
            probe.reference = table_name in scanned
            where = " (the reference points a Scan reads)" if probe.reference else ""
            yield f"'{name}' at and near the rows of '{table_name}'{where}", probe


def long_trip_counts(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> Iterator[tuple[str, dict]]:
    """(label, feeds) with each fed Loop trip count (an integer scalar graph input read as a
    top-level Loop's first input) at LONG_LOOP, the rest of ``feeds`` as given."""
    counts = {node.input[0] for node in model.graph.node if node.op_type == "Loop" and node.input and node.input[0]}
    for name, value in feeds.items():
        value = np.asarray(value)
        if name in counts and value.dtype.kind in "iu" and value.size == 1:
            probe = dict(feeds)
            probe[name] = np.full_like(value, LONG_LOOP)
            yield f"'{name}' = {LONG_LOOP} (a Loop's trip count)", probe


def long_sequences(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], loop_reads=()) -> Iterator[tuple[str, dict]]:
    """(label, feeds) with each named dim that is a top-level Scan's sequence axis, or the
    axis a top-level Loop reads one slice of per iteration (``loop_reads``, see
    scanopt.scan_view.top_scanned_inputs; on a graph input it scans, directly or through one
    Transpose) at LONG_SEQUENCE: every input axis of that name stretched alike, repeating the
    seed's values along it. Sets over LONG_ELEMENTS elements are not made."""
    declared = {v.name: v for v in fed_inputs(model.graph)}
    for param in _sequence_dims(model, declared, loop_reads=loop_reads):
        probe = _stretched(feeds, declared, param, LONG_SEQUENCE)
        if probe is not None:
            yield f"'{param}' = {LONG_SEQUENCE} steps (a Scan's length)", probe


def wide_batches(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], loop_reads=()) -> Iterator[tuple[str, dict]]:
    """(label, feeds) with each named dim of a top-level Scan's scanned input (or of a
    sequence in ``loop_reads``) other than its scanned axis (its batch) at WIDE_BATCH,
    stretched as :func:`long_sequences` does: fuse's run-time dispatch on an unknown batch
    (If(B >= k), k at most WIDE_BATCH) runs the Scan, and what the forms after fuse made of
    it, only there, and the seeds' batches are smaller."""
    declared = {v.name: v for v in fed_inputs(model.graph)}
    for param in _sequence_dims(model, declared, scanned=False, loop_reads=loop_reads):
        probe = _stretched(feeds, declared, param, WIDE_BATCH)
        if probe is not None:
            yield f"'{param}' = {WIDE_BATCH} (a Scan's batch)", probe


def _stretched(feeds: Mapping[str, np.ndarray], declared: dict, param: str, size: int) -> dict | None:
    """``feeds`` with every input axis named ``param`` at ``size``, repeating the values along
    it; None when none grew or the set would hold over LONG_ELEMENTS elements."""
    probe, grown = dict(feeds), False
    for name, info in declared.items():
        value = np.asarray(feeds[name]) if name in feeds else None
        dims = info.type.tensor_type.shape.dim
        for axis, dim in enumerate(dims):
            if value is None or not dim.HasField("dim_param") or dim.dim_param != param or axis >= value.ndim:
                continue
            if value.shape[axis] == 0 or value.shape[axis] >= size:
                break
            value = np.take(value, np.arange(size) % value.shape[axis], axis=axis)
            probe[name], grown = value, True
    if grown and sum(np.asarray(v).size for v in probe.values()) <= LONG_ELEMENTS:
        return probe
    return None


def _sequence_dims(model: onnx.ModelProto, declared: dict, scanned: bool = True, loop_reads=()) -> list[str]:
    """The dim names that are the scanned axis of a sequence the top graph scans
    (scanopt.scan_view.top_scanned_inputs: a top-level Scan's input or one of
    ``loop_reads``; ``scanned=False``: its other named axes), read on the graph input itself
    or on the input of a Transpose feeding it."""
    from scanopt.scan_view import top_scanned_inputs

    found: list[str] = []
    for name, axis in top_scanned_inputs(model, loop_reads):
        dims = declared[name].type.tensor_type.shape.dim if name in declared else ()
        if axis >= len(dims):
            continue
        for k, dim in enumerate(dims):
            if (k == axis) == scanned and dim.HasField("dim_param") and dim.dim_param not in found:
                found.append(dim.dim_param)
    return found


def _tables(model: onnx.ModelProto, width: int) -> list[tuple[str, np.ndarray]]:
    """The largest MAX_TABLES float initializers [R >= 2, width] of the top graph, up to
    TABLE_BYTES each."""
    found = []
    for tensor in model.graph.initializer:
        if len(tensor.dims) != 2 or tensor.dims[0] < 2 or tensor.dims[1] != width or tensor.data_type not in _PLAIN:
            continue
        if tensor.dims[0] * tensor.dims[1] * _PLAIN[tensor.data_type].itemsize > TABLE_BYTES:
            continue
        found.append((tensor.dims[0] * tensor.dims[1], tensor))
    found.sort(key=lambda item: -item[0])
    return [(t.name, _values(t)) for _, t in found[:MAX_TABLES]]


def _values(tensor: onnx.TensorProto) -> np.ndarray:
    """The table's values without a copy where they are plain bytes (a view of raw_data, or
    a memory map of an external file): only the rows picked are read."""
    if source(tensor):
        return np.asarray(as_array(tensor))
    if tensor.raw_data and tensor.data_type in _PLAIN:
        return np.frombuffer(tensor.raw_data, _PLAIN[tensor.data_type]).reshape(tuple(tensor.dims))
    return numpy_helper.to_array(tensor)


_SCALING = ("Div", "Mul", "Add", "Sub", "Cast", "Identity")  # ops a table may pass through to a Scan


def _scanned_tables(model: onnx.ModelProto) -> set[str]:
    """The initializers a top-level Scan scans: its scan input itself, or reached from it
    through elementwise ops whose other operands are initializers (skl2onnx scales a GP's
    training rows by the length scale: Div(rows, l))."""
    from scanopt.scan_view import top_scan_inputs

    inits = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}
    found = set()
    for name, _ in top_scan_inputs(model):
        for _ in range(4):
            if name in inits:
                found.add(name)
                break
            node = producers.get(name)
            if node is None or node.op_type not in _SCALING or node.domain not in ("", "ai.onnx") or not node.input:
                break
            computed = [i for i in node.input if i not in inits]
            rows = computed[0] if computed else max(node.input, key=lambda i: inits[i])
            if len(computed) > 1 or (rows != node.input[0] and node.op_type in ("Sub", "Div")):
                break  # another computed operand, or the rows as a divisor / subtrahend
            name = rows
    return found


def _free_rows(info: onnx.ValueInfoProto, inputs) -> bool:
    """Whether the row count of ``info`` is a named dim no other input shares, or an unnamed
    one of the only fed input: a batch shared with a state input (h0 [batch, H]) must keep
    the seed's size."""
    dims = info.type.tensor_type.shape.dim
    inputs = list(inputs)
    if dims and not dims[0].HasField("dim_param") and not dims[0].HasField("dim_value"):
        return len(inputs) == 1
    if not dims or not dims[0].HasField("dim_param"):
        return False
    name = dims[0].dim_param
    uses = sum(dim.HasField("dim_param") and dim.dim_param == name
               for other in inputs for dim in other.type.tensor_type.shape.dim)
    return uses == 1


def _queries(rows: np.ndarray, count: int | None) -> np.ndarray:
    """Rows exactly, near each (NEAR of the spread), and a spread away: the exact zero
    distance, the tiny ones, and ordinary ones at the rows' offset (random, not midway
    between rows: an exact tie may rank either way in any rounding). Only the rows picked
    (and SPREAD_ROWS for the spread) are read and widened: a table may be large."""
    rng = np.random.default_rng(0)
    want = MAX_QUERIES if count is None else count
    sample = rows[np.sort(rng.permutation(len(rows))[:SPREAD_ROWS])].astype(np.float64)
    spread = float(np.std(sample)) or 1.0
    picked = rows[rng.permutation(len(rows))[: max(1, -(-want // 4))]].astype(np.float64)
    parts = [picked]
    parts += [picked + rng.standard_normal(picked.shape) * (near * spread) for near in NEAR]
    parts.append(picked + rng.standard_normal(picked.shape) * spread)
    queries = np.concatenate(parts)
    return np.resize(queries, (want, rows.shape[1]))
