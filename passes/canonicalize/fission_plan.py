"""Loop fission, the analysis: which states form which strongly connected components,
which splits are possible, and what the second piece reads from the first (the frontier).
Read-only; :mod:`fission` decides and :mod:`fission_build` builds (see :mod:`fission` for
the whole story).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from scanopt.graph import identity_root
from scanopt.pass_api import Match
from scanopt.passes.canonicalize.analysis import Dependencies
from scanopt.scan_view import ScanView


@dataclass
class Fission(Match):
    """One split: ``first`` (a component no other state feeds) and everything else."""

    first: list[int]  # states of the first piece
    rest: list[int]
    first_outputs: list[int]  # scan outputs each piece computes
    rest_outputs: list[int]
    frontier: list[gs.Tensor]  # body values of the first piece the rest reads per step
    stacked_as: dict[int, int]  # frontier position -> a scan output of the first piece that stacks it already
    forms: list[str]  # what later passes make of the pieces (the trial), for the report


def components(reads: list[set[int]]) -> list[list[int]]:
    """Strongly connected components of ``i -> reads[i]``, each sorted, the components a
    component reads before it (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in range(len(reads)):
        if root in index:
            continue
        work = [(root, iter(sorted(reads[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        u = stack.pop()
                        on_stack.discard(u)
                        comp.append(u)
                        if u == v:
                            break
                    found.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w)
                on_stack.add(w)
                work.append((w, iter(sorted(reads[w]))))
            elif w in on_stack:
                low[v] = min(low[v], index[w])
    return found


def plan_fission(node: gs.Node, view: ScanView, ctx) -> list[Fission] | str | None:
    """The possible splits of ``node``'s states, one per component no other state feeds
    (an RNN's h and a step counter beside it are two), before any trial; the reason there
    is none; or None when there is nothing to split (fewer than two states)."""
    n, k = view.num_states, view.num_scan_outputs
    if n < 2:
        return None
    body = node.attrs["body"]
    deps = Dependencies(body)
    states = set(range(n))
    reads = [set(deps.of(body.outputs[j])) & states for j in range(n)]
    comps = components(reads)
    if len(comps) == 1:
        pair = next(((i, j) for i in range(n) for j in reads[i] if j != i and i in reads[j]), None)
        why = (f"state {pair[0]} reads state {pair[1]} and state {pair[1]} reads state {pair[0]}" if pair
               else "each state reads another through a cycle")
        return f"its {n} states are one recurrence ({why})"
    plans = []
    for first in (c for c in comps if set().union(*(reads[j] for j in c)) <= set(c)):
        rest = [j for j in range(n) if j not in first]
        first_outputs = [i for i in range(k) if set(deps.of(body.outputs[n + i])) & states <= set(first)]
        rest_outputs = [i for i in range(k) if i not in first_outputs]
        frontier = _frontier(body, deps, [body.outputs[j] for j in rest] + [body.outputs[n + i] for i in rest_outputs],
                             [body.outputs[j] for j in first] + [body.outputs[n + i] for i in first_outputs],
                             set(first), set(rest))
        unknown = next((f for f in frontier if ctx.shapes.dtype(f) is None), None)
        if unknown is not None:
            return f"the type of body value '{unknown.name}' the states {rest} read from states {first} is unknown"
        plans.append(Fission(first, rest, first_outputs, rest_outputs, frontier,
                             _stacked_already(node, view, frontier, first_outputs), []))
    return plans


def _stacked_already(node, view, frontier, first_outputs) -> dict[int, int]:
    """Frontier values a scan output of the first piece stacks already, in processing order
    (axis 0, appending; Scan-8 always): the rest reads that output instead of a new one."""
    n, body = view.num_states, node.attrs["body"]
    found = {}
    for p, f in enumerate(frontier):
        for k in first_outputs:
            forward = view.batched or (view.output_axes[k] == 0 and not view.output_directions[k])
            if forward and node.outputs[n + k].name and identity_root(body.outputs[n + k]) is identity_root(f):
                found[p] = k
                break
    return found


def _frontier(body, deps: Dependencies, outputs, first_outputs, first: set[int], rest: set[int]) -> list[gs.Tensor]:
    """The values the rest reads from the first piece: walking back from the rest's
    ``outputs``, the first values that depend on no ``rest`` state and that the first
    piece computes anyway (on the way to ``first_outputs``) or that are body inputs. What
    lies between (``0.1 * h`` of an EMA) is computed again in the rest, so the first piece
    only stacks values it has (``h``, often a scan output already)."""
    cone = {id(t) for t in _walk_back(deps, first_outputs, lambda t: False)}

    def cut(t) -> bool:
        on = deps.of(t)
        return bool(on & first) and not on & rest and (id(t) in cone or deps.producer(t) is None)

    return [t for t in _walk_back(deps, outputs, cut) if cut(t)]


def _walk_back(deps: Dependencies, outputs, stop) -> list[gs.Tensor]:
    """Every body value ``outputs`` are computed from, once each, in the order a depth-first
    walk from the first output meets them; the producers of a value where ``stop(value)``
    are not entered."""
    seen, order, stack = set(), [], list(reversed(outputs))
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        order.append(t)
        producer = deps.producer(t)
        if producer is not None and not stop(t):
            stack.extend(reversed(deps.reads(producer)))
    return order
