"""What makes a Loop a Scan in disguise: the proofs the loop_to_scan pass needs, read
from the graph without changing it.

A Loop qualifies when every iteration runs (its condition is constant true), its
iteration counter is read only to index outer tensors at the iteration number (or at
``T-1-i`` for a reversed read), and each loop-carried value is either a state or a stack
of per-step values (SequenceInsert then ConcatFromSequence, or a Concat that grows by one
Unsqueezed row per step from an empty start).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.constexpr import ConstantFolder
from scanopt.graph import HUGE, has_node, is_op, subgraphs_of, walk_graphs
from scanopt.pass_api import Match, Skip
from scanopt.shapes import ShapeTable

from scanopt.passes.loop_to_scan.affine import Affine
from scanopt.passes.loop_to_scan.slice_end import one_row_end

# Ops that pass an integer index through unchanged (a scalar stays a scalar).
_INDEX_PASSTHROUGH = ("Identity", "Cast")


@dataclass
class Read:
    """One per-iteration read ``node`` of outer ``source`` along ``axis``."""

    node: gs.Node
    source: gs.Tensor
    axis: int
    reverse: bool
    keeps_axis: bool  # Slice(i, i+1) / Gather([i]): the step's row keeps its axis (length 1)
    helpers: list[gs.Node]  # index arithmetic read only by this read (removed with it)
    invariant: list[gs.Node] = field(default_factory=list)  # body nodes computing ``source`` from outer values
    index: Affine | None = None  # read at c ± i other than i, T-1-i: the scan input gathers the Loop's indices
    squeezed: bool = False  # a Slice row read only by a Squeeze of its axis: past X's end it fails as a Gather does


@dataclass
class Stack:
    """A loop-carried value that only collects one value per step."""

    slot: int  # position among the carried values
    value: gs.Tensor  # the step's value in the body
    axis: int  # the stacking axis of the result
    grower: gs.Node  # the SequenceInsert / Concat in the body
    result: gs.Tensor  # the outer tensor holding the stacked result
    finisher: gs.Node | None  # the ConcatFromSequence after the Loop (None for a Concat)
    merge: bool = False  # concatenated (new_axis=0): the stacked axis merges into the next one


@dataclass
class CounterTest:
    """A while loop's ``c + 1 < bound`` (``<=`` when ``inclusive``) on a carried counter c
    that starts at the constant ``start`` and steps by 1; ``limit`` is the Loop's trip count
    M where one is given (TorchScript writes INT64_MAX: none). The Loop then runs
    ``min(M, max(0, bound + inclusive - start))`` times, and its counter ends at
    ``start`` plus that."""

    slot: int
    bound: gs.Tensor  # outer, loop-invariant
    start: int
    inclusive: bool
    nodes: list[gs.Node]  # the body's test and the counter's increment
    limit: gs.Tensor | None = None

    def empty_only_at_zero_length(self, folder: ConstantFolder) -> bool:
        """True when the Loop runs zero steps only where a dim is 0 (the documented zero-length
        case): no M, and T a shape dim d, or d - k, with T + inclusive - start = d - offset,
        offset = start - inclusive + k ≤ 0 (``x.size(0) - 1`` with ``<=`` from 0); or a
        constant T the counter starts below (never zero steps)."""
        if self.limit is not None:
            return False
        value = folder.scalar(self.bound)
        if value is not None:  # a constant trip count: zero steps never, or always
            return value + int(self.inclusive) - self.start >= 1
        taken = 0
        node = self.bound.inputs[0] if len(self.bound.inputs) == 1 else None
        dim = shape_dim(self.bound, folder)
        if dim is None and node is not None and is_op(node, "Sub") and folder.scalar(node.inputs[1]) is not None:
            dim, taken = shape_dim(node.inputs[0], folder), folder.scalar(node.inputs[1])
        return dim is not None and self.start - int(self.inclusive) + taken <= 0

    def is_plain(self, folder: ConstantFolder) -> bool:
        """True when the trip count is the bound itself: from 0, ``<``, no M, a bound never
        negative (a shape dim or a constant; a negative one would run the Loop zero times)."""
        value = folder.scalar(self.bound)
        never_negative = shape_dim(self.bound, folder) is not None or (value is not None and value >= 0)
        return self.start == 0 and not self.inclusive and self.limit is None and never_negative


@dataclass
class LoopMatch(Match):
    reads: list[Read]
    stacks: list[Stack]
    states: list[int]  # carried slots that stay states
    cond_nodes: list[gs.Node] = field(default_factory=list)  # body nodes computing the condition
    trip: gs.Tensor | None = None  # the trip count: M, or the bound of a counter test
    counter_slot: int | None = None  # the carried counter a counter test increments
    count: CounterTest | None = None  # the counter test, when one bounds the Loop
    zero_steps: list | None = None  # where it may run zero steps: each Scan output's value then (zero_steps.plan)


def analyse(node: gs.Node, graph: gs.Graph, opset: int, shapes: ShapeTable, folder: ConstantFolder) -> LoopMatch | Skip:
    """A LoopMatch when ``node`` (in ``graph``) is a scan in disguise, else Skip with the reason."""
    if opset < 9:
        return Skip(f"opset {opset}: the Scan a Loop becomes needs opset 9 (scan axes)")
    body = node.attrs.get("body")
    if not isinstance(body, gs.Graph) or len(node.inputs) < 2:
        return Skip("malformed Loop")
    carried = len(node.inputs) - 2
    if len(body.inputs) != 2 + carried or len(body.outputs) < 1 + carried:
        return Skip(f"malformed Loop: {carried} carried value(s), but the body has {len(body.inputs)} inputs and "
                    f"{len(body.outputs)} outputs (2 + N inputs and 1 + N + K outputs, says the spec)")
    trip = node.inputs[0]
    counter, cond_in, cond_out = body.inputs[0], body.inputs[1], body.outputs[0]
    counted = _counter_test(node, body, folder) if cond_out is not cond_in and not _is_true(cond_out, folder) else None
    if isinstance(counted, Skip):
        return counted
    if counted is not None:
        if trip.name and not _is_int64_max(trip, folder):
            counted.limit = trip
        slot = counted.slot
        if any(not _among(u, counted.nodes) for u in counter.outputs):
            return Skip("the body reads both its iteration number and a counter of its own")
        counter = body.inputs[2 + slot]
        cond_nodes = counted.nodes
        # a trip count other than the bound is computed by the rewrite; until then a
        # placeholder no read's index can equal (no reversed read is proven against it)
        trip = counted.bound if counted.is_plain(folder) else gs.Variable("")
    else:
        slot = None
        if not trip.name:
            return Skip("no trip count: the Loop runs until its condition turns false (a while loop)")
        bounded = _bounded_by_trip(node, body, trip, folder)
        if isinstance(bounded, Skip):
            return bounded
        cond_nodes, aliases = bounded
    if any(not _among(n, cond_nodes) for n in list(cond_in.outputs) + list(cond_out.outputs)):
        return Skip("the body reads its condition")
    outer_of = _passed_through(node, body)
    reads = []
    for index in [counter] + (aliases if counted is None else []):
        first = Affine(const=counted.start) if counted is not None and index is counter else Affine()
        found = _reads(index, body, trip, shapes, folder, ignore=cond_nodes + _increments(index, body), first=first,
                       outer_of=outer_of)
        if isinstance(found, Skip):
            return found
        reads += found
    if not reads:
        return Skip("it reads no outer tensor per iteration: nothing to scan, the trip count is its only input")
    stacks, states = [], []
    for k in range(len(node.inputs) - 2):
        if k == slot:
            continue
        found = _stack(node, body, k, graph, opset, shapes, folder)
        if isinstance(found, Skip):
            return found
        if found is None:
            if _is_sequence(body.inputs[2 + k]) or _is_sequence(node.inputs[2 + k]):
                return Skip(f"carried value {k} is a sequence used other than by appending to it")
            changes = _changes_shape(node.inputs[2 + k], body.inputs[2 + k], body.outputs[1 + k], shapes)
            if changes:
                return Skip(f"carried value {k} {changes}: a Scan state keeps its shape from step to step")
            states.append(k)
        else:
            stacks.append(found)
    if counted is not None and not counted.empty_only_at_zero_length(folder) and not _fails_empty(stacks, graph):
        return Skip("the counter test may stop the Loop before its first step on a non-empty input (it starts at "
                    f"{counted.start}, its bound or trip count is data): there the Loop returns its initial values, "
                    "and onnxruntime's Scan refuses to run zero steps")
    return LoopMatch(reads, stacks, states, cond_nodes, trip, slot, counted)


def _fails_empty(stacks: list[Stack], graph: gs.Graph) -> bool:
    """True when the Loop's result is used through a ConcatFromSequence of a stacked sequence,
    which fails on the empty sequence of zero steps (onnxruntime and the reference alike):
    a TorchScript ``torch.stack(outs)``. Then a zero-step run fails before and after."""
    return any(s.finisher is not None and (s.result.outputs or any(o is s.result for o in graph.outputs)) for s in stacks)


def _among(node: gs.Node, nodes: list[gs.Node]) -> bool:
    return any(node is n for n in nodes)


def _increments(counter: gs.Tensor, body: gs.Graph) -> list[gs.Node]:
    """The ``c + 1`` of a carried counter c (it stays: c stays a state)."""
    return [n for n in counter.outputs if is_op(n, "Add") and any(n.outputs[0] is o for o in body.outputs)]


def _bounded_by_trip(loop: gs.Node, body: gs.Graph, trip: gs.Tensor, folder) -> tuple[list, list] | Skip:
    """(condition nodes, counters) when the condition never ends the loop before its trip
    count M does: constant true, passed through, or a conjunction of ``k < M``, ``c < M``
    and ``c + 1 < M`` for the iteration number k and carried counters c that start at 0
    and step by 1 (tf2onnx writes TF2 while loops so, through float Casts; comparing the
    floats is comparing the integers below 2**24 steps). The initial condition must be
    true, or ``0 < M`` (false only when M = 0, where the Loop runs zero times anyway)."""
    cond, cond_in, cond_out = loop.inputs[1], body.inputs[1], body.outputs[0]
    counters = _counters(loop, body, folder)
    passed = cond_out.inputs and is_op(cond_out.inputs[0], "Identity") and cond_out.inputs[0].inputs[0] is cond_in
    if cond_out is cond_in or passed or _is_true(cond_out, folder):
        nodes = [cond_out.inputs[0]] if cond_out is not cond_in and cond_out.inputs and is_op(cond_out.inputs[0], "Identity") else []
    else:  # the body's test first: a data-dependent exit is the reason a user can act on
        terms = _terms(cond_out, body, folder)
        if terms is None:
            return Skip("the condition is computed from data each step (a while loop with an early exit)")
        ok = {id(body.inputs[0])} | {id(c) for c, _ in counters} | {id(body.outputs[1 + k]) for _, k in counters}
        for a, b in terms[0]:
            if id(_strip_casts(a)) not in ok or not same_value(_resolve(b, loop, body), trip, folder):
                return Skip("the condition tests more than the iteration number against the trip count (an early exit)")
        nodes = terms[1]
    if cond.name and not _is_true(cond, folder):
        terms = _terms(cond, None, folder)
        if terms is None or not all(_is_zero(a, folder) and same_value(_resolve(b, loop, body), trip, folder) for a, b in terms[0]):
            return Skip("the initial condition is not constant true (nor 0 < the trip count)")
    return nodes, [c for c, _ in counters]


def _counters(loop: gs.Node, body: gs.Graph, folder) -> list[tuple[gs.Tensor, int]]:
    """Carried counters (body input, slot): values starting at 0 and stepping by 1."""
    found = []
    for k, c_in in enumerate(body.inputs[2:]):
        start = folder.value(loop.inputs[2 + k])
        step = body.outputs[1 + k]
        add = step.inputs[0] if len(step.inputs) == 1 else None
        if start is None or start.ndim != 0 or start.reshape(-1)[0] != 0 or add is None or not is_op(add, "Add"):
            continue
        other = add.inputs[1] if add.inputs[0] is c_in else add.inputs[0] if add.inputs[1] is c_in else None
        if other is not None and folder.scalar(other) == 1:
            found.append((c_in, k))
    return found


def _terms(t: gs.Tensor, body: gs.Graph | None, folder):
    """([(a, b)] for a conjunction of ``a < b`` tests, [its nodes]) or None. Inside a body,
    every value of the tree must be read only by the tree (so removing it loses nothing)."""
    pairs, nodes, stack = [], [], [t]
    while stack:
        value = stack.pop()
        if value is not t and folder.scalar(value) is True:  # a constant true conjunct decides nothing
            continue  # (TorchScript's `continue` writes And(i + 1 < n, true))
        node = value.inputs[0] if len(value.inputs) == 1 else None
        if node is None or (body is not None and not has_node(body, node)):
            return None
        nodes.append(node)
        if node.op == "And":
            stack.extend(node.inputs)
        elif node.op == "Identity":
            stack.append(node.inputs[0])
        elif node.op in ("Less", "Greater"):
            a, b = node.inputs if node.op == "Less" else node.inputs[::-1]
            pairs.append((a, b))
        else:
            return None
    if body is not None:
        inner = [x for n in nodes for x in n.outputs if x is not t]
        if any(not _among(r, nodes) for x in inner for r in x.outputs):
            return None
        nodes += [c for a, b in pairs for x in (a, b) for c in _cast_chain(x, body)]
    return pairs, nodes


def _cast_chain(t: gs.Tensor, body: gs.Graph) -> list[gs.Node]:
    chain = []
    while len(t.inputs) == 1 and t.inputs[0].op == "Cast" and has_node(body, t.inputs[0]) and len(t.outputs) <= 1:
        chain.append(t.inputs[0])
        t = t.inputs[0].inputs[0]
    return chain


def _strip_casts(t: gs.Tensor) -> gs.Tensor:
    while len(t.inputs) == 1 and t.inputs[0].op == "Cast":
        t = t.inputs[0].inputs[0]
    return t


def _resolve(t: gs.Tensor, loop: gs.Node, body: gs.Graph) -> gs.Tensor:
    """``t`` without Casts, a carried value passed through unchanged replaced by its initial value."""
    t = _strip_casts(t)
    for k, c_in in enumerate(body.inputs[2:]):
        if c_in is t and body.outputs[1 + k] is c_in:
            return _strip_casts(loop.inputs[2 + k])
    return t


def _is_zero(t: gs.Tensor, folder) -> bool:
    return folder.scalar(t) == 0


_STRICT = {"Less": False, "Greater": True}  # op -> operands swapped (bound first)
_INCLUSIVE = {"LessOrEqual": False, "GreaterOrEqual": True}


def _comparison(node: gs.Node | None) -> tuple[gs.Tensor, gs.Tensor, bool] | None:
    """(small, large, inclusive) for ``small < large`` or ``small <= large`` in any spelling."""
    if node is None or (node.op not in _STRICT and node.op not in _INCLUSIVE):
        return None
    swapped = _STRICT.get(node.op, _INCLUSIVE.get(node.op))
    small, large = node.inputs[::-1] if swapped else node.inputs
    return small, large, node.op in _INCLUSIVE


def _counter_test(loop: gs.Node, body: gs.Graph, folder) -> CounterTest | Skip | None:
    """The counter test when the condition is ``c + 1 < T`` (or ``<=``) for a carried counter
    c that starts at a constant s ≥ 0 and T an outer value the same in every step: then c is
    s plus the iteration number. None when the condition is not a comparison at all.

    Proof obligations: c is carried and updated exactly as c + 1 (no overflow: while the
    Loop runs c + 1 ≤ T, and for ``<=`` T is provably below the type's maximum); T is
    loop-invariant; the initial condition is the same predicate at c = s; then step k reads
    at s + k and the Loop runs min(M, max(0, T + inclusive - s)) times."""
    cond_out = body.outputs[0]
    test = cond_out.inputs[0] if len(cond_out.inputs) == 1 else None
    trip_terms: list[gs.Node] = []
    if test is not None and test.op == "And" and has_node(body, test):
        split = _split_conjunction(loop, body, folder)
        if split is None:
            return None
        test, trip_terms = split
    compared = _comparison(test) if test is not None and has_node(body, test) else None
    if compared is None:
        return None
    step, bound, inclusive = compared
    casts = _cast_chain(step, body) + _cast_chain(bound, body)  # tf2onnx compares as floats
    widened = _comparison_casts(step) + _comparison_casts(bound)
    if any(to not in _EXACT_CASTS for to in widened):
        return Skip("the condition compares the counter through a cast to a type that may round it (float16, bool)")
    step, bound = _strip_casts(step), _strip_casts(bound)
    if any(step is t for t in body.inputs[2:]):
        return Skip("the condition tests the counter before its increment (the Loop then runs one step more "
                    "than the test says; not converted)")
    increment = step.inputs[0] if len(step.inputs) == 1 else None
    if increment is None or not is_op(increment, "Add") or not has_node(body, increment):
        return Skip("the condition is computed from data each step (a while loop with an early exit)")
    c_in, one = increment.inputs
    if not any(c_in is t for t in body.inputs[2:]):
        c_in, one = one, c_in
    slot = next((k for k, t in enumerate(body.inputs[2:]) if t is c_in), None)
    if slot is None:
        return Skip("the condition tests a value other than a counter incremented by 1")
    if folder.scalar(one) != 1:
        shown = folder.scalar(one)
        return Skip(f"the tested counter steps by {shown if shown is not None else 'a computed value'}, not 1: "
                    "the Loop would not read every row")
    if body.outputs[1 + slot] is not step or sum(t is step for t in body.outputs) != 1:
        return Skip("the tested counter is not the carried value it increments")
    start = folder.value(loop.inputs[2 + slot])
    if start is None or start.ndim != 0 or start.dtype.kind not in "iu":
        return Skip("the counter tested in the condition does not start at a constant integer")
    start = int(start)
    if start < 0:
        return Skip(f"the counter tested in the condition starts at {start}, below 0")
    bound_nodes = []
    if any(bound is t for t in body.inputs) or any(bound is o for n in body.nodes for o in n.outputs):
        resolved, local, outer_of = _resolve(bound, loop, body), _local_ids(body), _passed_through(loop, body)
        bound_nodes = invariant_nodes(resolved, body, local, outer_of) if id(resolved) in local else []
        if bound_nodes is None:
            return Skip(f"the condition's bound '{bound.name}' changes in the body (computed from the step's values)")
        outer = _outer_bound(resolved, loop.inputs[1], body, folder, outer_of)
        if outer is None:
            return Skip("the condition's bound is computed inside the body and not provably the initial test's bound")
        bound = outer
    if len(step.outputs) != 1 or len(c_in.outputs) < 1:
        return Skip("the counter tested in the condition is read elsewhere")
    if inclusive and not _below_max(bound, c_in, folder):
        return Skip("the condition is c + 1 <= T with T not provably below the counter type's maximum: "
                    "c + 1 may overflow before the test fails")
    cond = loop.inputs[1]
    bound_value = folder.scalar(bound)
    first = cond.inputs[0] if len(cond.inputs) == 1 else None
    if trip_terms:
        first = _initial_counter_term(loop, body, folder)
    runs_once = bound_value is not None and bound_value + inclusive - start >= 1
    if not ((cond.name and _is_true(cond, folder) and runs_once) or _tests_start(first, start, bound, inclusive, folder)):
        return Skip("the initial condition is not the counter test at the counter's start "
                    "(nor true with a bound the counter provably stays below)")
    return CounterTest(slot, bound, start, inclusive, [test, increment] + casts + bound_nodes + trip_terms)


def _split_conjunction(loop: gs.Node, body: gs.Graph, folder) -> tuple[gs.Node, list[gs.Node]] | None:
    """(the counter test, the other nodes of the condition) when the condition is a
    conjunction of one counter test and terms that never end the Loop before its trip count
    M does (``k < M`` and the like, as :func:`_bounded_by_trip` accepts them): tf2onnx's
    ``tf.while_loop(..., maximum_iterations=m)``. Else None."""
    trip = loop.inputs[0]
    terms = _terms(body.outputs[0], body, folder)
    if not trip.name or terms is None:
        return None
    trip_pairs = [(a, b) for a, b in terms[0] if _is_trip_term(a, b, loop, body, trip, folder)]
    tests = [n for n in terms[1] if n.op in _STRICT and not any(p[0] is n.inputs[0] and p[1] is n.inputs[1] or
                                                                 p[1] is n.inputs[0] and p[0] is n.inputs[1] for p in trip_pairs)]
    if len(tests) != 1 or len(trip_pairs) != len(terms[0]) - 1:
        return None
    test = tests[0]
    return test, [n for n in terms[1] if n is not test and not any(n is c for x in test.inputs for c in _cast_chain(x, body))]


def _is_trip_term(a: gs.Tensor, b: gs.Tensor, loop: gs.Node, body: gs.Graph, trip: gs.Tensor, folder) -> bool:
    """True when ``a < b`` is ``k < M`` (or ``c < M``, ``c + 1 < M`` for a counter c from 0
    by 1): true in every step the trip count M lets run."""
    counters = _counters(loop, body, folder)
    ok = {id(body.inputs[0])} | {id(c) for c, _ in counters} | {id(body.outputs[1 + k]) for _, k in counters}
    return id(_strip_casts(a)) in ok and same_value(_resolve(b, loop, body), trip, folder)


def _initial_counter_term(loop: gs.Node, body: gs.Graph, folder) -> gs.Node | None:
    """The one comparison of an initial conjunction that is not ``0 < M`` (the counter test
    at its start, to be checked), or None."""
    terms = _terms(loop.inputs[1], None, folder)
    if terms is None:
        return None
    rest = [n for n in terms[1] if n.op in _STRICT and not (
        _is_zero(_comparison(n)[0], folder) and same_value(_resolve(_comparison(n)[1], loop, body), loop.inputs[0], folder))]
    return rest[0] if len(rest) == 1 else None


# Casts a counter test may compare through: int32/int64 (the counter's own types), float32
# (exact below 2**24: tf2onnx's TF2 while loops compare so, as loop_to_scan's trip-count
# conjunctions already accept) and float64 (exact below 2**53).
_EXACT_CASTS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.INT32, onnx.TensorProto.INT64)


def _comparison_casts(t: gs.Tensor) -> list[int]:
    """The target types of the Casts ``t`` is computed through."""
    found = []
    while len(t.inputs) == 1 and t.inputs[0].op == "Cast":
        found.append(int(t.inputs[0].attrs.get("to", 0)))
        t = t.inputs[0].inputs[0]
    return found


def _is_int64_max(t: gs.Tensor, folder) -> bool:
    """TorchScript's trip count of a while loop: INT64_MAX, no limit at all."""
    value = folder.value(t)
    return (value is not None and value.size == 1 and value.dtype == np.int64
            and int(value.reshape(-1)[0]) == np.iinfo(np.int64).max)


def _below_max(bound: gs.Tensor, counter: gs.Tensor, folder) -> bool:
    """True when ``bound`` is provably below the largest value of the counter's type: a
    constant, or a shape dim minus a positive constant (TorchScript's ``x.size(0) - 1``;
    tf2onnx's ``n - 1`` of a dim cast to int32, exact as the trip counts read through such
    casts are: below 2**31 rows)."""
    value = folder.scalar(bound)
    dtype = np.dtype(counter.dtype) if counter.dtype is not None else None
    if value is not None:
        return dtype is not None and dtype.kind in "iu" and value < np.iinfo(dtype).max
    node = bound.inputs[0] if len(bound.inputs) == 1 else None
    if node is None or not is_op(node, "Sub") or dtype not in (np.int64, np.int32):
        return False
    taken = folder.scalar(node.inputs[1])
    return taken is not None and taken >= 1 and shape_dim(node.inputs[0], folder) is not None


def _outer_bound(bound: gs.Tensor, cond: gs.Tensor, body: gs.Graph, folder, outer_of: dict) -> gs.Tensor | None:
    """The outer value a body's bound holds in every step: a carried value passed through
    unchanged (its initial value), or the outer twin of a bound the body recomputes each
    step from outer values alone (the dynamo exporter's ``while_loop`` re-reads
    ``x.size(0)`` inside the body; tf2onnx's ``n - 1`` of a carried n): the initial
    condition's bound when both provably hold the same integer. Else None."""
    if id(bound) not in _local_ids(body):
        return bound
    compared = _comparison(cond.inputs[0] if len(cond.inputs) == 1 else None)
    if compared is None:
        return None
    outer = _strip_casts(compared[1])
    return outer if same_value(outer, bound, folder) or _same_expression(outer, bound, outer_of, folder) else None


def _same_expression(outer: gs.Tensor, inner: gs.Tensor, outer_of: dict, folder, depth: int = 8) -> bool:
    """True when body value ``inner`` is computed as ``outer`` is, node for node (the same
    op, attributes and inputs), with carried values passed through read as their initial
    values: both then hold the same value."""
    inner = outer_of.get(id(inner), inner)
    if outer is inner or same_value(outer, inner, folder):
        return True
    a = outer.inputs[0] if len(outer.inputs) == 1 else None
    b = inner.inputs[0] if len(inner.inputs) == 1 else None
    if depth == 0 or a is None or b is None or a.op != b.op or a.attrs != b.attrs or len(a.inputs) != len(b.inputs):
        return False
    if any(True for _ in subgraphs_of(a)) or a.op.startswith("Random"):
        return False
    return all(_same_expression(x, y, outer_of, folder, depth - 1) for x, y in zip(a.inputs, b.inputs))


def _passed_through(loop: gs.Node, body: gs.Graph) -> dict[int, gs.Tensor]:
    """id(body input) -> the Loop's initial value, for carried values passed through unchanged."""
    return {id(body.inputs[2 + k]): loop.inputs[2 + k] for k in range(len(loop.inputs) - 2)
            if body.outputs[1 + k] is body.inputs[2 + k]}


def _tests_start(test: gs.Node | None, start: int, bound: gs.Tensor, inclusive: bool, folder) -> bool:
    """True when the initial condition is the body's test at the counter's start."""
    compared = _comparison(test)
    if compared is None or compared[2] != inclusive:
        return False
    return folder.scalar(_strip_casts(compared[0])) == start and same_value(_strip_casts(compared[1]), bound, folder)


def _changes_shape(initial: gs.Tensor, inside: gs.Tensor, new: gs.Tensor, shapes: ShapeTable) -> str:
    """Why a carried value provably or likely changes shape across steps, else "": it grows
    by a Concat of itself, or its new value's inferred rank or a static dim differs from the
    initial value's (a symbolic dim against another is left to verification)."""
    grower = new.inputs[0] if len(new.inputs) == 1 else None
    if grower is not None and is_op(grower, "Concat") and any(t is inside for t in grower.inputs):
        return "grows each step (a Concat of itself read in the step)"
    before, after = shapes.type_of(initial.name)[1], shapes.type_of(new.name)[1]
    if before is None or after is None:
        return ""
    if len(before) != len(after):
        return f"changes rank ({len(before)} -> {len(after)})"
    for a, b in zip(before, after):
        if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)) and a != b:
            return f"changes shape ({before} -> {after})"
    return ""


def _is_true(t: gs.Tensor, folder: ConstantFolder) -> bool:
    return bool(folder.scalar(t))


def _is_sequence(t: gs.Tensor) -> bool:
    return t.inputs and t.inputs[0].op in ("SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SplitToSequence")


def _local_ids(body: gs.Graph) -> set[int]:
    ids = {id(t) for t in body.inputs}
    for level in walk_graphs(body):
        for n in level.graph.nodes:
            ids.update(id(t) for t in n.outputs)
    return ids


def _reads(counter: gs.Tensor, body: gs.Graph, trip: gs.Tensor, shapes: ShapeTable, folder, ignore=(),
           first: Affine = Affine(), outer_of: dict | None = None) -> list[Read] | Skip:
    """Every use of the counter, each an indexing read of an outer tensor, else Skip.

    Follows the counter through value-preserving steps (Identity, an integer Cast, a
    scalar made 1-D) and affine arithmetic with loop-invariant values (:class:`Affine`).
    ``outer_of`` maps a carried value passed through unchanged to its outer initial value
    (tf2onnx carries the tensor a while loop reads so): reading it is reading that."""
    local = _local_ids(body)
    outer_of = outer_of or {}
    ends = {id(n): (n, found) for n in body.nodes if is_op(n, "Slice")
            for found in [one_row_end(n, counter, body, folder)] if found is not None}
    ignore = list(ignore) + [m for _, found in ends.values() for m in found]
    reads: list[Read] = []
    slices: dict[int, list] = {}  # id(Slice) -> [node, start (affine, helpers) or None, end or None]
    frontier = [(counter, [], first)]  # (index value, helper nodes, its expression in i)
    while frontier:
        index, helpers, affine = frontier.pop()
        if _captured_in_nested(index, body):
            return Skip(f"the iteration counter ('{index.name}') is read inside a nested graph")
        if counter is body.inputs[0] and any(index is t for t in body.outputs):
            # the Scan has no iteration number: stacking it would take a Range, not an index
            return Skip(f"the iteration number is a Loop output ('{index.name}'), not only an index")
        for user in list(index.outputs):
            if _among(user, ignore):
                continue
            if not has_node(body, user):
                return Skip(f"the iteration counter is read outside the body by {user.op}")
            if is_op(user, "Slice") and any(user.inputs[p] is index for p in (1, 2)):
                entry = slices.setdefault(id(user), [user, None, None])
                entry[1 if user.inputs[1] is index else 2] = (affine, helpers)
                continue
            found = _classify(user, index, helpers, affine, trip, shapes, folder, local, body, outer_of)
            if isinstance(found, Skip):
                return found
            if isinstance(found, Read):
                reads.append(found)
            else:
                frontier.append(found)
    for key, (node, _) in ends.items():
        if key not in slices or slices[key][1] is None:
            return Skip(f"the iteration counter computes the end of Slice '{node.name}', which does not start at it")
    for key, (node, start, end) in slices.items():
        if end is None and key in ends:  # an end in [c + 1, c + step]: the row at c
            end = (first.plus_const(1), ends[key][1])
        found = _slice_read(node, start, end, shapes, folder, local, body, outer_of, key in ends)
        if isinstance(found, Skip):
            return found
        reads.append(found)
    return reads


def _slice_read(node, start, end, shapes, folder, local, body, outer_of, one_row=False) -> Read | Skip:
    """``Slice(X, [i], [i+1], [a])``: the step's row of X along a, axis kept. Only at i
    itself: at another index a Slice clamps where a Gather wraps or fails (``x[-1:0]`` is
    empty), so its rows are not provably one per step. With ``one_row`` the end is proven
    in [i + 1, i + step] (:mod:`.slice_end`), so any step ≥ 1 takes the row at i alone.
    A row read only by a Squeeze of the axis fails past X's end as a Gather does (a Squeeze
    of an empty axis fails): then a read at s + i (a counter from s ≥ 0, never negative)
    is a Gather at s + i too."""
    if start is None or end is None:
        return Skip(f"Slice '{node.name}' reads [?, ?), not [i, i+1) at the iteration number i")
    at, upto = start[0], end[0]
    # [s + i, s + i + 1) (a proven one-row end stands for the counter's own + 1)
    row = not at.terms and at.scale == 1 and at.const >= 0 and not upto.terms and upto.scale == 1 and upto.const == at.const + 1
    if not row or (not at.is_counter() and not _only_squeezed(node, folder, shapes)):
        return Skip(f"Slice '{node.name}' reads [{at.describe()}, {upto.describe()}), not [i, i+1) at the "
                    "iteration number i (nor a row only squeezed at a counter from s >= 0)")
    axes = folder.value(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3].name else np.zeros(1, np.int64)
    steps = folder.value(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4].name else np.ones(1, np.int64)
    if axes is None or steps is None or axes.size != 1 or steps.size != 1 or (steps.reshape(-1)[0] != 1 and not one_row):
        return Skip(f"Slice '{node.name}' at the iteration number has no constant single axis and step 1")
    source = outer_of.get(id(node.inputs[0]), node.inputs[0])
    invariant = invariant_nodes(source, body, local) if id(source) in local else []
    if invariant is None:
        return Skip(f"the iteration counter slices '{source.name}', computed inside the body from its inputs")
    axis = _axis(int(axes.reshape(-1)[0]), source, shapes)
    if axis is None:
        return Skip(f"the rank of '{source.name}' is unknown: the Slice axis cannot be placed")
    squeezed = _only_squeezed(node, folder, shapes, axis)
    if not at.is_counter():
        return Read(node, source, axis, False, True, start[1] + end[1], invariant, at, squeezed)
    return Read(node, source, axis, False, True, start[1] + end[1], invariant, squeezed=squeezed)


def _only_squeezed(node: gs.Node, folder, shapes: ShapeTable, axis: int | None = None) -> bool:
    """True when the Slice's row is read only by Squeezes of its axis (given explicitly: a
    Squeeze without axes keeps an empty axis instead of failing)."""
    if axis is None:
        axes = folder.value(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3].name else np.zeros(1, np.int64)
        if axes is None or axes.size != 1:
            return False
        axis = _axis(int(axes.reshape(-1)[0]), node.inputs[0], shapes)
    row = node.outputs[0]
    if axis is None or not row.outputs:
        return False
    for user in row.outputs:
        squeezed = user.attrs.get("axes") if is_op(user, "Squeeze") else None
        if squeezed is None and is_op(user, "Squeeze") and len(user.inputs) > 1 and user.inputs[1].name:
            squeezed = folder.value(user.inputs[1])
        if squeezed is None or [_axis(int(a), row, shapes) for a in np.asarray(squeezed).reshape(-1)] != [axis]:
            return False
    return True


def invariant_nodes(t: gs.Tensor, body: gs.Graph, local: set[int], passed: dict | None = None) -> list[gs.Node] | None:
    """The body nodes computing ``t`` from outer values and constants alone (the same in
    every iteration, so they can move out of the loop), in order; None when ``t`` depends
    on a body input (other than one in ``passed``, carried values passed through
    unchanged) or on a node with a body of its own or side effects."""
    order, seen, stack = [], set(), [t]
    inputs = {id(x) for x in body.inputs} - set(passed or ())
    while stack:
        value = stack.pop()
        if id(value) not in local or id(value) in seen or id(value) in (passed or {}):
            continue
        seen.add(id(value))
        if id(value) in inputs or len(value.inputs) != 1:
            return None
        node = value.inputs[0]
        if not has_node(body, node) or any(True for _ in subgraphs_of(node)) or node.op.startswith("Random"):
            return None
        if any(node is n for n in order):
            continue
        order.append(node)
        stack.extend(x for x in node.inputs if x.name)
    positions = {id(n): k for k, n in enumerate(body.nodes)}
    return sorted(order, key=lambda n: positions[id(n)])


def _captured_in_nested(t: gs.Tensor, body: gs.Graph) -> bool:
    for n in body.nodes:
        for _, sub in subgraphs_of(n):
            for level in walk_graphs(sub):
                if any(x is t for m in level.graph.nodes for x in m.inputs):
                    return True
    return False


def _classify(user, index, helpers, affine, trip, shapes, folder, local, body, outer_of):
    """A Read, a (value, helpers, expression) step of index arithmetic to follow, or Skip."""
    if is_op(user, "Gather") and len(user.inputs) == 2 and user.inputs[1] is index:
        source = outer_of.get(id(user.inputs[0]), user.inputs[0])
        kind = _read_kind(affine, trip, folder)
        if isinstance(kind, Skip):
            return Skip(f"'{source.name}' is read at {affine.describe()}: {kind.reason}")
        invariant = invariant_nodes(source, body, local) if id(source) in local else []
        if invariant is None:
            return Skip(f"the iteration counter indexes '{source.name}', computed inside the body from its inputs")
        axis = _axis(user.attrs.get("axis", 0), source, shapes)
        if axis is None:
            return Skip(f"the rank of '{source.name}' is unknown: the Gather axis cannot be placed")
        index_rank = 0 if not helpers else shapes.rank(index)  # the counter itself is a scalar
        if index_rank not in (0, 1):
            return Skip(f"the counter read of '{source.name}' has an index of unknown rank")
        if kind == "indexed":
            return Read(user, source, axis, False, index_rank == 1, helpers, invariant + list(affine.invariant), affine)
        return Read(user, source, axis, kind == "reverse", index_rank == 1, helpers, invariant)
    if is_op(user, "SequenceAt") and user.inputs[1] is index:
        kind = _read_kind(affine, trip, folder)
        if kind not in ("forward", "reverse"):
            return Skip(f"the iteration counter picks from sequence '{user.inputs[0].name}' at {affine.describe()}, "
                        "not at i or T-1-i")
        split = _unit_split(user.inputs[0], folder)
        producer = user.inputs[0].inputs[0] if len(user.inputs[0].inputs) == 1 else None
        if split is None and producer is not None and is_op(producer, "SplitToSequence") and not producer.attrs.get("keepdims", 1):
            return Skip("the counter picks rows of a SplitToSequence with a split and keepdims=0: the spec keeps "
                        "their axis, onnxruntime drops it, so what the Loop computes depends on the runtime")
        if split is None:
            return Skip(f"the iteration counter picks from sequence '{user.inputs[0].name}', not a split of a tensor into rows")
        source, axis, keeps = split
        if id(source) in local:
            return Skip(f"the iteration counter picks from a split of '{source.name}', computed inside the body")
        axis = _axis(axis, source, shapes)
        if axis is None:
            return Skip(f"the rank of '{source.name}' is unknown: the split axis cannot be placed")
        return Read(user, source, axis, kind == "reverse", keeps, helpers, [])
    if user.op in _INDEX_PASSTHROUGH and len(user.outputs) == 1:
        if user.op == "Cast" and user.attrs.get("to") not in (6, 7):  # int32, int64
            return Skip(f"the iteration counter is used in arithmetic (Cast '{user.name}' to a non-integer type)")
        if user.op == "Cast" and user.attrs.get("to") != 7:
            affine = affine.narrowed(f"is cast to int32 (Cast '{user.name}'): it may wrap where int64 does not")
        return (user.outputs[0], helpers + [user], affine)
    if user.op in ("Unsqueeze", "Reshape") and shapes.rank(index) == 0 and shapes.rank(user.outputs[0]) == 1:
        if user.inputs[0] is index:
            return (user.outputs[0], helpers + [user], affine)
    if user.op == "Concat" and len(user.inputs) == 1 and shapes.rank(index) == 1:  # tf2onnx's one-piece stack
        return (user.outputs[0], helpers + [user], affine)
    if user.op in ("Add", "Sub", "Mul", "Neg"):
        found = _arithmetic(user, index, affine, shapes, folder, local, body)
        if isinstance(found, Skip):
            return found
        return (user.outputs[0], helpers + [user], found)
    return Skip(f"the iteration counter is used in arithmetic ({user.op} '{user.name}'), not only to index")


def _arithmetic(user, index, affine: Affine, shapes, folder, local, body) -> Affine | Skip:
    """The expression ``user`` computes from ``index`` (= ``affine``): plus, minus or times
    a constant integer, plus or minus a loop-invariant int64 scalar; else Skip."""
    arithmetic = Skip(f"the iteration counter is used in arithmetic ({user.op} '{user.name}'), not only to index")
    if user.op == "Neg":
        return affine.times(-1)
    if len(user.inputs) != 2 or user.inputs[0] is user.inputs[1]:
        return arithmetic
    first = user.inputs[0] is index
    other = user.inputs[1] if first else user.inputs[0]
    value = folder.value(other)
    if value is not None and (value.size != 1 or value.dtype.kind not in "iu"):
        return arithmetic
    if value is not None and value.dtype != np.int64:
        affine = affine.narrowed(f"is computed in {value.dtype}: it may wrap where int64 does not")
    if user.op == "Mul":
        return arithmetic if value is None else affine.times(int(value.reshape(-1)[0]))
    base = affine.times(-1) if user.op == "Sub" and not first else affine  # c - i
    sign = -1 if user.op == "Sub" and first else 1  # i - c
    if value is not None:
        return base.plus_const(sign * int(value.reshape(-1)[0]))
    moved = invariant_nodes(other, body, local) if id(other) in local else []
    if moved is None:
        return arithmetic
    elem, dims = shapes.type_of(other.name)
    if elem not in (onnx.TensorProto.INT32, onnx.TensorProto.INT64) or dims is None or any(d != 1 for d in dims):
        return Skip(f"the index adds '{other.name}', not provably one integer (its type: {elem}, {dims})")
    if elem != onnx.TensorProto.INT64:
        base = base.narrowed("is computed in int32: it may wrap where int64 does not")
    return base.plus_term(sign, other, moved)


def _read_kind(affine: Affine, trip: gs.Tensor, folder) -> str | Skip:
    """How a scan input reads what the Loop reads at ``affine``: "forward" (at i),
    "reverse" (at T-1-i for the trip count T) or "indexed" (at c ± i for another c:
    the rows gathered at the Loop's own indices), or Skip."""
    if affine.is_counter():
        return "forward"
    if affine.scale == -1 and _is_last(affine, trip, folder):
        return "reverse"
    if not affine.unit_steps():
        return Skip("steps of ±1 only (a range with another step does not read every row)")
    if affine.narrow:
        return Skip(f"the index {affine.narrow} (the gathered indices are int64)")
    return "indexed"


def _is_last(affine: Affine, trip: gs.Tensor, folder) -> bool:
    """True when ``affine`` is ``T-1-i`` with T the trip count."""
    if len(affine.terms) == 1 and affine.terms[0][0] == 1:
        term = affine.terms[0][1]
        return (affine.const == 0 and _is_last_index(term, trip, folder)) or (
            affine.const == -1 and same_value(term, trip, folder))
    value = folder.scalar(trip)
    return not affine.terms and value is not None and affine.const == int(value) - 1


def _at_least(t: gs.Tensor, bound: int, folder) -> bool:
    value = folder.value(t)
    return value is not None and value.size > 0 and bool((value >= bound).all())


def _unit_split(sequence: gs.Tensor, folder) -> tuple[gs.Tensor, int, bool] | None:
    """(X, axis, keeps axis) when ``sequence`` is SplitToSequence of X into rows of one
    : no split (keepdims decides), or a split of 1 with keepdims=1. A split of 1 with
    keepdims=0 (TorchScript's ``x.unbind(0)``) is not: the spec ignores keepdims when a split
    is given (rows keep the axis), onnxruntime drops the axis."""
    node = sequence.inputs[0] if len(sequence.inputs) == 1 else None
    if node is None or not is_op(node, "SplitToSequence"):
        return None
    axis = int(node.attrs.get("axis", 0))
    if len(node.inputs) < 2 or not node.inputs[1].name:
        return node.inputs[0], axis, bool(node.attrs.get("keepdims", 1))
    split = folder.value(node.inputs[1])
    if split is None or split.ndim != 0 or int(split) != 1 or not node.attrs.get("keepdims", 1):
        return None
    return node.inputs[0], axis, True


def _axis(axis: int, source: gs.Tensor, shapes: ShapeTable) -> int | None:
    if axis >= 0:
        return axis
    rank = shapes.rank(source)
    return None if rank is None else axis + rank


def _is_last_index(t: gs.Tensor, trip: gs.Tensor, folder) -> bool:
    """True when ``t`` is ``trip - 1`` (the last iteration number)."""
    node = t.inputs[0] if len(t.inputs) == 1 else None
    if node is None:
        return False
    if is_op(node, "Sub"):
        return folder.scalar(node.inputs[1]) == 1 and same_value(node.inputs[0], trip, folder)
    if is_op(node, "Add"):
        return folder.scalar(node.inputs[1]) == -1 and same_value(node.inputs[0], trip, folder)
    return False


def same_value(a: gs.Tensor, b: gs.Tensor, folder: ConstantFolder) -> bool:
    """True when ``a`` and ``b`` provably hold the same integer: one tensor, equal
    constants, or both ``Shape(X)[k]`` of one X (through casts and reshapes of scalars)."""
    a, b = _through_scalar_ops(a), _through_scalar_ops(b)
    if a is b:
        return True
    if folder.value(a) is not None and folder.value(b) is not None:
        va, vb = folder.scalar(a), folder.scalar(b)
        return va is not None and vb is not None and int(va) == int(vb)
    da, db = shape_dim(a, folder), shape_dim(b, folder)
    return da is not None and db is not None and da[0] is db[0] and da[1] == db[1]


def _through_scalar_ops(t: gs.Tensor) -> gs.Tensor:
    while len(t.inputs) == 1 and t.inputs[0].op in ("Identity", "Cast", "Squeeze", "Unsqueeze", "Reshape"):
        node = t.inputs[0]
        if node.op == "Cast" and node.attrs.get("to") not in (6, 7):
            break
        t = node.inputs[0]
    return t


def shape_dim(t: gs.Tensor, folder: ConstantFolder) -> tuple[gs.Tensor, int] | None:
    """(X, k) when ``t`` is ``Shape(X)[k]`` (k >= 0 counted on X), else None."""
    t = _through_scalar_ops(t)
    node = t.inputs[0] if len(t.inputs) == 1 else None
    if node is None:
        return None
    if is_op(node, "SequenceLength"):  # of a split into rows: the length of the split axis
        split = _unit_split(node.inputs[0], folder)
        return None if split is None or split[1] < 0 else (split[0], split[1])
    if is_op(node, "ReduceMin") and node.inputs and len(node.inputs[0].inputs) == 1 and is_op(node.inputs[0].inputs[0], "Concat"):
        # min(INT64_MAX, T), TorchScript's bound of enumerate(x): T
        pieces = [p for p in node.inputs[0].inputs[0].inputs if not _at_least(p, HUGE, folder)]
        return shape_dim(pieces[0], folder) if len(pieces) == 1 else None
    if is_op(node, "Shape"):  # Shape(X, start=k, end=k+1): [X.shape[k]] (the dynamo exporter's sym_size)
        start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
        return (node.inputs[0], start) if end is not None and start >= 0 and int(end) == start + 1 else None
    shape_value = _strip_casts(node.inputs[0]) if node.inputs else None
    if is_op(node, "Gather") and node.attrs.get("axis", 0) == 0:
        shape_node = shape_value.inputs[0] if len(shape_value.inputs) == 1 else None
        k = folder.value(node.inputs[1])
    elif is_op(node, "Slice") and len(node.inputs) >= 3:
        shape_node = shape_value.inputs[0] if len(shape_value.inputs) == 1 else None
        starts, ends = folder.value(node.inputs[1]), folder.value(node.inputs[2])
        if starts is None or ends is None or starts.size != 1 or ends.size != 1:
            return None
        if int(ends.reshape(-1)[0]) != int(starts.reshape(-1)[0]) + 1 or len(node.inputs) > 4:
            return None
        k = starts
    else:
        return None
    if shape_node is None or not is_op(shape_node, "Shape") or k is None or k.size != 1:
        return None
    k = int(k.reshape(-1)[0])
    start = int(shape_node.attrs.get("start", 0))
    if k < 0 or start < 0:
        return None
    return shape_node.inputs[0], k + start


def _stack(loop: gs.Node, body: gs.Graph, k: int, graph: gs.Graph, opset: int, shapes: ShapeTable, folder) -> Stack | Skip | None:
    """Stack when carried value ``k`` only collects one value per step, None for a state."""
    initial, inside, out = loop.inputs[2 + k], body.inputs[2 + k], body.outputs[1 + k]
    grower = out.inputs[0] if len(out.inputs) == 1 else None
    result = loop.outputs[k]
    if grower is None or len(inside.outputs) != 1 or inside.outputs[0] is not grower or not has_node(body, grower):
        return None
    if len(out.outputs) or sum(o is out for o in body.outputs) != 1:
        return None  # the grown value is read in the step: a state
    if is_op(grower, "SequenceInsert"):
        if len(grower.inputs) != 2 or grower.inputs[0] is not inside:
            return Skip(f"carried sequence {k} is inserted into at a position")
        if not (len(initial.inputs) == 1 and is_op(initial.inputs[0], "SequenceEmpty")):
            return Skip(f"carried sequence {k} does not start empty (SequenceEmpty)")
        finishers = list(result.outputs)
        if len(finishers) != 1 or not is_op(finishers[0], "ConcatFromSequence") or any(o is result for o in graph.outputs):
            return Skip(f"the sequence built in carried value {k} is read other than by one ConcatFromSequence")
        finisher = finishers[0]
        value = grower.inputs[1]
        merge = int(finisher.attrs.get("new_axis", 0)) != 1
        axis = int(finisher.attrs["axis"])
        rank = shapes.rank(value)
        if axis < 0:
            if rank is None:
                return Skip(f"the rank of '{value.name}' is unknown: the stacking axis cannot be placed")
            axis += rank + (0 if merge else 1)
        if merge:
            # torch.cat(outs): one scan output, its step axis merged into the next. Only where
            # every step has the same length there (a static one); the Loop also takes ragged steps.
            declared, inferred = shapes.shape(value), shapes.type_of(value.name)[1]  # an exporter may declare less
            if not any(d is not None and axis < len(d) and isinstance(d[axis], (int, np.integer)) for d in (declared, inferred)):
                return Skip("ConcatFromSequence concatenates (new_axis=0) steps whose length along the axis "
                            "is not static: they may differ from step to step")
            if opset < 10:
                return Skip("ConcatFromSequence concatenates (new_axis=0): merging the axes needs Slice-10")
        return Stack(k, value, axis, grower, finisher.outputs[0], finisher, merge)
    if is_op(grower, "Concat") and len(grower.inputs) == 2 and grower.inputs[0] is inside:
        row = grower.inputs[1]
        unsqueeze = row.inputs[0] if len(row.inputs) == 1 else None
        axis = _axis(int(grower.attrs["axis"]), out, shapes)
        if axis is None:
            return Skip(f"the rank of '{out.name}' is unknown: the growing Concat's axis cannot be placed")
        if unsqueeze is None or not is_op(unsqueeze, "Unsqueeze") or len(row.outputs) != 1:
            return Skip(f"carried value {k} grows by a block, not by one Unsqueezed row per step")
        axes = unsqueeze.attrs.get("axes")
        if axes is None and len(unsqueeze.inputs) > 1:
            axes = folder.value(unsqueeze.inputs[1])
        axes = None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
        rank = shapes.rank(row)
        if axes is None or len(axes) != 1 or rank is None or axes[0] % rank != axis:
            return Skip(f"carried value {k} grows by a row not unsqueezed at the Concat's axis")
        if not _empty_along(initial, axis, folder):
            return Skip(f"carried value {k} grows by Concat from a start not provably empty along axis {axis}")
        return Stack(k, unsqueeze.inputs[0], axis, grower, result, None)
    return None


def _empty_along(t: gs.Tensor, axis: int, folder) -> bool:
    """True when ``t`` has length 0 along ``axis``: a constant, or ConstantOfShape of a
    shape whose entry ``axis`` is a constant 0."""
    value = folder.value(t)
    if value is not None:
        return value.ndim > axis and value.shape[axis] == 0
    node = t.inputs[0] if len(t.inputs) == 1 else None
    if node is None or not is_op(node, "ConstantOfShape"):
        return False
    entry = shape_entry(node.inputs[0], axis, folder)
    return entry == 0


def shape_entry(t: gs.Tensor, position: int, folder) -> int | None:
    """Entry ``position`` of a 1-D int tensor when constant, through Concat of pieces."""
    value = folder.value(t)
    if value is not None:
        flat = value.reshape(-1)
        return int(flat[position]) if position < flat.size else None
    node = t.inputs[0] if len(t.inputs) == 1 else None
    if node is None or not is_op(node, "Concat"):
        return None
    offset = 0
    for piece in node.inputs:
        known = folder.value(piece)
        length = known.size if known is not None else _static_length(piece)
        if length is None:
            return None
        if position < offset + length:
            return None if known is None else int(known.reshape(-1)[position - offset])
        offset += length
    return None


def _static_length(t: gs.Tensor) -> int | None:
    if t.shape is not None and len(t.shape) == 1 and isinstance(t.shape[0], int):
        return t.shape[0]
    node = t.inputs[0] if len(t.inputs) == 1 else None
    if node is not None and node.op == "Unsqueeze":  # a scalar made 1-D
        return 1
    return None
