"""The edge inputs a model accepts, for verification: the written model must run wherever
the original runs, with the same outputs, shapes and errors (issue 33).

From seed 0's feeds, :func:`edge_sets` makes: each dynamic dimension at 0 (every input
axis sharing that symbolic name: an empty batch, a zero-length sequence), each fed Loop trip
count at 0, one Scan-8 ``sequence_lens`` entry at 0, and a NaN at one step of each float
sequence a top-level Scan reads, or a top-level Loop reads one slice of per iteration where the
pipeline names it (``loop_reads``: a Loop loop_to_scan made a Scan; scanopt.scan_view.
top_scanned_inputs) (not an inf: a saturating activation makes tanh(inf) = 1 in
the Scan and NaN inside onnxruntime's GRU kernel, both IEEE arithmetic, while the NaN finds
the same forms that read a later step). Verification adds them after the seeds and drops a
set the original refuses, as it does the weak spots (scanopt.weak_spots).

onnxruntime kills its process on some of them (SIGABRT in GRU/LSTM on an empty batch,
SIGFPE in a Scan over axis 1 with an empty batch), which no handler catches: :func:`screened`
runs each such set in a child process first (scanopt.isolated), for both models.
"""

from __future__ import annotations

from typing import Iterator, Mapping

import numpy as np
import onnx

from scanopt.protos import fed_inputs
from scanopt.scan_view import top_scanned_inputs

MAX_EMPTY_DIMS = 4  # empty-dimension sets per model: verification stays cheap


class LabelledFeeds(dict):
    """A feed set that keeps its label ("seed 1", "edge: dimension 'batch' = 0 ...") when it is
    passed back as ``inputs`` (a failure then names the edge), which models a child process
    found it safe for (``safe_for``: ids of protos) and why the candidate is not run on it, and
    whether its queries sit on a distance map's reference points (``reference``, kept from
    scanopt.weak_spots.RowQueries: verification judges the candidate there by the original)."""

    def __init__(self, feeds, label: str, safe_for: tuple = (), unsafe: str | None = None, reference: bool | None = None):
        super().__init__(feeds)
        self.label, self.safe_for, self.unsafe = label, safe_for, unsafe
        self.reference = bool(getattr(feeds, "reference", False)) if reference is None else reference


def edge_sets(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], loop_reads=()) -> Iterator[tuple[str, dict]]:
    """(label, feeds) for each edge input of ``model`` derived from ``feeds``; ``loop_reads``:
    (tensor, axis) of the top graph's tensors a top-level Loop reads one slice of per
    iteration (PassContext.loop_reads), probed as a top-level Scan's inputs are."""
    yield from _empty_dims(model, feeds)
    yield from _zero_trip_counts(model, feeds)
    yield from _zero_lengths(model, feeds)
    yield from _non_finite_steps(model, feeds, loop_reads)


def is_edge(feeds: Mapping[str, np.ndarray]) -> bool:
    """Whether a feed set has an empty input or a 0 in an integer vector or scalar (a trip
    count, sequence_lens): inputs that may kill onnxruntime's process rather than raise."""
    for value in feeds.values():
        if isinstance(value, (list, dict)):
            continue
        value = np.asarray(value)
        if value.size == 0:
            return True
        if value.dtype.kind in "iu" and value.ndim <= 1 and value.size <= 4096 and np.any(value == 0):
            return True
    return False


def screened(original, candidate, sets, notes: list[str], *, drop_errors: bool = True) -> list[tuple[str, dict]]:
    """``sets`` ((label, feeds)) that the original survives, each edge one (:func:`is_edge`)
    first run by both models in a child process (scanopt.isolated); an edge set the
    candidate does not survive is kept with ``unsafe`` set, so it fails without running.
    ``drop_errors=False`` keeps a set the original refuses cleanly (the user's own inputs:
    their error is the caller's to report)."""
    from scanopt.isolated import screen, screenable

    models = list({id(m): m for m in (original, candidate)}.values())
    risky = [(label, feeds) for label, feeds in sets if is_edge(feeds)
             and not all(id(m) in getattr(feeds, "safe_for", ()) for m in models)]
    if risky and not all(screenable(m) for m in models):
        notes.append("edge inputs with an empty dimension or a count of 0 not run: the model is too big "
                      "to run in a child process, and onnxruntime may kill the process on them")
    status = screen(models, [f for _, f in risky]) if risky and all(screenable(m) for m in models) else None
    kept = []
    for label, feeds in sets:
        if not any(feeds is f for _, f in risky):
            kept.append((label, feeds))
            continue
        if status is None:
            continue
        j = next(k for k, (_, f) in enumerate(risky) if f is feeds)
        if status[0][j] == "crash" or (status[0][j] == "error" and drop_errors):
            if status[0][j] == "crash":
                notes.append(f"{label}: onnxruntime's process dies on the original, not run")
            continue
        unsafe = None
        if status[-1][j] == "crash":
            unsafe = (f"not run on this edge input: onnxruntime's process dies on the candidate "
                      f"(a signal, such as GRU/LSTM's abort on an empty batch), where it runs the original")
        kept.append((label, LabelledFeeds(feeds, label, tuple(id(m) for m in models), unsafe)))
    return kept


def _empty_dims(model, feeds) -> Iterator[tuple[str, dict]]:
    groups: dict[str, list[tuple[str, int]]] = {}
    for info in fed_inputs(model.graph):
        value = feeds.get(info.name)
        if value is None or not info.type.HasField("tensor_type"):
            continue
        for axis, dim in enumerate(info.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") or axis >= np.ndim(value) or np.shape(value)[axis] == 0:
                continue
            groups.setdefault(dim.dim_param or f"{info.name}[{axis}]", []).append((info.name, axis))
    for name, axes in list(_merged(model, groups).items())[:MAX_EMPTY_DIMS]:
        probe = dict(feeds)
        for input_name, axis in axes:
            probe[input_name] = np.take(np.asarray(probe[input_name]), np.arange(0), axis=axis)
        yield f"dimension '{name}' = 0 (an empty batch or sequence)", probe


def _merged(model, groups: dict[str, list]) -> dict[str, list]:
    """``groups`` with those the model's ops prove one size merged (scanopt.dims: tf2onnx
    names one batch unk__124 on x and unk__125 on h0): emptying one alone makes a feed set the
    model cannot mean, on which an original may broadcast where its rewrite refuses."""
    try:
        from scanopt.dims import DimClasses

        classes = DimClasses(model)
    except Exception:  # noqa: BLE001 - an analysis that fails leaves the names as they are
        return groups
    merged: dict[str, list] = {}
    for name, axes in groups.items():
        home = next((key for key, kept in merged.items() if classes.same(kept[0], axes[0])), None)
        if home is None:
            merged[name] = list(axes)
        else:
            merged[home] += axes
    return merged


def _zero_trip_counts(model, feeds) -> Iterator[tuple[str, dict]]:
    counts = {node.input[0] for node in model.graph.node if node.op_type == "Loop" and node.input and node.input[0]}
    for name in sorted(counts & set(feeds)):
        value = np.asarray(feeds[name])
        if value.dtype.kind in "iu" and value.size == 1:
            yield f"'{name}' = 0 (a Loop's trip count)", dict(feeds, **{name: np.zeros_like(value)})


def _zero_lengths(model, feeds) -> Iterator[tuple[str, dict]]:
    if _opset(model) >= 9:
        return
    for node in model.graph.node:
        if node.op_type == "Scan" and node.input and node.input[0] in feeds:
            value = np.asarray(feeds[node.input[0]])
            if value.ndim == 1 and value.size and value.dtype.kind in "iu":
                lens = value.copy()
                lens[0] = 0
                yield f"'{node.input[0]}'[0] = 0 (a sequence_lens entry)", dict(feeds, **{node.input[0]: lens})


def _non_finite_steps(model, feeds, loop_reads=()) -> Iterator[tuple[str, dict]]:
    """A NaN at the middle step (first item, first feature) of each float sequence a
    top-level Scan or Loop reads (scanopt.scan_view.top_scanned_inputs: on the graph input,
    or through one Transpose): steps before it must stay as the original's."""
    seen = set()
    for name, axis in top_scanned_inputs(model, loop_reads):
        value = feeds.get(name)
        if name in seen or value is None or np.asarray(value).dtype.kind != "f" or np.ndim(value) <= axis:
            continue
        seen.add(name)
        value = np.asarray(value)
        if value.shape[axis] < 2 or value.size == 0:
            continue
        index = [0] * value.ndim
        index[axis] = value.shape[axis] // 2
        probe = value.copy()
        probe[tuple(index)] = np.nan
        yield f"'{name}' with nan at step {index[axis]}", dict(feeds, **{name: probe})


def _opset(model) -> int:
    from scanopt.validate import default_opset

    return default_opset(model) or 0
