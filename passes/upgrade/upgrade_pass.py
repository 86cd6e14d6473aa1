"""upgrade: rewrite every opset-8 (batched) Scan into an equivalent opset-9+ construction.

Handles Scan-8 at every nesting level (deepest first), with or without sequence_lens,
any directions, any number of states, scan inputs and scan outputs, and bodies that read
outer-scope values. The graph's outputs keep their tensors (names, types, shapes);
scan-output positions at and past ``len[b]`` are zero. Strategies, cheapest correct first:

(a) batch 1, no sequence_lens: Squeeze the batch axis, one Scan-9, Unsqueeze it back.
(b) batch-polymorphic body (proved by :mod:`proof`): one Scan-9 over the time
    axis (axis 1) with the batch inside every state and element; sequence_lens by a mask
    computed once (a state keeps its value past ``len[b]``, an output is zero there);
    reverse inputs with lengths go through ReverseSequence first (:mod:`batched`).
(c) anything else (and batch 1 with sequence_lens, where (b)'s masks cost more than
    they save): a loop over batch items (a Scan-9 over the batch axis) whose body runs a
    Scan-9 over the item's first ``len[b]`` steps and pads the outputs with zeros
    (:mod:`per_item`).

``options["upgrade_strategy"]`` ("a", "b" or "c") forces one strategy (for tests and
benchmarks); a forced strategy that does not apply is a skip with the reason.

A Scan-9 is valid only at opset >= 9, and the rest of the model must be converted
around it, so this pass rewrites only inside :func:`scanopt.migrate.migrate` (which sets
``options["target_opset"]`` and converts everything else). Emitted nodes are written at
the target opset in the hold domain until the migration releases them. Without a target
opset a Scan-8 is kept, with a reason that says how to ask for the migration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.graph import GraphLevel, dtype_of, node_label
from scanopt.emit import HOLD_DOMAIN, MIN_TARGET, Emitter, supports
from scanopt.pass_api import Match, PassContext, ScanPass, Skip, register_pass
from scanopt.passes.upgrade.proof import BatchPlan, prove_batch_polymorphic
from scanopt.rewrite import Builder, rebind_outputs
from scanopt.scan_view import ScanView

STRATEGY_TEXT = {
    "a": "strategy (a): batch 1 squeezed around one Scan-9",
    "b": "strategy (b): one Scan-9 over time, batch kept inside states and elements",
    "c": "strategy (c): loop over batch items (a Scan-9 over the batch axis), one Scan-9 per item",
}


@dataclass
class UpgradeMatch(Match):
    strategy: str  # "a", "b" or "c"
    view: ScanView
    target: int
    batch_dim: int | str | None  # the batch size where the graph states it
    output_ranks: list[int | None]  # per-item ranks of the body outputs (states, then scan outputs)
    output_dtypes: list[np.dtype]  # body output dtypes (states, then scan outputs)
    input_dtypes: list[np.dtype]  # dtypes of the node's inputs (sequence_lens if present, states, scans)
    plan: BatchPlan | None = None  # strategy (b)
    why_not_b: str = ""  # strategy (c): why (b) was declined


@register_pass
class Upgrade(ScanPass):
    name = "upgrade"
    kind = "normalizer"
    order = 20
    summary = "rewrite opset-8 batched Scans into equivalent opset-9+ Scans (needs a target opset)"

    def match(self, node: gs.Node, view: ScanView, level: GraphLevel, ctx: PassContext) -> Match | Skip:
        if not view.batched:
            return Skip(f"already Scan-{view.version}; only Scan-8 needs upgrading")
        target = ctx.options.get("target_opset")
        if target is None or target < MIN_TARGET:
            return Skip(
                "kept as Scan-8: an unbatched Scan needs opset >= 9 and the model is at opset 8; run "
                f"`scanopt upgrade --target-opset N IN OUT` or pass --target-opset N to optimize "
                f"(N >= {MIN_TARGET})"
            )
        body = node.attrs["body"]
        n, m = view.num_states, view.num_scan_inputs
        dtypes = [_dtype(ctx, t) for t in body.outputs]
        if any(d is None for d in dtypes):
            return Skip("a body output has no element type; declare the body's output types")
        inputs = [t for t in node.inputs if t.name]
        # An outer value nothing types (e.g. the output of an ai.onnx.ml op onnx cannot
        # infer) has the element type its body input declares: Scan's contract.
        declared = ([np.dtype(np.int64)] if view.sequence_lens is not None else []) + [
            _dtype(ctx, t) for t in body.inputs[:n + m]]
        input_dtypes = [_first_known(_dtype(ctx, t), d) for t, d in zip(inputs, declared)]
        if any(d is None for d in input_dtypes):
            return Skip("an input of the Scan has no known element type")
        ranks = [_rank(ctx, t) for t in body.outputs]
        ranks[:n] = [r if r is not None else _rank(ctx, t) for r, t in zip(ranks[:n], body.inputs[:n])]
        batch_dims = [_dim0(ctx, t) for t in node.inputs[1:1 + n + m]]
        known = {d for d in batch_dims if d is not None}
        batch = next((d for d in known if isinstance(d, int)), None) if known else None
        common = dict(view=view, target=target, batch_dim=batch, output_ranks=ranks, output_dtypes=dtypes,
                      input_dtypes=input_dtypes)
        if view.sequence_lens is not None:
            unpaddable = [str(d) for d in dtypes[n:] if d.kind in "OSU" or not supports("ConstantOfShape", target, d)]
            if unpaddable:
                return Skip(f"scan outputs of type {', '.join(unpaddable)} cannot be zero-padded at opset {target}")
        forced = ctx.options.get("upgrade_strategy") or "auto"
        if forced not in ("auto", "a", "b", "c"):
            return Skip(f"unknown upgrade strategy '{forced}' (choose a, b, c or auto)")
        squeezable = view.sequence_lens is None and known == {1}
        if forced == "a" or (forced == "auto" and squeezable):
            if not squeezable:
                return Skip("strategy (a) needs batch 1 stated by the graph and no sequence_lens")
            return UpgradeMatch("a", **common)
        if forced == "c":
            found = "strategy (c) was asked for"
        elif forced == "auto" and known == {1}:  # then (b)'s per-step masks cost more than they save
            found = "batch 1 with sequence_lens: slicing one item is cheaper than masking every step"
        else:
            found = _match_batched(node, view, target, ranks, dtypes, ctx)
        if isinstance(found, BatchPlan):
            return UpgradeMatch("b", plan=found, **common)
        if forced == "b":
            return Skip(f"strategy (b) does not apply: {found}")
        return UpgradeMatch("c", why_not_b=found if forced == "auto" else "", **common)

    def rewrite(self, node: gs.Node, match: Match, level: GraphLevel, ctx: PassContext) -> str:
        assert isinstance(match, UpgradeMatch)
        name = node_label(node)
        _declare_body_outputs(node.attrs["body"], match, ctx)
        if match.strategy == "a":
            new = _rewrite_batch_one(node, match, level, ctx)
        elif match.strategy == "b":
            from scanopt.passes.upgrade.batched import rewrite_batched

            new = rewrite_batched(node, match, level, ctx)
        else:
            from scanopt.passes.upgrade.per_item import rewrite_per_item

            new = rewrite_per_item(node, match, level, ctx)
        new.name = name  # the replacement takes over the Scan-8's name (it is gone now)
        detail = f"{STRATEGY_TEXT[match.strategy]} (opset {match.target})"
        if match.view.sequence_lens is not None:
            detail += ", sequence_lens " + ("by masking" if match.strategy == "b" else "by slicing and zero padding")
        if match.why_not_b:
            detail += f"; not (b): {match.why_not_b}"
        if match.strategy == "c" and match.view.sequence_lens is not None and _batch(node, match.view, ctx) == 1:
            detail += (f"; expected {BATCH1_LENS_SPEED:.2f}x the Scan-8's speed (strategy c at batch 1 with "
                       "sequence_lens is slower than Scan-8)")
        return detail


# strategy (c) at batch 1 with sequence_lens against the Scan-8 it replaces (issue 14: 11-18%
# slower on three BiDAF-style bodies; benchmarks/bench_upgrade.py). The upgrade is what an
# opset migration needs: it is never declined for speed, only described.
BATCH1_LENS_SPEED = 0.85


def _batch(node: gs.Node, view: ScanView, ctx: PassContext) -> int | None:
    """The Scan-8's batch (axis 0 of its first scan input) at the deployment shapes, else as the
    graph states it."""
    x = next((t for t in node.inputs if view.scan_inputs and t.name == view.scan_inputs[0]), None)
    if x is None:
        return None
    deployment = ctx.options.get("deployment")
    shape = (deployment.type_of(x.name)[1] if deployment is not None else None) or ctx.shapes.shape(x)
    return shape[0] if shape and isinstance(shape[0], int) else None


def _declare_body_outputs(body: gs.Graph, match: UpgradeMatch, ctx: PassContext) -> None:
    """Declare each body output's shape that inference at the source opset knows and the body
    leaves out: onnxruntime runs a Scan-8 body with unshaped outputs but refuses a Scan-9
    body output it cannot shape, and after migration it may no longer infer one (e.g. the
    converter's Softmax 12->13 form ends in Reshape(.., Shape(x))). Strategy (b) prefixes the
    batch axis to the ones it batches; any other output stays undeclared."""
    batched = {id(t) for t in match.plan.batched} if match.strategy == "b" else None
    for tensor in body.outputs:
        shape = ctx.shapes.shape(tensor) if tensor.shape is None else None
        if shape is not None and (batched is None or id(tensor) in batched):
            tensor.shape = list(shape)


def _match_batched(node, view: ScanView, target: int, ranks, dtypes, ctx) -> BatchPlan | str:
    """Strategy (b)'s preconditions and proof; the reason it does not apply otherwise."""
    if view.sequence_lens is not None and any(view.input_directions) and target < 10:
        return "reverse inputs with sequence_lens need ReverseSequence (opset 10)"
    if view.sequence_lens is not None and any(r is None for r in ranks):
        return "the rank of a body output is unknown, so its per-step mask cannot be shaped"
    if view.sequence_lens is not None and not all(supports("Where", target, d) for d in dtypes):
        return f"Where at opset {target} cannot mask every state and output type"
    return prove_batch_polymorphic(node.attrs["body"], ctx.shapes.shape)


def _rewrite_batch_one(node: gs.Node, match: UpgradeMatch, level: GraphLevel, ctx: PassContext) -> gs.Node:
    """(a): Squeeze axis 0 of every state and scan input, Scan-9, Unsqueeze every output."""
    view = match.view
    e = held(level.graph, match, ctx)
    inputs = [e.squeeze(t, [0]) for t in node.inputs[1:]]
    outputs = [e.b.variable(f"{t.name}_item", dtype=t.dtype) for t in node.outputs]
    scan_9(e, inputs, outputs, node.attrs["body"], view.num_scan_inputs, directions=view.input_directions)
    scan = outputs[0].inputs[0]
    rebind_outputs(node, [e.unsqueeze(t, [0]) for t in outputs], level.graph)
    return scan


def held(graph: gs.Graph, match: UpgradeMatch, ctx: PassContext) -> Emitter:
    """An Emitter of ops at the target opset, in the hold domain (see scanopt.migrate)."""
    return Emitter(Builder(graph, ctx.names), match.target, domain=HOLD_DOMAIN)


def scan_9(e: Emitter, inputs, outputs, body, m: int, *, directions=(), input_axes=None, output_axes=None) -> None:
    """Append a Scan (opset 9+ form) writing into ``outputs``."""
    attrs = {"body": body, "num_scan_inputs": m}
    if any(directions):
        attrs["scan_input_directions"] = list(directions)
    if input_axes:
        attrs["scan_input_axes"] = list(input_axes)
    if output_axes:  # none when the Scan has no scan outputs (an empty list cannot be exported)
        attrs["scan_output_axes"] = list(output_axes)
    e.op("Scan", inputs, outputs=outputs, **attrs)


def _dtype(ctx: PassContext, tensor: gs.Tensor) -> np.dtype | None:
    """The tensor's numpy dtype, declared or inferred (np.dtype is falsy: test for None)."""
    dtype = dtype_of(tensor)
    if dtype is not None:
        return dtype
    elem = ctx.shapes.elem_type(tensor)
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)) if elem else None


def _first_known(*dtypes):
    """The first dtype that is not None (np.dtype is falsy, so ``a or b`` would skip it)."""
    return next((d for d in dtypes if d is not None), None)


def _rank(ctx: PassContext, tensor: gs.Tensor) -> int | None:
    shape = ctx.shapes.shape(tensor)
    return None if shape is None else len(shape)


def _dim0(ctx: PassContext, tensor: gs.Tensor):
    shape = ctx.shapes.shape(tensor)
    return shape[0] if shape else None
