"""Loop fission, the construction: the two Scan nodes of a split, each with its own body
(copies for a trial, the node's own body for the first piece of the real rewrite), and
the unhooking of pieces a trial built and does not keep (gs records every reader on the
tensors a node reads, outer-scope captures of nested bodies included).
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from scanopt.clone import clone_graph
from scanopt.graph import GraphLevel, cleanup, node_label, walk_graphs
from scanopt.passes.canonicalize.fission_plan import Fission
from scanopt.rewrite import replace_all_uses
from scanopt.scan_view import ScanView


def build_pieces(node, view, plan: Fission, inputs, outputs, ctx, *, rest_name: str, reuse_body: bool = False):
    """The two Scan nodes (first, rest) reading ``inputs`` and writing ``outputs`` (the
    node's own, or stand-ins for a trial). ``reuse_body``: the first piece takes the
    node's body itself (the node goes); else both bodies are copies. A string when the
    pieces would still read each other's states (never expected: the plan's analysis)."""
    n, m, lead = view.num_states, view.num_scan_inputs, 1 if view.batched else 0
    body, names = node.attrs["body"], ctx.names
    inits, xs = inputs[lead:lead + n], inputs[lead + n:]
    finals, ys = outputs[:n], outputs[n:]
    rest_body, rest_of = _copy(body, ctx)
    first_body, first_of = (body, lambda t: t) if reuse_body else _copy(body, ctx)
    b_in, b_out = list(body.inputs), list(body.outputs)
    steps = []
    emitted = [f for p, f in enumerate(plan.frontier) if p not in plan.stacked_as]
    for f in plan.frontier:
        shape = ctx.shapes.shape(f)
        step = gs.Variable(names.fresh(f"{f.name}_step"), dtype=ctx.shapes.dtype(f), shape=shape)
        replace_all_uses(rest_of(f), step, rest_body)
        steps.append(step)
    rest_outs = list(rest_body.outputs)
    _finish(rest_body, [rest_of(b_in[j]) for j in plan.rest] + [rest_of(t) for t in b_in[n:]] + steps,
            [rest_outs[j] for j in plan.rest] + [rest_outs[n + i] for i in plan.rest_outputs], names)
    _finish(first_body, [first_of(b_in[j]) for j in plan.first] + [first_of(t) for t in b_in[n:]],
            [first_of(b_out[j]) for j in plan.first] + [first_of(b_out[n + i]) for i in plan.first_outputs]
            + [first_of(f) for f in emitted], names)
    leaks = [(g, [of(b_in[j]) for j in other]) for g, of, other in
             ((rest_body, rest_of, plan.first), (first_body, first_of, plan.rest))]
    if any(_read_in(t, g) for g, ts in leaks for t in ts):
        for g in (rest_body, first_body) if not reuse_body else (rest_body,):
            unhook_graph(g)
        return "the pieces would still read each other's states"
    new_stacks = [gs.Variable(names.fresh(f"{f.name}_stacked"), dtype=ctx.shapes.dtype(f)) for f in emitted]
    made = iter(new_stacks)
    stacks = [ys[plan.stacked_as[p]] if p in plan.stacked_as else next(made) for p in range(len(plan.frontier))]
    attrs = dict(node.attrs)
    first_attrs = _attrs(attrs, view, first_body, plan.first_outputs, 0)
    rest_attrs = _attrs(attrs, view, rest_body, plan.rest_outputs, len(steps))
    # the first piece keeps the node's label (reports, rollback keys, measured choices)
    first_name = (node.name or ctx.names.fresh(node_label(node))) if reuse_body else node.name
    first = gs.Node("Scan", name=first_name, attrs=first_attrs, domain=node.domain,
                    inputs=list(inputs[:lead]) + [inits[j] for j in plan.first] + list(xs),
                    outputs=[finals[j] for j in plan.first] + [ys[i] for i in plan.first_outputs] + new_stacks)
    rest = gs.Node("Scan", name=rest_name, attrs=rest_attrs, domain=node.domain,
                   inputs=list(inputs[:lead]) + [inits[j] for j in plan.rest] + list(xs) + stacks,
                   outputs=[finals[j] for j in plan.rest] + [ys[i] for i in plan.rest_outputs])
    return first, rest


def _attrs(attrs: dict, view: ScanView, body: gs.Graph, outputs: list[int], extra_inputs: int) -> dict:
    """A piece's attributes: the node's, its own scan outputs', and forward axis-0 entries
    for the frontier (the first piece's extra outputs, the rest's extra inputs)."""
    m = view.num_scan_inputs
    extra_outputs = len(body.outputs) - len(outputs) - (len(body.inputs) - m - extra_inputs)
    new = dict(attrs, body=body, num_scan_inputs=m + extra_inputs)
    if view.batched:
        if "directions" in attrs:
            new["directions"] = list(view.input_directions) + [0] * extra_inputs
        return new
    per = {"scan_input_axes": (list(view.input_axes), extra_inputs),
           "scan_input_directions": (list(view.input_directions), extra_inputs),
           "scan_output_axes": ([view.output_axes[i] for i in outputs], extra_outputs),
           "scan_output_directions": ([view.output_directions[i] for i in outputs], extra_outputs)}
    for key, (values, more) in per.items():
        raw = attrs.get(key)
        if key.startswith("scan_input"):
            values = list(raw) if raw is not None else values
        else:
            values = [list(raw)[i] for i in outputs] if raw is not None else values
        values += [0] * more
        if any(values) or (raw is not None and values):
            new[key] = values
        else:
            new.pop(key, None)
    return new


def _copy(body: gs.Graph, ctx):
    """A detached copy of ``body`` and original -> copy for its inputs and its nodes'
    values; a copy without a declared shape or type takes the original's inferred one."""
    copy = clone_graph(body, ctx.names)
    mapping = {id(a): b for a, b in zip(body.inputs, copy.inputs)}
    for old, new in zip(body.nodes, copy.nodes):
        for a, b in zip(list(old.inputs) + list(old.outputs), list(new.inputs) + list(new.outputs)):
            mapping.setdefault(id(a), b)
    for a in list(body.inputs) + [t for node in body.nodes for t in node.outputs]:
        b = mapping[id(a)]
        if b.shape is None:
            b.shape = ctx.shapes.shape(a)
        if b.dtype is None:
            b.dtype = ctx.shapes.dtype(a)
    return copy, lambda t: mapping.get(id(t), t)


def _finish(body: gs.Graph, inputs: list, outputs: list, names) -> None:
    """Give ``body`` its signature; an output that is an input or listed twice goes
    through an Identity; drop the nodes nothing reads any more."""
    listed: set[int] = {id(t) for t in inputs}
    final = []
    for t in outputs:
        if id(t) in listed:
            copy = gs.Variable(names.fresh(f"{t.name}_copy"), dtype=t.dtype, shape=t.shape)
            body.nodes.append(gs.Node("Identity", name=names.fresh(f"{t.name}_copy"), inputs=[t], outputs=[copy]))
            t = copy
        listed.add(id(t))
        final.append(t)
    body.inputs = list(inputs)
    body.outputs = final
    dropped = [node for node in body.nodes]
    cleanup(body)
    kept = {id(node) for node in body.nodes}
    for node in dropped:  # a removed node's own bodies still hold reads of our values
        if id(node) not in kept:
            for level in walk_graphs(gs.Graph(nodes=[node])):
                if level.parents:
                    unhook_graph(level.graph, recurse=False)


def _read_in(t: gs.Tensor, graph: gs.Graph) -> bool:
    """Whether a node of ``graph`` (nested bodies included) or its outputs read ``t``."""
    return any(t is x for level in walk_graphs(graph) for node in level.graph.nodes for x in node.inputs) or any(
        t is o for o in graph.outputs)


def unhook(node: gs.Node) -> None:
    """Detach a node that never joins the graph, and every node of its bodies, from the
    tensors they read and write (gs keeps readers on each tensor)."""
    for level in walk_graphs(gs.Graph(nodes=[node])):
        unhook_graph(level.graph, recurse=False)


def unhook_graph(graph: gs.Graph, recurse: bool = True) -> None:
    """Detach every node of ``graph`` (and, with ``recurse``, of the graphs nested in it)."""
    levels = walk_graphs(graph) if recurse else [GraphLevel(graph, (), "")]
    for level in levels:
        for node in level.graph.nodes:
            node.inputs.clear()
            node.outputs.clear()
