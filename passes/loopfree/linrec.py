"""linrec: a Scan whose states follow linear recurrences h' = a ⊙ h + b becomes a loop-free graph.

Recognized (:mod:`linear_form`): every state that changes is updated as a ⊙ h + b where a and b
depend only on scan elements, outer values and pass-through states (never on a state), and every
scan output reads states only after their update (h', not h). States of any rank; a and b
broadcast to it (a scalar or diagonal decay of a matrix state included).

Forms (:mod:`prefix_scan`), all over the whole sequence at once:
- a = 1 (running sums, counters): ``h0 + CumSum(B)``.
- otherwise (products b = 0 included): a chunked parallel scan, doubling within chunks of
  ``linrec_chunk`` steps and across chunks, no division, no log/exp.
The a's and b's and the scan outputs y_t = f(h_t, x_t) are the body lifted over all steps (the
rules of :mod:`lift`). Final states are the last row (static lengths) or h0 + the sum (sums).

A state wider than ``linrec_max_state`` (Mamba's [B, D, N]): the two-pass positions form
(:mod:`two_pass`; outputs linear in the state read in the chunk pass plus a decay correction,
:mod:`decay_correction`), which never materializes h over all steps; its lifted steps emit the
selective scan's products as MatMuls (:mod:`products`) and Softplus in vector ops
(:mod:`softplus`), the same values in forms onnxruntime runs faster.

Declined with the reason: a state read nonlinearly (:class:`NotLinear`), a or b depending on a
state, an output reading a state before its update, float16/bfloat16 states (the loop rounds the
state to 16 bits every step; another association order would round differently), a symbolic
length for the doubling form (the positions form reads the steps by position at run time),
opset < 11 (CumSum, Pad with input pads), and lengths below ``linrec_min_steps`` for the
chunked form (measured: it loses to the loop on short sequences).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.clone import clone_graph
from scanopt.graph import GraphLevel, identity_root, node_label
from scanopt.pass_api import FALLBACK_MARK, Match, PassContext, ScanPass, Skip, register_pass
from scanopt.passes.loopfree.lift import (
    Declined, LiftEmitter, LiftPlan, Value, element_value, emit_nodes, from_processing_order, plan_nodes,
    changing_states, to_processing_order,
)
from scanopt.passes.loopfree import absorb, dispatch
from scanopt.passes.loopfree.linear_attention import AttentionForm, emit_attention, find_attention
from scanopt.passes.loopfree.linear_form import LinearUpdate, NotLinear, Term, linear_update
from scanopt.emit import INT64_MAX, Emitter, supports
from scanopt.passes.loopfree.products import as_matmuls, unsqueezed_axes
from scanopt.passes.loopfree.decay_correction import ExponentChain, exponent_chain, linear_part
from scanopt.passes.loopfree.softplus import fast_softplus
from scanopt.passes.loopfree.prefix_scan import (
    carry_loop, chunk_loop_scan, chunk_loop_scan_symbolic, chunked_scan, cumulative_product,
    cumulative_sum, steady_two_pass_symbolic,
)
from scanopt.passes.loopfree.two_pass import (
    Chunking, by_position, permute_steps, position_loop, unpermute_steps,
)
from scanopt.rewrite import Guard, place_appended, rebind_outputs, replacing
from scanopt.scan_view import ScanView

# Chunk length: 16 for the doubling form; for the positions loop 0 = auto, the power of two at or
# below sqrt(T), balancing C loop iterations against log2(T/C) doubling rounds across chunks
# (bench_linrec --chunks 16,32,64,128: EMA T=2048 best at 32, minGRU T=1024 at 16-32).
DEFAULT_CHUNK = 16
AUTO_CHUNK = 0
DEFAULT_MIN_STEPS = 16
# Per-step state elements above which the chunked form barely beats the loop (bench_linrec: Mamba
# [1, 64, 16] = 1,024 elements 1.0-1.2x, a 64x64 matrix state 0.5x; EMA 128 and minGRU 64: 2-4x).
DEFAULT_MAX_STATE = 512
DEFAULT_ATTENTION_CHUNK = 64
DEFAULT_FORM = "auto"
FORMS = {"positions": chunk_loop_scan, "doubling": chunked_scan}
# "auto": doubling below this length, the positions loop from it (bench_linrec, EMA H=128 and
# minGRU H=64: doubling 1.4-2.9x at T=16..64 where the positions loop is 0.7-2.0x; at T=1024-2048
# the positions loop 2.3-4.4x, doubling 1.9-3.1x).
POSITIONS_FROM = 512
# States over linrec_max_state: the two-pass positions form (module two_pass), which never
# materializes h over all steps (bench_linrec, Mamba D=64, N=16, T=1024).
TWO_PASS = "two-pass"
# Two-pass: a and b are computed inside the position Loops when over all steps they would hold
# at least this many elements (1 MiB of float32, this machine's L2 per core), else lifted once
# (bench_linrec, Mamba D=64 N=16: in the Loops T=1024 3.62 ms against 3.89; T=16 loses to the
# per-position node overhead).
IN_LOOPS_FROM = 1 << 18
SYMBOLIC_SLOWER_BELOW = 64
STATE_DTYPES = (np.float32, np.float64, np.int32, np.int64)
# Two-pass: the outputs are read in the chunk pass plus a correction (module decay_correction)
# when they are linear in the state and take at most this many plan steps, since the correction
# repeats their linear part (bench_linrec, Mamba T=1024, y one MatMul: 2.72-2.85x against the
# second pass's 2.23x).
CORRECTED_MAX_LATE = 4


@dataclass
class LinrecMatch(Match):
    view: ScanView
    updates: dict[int, LinearUpdate]  # state index -> its update (changing states only)
    ranks: dict[int, int]  # state index -> state rank
    dtypes: dict[int, np.dtype]
    plan: LiftPlan
    early: list  # plan steps that do not read an updated state (a, b and what they need)
    late: list  # plan steps reading updated states (the scan outputs' rest)
    out_ranks: list[int | None]
    chunk: int
    form: str
    attention: AttentionForm | None = None  # the matmul form of decayed linear attention
    slower_below: int | None = None  # see Match; set for the chunked forms on a symbolic length
    checked_widths: list[int] = field(default_factory=list)  # states the run-time dispatch tests the width of
    # widening producers of the scan inputs to take into the body first (module absorb); the
    # match then describes the Scan they make, and ``plain`` is the Scan's own
    absorb: absorb.Absorption | None = None
    plain: "LinrecMatch | Skip | None" = None


@register_pass
class Linrec(ScanPass):
    name = "linrec"
    order = 60
    loop_free = True
    summary = "linear recurrences h' = a*h + b -> CumSum/CumProd, a chunked parallel scan, or linear attention's chunked matmul form"
    tunables = {
        "linrec_chunk": (int, f"chunk length C of the chunked parallel scan (default: {DEFAULT_CHUNK} for doubling, "
                              "about sqrt(T) for the positions loop)"),
        "linrec_min_steps": (int, f"shortest static length rewritten (default {DEFAULT_MIN_STEPS}; shorter loops are "
                                  "left to unroll)"),
        "linrec_max_state": (int, f"largest per-step state (elements, symbolic dims counted as 1) given the one-pass "
                                  f"chunked forms (default {DEFAULT_MAX_STATE}; sums are not limited; wider: "
                                  f"the {TWO_PASS} form)"),
        "linrec_attention_chunk": (int, f"chunk length of decayed linear attention's matmul form, the largest "
                                        f"divisor of T up to it (default {DEFAULT_ATTENTION_CHUNK})"),
        "linrec_dispatch_below": (int, f"a symbolic length: the loop below this many steps, the chunked form from it, "
                                       f"chosen at run time (default {dispatch.THRESHOLD}, measured)"),
        "linrec_form": (str, "within chunks: 'positions' (a Loop over the chunk's positions, all chunks at once), "
                             f"'doubling' (log-depth, no loop), '{TWO_PASS}' (chunk ends, then a second Loop "
                             "reading the outputs per position) or 'auto' (doubling below "
                             f"T={POSITIONS_FROM}, {TWO_PASS} over linrec_max_state; default {DEFAULT_FORM})"),
    }

    def match(self, node: gs.Node, view: ScanView, level: GraphLevel, ctx: PassContext) -> Match | Skip:
        if node.name and ctx.loop_branches.get(node.name) == self.name:  # before absorption: its Scan is new
            return Skip("the loop branch of linrec's run-time dispatch on the length (module dispatch): not "
                        "rewritten again")
        plain = self._match(node, view, level, ctx)
        found = absorb.absorption(node, view, level, ctx.shapes)
        if found is None:
            return plain
        wider = self._with_absorbed(node, view, found, level, ctx)
        if not isinstance(wider, LinrecMatch):
            return plain
        wider.absorb, wider.plain = found, plain
        return wider

    def _with_absorbed(self, node, view, found: absorb.Absorption, level, ctx, keep: bool = False):
        """The match of the Scan ``found``'s producers make; the Scan is built apart from the
        graph and unhooked again unless ``keep`` (then it is returned with its match). Only a
        kept Scan takes names: one built to be matched and dropped draws them from a draft, so
        a proposal consumes none (the names a rewrite gets do not depend on what was asked)."""
        names = ctx.names if keep else ctx.names.draft()
        scan = absorb.build(node, view, found, ctx.shapes, names, ctx.opset)
        try:
            wider = self._match(scan, ScanView.from_gs(scan, ctx.opset, ctx.shapes), level, ctx)
        except Exception:
            absorb.discard(scan)
            raise
        if not keep or not isinstance(wider, LinrecMatch):
            absorb.discard(scan)
            return wider
        return scan, wider

    def _match(self, node: gs.Node, view: ScanView, level: GraphLevel, ctx: PassContext) -> Match | Skip:
        if view.batched:
            return Skip("opset-8 batched Scan: linrec handles Scan-9+ (the upgrade pass converts it first)")
        if ctx.opset < 11:
            return Skip(f"CumSum and Pad with run-time pads need opset 11+, the model is at opset {ctx.opset}")
        body = node.attrs["body"]
        n = view.num_states
        changing = changing_states(body, n)
        if not changing:
            return Skip("no state changes across steps: a map (vectorize's case)")
        depends = _dependence(body, [body.inputs[i] for i in changing])
        updates: dict[int, LinearUpdate] = {}
        ranks: dict[int, int] = {}
        dtypes: dict[int, np.dtype] = {}
        for i in changing:
            label = f"state '{view.initial_states[i] or i}'"
            h_in, h_out = body.inputs[i], identity_root(body.outputs[i])
            try:
                update = linear_update(h_in, h_out, lambda t, i=i: i in depends.get(id(t), ()), ctx.shapes.shape)
            except NotLinear as exc:
                return Skip(f"{label} is not a linear recurrence: {exc}")
            for term in (update.a, update.b):
                for leaf in term.leaves() if term is not None else ():
                    if depends.get(id(leaf)):
                        return Skip(f"{label}: its coefficient '{leaf.name}' depends on a state, so a "
                                    "and b are not known before the loop")
            rank = ctx.shapes.rank(h_in) if ctx.shapes.rank(h_in) is not None else ctx.shapes.rank(node.inputs[i])
            if rank is None:
                return Skip(f"{label} has an unknown rank")
            dtype = ctx.shapes.dtype(h_in)
            if dtype is None or dtype.type not in STATE_DTYPES:
                return Skip(f"{label} is {dtype}: the loop rounds such a state every step and a parallel form "
                            "rounds in another order (float32, float64, int32, int64 states only)")
            updates[i], ranks[i], dtypes[i] = update, rank, dtype
        general = [i for i in changing if not updates[i].is_sum and not _by_cumprod(updates[i], ctx.opset, dtypes[i])]
        trip = view.trip_count

        minimum = ctx.options.get("linrec_min_steps", DEFAULT_MIN_STEPS)
        if trip is not None and trip < minimum:
            return Skip(f"{trip} steps is below linrec_min_steps={minimum}: short loops are left to unroll")
        attention = self._attention(node, view, body, changing, updates, ranks, dtypes, ctx)
        if isinstance(attention, LinrecMatch):
            return attention
        largest = ctx.options.get("linrec_max_state", DEFAULT_MAX_STATE)
        form = ctx.options.get("linrec_form", DEFAULT_FORM)
        two_pass = _two_pass_fits(view, general, changing, updates)
        for i in general:
            size = _state_elements(ctx.shapes.shape(body.inputs[i]))
            if size is None:
                # the body may declare less than the initial value says (onnxscript's Loop body
                # types h [?, ?] for a [B, 4] state); a state keeps its initial value's shape, so
                # a small one proves the state small. A wide one stays unknown: the loops of
                # linrec's own two-pass form, optimized again, keep their loops
                # (test_linrec_two_pass.py::test_optimizing_the_result_again_leaves_its_loops)
                outer = _state_elements(ctx.shapes.shape(node.inputs[i]))
                size = outer if outer is not None and outer <= largest else None
            if size is not None and size > largest and form == "auto" and two_pass is None:
                form = TWO_PASS
            elif (size is None or size > largest) and form != TWO_PASS:
                what = "an unknown shape" if size is None else f"{size:,} elements per step"
                why = f"; {two_pass}" if two_pass else ""
                return Skip(f"state '{view.initial_states[i] or i}' has {what}, over linrec_max_state={largest}: "
                            f"the loop is as fast or faster than the one-pass chunked forms on wide states{why}")
        if form == TWO_PASS and two_pass is not None:
            return Skip(f"linrec_form={TWO_PASS}: {two_pass}")
        if form == "auto":
            form = "positions" if trip is None or trip >= POSITIONS_FROM else "doubling"
        if general and trip is None and form not in ("positions", TWO_PASS):
            return Skip("the length is symbolic: the doubling form needs a static length (linrec_form=positions)")
        if form not in FORMS and form != TWO_PASS:
            return Skip(f"linrec_form={form!r} is not one of auto, {', '.join(FORMS)}, {TWO_PASS}")
        found = self._plan(node, view, body, changing, updates, ranks, ctx)
        if isinstance(found, Skip):
            return found
        plan, early, late, out_ranks = found
        chunk = int(ctx.options.get("linrec_chunk", AUTO_CHUNK))
        if chunk <= 0:  # two-pass: sqrt(T) too (bench_linrec --only mamba --chunks 16,32,64: T=1024 best at 32)
            chunk = DEFAULT_CHUNK if form == "doubling" else 1 << max(3, int(math.isqrt(trip or 1024)).bit_length() - 1)
        # a symbolic length runs the chunked forms with C fixed (padding, run-time counts): at T = 16
        # they measured 0.4-0.7x the loop (Mamba's two-pass 0.41-0.58x), at 64 1.1-1.6x
        slower = SYMBOLIC_SLOWER_BELOW if general and trip is None else None
        match = LinrecMatch(view, updates, ranks, dtypes, plan, early, late, out_ranks, chunk, form,
                            slower_below=slower)
        # the run-time dispatch: measured for the one-pass positions form (EMA, minGRU); the
        # two-pass form's crossover is not (it stays declined unmeasured on a symbolic length)
        if slower is not None and form == "positions" and _length_axis(view) is not None:
            widths = {i: _row_width(ctx.shapes.shape(body.inputs[i]) or ctx.shapes.shape(node.inputs[i])) for i in general}
            if all(w is None or w <= dispatch.MEASURED_STATE for w in widths.values()):
                match.dispatch_below = int(ctx.options.get("linrec_dispatch_below", dispatch.THRESHOLD))
                match.checked_widths = [i for i, w in widths.items() if w is None]
        return match

    def _attention(self, node, view, body, changing, updates, ranks, dtypes, ctx):
        """A LinrecMatch in the matmul form (module linear_attention) where it applies, else None."""
        if len(changing) != 1 or view.trip_count is None:
            return None
        i = changing[0]
        update = updates[i]
        if update.a is None or update.b is None or update.b.op != "leaf" or dtypes[i].type not in (np.float32, np.float64):
            return None
        n = view.num_states
        per_step = _dependence(body, list(body.inputs[n:]))
        for leaf in update.a.leaves():
            shape = ctx.shapes.shape(leaf)
            if shape is None and isinstance(leaf, gs.Constant):
                shape = list(np.asarray(leaf.values).shape)
            if per_step.get(id(leaf)) or shape is None or any(d != 1 for d in shape):
                return None  # a per-step or non-scalar decay: the elementwise forms
        new_state = {id(t) for t in _identity_chain(body.outputs[i])}
        found = find_attention(update.b.tensor, body.outputs[n:], new_state, ranks[i])
        if found is None:
            return None
        chunk = _divisor_at_most(view.trip_count, ctx.options.get("linrec_attention_chunk", DEFAULT_ATTENTION_CHUNK))
        if chunk is None:
            return None
        wanted = update.a.leaves() + [found.keys, found.values] + list(found.queries)
        planned = self._plan(node, view, body, changing, updates, ranks, ctx, wanted=wanted)
        if isinstance(planned, Skip):
            return None
        plan, early, late, _ = planned
        for t in [found.keys, found.values] + list(found.queries):
            if plan.value(t, ctx.shapes.shape).rank != ranks[i] - 1:
                return None
        out_ranks = [ranks[i] - 1] * view.num_scan_outputs
        return LinrecMatch(view, updates, ranks, dtypes, plan, early + late, [], out_ranks, chunk, "attention",
                           attention=found)

    def _plan(self, node, view, body, changing, updates, ranks, ctx, wanted=None):
        n = view.num_states
        roots: dict[int, Value] = {}
        for i in range(n):
            if i not in changing:
                roots[id(body.inputs[i])] = Value(False, ctx.shapes.rank(body.inputs[i]))
        for j in range(view.num_scan_inputs):
            if view.input_axes[j] != 0 and view.input_ranks[j] is None:
                return Skip(f"scan input '{view.scan_inputs[j]}' on axis {view.input_axes[j]} has an unknown rank")
            roots[id(body.inputs[n + j])] = element_value(view, j, body.inputs[n + j], ctx.shapes)
        updated = {id(t): i for i in changing for t in _identity_chain(body.outputs[i])}
        for t, i in updated.items():
            roots[t] = Value(True, ranks[i])
        chain = set().union(*(updates[i].chain for i in changing))
        old = {id(body.inputs[i]) for i in changing}
        leaves = [t for i in changing for term in (updates[i].a, updates[i].b) if term is not None for t in term.leaves()]
        outputs = list(body.outputs[n:]) if wanted is None else []
        nodes = _needed_until(body, (leaves if wanted is None else wanted) + outputs, set(updated))
        for nd in nodes:
            if id(nd) in chain:
                return Skip(f"a scan output reads '{nd.outputs[0].name}', part of a state update, not the new state")
            if any(id(t) in old for t in nd.inputs):
                return Skip(f"{nd.op} '{nd.name}' reads a state before its update (h, not h')")
        if any(id(t) in old for t in outputs):
            return Skip("a scan output is a state before its update (h, not h')")
        try:
            plan = plan_nodes(nodes, roots, ctx.opset, ctx.shapes.shape)
        except Declined as exc:
            return Skip(f"not lifted: {exc}")
        reads_new: set[int] = set(updated)
        early, late = [], []
        for step in plan.steps:
            nd = step[0]
            if any(id(t) in reads_new for t in nd.inputs):
                reads_new.update(id(t) for t in nd.outputs)
                late.append(step)
            else:
                early.append(step)
        out_ranks = []
        for k, t in enumerate(outputs):
            value = plan.value(t, ctx.shapes.shape)
            if (not value.per_step or view.output_axes[k] != 0) and value.rank is None:
                return Skip(f"scan output '{view.scan_outputs[k]}': the rank of body output '{t.name}' is unknown")
            out_ranks.append(value.rank)
        for leaf in leaves if wanted is None else wanted:
            if plan.value(leaf, ctx.shapes.shape).rank is None:
                return Skip(f"the rank of coefficient '{leaf.name}' is unknown")
        return plan, early, late, out_ranks

    def rewrite(self, node: gs.Node, match: Match, level: GraphLevel, ctx: PassContext) -> str:
        assert isinstance(match, LinrecMatch)
        if match.absorb is not None:
            built = self._with_absorbed(node, ScanView.from_gs(node, ctx.opset, ctx.shapes), match.absorb, level, ctx,
                                        keep=True)
            if isinstance(built, tuple):
                scan, wider = built
                wider.dispatch = match.dispatch and wider.dispatch_below is not None
                absorb.install(scan, node, match.absorb, level.graph)
                taken = len(match.absorb.moved)
                return f"{self.rewrite(scan, wider, level, ctx)}; {taken} producer{'s' * (taken > 1)} of its inputs " \
                       "taken into the steps (module absorb)"
            assert isinstance(match.plain, LinrecMatch), "the Scan with its producers no longer matches"
            match.plain.dispatch = match.dispatch and match.plain.dispatch_below is not None
            match = match.plain
        graph, view, plan = level.graph, match.view, match.plan
        position, start, build = replacing(node, graph, ctx.names)
        body = node.attrs["body"]
        n = view.num_states
        e = LiftEmitter(build, ctx.opset, steps=lambda: e.length(scanned[0]))
        scanned = [to_processing_order(e, node.inputs[n + j], view, j) for j in range(view.num_scan_inputs)]
        if match.form == TWO_PASS:
            at = Chunking.of(e, match.chunk, view.trip_count, scanned[0])
            scanned = [permute_steps(e, x, view.input_ranks[j], at, _element_shape(node.inputs[n + j],
                                                                                  view.input_axes[j], ctx))
                       for j, x in enumerate(scanned)]
        mapping: dict[int, gs.Tensor] = {id(body.inputs[i]): node.inputs[i] for i in range(n) if i not in match.updates}
        mapping.update((id(body.inputs[n + j]), x) for j, x in enumerate(scanned))
        if match.form == TWO_PASS:
            early, late = self._faster_steps(node, match, body, ctx)
            outside, inside = _split_by_width(early, late, match, body, ctx)
            (i, _), = match.updates.items()
            wide = _state_elements(ctx.shapes.shape(body.inputs[i]) or ctx.shapes.shape(node.inputs[i])) or 0
            if view.trip_count is not None and view.trip_count * wide < IN_LOOPS_FROM:  # fits the cache: lifted once
                outside, inside = early, []
            emit_nodes(outside, e, mapping)
        else:
            emit_nodes(match.early, e, mapping)
        if match.attention is not None:
            return self._rewrite_attention(node, match, e, mapping, graph, position, start, ctx)
        if match.form == TWO_PASS:
            return self._rewrite_two_pass(node, match, e, mapping, graph, position, start, at, inside, late, ctx)
        finals: dict[int, gs.Tensor] = {}
        forms = []
        checked = []  # the chunked forms' states over all steps and final states (floating point)
        by_position = {}  # state index -> its ByPosition, read back in step order after every state's passes
        for i, update in match.updates.items():
            rank, dtype, h0 = match.ranks[i], match.dtypes[i], node.inputs[i]
            b = _per_step(e, update.b, mapping, plan, rank, dtype, ctx) if update.b is not None else None
            if update.is_sum:
                h = cumulative_sum(e, h0, b)
                finals[i] = _last_or_initial(e, h, h0, b, view.trip_count)
                forms.append("CumSum")
            elif _by_cumprod(update, ctx.opset, dtype):
                a = _per_step(e, update.a, mapping, plan, rank, dtype, ctx)
                h, finals[i] = cumulative_product(e, h0, a)
                forms.append("CumProd")
            else:
                value, per_step, a_rank = _evaluate(e, update.a, mapping, plan, dtype, ctx)
                if view.trip_count is None and not per_step and b is not None:  # a learned decay, run-time length
                    by_position[i] = steady_two_pass_symbolic(e, h0, value, b, rank, match.chunk, dtype, a_rank)
                elif view.trip_count is None:  # the positions form with a run-time chunk count
                    a = _stacked(e, value, per_step, a_rank, rank)
                    h, finals[i] = chunk_loop_scan_symbolic(e, h0, a, b, rank, match.chunk, dtype).assemble(e)
                elif not per_step and match.form == "positions" and b is not None:  # a learned decay
                    h, finals[i] = chunk_loop_scan(e, h0, value, b, rank, view.trip_count, match.chunk, dtype,
                                                   steady_rank=a_rank)
                else:
                    a = _stacked(e, value, per_step, a_rank, rank)
                    h, finals[i] = FORMS[match.form](e, h0, a, b, rank, view.trip_count, match.chunk, dtype)
                what = "chunked scan" if update.b is not None else "chunked product"
                forms.append(f"{what} (C={min(match.chunk, view.trip_count or match.chunk)}, {match.form}"
                             f"{', symbolic length' if view.trip_count is None else ''})")
                if np.issubdtype(dtype, np.floating):
                    # by position: each chunk's end (its states are finite exactly when these are)
                    checked += [(by_position[i].ends, dtype)] if i in by_position else [(h, dtype), (finals[i], dtype)]
                if i in by_position:
                    continue
            mapping.update((id(t), h) for t in _identity_chain(body.outputs[i]))
        # from here on, the nodes only read the states back and compute the outputs: with a check
        # on chunk ends alone, they go into the If's finite branch (no copy of the outputs there)
        tail = len(graph.nodes) if by_position and checked and len(checked) == len(by_position) else None
        for i, chunks in by_position.items():
            h, finals[i] = chunks.assemble(e)
            mapping.update((id(t), h) for t in _identity_chain(body.outputs[i]))
        _emit_aliasing_identities(match.late, e, mapping)
        outputs = []
        for k, t in enumerate(body.outputs[n:]):
            value = mapping.get(id(t), t)
            if not plan.value(t, ctx.shapes.shape).per_step:
                value = e.over_steps(value, match.out_ranks[k])
            outputs.append(from_processing_order(e, value, view, k, match.out_ranks[k]))
        states = [finals.get(i, node.inputs[i]) for i in range(n)]
        # the positions forms' chunk Loops (loop_to_scan makes them Scans) and Scans: not matched again
        ctx.chosen.update((nd.name, self.name) for nd in graph.nodes[start:] if nd.op in ("Loop", "Scan"))
        values, guarded = states + outputs, ""
        if checked:
            values = _loop_unless_finite(e, node, values, checked, ctx, tail)
            guarded = "; the loop behind an If where the state is not finite at some step"
        below = self._replace(node, match, values, graph, start, ctx)
        added = place_appended(graph, position, start - 1)
        left = f"{below} on the finite path" if guarded else below
        return f"linear recurrence{'s' if len(forms) > 1 else ''} -> {', '.join(forms)}{guarded} ({added} nodes, {left})"

    def _replace(self, node: gs.Node, match: LinrecMatch, values: list, graph: gs.Graph, start: int, ctx) -> str:
        """``node``'s outputs become ``values`` (computed by the nodes appended from ``start``
        on), or with ``match.dispatch`` those nodes go behind If(length < dispatch_below) with
        ``node`` itself in the other branch (module dispatch); what is left, for the report."""
        if not match.dispatch:
            rebind_outputs(node, values, graph)
            return "no Scan left"
        if not node.name:  # named as the report labelled it, for the entries of later passes
            label = node_label(node)
            node.name = ctx.names.fresh(label)
            ctx.derived[node.name] = label
        ctx.loop_branches[node.name] = self.name
        view = match.view
        widths = [(node.inputs[i], match.ranks[i]) for i in match.checked_widths]
        dispatch.wrap(node, values, graph, start, match.dispatch_below, node.inputs[view.num_states], _length_axis(view),
                      ctx.opset, ctx.names, ctx.shapes.dtype, widths)
        wide = (f" or a state over {dispatch.MEASURED_STATE} elements per batch row (its width is symbolic)"
                if widths else "")
        return (f"behind If(T < {match.dispatch_below}{wide}): the Scan below {match.dispatch_below} steps, this form "
                "from there (the length is symbolic: a run-time dispatch)")

    def _rewrite_attention(self, node, match: LinrecMatch, e: LiftEmitter, mapping, graph, position, start, ctx) -> str:
        (i, update), = match.updates.items()
        found, view, plan = match.attention, match.view, match.plan
        gamma, _, _ = _evaluate(e, update.a, mapping, plan, match.dtypes[i], ctx)
        keys, values = (_lifted_steps(e, t, mapping, plan, ctx) for t in (found.keys, found.values))
        queries = [_lifted_steps(e, t, mapping, plan, ctx) for t in found.queries]
        s0 = node.inputs[i]
        swap = list(range(found.batch)) + [found.batch + 1, found.batch]  # S [*b, dv, dk] <-> Sᵀ [*b, dk, dv]
        if found.transposed:
            s0 = e.op("Transpose", [s0], perm=swap)
        ys, final = emit_attention(e, gamma, keys, values, queries, s0, found.batch, view.trip_count,
                                   match.chunk, match.dtypes[i])
        if found.transposed:
            final = e.op("Transpose", [final], perm=swap)
        outputs = [from_processing_order(e, y, view, k, match.out_ranks[k]) for k, y in enumerate(ys)]
        states = [final if k == i else node.inputs[k] for k in range(view.num_states)]
        rebind_outputs(node, states + outputs, graph)
        added = place_appended(graph, position, start - 1)
        return (f"decayed linear attention -> chunked matmul form (C={match.chunk}; masked decay matrix, "
                f"chunk states by doubling) ({added} nodes, no Scan left)")


    def _faster_steps(self, node: gs.Node, match: LinrecMatch, body: gs.Graph, ctx) -> tuple[list, list]:
        """(early, late) plan steps with the selective scan's products as MatMuls (module products)
        and Softplus in vector ops (module softplus)."""
        (i, _), = match.updates.items()
        if match.dtypes[i].type not in (np.float32, np.float64):
            return match.early, match.late
        new_state = {id(t) for t in _identity_chain(body.outputs[i])}
        state_shape = ctx.shapes.shape(body.inputs[i]) or ctx.shapes.shape(node.inputs[i])

        def rank_of(t):
            value = match.plan.value(t, ctx.shapes.shape)
            return value.rank, value.per_step

        def last_dim_of(t):
            shape = state_shape if id(t) in new_state else ctx.shapes.shape(t)
            unknown = shape is None or not isinstance(shape[-1] if shape else None, (int, np.integer))
            if unknown and len(t.inputs) == 1 and t.inputs[0].op == "Unsqueeze" and rank_of(t)[0]:
                # a derived rank gives [None] * r: the last dim is then its input's
                rank = rank_of(t)[0]
                if rank - 1 not in unsqueezed_axes(t, rank):
                    shape = ctx.shapes.shape(t.inputs[0].inputs[0])
            last = shape[-1] if shape else None
            return int(last) if isinstance(last, (int, np.integer)) else None

        outputs = {id(t) for t in body.outputs}
        late_reads = {id(t) for step in match.late for t in step[0].inputs}
        dtype = match.dtypes[i]
        return (fast_softplus(as_matmuls(match.early, rank_of, last_dim_of, outputs | late_reads, dtype), ctx.shapes.dtype),
                fast_softplus(as_matmuls(match.late, rank_of, last_dim_of, outputs, dtype), ctx.shapes.dtype))

    def _rewrite_two_pass(self, node, match: LinrecMatch, e: LiftEmitter, mapping, graph, position, start,
                          at: Chunking, inside: list, late: list, ctx) -> str:
        """The two-pass positions form (module two_pass). ``mapping`` holds the early values
        lifted over the steps in position-major order, but for the ``inside`` steps (those
        computing state-wide values for a and b), which both Loops compute per position on
        [K, ...] slices, so no value over all steps and the state's width is ever materialized."""
        (i, update), = match.updates.items()
        view, plan, body = match.view, match.plan, node.attrs["body"]
        rank, dtype, h0 = match.ranks[i], match.dtypes[i], node.inputs[i]
        n = view.num_states
        new_state = _identity_chain(body.outputs[i])
        computed_inside = {id(t) for step in inside + late for t in step[0].outputs} | {id(t) for t in new_state}
        read = {id(t): t for step in inside + late for t in step[0].inputs if t.name}
        read.update((id(t), t) for term in (update.a, update.b) for t in term.leaves())
        per_step = {key: by_position(e, mapping[key], at, plan.value(t, ctx.shapes.shape).rank + 1, ctx.shapes.shape(t))
                    for key, t in read.items()
                    if key in mapping and key not in computed_inside and plan.value(t, ctx.shapes.shape).per_step}

        def coefficients(inner: Emitter, gathered: dict):
            """a and b at the position ([K, ...] or broadcasting to it). Padding steps come after
            the last chunk's real steps, so they reach no output and no other chunk; the final
            state is read at the last real step (:func:`_at_last_step`)."""
            le = LiftEmitter(inner.b, inner.opset, steps=lambda: None)
            scope = {**mapping, **gathered}
            emit_nodes(inside, le, scope)
            pair = []
            for term in (update.a, update.b):
                value, varies, r = _evaluate(le, term, scope, plan, dtype, ctx)
                pair.append(le.pad(value, rank - r) if varies else value)
            return pair, scope

        count = e.ints("count", [at.count]) if at.static else at.count
        state_shape = e.op("Concat", [count, e.op("Shape", [h0])], axis=0)
        outs = [k for k, t in enumerate(body.outputs[n:]) if id(t) in computed_inside]
        linear = linear_part(late, {id(t) for t in new_state}, ctx.shapes.shape) \
            if (not at.static or at.count > 1) and len(late) <= CORRECTED_MAX_LATE else None
        if linear is not None:
            final, stacked, loops, checked = self._first_pass_and_correction(
                e, match, body, h0, mapping, per_step, coefficients, inside, late, linear, outs, at, state_shape, ctx)
            form = "the outputs read in the chunk pass plus a decay correction"
        else:
            final, stacked, loops, checked = self._chunk_ends_then_outputs(
                e, match, body, h0, per_step, coefficients, late, outs, at, state_shape)
            form = "chunk ends, then the outputs read per position"
        ctx.chosen.update((t.inputs[0].name, self.name) for t in loops)
        computed = dict(zip(outs, stacked))
        results = []
        for k, t in enumerate(body.outputs[n:]):
            r = match.out_ranks[k]
            if k in computed:
                value = e.op("Reshape", [computed[k], e.op("Concat", [e.ints("rows", [-1]), e.slice(
                    e.op("Shape", [computed[k]]), [2], [INT64_MAX], [0])], axis=0)])
            else:
                value = mapping.get(id(t), t)
                if not plan.value(t, ctx.shapes.shape).per_step:
                    value = e.over_steps(value, r)
            results.append(from_processing_order(e, unpermute_steps(e, value, r + 1, at), view, k, r))
        states = [final if k == i else node.inputs[k] for k in range(n)]
        values, guarded = states + results, ""
        if checked and np.issubdtype(dtype, np.floating):
            values = _loop_unless_finite(e, node, values, [(v, dtype) for v in checked], ctx)
            guarded = "; the loop behind an If where a chunk start or the final state is not finite"
        below = self._replace(node, match, values, graph, start, ctx)
        added = place_appended(graph, position, start - 1)
        length = "" if at.static else ", symbolic length"
        left = f"{below} on the finite path" if guarded else below
        return f"linear recurrence -> chunked scan (C={at.chunk}, {TWO_PASS}{length}: {form}{guarded}) " \
               f"({added} nodes, {left})"

    def _chunk_ends_then_outputs(self, e, match: LinrecMatch, body, h0, per_step, coefficients, late, outs,
                                 at: Chunking, state_shape):
        """(final state, stacked outputs, the Loops' results): pass 1 carries each chunk's local
        state from zero and its running product of a; pass 2 runs again from the chunk starts
        and reads the outputs (any function of the state)."""
        (i, _), = match.updates.items()
        n, rank, dtype = match.view.num_states, match.ranks[i], match.dtypes[i]
        new_state = _identity_chain(body.outputs[i])
        loops = []
        if at.static and at.count == 1:
            starts = e.unsqueeze(h0, [0])
        else:
            def ends(inner, _, carried, gathered):
                (a, b), _ = coefficients(inner, gathered)
                h, p = carried
                return [inner.op("Add", [inner.op("Mul", [a, h]), b]), inner.op("Mul", [a, p])], []

            zeros, ones = (_filled(e, state_shape, v, dtype) for v in (0, 1))
            (local, product), _ = position_loop(e, [zeros, ones], per_step, at.chunk, rank + 1, dtype, ends)
            (across,), (starts,) = carry_loop(e, product, local, h0, None, rank, dtype, at.chunks(e), False,
                                              before=True)
            loops += [product, across]

        def outputs(inner, _, carried, gathered):
            (a, b), scope = coefficients(inner, gathered)
            h = inner.op("Add", [inner.op("Mul", [a, carried[0]]), b], dtype=dtype, shape=[None] * (rank + 1))
            return [h], _read_per_position(inner, scope, h, new_state, late, [body.outputs[n + k] for k in outs], at)

        (finals,), stacked = position_loop(e, [starts], per_step, at.chunk, rank + 1, dtype, outputs)
        loops.append(finals)
        if at.padded:
            final, stacked = _at_last_step(e, stacked[-1], at, h0), stacked[:-1]
        else:
            final = e.squeeze(e.slice(finals, [-1], [INT64_MAX], [0]), [0])
        # one chunk runs the loop's own steps from h0: nothing to check
        return final, stacked, loops, ([] if at.static and at.count == 1 else [starts, final])

    def _first_pass_and_correction(self, e, match: LinrecMatch, body, h0, mapping, per_step, coefficients, inside,
                                   late, linear, outs, at: Chunking, state_shape, ctx):
        """(final state, stacked outputs, the Loops' results) by the module decay_correction's
        form: pass 1 from zero reads the outputs on the local state (and carries Π a unless a is
        Exp of a value linear in a per-step one: then Exp(f(Σ x)) per chunk); the correction
        Loop carries G = a ⊙ G from the chunk starts and adds the outputs' linear part of G."""
        (i, update), = match.updates.items()
        plan, n = match.plan, match.view.num_states
        rank, dtype = match.ranks[i], match.dtypes[i]
        new_state = _identity_chain(body.outputs[i])
        per_step_value = lambda t: plan.value(t, ctx.shapes.shape).per_step  # noqa: E731
        available = {key for key in mapping if key not in {id(t) for step in inside for t in step[0].outputs}}
        chain = exponent_chain(update.a.tensor, inside, available, per_step_value) if update.a.op == "leaf" else None
        a_steps = _steps_needed(inside, update.a.leaves())

        def first(inner, _, carried, gathered):
            (a, b), scope = coefficients(inner, gathered)
            h = inner.op("Add", [inner.op("Mul", [a, carried[0]]), b], dtype=dtype, shape=[None] * (rank + 1))
            new = [h] if chain is not None else [h, inner.op("Mul", [a, carried[1]])]
            return new, _read_per_position(inner, scope, h, new_state, late, [body.outputs[n + k] for k in outs], at)

        carried = [_filled(e, state_shape, 0, dtype)] + ([] if chain is not None else [_filled(e, state_shape, 1, dtype)])
        ends, local_ys = position_loop(e, carried, per_step, at.chunk, rank + 1, dtype, first)
        if chain is None:
            decay = ends[1]
        else:
            decay = _chunk_decay(e, chain, mapping, per_step, plan, at, rank, ctx)
        for value in (decay, ends[0]):  # [K, ...]: declared, so loop_to_scan reads them as they are
            if value.shape is None and at.static:
                value.shape = [at.count] + [None] * rank
        (final,), (starts,) = carry_loop(e, decay, ends[0], h0, None, rank, dtype, at.chunks(e), False, before=True)

        def correction(inner, _, carried, gathered):
            le = LiftEmitter(inner.b, inner.opset, steps=lambda: None)
            scope = {**mapping, **gathered}
            emit_nodes(a_steps, le, scope)
            a, varies, r = _evaluate(le, update.a, scope, plan, dtype, ctx)
            g = inner.op("Mul", [le.pad(a, rank - r) if varies else a, carried[0]], dtype=dtype,
                         shape=[None] * (rank + 1))
            return [g], _read_per_position(inner, scope, g, new_state, linear, [body.outputs[n + k] for k in outs], at)

        (corrected,), corrections = position_loop(e, [starts], per_step, at.chunk, rank + 1, dtype, correction)
        if at.padded:  # the state at the last real step: local + the start's decay there
            final = _at_last_step(e, e.op("Add", [local_ys.pop(), corrections.pop()]), at, h0)
        stacked = [e.op("Add", [y, c]) for y, c in zip(local_ys, corrections)]
        # Π a computed as Exp(f(Σ x)) does not see a running product that overflows mid-chunk:
        # the correction's own (sticky) end does
        checked = [starts, final] + ([corrected] if chain is not None else [])
        return final, stacked, [ends[-1], starts, corrected], checked


def _loop_unless_finite(e: LiftEmitter, node: gs.Node, values: list, checked: list, ctx, tail: int | None = None) -> list:
    """``values`` (a chunked form's results for ``node``'s outputs) behind
    ``If(some value of checked is not finite)`` (pairs of a value and its dtype), whose then
    branch runs ``node``'s Scan as it is. ``tail``: the nodes of the graph from this index on
    (none of them computing a checked value) go into the else branch, writing its outputs
    there; otherwise the else branch copies ``values`` (Identity).

    The one-pass chunked forms (module prefix_scan) check the state at every step and the
    final state: doubling composes the a's of a chunk in a tree, whose partial products the
    loop never forms (one can overflow at a position while the chunk's end stays finite), and
    a state that overflows the loop's way gives NaN there (inf - inf where terms of both signs
    overflow, 0·inf after a zero initial state: the differential fuzz's x1e4 regime). Where
    every state is finite, the outputs are the same reads of states within rounding of the
    loop's; where one is not, the loop's own outcome. The check is one ReduceSum over the
    states the form has made anyway (measured, thread CPU time, one thread, --target portable,
    time relative to the loop without -> with it: EMA H=128 T=2048 0.258 -> 0.262 and T=64
    0.483 -> 0.531, minGRU H=64 T=1024 0.189 -> 0.189 and T=64 0.365 -> 0.383; spreads
    0.01-0.08).

    Two-pass:

    The chunk starts combine each chunk's local state (from zero) and decay (Π a) with the
    previous start; the loop never forms these. Where the loop's state overflows, they make
    NaN where the loop has ±inf (issue 33 S7: 0·inf when Π a underflows to 0 after a start of
    inf, inf - inf when a chunk's local state overflows the other way): a NaN behind a bounded
    read (Tanh), or an inf one where the loop's is finite. Every such case leaves a start or
    the final state non-finite (an overflowed local state or product stays non-finite through
    the chunk: a·inf + b is ±inf or NaN), and where all are finite, each position's state is
    the loop's from a start within rounding. So: finite, the form; else the loop itself (the
    same outcome on a NaN or inf input). The check is one ReduceSum over the K starts, not
    over the steps.

    By position on a symbolic length with a steady decay (prefix_scan.steady_two_pass_symbolic):
    the states are the loop's steps from the chunk starts, and a non-finite one stays so to its
    chunk's end, so the K chunk ends are checked, and reading the states back in step order
    (``tail``) happens in the finite branch only."""
    moved = []
    if tail is not None:
        moved = e.b.graph.nodes[tail:]
        e.b.graph.nodes[:] = e.b.graph.nodes[:tail]
    totals: dict = {}  # per dtype (a Scan's float32 and float64 states are summed apart)
    for value, kind in checked:
        # one pass: the sum is ±inf or NaN where a value is (or, all finite, where the sum
        # itself overflows: the loop then, which is slower but the same outcome)
        part = e.op("ReduceSum", [value], keepdims=0)
        kind = np.dtype(kind)
        totals[kind] = part if kind not in totals else e.op("Add", [totals[kind], part])
    finite = None
    for kind, total in totals.items():
        zero = e.op("Sub", [total, total])  # 0, or NaN for ±inf and NaN
        ok = e.op("Greater", [zero, e.const("minus_one", np.array(-1, kind))], dtype=np.bool_, shape=[])
        finite = ok if finite is None else e.op("And", [finite, ok], dtype=np.bool_, shape=[])
    overflowed = e.op("Not", [finite], dtype=np.bool_, shape=[])
    names = e.b.names
    guard = Guard(names, names.fresh("linrec_overflowed"), names.fresh("linrec_finite"))
    loop = guard.then.values(node.outputs, "{}_loop")
    # a body of its own: the Scan itself may stay in the graph and be rewritten further (the loop
    # branch of linrec's run-time dispatch on the length, which hoist changes)
    attrs = {**node.attrs, "body": clone_graph(node.attrs["body"], ctx.names)}
    guard.then.graph.nodes.append(gs.Node("Scan", name=names.fresh(f"{FALLBACK_MARK}_{node.name or 'scan'}"),
                                          attrs=attrs, inputs=list(node.inputs), outputs=loop))
    written = [k for k, t in enumerate(node.outputs) if t.name]
    if tail is not None:
        guard.orelse.graph.nodes.extend(moved)
        form = guard.orelse.values([node.outputs[k] for k in written], "{}_chunked")
        placeholder = gs.Node("Identity", inputs=[], outputs=list(form))
        guard.orelse.graph.nodes.append(placeholder)
        rebind_outputs(placeholder, [values[k] for k in written], guard.orelse.graph)
    else:
        form = [guard.orelse.b.op("Identity", [values[k]], dtype=node.outputs[k].dtype, shape=node.outputs[k].shape)
                for k in written]
    results = [e.b.variable(f"{t.name}_guarded", dtype=t.dtype, shape=t.shape) if t.name else None for t in node.outputs]
    guard.close(e.b, overflowed, [results[k] for k in written], [loop[k] for k in written], form, domain=e.domain)
    return results  # None: an omitted output


def _length_axis(view: ScanView) -> int | None:
    """The scan axis of the first scan input, non-negative, where known (the run-time length)."""
    if not view.num_scan_inputs:
        return None
    axis, rank = view.input_axes[0], view.input_ranks[0]
    if axis >= 0:
        return axis
    return axis + rank if rank is not None and axis + rank >= 0 else None


def _steps_needed(steps: list, wanted) -> list:
    """The ``steps`` (in order) that ``wanted`` body values depend on."""
    needed = {id(t) for t in wanted}
    kept = []
    for step in reversed(steps):
        if any(id(t) in needed for t in step[0].outputs):
            kept.append(step)
            needed.update(id(t) for t in step[0].inputs)
    return kept[::-1]


def _chunk_decay(e: LiftEmitter, chain: ExponentChain, mapping, per_step: dict, plan: LiftPlan, at: Chunking,
                 rank: int, ctx) -> gs.Tensor:
    """Π a over each chunk, [K, ...] (rank ``rank`` + 1), for a = Exp(f(x)), f linear in x:
    Exp(f(Σ x)) with x summed over the chunk (the last chunk's padding included: its decay
    reaches nothing); x by position [C, K, ...] as the Loops read it where they do."""
    x_rank = plan.value(chain.x, ctx.shapes.shape).rank
    x = per_step.get(id(chain.x))
    if x is None:
        x = by_position(e, mapping[id(chain.x)], at, x_rank + 1, ctx.shapes.shape(chain.x))
    total = e.op("ReduceSum", [x, e.ints("axes", [0])], keepdims=0) if e.opset >= 13 else \
        e.op("ReduceSum", [x], axes=[0], keepdims=0)
    scope = {**mapping, id(chain.x): total}
    emit_nodes(chain.steps, e, scope)
    return e.pad(e.op("Exp", [scope[id(chain.u)]]), rank - plan.value(chain.u, ctx.shapes.shape).rank)


def _filled(e: Emitter, shape: gs.Tensor, value, dtype) -> gs.Tensor:
    """A tensor of ``shape`` (int64 [rank]) holding ``value`` (the Loops' zero start, ones)."""
    return e.op("ConstantOfShape", [shape], value=gs.Constant(e.b.names.fresh("fill"), np.full([1], value, dtype)))


def _read_per_position(inner: Emitter, scope: dict, state: gs.Tensor, new_state, steps, outputs, at: Chunking) -> list:
    """The body ``outputs`` read from ``state`` (the new state at a position, [K, ...]) by the
    plan ``steps``, then the last chunk's row of it where padding may exist (_at_last_step)."""
    scope.update((id(t), state) for t in new_state)
    le = LiftEmitter(inner.b, inner.opset, steps=lambda: le.length(state))
    _emit_aliasing_identities(steps, le, scope)
    last = [inner.slice(state, [-1], [INT64_MAX], [0])] if at.padded else []
    return [scope[id(t)] for t in outputs] + last


def _at_last_step(e: LiftEmitter, rows: gs.Tensor, at: Chunking, h0: gs.Tensor) -> gs.Tensor:
    """The state at step T - 1 from ``rows`` [C, 1, ...], the last chunk's state at each
    position: position T - 1 - (K - 1)·C; h0 for zero steps (a symbolic length)."""
    if at.static:
        c = at.steps - 1 - (at.count - 1) * at.chunk
        return e.squeeze(e.slice(rows, [c], [c + 1], [0]), [0, 1])
    c = e.op("Sub", [at.steps, e.op("Mul", [e.op("Sub", [at.count, e.ints("one", [1])]), e.ints("chunk", [at.chunk])])])
    c = e.op("Max", [e.op("Sub", [c, e.ints("one", [1])]), e.ints("zero", [0])])
    last = e.squeeze(e.op("Gather", [rows, c], axis=0), [0, 1])
    return e.op("Where", [e.op("Greater", [at.steps, e.ints("zero", [0])]), last, h0])


def _split_by_width(early: list, late: list, match: LinrecMatch, body: gs.Graph, ctx) -> tuple[list, list]:
    """(outside, inside): the early steps computed once over all steps, and those the position
    Loops compute per position: the ones making a value of the state's rank for a or b (the
    broadcasts and what follows them: Δ ⊗ A, Exp, the outer product; not Unsqueeze or Reshape,
    which only view a small value), and only where nothing outside them reads their values."""
    (i, update), = match.updates.items()
    rank = match.ranks[i]
    views = ("Unsqueeze", "Reshape", "Identity", "Squeeze", "Flatten")
    inside = {id(step[0]) for step in early
              if step[0].op not in views and all(
                  (v := match.plan.value(t, ctx.shapes.shape)).per_step and v.rank == rank
                  for t in step[0].outputs if t.name)}
    readers_ok = {id(t) for term in (update.a, update.b) for t in term.leaves()}
    outputs = {id(t) for t in body.outputs}
    late_nodes = {id(step[0]) for step in late}
    changed = True
    while changed:  # drop a step whose value something outside the loops reads
        changed = False
        for step in early:
            node = step[0]
            if id(node) not in inside:
                continue
            for t in node.outputs:
                consumers = [c for c in t.outputs if id(c) not in inside and id(c) not in late_nodes]
                if id(t) in outputs or (consumers and id(t) not in readers_ok) or \
                        any(not isinstance(c, gs.Node) for c in consumers):
                    inside.discard(id(node))
                    changed = True
                    break
    return [s for s in early if id(s[0]) not in inside], [s for s in early if id(s[0]) in inside]


def _term_shape(term: Term, rank: int, ctx) -> list | None:
    """The per-step shape of a one-leaf term as it is stacked (unit axes in front up to ``rank``),
    where known; None for other terms."""
    shape = ctx.shapes.shape(term.tensor) if term.op == "leaf" else None
    return None if shape is None or len(shape) > rank else [1] * (rank - len(shape)) + list(shape)


def _element_shape(x: gs.Tensor, axis: int, ctx) -> list | None:
    """A scan input's per-step shape (its shape without the scan axis), where known."""
    shape = ctx.shapes.shape(x)
    if shape is None:
        return None
    return [d for k, d in enumerate(shape) if k != (axis % len(shape))]


def _two_pass_fits(view: ScanView, general: list[int], changing: list[int], updates) -> str | None:
    """Why the two-pass positions form does not apply, or None."""
    if len(changing) != 1 or len(general) != 1 or updates[general[0]].b is None:
        return "the two-pass form takes one state with a general update (a and b both present)"
    if any(r is None for r in view.input_ranks):
        return "the two-pass form needs the ranks of the scan inputs"
    return None


def _lifted_steps(e: LiftEmitter, t: gs.Tensor, mapping, plan: LiftPlan, ctx) -> gs.Tensor:
    value = plan.value(t, ctx.shapes.shape)
    lifted = mapping.get(id(t), t)
    return lifted if value.per_step else e.over_steps(lifted, value.rank)


def _per_step(e: LiftEmitter, term: Term, mapping, plan: LiftPlan, rank: int, dtype, ctx) -> gs.Tensor:
    """``term`` over all steps as [T, ...] of rank ``rank`` + 1 (an invariant term repeated)."""
    return _stacked(e, *_evaluate(e, term, mapping, plan, dtype, ctx), rank)


def _stacked(e: LiftEmitter, value: gs.Tensor, per_step: bool, r: int, rank: int) -> gs.Tensor:
    if not per_step:
        value = e.over_steps(value, r)
    return e.pad(value, rank - r)


def _evaluate(e: LiftEmitter, term: Term, mapping, plan: LiftPlan, dtype, ctx):
    """(tensor, per_step, per-step rank) of an h-free term, lifted."""
    if term.op in ("one", "zero"):
        return e.const(term.op, (np.ones if term.op == "one" else np.zeros)([], dtype)), False, 0
    if term.op == "leaf":
        t = term.tensor
        value = plan.value(t, ctx.shapes.shape)
        return mapping.get(id(t), t), value.per_step, value.rank
    parts = [_evaluate(e, arg, mapping, plan, dtype, ctx) for arg in term.args]
    if term.op == "view":  # expanded to the reshape's input shape, then reshaped with it
        (x, per_step, r), (pre, out) = parts[0], term.shapes
        if per_step:
            x = e.op("Expand", [e.pad(x, len(pre) - r), e.ints("shape", [1, *pre])])
            return e.op("Reshape", [x, e.ints("shape", [0, *out])]), True, len(out)  # 0 copies the step count
        x = e.op("Expand", [x, e.ints("shape", list(pre))])
        return e.op("Reshape", [x, e.ints("shape", list(out))]), False, len(out)
    if term.op == "neg":
        x, per_step, r = parts[0]
        return e.op("Neg", [x]), per_step, r
    if term.op == "where":  # the condition and both branches broadcast as the body's Where does
        r = max(rank for _, _, rank in parts)
        args = [e.pad(x, r - rx) if px else x for x, px, rx in parts]
        return e.op("Where", args), any(px for _, px, _ in parts), r
    (x, px, rx), (y, py, ry) = parts
    r = max(rx, ry)
    x = e.pad(x, r - rx) if px else x
    y = e.pad(y, r - ry) if py else y
    op = {"mul": "Mul", "add": "Add", "sub": "Sub", "div": "Div"}[term.op]
    return e.op(op, [x, y]), px or py, r


def _last_or_initial(e: LiftEmitter, h: gs.Tensor, h0: gs.Tensor, b: gs.Tensor, trip: int | None) -> gs.Tensor:
    """The final state of a sum: the last row for a static length >= 1, else h0 + the total,
    which is h0 for zero steps. An integer state: the last row of
    [h0; h] (issue 33, S8): onnxruntime's integer ReduceSum is not exact (int64 2^55 + 3 gives
    2^55) and its int32 one saturates, where CumSum and Add are exact and wrap as the loop does."""
    if trip is not None and trip >= 1:
        return e.squeeze(e.slice(h, [trip - 1], [trip], [0]), [0])
    if h.dtype is not None and np.dtype(h.dtype).kind in "iu" or h0.dtype is not None and np.dtype(h0.dtype).kind in "iu":
        rows = e.op("Concat", [e.unsqueeze(h0, [0]), h], axis=0)
        return e.squeeze(e.slice(rows, [-1], [INT64_MAX], [0]), [0])
    total = e.op("ReduceSum", [b, e.ints("axes", [0])], keepdims=0) if e.opset >= 13 else \
        e.op("ReduceSum", [b], axes=[0], keepdims=0)
    return e.op("Add", [h0, total])


def _by_cumprod(update: LinearUpdate, opset: int, dtype) -> bool:
    """A product (b = 0) the opset's CumProd computes (probed in onnx.defs: CumProd is opset 26+)."""
    return update.is_product and not update.is_sum and supports("CumProd", opset, dtype)


def _divisor_at_most(steps: int, most: int) -> int | None:
    """The largest chunk length <= ``most`` dividing ``steps`` (at least 8, or ``steps`` itself)."""
    if steps <= most:
        return steps
    return next((c for c in range(most, 7, -1) if steps % c == 0), None)


def _emit_aliasing_identities(steps, e: LiftEmitter, mapping) -> None:
    """emit_nodes, but an Identity maps its output to its input instead of copying T steps."""
    for step in steps:
        nd = step[0]
        if nd.op == "Identity" and nd.inputs[0].name:
            mapping[id(nd.outputs[0])] = mapping.get(id(nd.inputs[0]), nd.inputs[0])
        else:
            emit_nodes([step], e, mapping)


def _row_width(shape) -> int | None:
    """A state's elements per batch row (its leading dim; a rank-1 state is one row) where every
    other dim is known, else None: then the run-time dispatch tests it (module dispatch). A
    symbolic width counted as 1 let Mamba's [B, D, N] through as narrow, where the chunked form
    measured 0.59-0.68x the loop at D=64, N=16, T=1024 (models/heldout_mamba, declared: the
    tuner's times; whole model without shapes, einsum_outside_os 0.93x -> 0.98x, A/A 5-8%)."""
    rest = list(shape[1:]) if shape and len(shape) > 1 else list(shape or [])
    if shape is None or any(not isinstance(d, (int, np.integer)) or d < 0 for d in rest):
        return None
    return int(np.prod(rest, dtype=np.int64))


def _state_elements(shape) -> int | None:
    """Elements per step, a symbolic dim (a name) counted as 1; None when a dim is not known at
    all (the rank alone known, or a partial shape: a chunk Loop's [C, K, ?, ...] once made a
    Scan, whose width must not be guessed small)."""
    if shape is None or any(d is None for d in shape):
        return None
    return int(np.prod([d if isinstance(d, (int, np.integer)) and d > 0 else 1 for d in shape], dtype=np.int64))


def _identity_chain(t: gs.Tensor) -> list[gs.Tensor]:
    """``t`` and the values it copies through Identity nodes (all the new state)."""
    chain = [t]
    while chain[-1] is not identity_root(chain[-1]):
        chain.append(chain[-1].inputs[0].inputs[0])
    return chain


def _dependence(body: gs.Graph, states: list[gs.Tensor]) -> dict[int, set[int]]:
    """id(body value) -> indices (into ``states``' Scan numbering) of the states it depends on."""
    index = {id(t): i for i, t in zip(_state_indices(body, states), states)}
    deps: dict[int, set[int]] = {id(t): {i} for t, i in ((t, index[id(t)]) for t in states)}
    for nd in body.nodes:
        found: set[int] = set()
        for t in nd.inputs:
            found |= deps.get(id(t), set())
        if found:
            for t in nd.outputs:
                deps[id(t)] = found
    return deps


def _state_indices(body: gs.Graph, states: list[gs.Tensor]) -> list[int]:
    position = {id(t): k for k, t in enumerate(body.inputs)}
    return [position[id(t)] for t in states]


def _needed_until(body: gs.Graph, wanted, stop: set[int]) -> list:
    """The body nodes ``wanted`` depend on, in body order, not looking past values in ``stop``."""
    producer = {id(t): nd for nd in body.nodes for t in nd.outputs}
    keep: set[int] = set()
    stack = [producer[id(t)] for t in wanted if id(t) in producer and id(t) not in stop]
    while stack:
        nd = stack.pop()
        if id(nd) in keep:
            continue
        keep.add(id(nd))
        stack.extend(producer[id(t)] for t in nd.inputs if id(t) in producer and id(t) not in stop)
    return [nd for nd in body.nodes if id(nd) in keep]
