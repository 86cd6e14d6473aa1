"""Inputs where rewrites are weak, drawn from the model itself.

Random feeds miss the inputs a model meets most: a fitted distance model (KNN, a Gaussian
process, kernel PCA) is queried at and near its own training rows, where the exact distance
is 0 or tiny and any cancelling form of it loses every digit; and its rows may sit far from
the origin. Those rows are in the model, as a float initializer [R, F] beside a graph input
[N, F] of the same width: :func:`row_queries` builds feed sets whose queries are those rows
exactly, within 1e-3 and 1e-5 of them (relative to the rows' spread), and a spread away, at
the rows' own offset. And a Loop whose trip count is a graph input ran 0-4 steps on random
integers: :func:`long_trip_counts` runs it LONG_LOOP steps (a converted Loop's Scan, with
its Slice of the sequence, past the first few positions). Verification adds these sets to the
synthesized ones (scanopt.verify); a set the original refuses is dropped.
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


def row_queries(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> Iterator[tuple[str, dict]]:
    """(label, feeds) for each float graph input [N, F] and each float initializer [R, F]
    (R >= 2) of the top graph: ``feeds`` with that input's rows replaced by the initializer's
    rows, near copies of them and points between them. N keeps its size in ``feeds``
    unless it is a named dim of that input alone."""
    declared = {v.name: v for v in fed_inputs(model.graph)}
    for name, value in feeds.items():
        value = np.asarray(value)
        if name not in declared or value.ndim != 2 or value.dtype.kind != "f" or value.shape[0] < 1:
            continue
        for table_name, rows in _tables(model, value.shape[1]):
            free = _free_rows(declared[name], declared.values())
            queries = _queries(rows.astype(np.float64), None if free else value.shape[0])
            probe = dict(feeds)
            probe[name] = queries.astype(value.dtype)
            yield f"'{name}' at and near the rows of '{table_name}'", probe


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


def _tables(model: onnx.ModelProto, width: int) -> list[tuple[str, np.ndarray]]:
    """The largest MAX_TABLES float initializers [R >= 2, width] of the top graph."""
    found = []
    for tensor in model.graph.initializer:
        if len(tensor.dims) != 2 or tensor.dims[0] < 2 or tensor.dims[1] != width or tensor.data_type not in (
                onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
            continue
        found.append((tensor.dims[0] * tensor.dims[1], tensor))
    found.sort(key=lambda item: -item[0])
    return [(t.name, np.asarray(as_array(t) if source(t) else numpy_helper.to_array(t))) for _, t in found[:MAX_TABLES]]


def _free_rows(info: onnx.ValueInfoProto, inputs) -> bool:
    """Whether the row count of ``info`` is a named dim no other input shares: a batch
    shared with a state input (h0 [batch, H]) must keep the seed's size."""
    dims = info.type.tensor_type.shape.dim
    if not dims or not dims[0].HasField("dim_param"):
        return False
    name = dims[0].dim_param
    uses = sum(dim.HasField("dim_param") and dim.dim_param == name
               for other in inputs for dim in other.type.tensor_type.shape.dim)
    return uses == 1


def _queries(rows: np.ndarray, count: int | None) -> np.ndarray:
    """Rows exactly, near each (NEAR of the spread), and a spread away: the exact zero
    distance, the tiny ones, and ordinary ones at the rows' offset (random, not midway
    between rows: an exact tie may rank either way in any rounding)."""
    rng = np.random.default_rng(0)
    spread = float(np.std(rows)) or 1.0
    want = MAX_QUERIES if count is None else count
    picked = rows[rng.permutation(len(rows))[: max(1, -(-want // 4))]]
    parts = [picked]
    parts += [picked + rng.standard_normal(picked.shape) * (near * spread) for near in NEAR]
    parts.append(picked + rng.standard_normal(picked.shape) * spread)
    queries = np.concatenate(parts)
    return np.resize(queries, (want, rows.shape[1]))
