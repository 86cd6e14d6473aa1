"""The edits of the canonicalize pass: apply a CanonicalPlan to one Scan node.

Outer tensors keep their names: a Transpose, or the Scan itself, writes into the tensor
readers already read; a removed output's readers move to an equal value, through an
Identity where the tensor is a graph output.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from scanopt.graph import has_node, identity_root, in_graph_outputs, is_op, node_position
from scanopt.passes.canonicalize.epilogue import emit_epilogue, write_into
from scanopt.rewrite import Builder, detach, is_read, replace_all_uses
from scanopt.scan_view import ScanView


def apply_plan(node: gs.Node, plan, level, ctx) -> str:
    """Rewrite ``node`` as ``plan`` says; return the one-line description."""
    graph, body, n = level.graph, node.attrs["body"], plan.n
    top = level.parents[0] if level.parents else level.graph
    lead = list(node.inputs[:plan.first])  # Scan-8's sequence_lens
    inits, xs = list(node.inputs[plan.first:plan.first + n]), list(node.inputs[plan.first + n:])
    finals, ys = list(node.outputs[:n]), list(node.outputs[n:])
    description = _describe(plan, dict(node.attrs), inits, xs, ys, finals)
    # New nodes are built apart, then placed just before / just after the Scan.
    before, after = Builder(gs.Graph(), ctx.names), Builder(gs.Graph(), ctx.names)
    # The tensor each read scan output ends in: a folded reversal's output takes its place;
    # its value on axis 0 (before the Transpose back to its axis, if any).
    targets = {
        i: plan.output_flips[i].outputs[0] if i in plan.output_flips else ys[i]
        for i in plan.keep_outputs + list(plan.merged_outputs) + list(plan.epilogues)
    }
    axis0, moves = {}, []
    for i in plan.keep_outputs:
        axis0[i] = targets[i]
        if i in plan.output_perms:
            perm = plan.output_perms[i]
            inverse = [perm.index(d) for d in range(len(perm))]
            shape = _permuted(targets[i], inverse, ctx)
            axis0[i] = after.variable("scan_axis0_out", dtype=targets[i].dtype, shape=shape)
            moves.append((axis0[i], targets[i], perm))
    new_stacks = {}  # source index -> (body value stacked, the new scan output)
    for k, j in plan.new_stacks.items():
        value = identity_root(body.outputs[j])
        stack = after.variable(f"{value.name}_stacked", dtype=value.dtype)
        new_stacks[k] = (value, stack)
        axis0[k] = stack
    if plan.epilogues:  # emitted while the body still holds the nodes they lift
        view = ScanView.from_gs(node, ctx.opset, ctx.shapes)
        for k, chain in plan.epilogues.items():
            value = emit_epilogue(chain, axis0, xs, view, after, ctx.opset)
            if k in plan.output_perms:
                moves.append((value, targets[k], plan.output_perms[k]))
                axis0[k] = value
            else:
                write_into(value, targets[k], after)
                axis0[k] = targets[k]  # a merged duplicate of this output reads it
    _edit_body(body, plan, inits, ctx.names)
    for value, _ in new_stacks.values():  # a body output of its own: the state keeps its value
        copy = gs.Variable(ctx.names.fresh(f"{value.name}_step"), dtype=value.dtype, shape=value.shape)
        body.nodes.append(gs.Node("Identity", name=ctx.names.fresh(f"{value.name}_stack"), inputs=[value],
                                  outputs=[copy]))
        body.outputs.append(copy)
    redirects = [(finals[j], inits[j]) for j in plan.invariant_states]

    if plan.removes_node:
        position = node_position(graph, node)
        detach(node, graph)
        _redirect(redirects, after, top, graph)
        graph.nodes[position:position] = after.graph.nodes
        return "removed the Scan: every output it computes is unread or loop-invariant (" + description + ")"

    transposed: dict[tuple, gs.Tensor] = {}
    new_inputs = lead + [inits[j] for j in plan.keep_states]
    for i in plan.keep_inputs:
        source = plan.input_flips[i].inputs[0] if i in plan.input_flips else xs[i]
        if i in plan.input_perms:
            perm = plan.input_perms[i]
            key = (id(source), tuple(perm))
            if key not in transposed:
                shape = _permuted(source, perm, ctx)
                transposed[key] = before.op("Transpose", [source], perm=perm, dtype=source.dtype, shape=shape)
            source = transposed[key]
        new_inputs.append(source)
    node.inputs.clear()
    node.inputs.extend(new_inputs)
    for flip in list(plan.output_flips.values()) + list({id(f): f for f in plan.input_flips.values()}.values()):
        _drop_with_constants(flip, graph, top)

    node.outputs.clear()
    node.outputs.extend([finals[j] for j in plan.keep_states] + [axis0[i] for i in plan.keep_outputs]
                        + [stack for _, stack in new_stacks.values()])
    for dup, kept in plan.merged_outputs.items():
        if dup in plan.output_perms:  # the same values in another layout
            moves.append((axis0[kept], targets[dup], plan.output_perms[dup]))
        else:
            redirects.append((targets[dup], axis0[kept]))
    for stacked, target, perm in moves:
        after.op("Transpose", [stacked], outputs=[target], perm=perm)
    node.attrs.clear()
    node.attrs.update(plan.attrs)
    _redirect(redirects, after, top, graph)
    position = node_position(graph, node)
    graph.nodes[position:position + 1] = before.graph.nodes + [node] + after.graph.nodes
    return description


def _edit_body(body: gs.Graph, plan, inits: list, names) -> None:
    """Merge duplicate inputs, make invariant states read the outer initial value, and drop
    the removed inputs and outputs together with the body nodes left dead."""
    n, b_in = plan.n, list(body.inputs)
    for dup, kept in plan.merged_inputs.items():
        replace_all_uses(b_in[n + dup], b_in[n + kept], body)
    kept_slots = plan.keep_states + [n + i for i in plan.keep_outputs]
    for j in plan.invariant_states:
        old = b_in[j]
        passthrough = [p for p in kept_slots if body.outputs[p] is old]
        replace_all_uses(old, inits[j], body)
        if passthrough:  # a body output must be computed in the body: copy the outer value in
            copy = gs.Node("Identity", name=names.fresh(f"{old.name}_outer"), inputs=[inits[j]], outputs=[old])
            body.nodes.insert(0, copy)
            for p in passthrough:
                body.outputs[p] = old
    outputs = list(body.outputs)
    body.outputs = [outputs[p] for p in kept_slots]
    body.inputs = [b_in[j] for j in plan.keep_states] + [b_in[n + i] for i in plan.keep_inputs]
    body.cleanup(recurse_subgraphs=False, remove_unused_graph_inputs=False)


def _redirect(pairs, builder: Builder, top: gs.Graph, graph: gs.Graph) -> None:
    """Readers of each old tensor read the new value instead; a graph output keeps its name
    through an Identity."""
    for old, new in pairs:
        if in_graph_outputs(old, top):
            builder.op("Identity", [new], outputs=[old])
        elif is_read(old, top):
            replace_all_uses(old, new, graph)


def _drop_with_constants(flip: gs.Node, graph: gs.Graph, top: gs.Graph) -> None:
    """Remove a folded reversal and the Constant nodes only it read."""
    constants = [t.inputs[0] for t in flip.inputs[1:] if len(t.inputs) == 1 and is_op(t.inputs[0], "Constant")]
    detach(flip, graph)
    for const in constants:
        if has_node(graph, const) and not any(is_read(t, top) for t in const.outputs):
            detach(const, graph)


def _permuted(tensor: gs.Tensor, perm: list[int], ctx) -> list | None:
    shape = ctx.shapes.shape(tensor)
    return None if shape is None or len(shape) != len(perm) else [shape[p] for p in perm]


def _sources(chain, xs, new_stacks) -> str:
    """What an epilogue reads, for the report: 'scan output 0', 'scan output 2 and scan input 0',
    'the steps of state 0 (a new scan output)'."""
    read = [f"the steps of state {new_stacks[k]} (a new scan output)" if k in new_stacks else f"scan output {k}"
            for k in sorted(set(chain.sources.values()))]
    read += [f"scan input {j} ('{xs[j].name}')" for j in sorted(set(chain.elements.values()))]
    return " and ".join(read)


def _describe(plan, attrs: dict, inits, xs, ys, finals) -> str:
    """One line: every change, then what stays non-canonical."""
    in_axes = attrs.get("scan_input_axes", [0] * len(xs))
    out_axes = attrs.get("scan_output_axes", [0] * len(ys))
    parts = [f"removed scan output {i} (outer tensor '{ys[i].name}'), which nothing reads" for i in plan.dead_outputs]
    parts += [
        f"merged scan output {d} (outer tensor '{ys[d].name}') into scan output {k} (same body value)" for d, k in plan.merged_outputs.items()
    ]
    parts += [
        f"scan output {k} (outer tensor '{ys[k].name}') computed after the loop from {_sources(e, xs, plan.new_stacks)} "
        f"({', '.join(e.ops()) or 'a copy'})" for k, e in plan.epilogues.items()
    ]
    parts += [
        f"removed loop-invariant state {j}: the body reads its initial value, outer tensor '{inits[j].name}', directly" for j in plan.invariant_states
    ]
    parts += [
        f"removed dead state {j} (its final value, outer tensor '{finals[j].name}', is unread and nothing kept depends on it)" for j in plan.dead_states
    ]
    parts += [f"merged scan input {d} (outer tensor '{xs[d].name}') into scan input {k}" for d, k in plan.merged_inputs.items()]
    parts += [f"stopped passing outer tensor '{xs[i].name}' to the Scan (scan input {i}): the body never reads it" for i in plan.unused_inputs]
    for kind, flips in (("input", plan.input_flips), ("output", plan.output_flips)):
        parts += [f"folded the reversal node '{f.name}' of scan {kind} {i} into its direction" for i, f in flips.items()]
    for i, perm in plan.input_perms.items():
        parts.append(f"scan input {i} (outer tensor '{xs[i].name}'): axis {in_axes[i]} -> 0, Transpose{perm} before the Scan")
    for i, perm in plan.output_perms.items():
        parts.append(f"scan output {i} (outer tensor '{ys[i].name}'): axis {out_axes[i]} -> 0, Transpose{perm} after the Scan")
    if plan.dropped:
        parts.append("dropped default attributes " + ", ".join(plan.dropped))
    line = "; ".join(parts)
    return line + (" (left: " + "; ".join(plan.left) + ")" if plan.left else "")
