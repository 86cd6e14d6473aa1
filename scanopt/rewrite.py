"""Graph edits: the one small module every pass makes its changes through.

The idiom: a rewrite builds new nodes that write into the replaced node's own output
tensors (so graph outputs and every reader, nested bodies included, keep their names,
types and shapes), then detaches the old node. New values get fresh model-wide names
from the pipeline's NameAllocator. A rewrite that must keep the original's behaviour where its
form cannot run puts the form behind an If through :class:`Guard`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.graph import NameAllocator, has_node, in_graph_outputs, node_position, note_output, output_positions, remove_node


class Builder:
    """Adds nodes, values and constants to one graph with fresh model-wide names.

    ``builder.op("Transpose", [x], perm=[1, 0])`` appends a node and returns its output;
    pass ``outputs=[...]`` to write into existing tensors instead (e.g. the outputs of
    the node being replaced).
    """

    def __init__(self, graph: gs.Graph, names: NameAllocator, prefix: str = ""):
        self.graph = graph
        self.names = names
        self.prefix = prefix

    def _fresh(self, hint: str) -> str:
        return self.names.fresh(f"{self.prefix}{hint}" if self.prefix else hint)

    def variable(self, hint: str, dtype=None, shape=None) -> gs.Variable:
        return gs.Variable(self._fresh(hint), dtype=dtype, shape=shape)

    def constant(self, hint: str, value) -> gs.Constant:
        return gs.Constant(self._fresh(hint), np.asarray(value))

    def op(
        self,
        op: str,
        inputs: Sequence[gs.Tensor],
        *,
        outputs: Sequence[gs.Tensor] | None = None,
        n_outputs: int = 1,
        dtype=None,
        shape=None,
        domain: str | None = None,
        **attrs,
    ):
        """Append ``op`` to the graph; return its output (or the list when several). Every
        other keyword is an ONNX attribute (``num_outputs`` of Split-18 included)."""
        if outputs is None:
            outputs = [self.variable(f"{op.lower()}_out", dtype, shape if n_outputs == 1 else None) for _ in range(n_outputs)]
        node = gs.Node(op, name=self._fresh(op.lower()), attrs=attrs, inputs=list(inputs), outputs=list(outputs), domain=domain)
        self.graph.nodes.append(node)
        return outputs[0] if len(outputs) == 1 else list(outputs)


def replacing(node: gs.Node, graph: gs.Graph, names: NameAllocator) -> tuple[int, int, Builder]:
    """The prologue of a rewrite that replaces ``node``: where it stands (for
    :func:`place_appended`), where the nodes it is about to append will start, and a
    Builder naming new values after it."""
    prefix = f"{node.name}_" if node.name else ""
    return node_position(graph, node), len(graph.nodes), Builder(graph, names, prefix=prefix)


def detach(node: gs.Node, graph: gs.Graph) -> None:
    """Remove ``node`` from ``graph`` and unhook its tensors, so new producers can own them."""
    node.inputs.clear()
    node.outputs.clear()
    remove_node(graph, node)


def rebind_outputs(old: gs.Node, new_values: Sequence[gs.Tensor | None], graph: gs.Graph) -> None:
    """Detach ``old`` and make each of its output tensors be computed as ``new_values[i]``.

    Readers keep reading the old tensor object, so its name, type and shape survive
    (graph outputs included). Where the new value comes from a node of ``graph``, that
    node writes into the old tensor directly and the new value's readers move to it;
    otherwise (a graph input, a constant, a value already bound to another output) an
    Identity links them. ``None`` marks an output nobody reads any more; so does an omitted
    optional output (empty name), which no node may write (onnx.checker rejects it).
    """
    outputs = list(old.outputs)
    detach(old, graph)
    bound: dict[int, gs.Tensor] = {}  # id(new value) -> the old tensor now holding it
    for old_tensor, new_value in zip(outputs, new_values):
        if new_value is None or not old_tensor.name:
            continue
        source = bound.get(id(new_value), new_value)
        producer = source.inputs[0] if len(source.inputs) == 1 else None
        if source is new_value and producer is not None and has_node(graph, producer) and not is_graph_output(new_value, graph):
            slot = next(i for i, t in enumerate(producer.outputs) if t is new_value)
            replace_all_uses(new_value, old_tensor, graph)
            producer.outputs[slot] = old_tensor
            if old_tensor.dtype is None:
                old_tensor.dtype = new_value.dtype
            bound[id(new_value)] = old_tensor
        else:
            # Unnamed: node names are optional, and a made-up one could collide.
            graph.nodes.append(gs.Node("Identity", inputs=[source], outputs=[old_tensor]))


def consumers(tensor: gs.Tensor) -> list[gs.Node]:
    """Every node reading ``tensor``, in any graph (gs tracks readers across bodies)."""
    return list(tensor.outputs)


def is_graph_output(tensor: gs.Tensor, graph: gs.Graph) -> bool:
    """True if ``graph`` (this level only) lists ``tensor`` among its outputs."""
    return bool(output_positions(tensor, graph))


def replace_all_uses(old: gs.Tensor, new: gs.Tensor, graph: gs.Graph) -> None:
    """Point every reader of ``old`` (nested bodies included) and ``graph``'s outputs at ``new``."""
    for node in consumers(old):
        for i, t in enumerate(node.inputs):
            if t is old:
                node.inputs[i] = new
    positions = output_positions(old, graph)
    for p in positions:
        graph.outputs[p] = new
    if positions:
        note_output(new, graph, positions)


def is_read(tensor: gs.Tensor, root: gs.Graph) -> bool:
    """True if anything under ``root`` reads ``tensor``: a node at any nesting level
    (outer-scope reads included) or any graph's output list (the model's or a body's)."""
    return bool(tensor.outputs) or in_graph_outputs(tensor, root)


def new_graph(name: str) -> gs.Graph:
    """An empty gs.Graph for a new body, tagged like an imported one: scanopt.ir reads
    those tags on export, and gs.Graph logs every missing attribute as an error."""
    from scanopt.ir import GRAPH_METADATA, VALUE_INFO

    graph = gs.Graph(name=name)
    setattr(graph, GRAPH_METADATA, [])
    setattr(graph, VALUE_INFO, [])
    return graph


def stored_in(graph: gs.Graph, tensors) -> None:
    """Export each new Constant among ``tensors`` as an initializer of ``graph`` even when only
    a body below reads it (gs would write it into that body): a weight stays where the
    model's other weights are, and in the external-data file with them."""
    from scanopt.ir import OWNER

    for tensor in tensors:
        if isinstance(tensor, gs.Constant) and getattr(tensor, OWNER, None) is None:
            setattr(tensor, OWNER, graph)


def place_appended(graph: gs.Graph, position: int, start: int) -> int:
    """Move the nodes appended from index ``start`` on to ``position`` (where a replaced node
    stood), so the graph stays topologically sorted; return how many there are."""
    added = graph.nodes[start:]
    graph.nodes[:] = graph.nodes[:position] + added + graph.nodes[position:start]
    return len(added)


class Branch:
    """One branch of a :class:`Guard`'s If: a new body graph and a Builder adding to it with
    the model-wide names. Outer values its nodes read stay outer-scope reads."""

    def __init__(self, name: str, names: NameAllocator):
        self.graph = new_graph(name)
        self.b = Builder(self.graph, names)

    def values(self, outputs: Sequence[gs.Tensor], name: str, dtype_of=None) -> list[gs.Variable]:
        """A new value of this branch for each of ``outputs`` (outer tensors the If will
        write), named ``name.format(the output's name)``, with the output's dtype (else
        ``dtype_of(output)``) and shape; an omitted output (no name) stays omitted."""
        found = []
        for t in outputs:
            if not t.name:
                found.append(gs.Variable.empty())
                continue
            dtype = t.dtype if t.dtype is not None or dtype_of is None else dtype_of(t)
            shape = None if t.shape is None else list(t.shape)
            found.append(self.b.variable(name.format(t.name), dtype=dtype, shape=shape))
        return found

    def take(self, node: gs.Node, name: str, dtype_of=None) -> list[gs.Tensor]:
        """Move ``node`` (in no graph: new, or removed from its own) to the end of this
        branch, its outputs replaced by new values of the branch (see :meth:`values`), and
        return them: the outer tensors it wrote are free for the If."""
        node.outputs = self.values(node.outputs, name, dtype_of)
        self.graph.nodes.append(node)
        return list(node.outputs)


class Guard:
    """``If(condition) then <then branch> else <else branch>`` in place of a rewritten node:
    the else branch holds the rewritten form, the then branch what the original gives where
    the form cannot run as it does (an empty input, zero steps, a length it is slow at, a
    non-finite value); the If writes the original's output tensors, so their names, types
    and shapes stay. The pass knows the condition and what each branch computes: it fills
    :attr:`then` and :attr:`orelse` (in any order: each new name is taken where its node is
    built) and makes the condition, then calls :meth:`close`."""

    def __init__(self, names: NameAllocator, then_name: str, else_name: str):
        self.then = Branch(then_name, names)
        self.orelse = Branch(else_name, names)

    def close(self, outer: Builder, condition: gs.Tensor, outputs: Sequence[gs.Tensor],
              then_values: Sequence[gs.Tensor], else_values: Sequence[gs.Tensor], *, domain: str | None = None,
              outer_weights: bool = False) -> gs.Node:
        """Append the If to ``outer``'s graph (in ``domain``) and return it: it writes
        ``outputs``, each the value at its position in ``then_values`` or ``else_values``
        (which become the branches' outputs). ``outer_weights``: the new Constants the else
        branch's nodes read are exported with ``outer``'s graph (see :func:`stored_in`), not
        inside the branch."""
        if not len(outputs) == len(then_values) == len(else_values):
            raise ValueError(f"a guard writes {len(outputs)} outputs: its branches give {len(then_values)} and "
                             f"{len(else_values)}")
        self.then.graph.outputs = list(then_values)
        self.orelse.graph.outputs = list(else_values)
        if outer_weights:
            stored_in(outer.graph, [t for node in self.orelse.graph.nodes for t in node.inputs])
        outer.op("If", [condition], outputs=list(outputs), domain=domain, then_branch=self.then.graph,
                 else_branch=self.orelse.graph)
        return outer.graph.nodes[-1]


def loop_where(node: gs.Node, values: Sequence[gs.Tensor | None], graph: gs.Graph, start: int, names: NameAllocator,
               condition: Callable[[], gs.Tensor], form: str, dtype_of=None) -> None:
    """A run-time choice between ``node`` (a loop) and the form that replaces it: the nodes
    appended to ``graph`` from ``start`` on, computing ``values`` (one per output of ``node``;
    None: an output nobody reads) go into the else branch of ``If(condition)``, ``node`` itself
    into the then branch, and the If writes ``node``'s read output tensors. ``condition``
    emits the test into ``graph`` once the form's nodes are out of it (the loop where it
    holds: a length or batch the form is slower at)."""
    guard = Guard(names, f"{node.name}_loop", f"{node.name}_{form}")
    branch = guard.orelse
    branch.graph.nodes.extend(graph.nodes[start:])
    graph.nodes[:] = graph.nodes[:start]
    kept = [k for k, (t, v) in enumerate(zip(node.outputs, values)) if t.name and v is not None]
    written = [node.outputs[k] for k in kept]
    results = branch.values(written, "{}_" + form, dtype_of)
    placeholder = gs.Node("Identity", inputs=[], outputs=list(results))
    branch.graph.nodes.append(placeholder)
    rebind_outputs(placeholder, [values[k] for k in kept], branch.graph)
    remove_node(graph, node)
    looped = guard.then.take(node, "{}_looped", dtype_of)
    outer = Builder(graph, names, prefix=f"{node.name}_" if node.name else "")
    guard.close(outer, condition(), written, [looped[k] for k in kept], results)
