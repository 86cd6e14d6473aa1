"""Copying a body graph: into another graph (inlining) or as a new graph, with fresh names.

Every value a copied body defines gets a fresh model-wide name at every nesting level, so
copies never collide with each other, with the original or with an enclosing scope.
Reads of the body's inputs and of its own values from nested subgraphs are rewired to
the copies; reads of enclosing scopes (outer-scope captures) stay on the same outer
tensor objects unless ``bindings`` (outer name -> tensor) redirects them. Declared dtypes
and shapes (value_info) are kept: a copy computes what its original computed. The
original is never modified.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from scanopt.graph import NameAllocator, is_op, outer_captures, walk_graphs
from scanopt.ir import GRAPH_METADATA, NODE_EXTRAS, OWNER, VALUE_INFO


class BodyInliner:
    """Appends copies of ``body``'s nodes to ``target``, one copy per :meth:`inline` call.

    The body's own initializers and Constant nodes do not depend on its inputs, so they
    are hoisted: created once in ``target`` (with fresh names) and shared by every copy.
    Those of nested subgraphs are copied with their subgraph.
    """

    def __init__(self, body: gs.Graph, target: gs.Graph, names: NameAllocator):
        self.body = body
        self.target = target
        self.names = names
        self._outer = {id(t) for t in outer_captures(body)}
        self._nested = {id(level.graph) for level in walk_graphs(body)} - {id(body)}
        self.hoisted: dict[int, gs.Tensor] = {}  # id(original) -> its one copy in target

    def inline(
        self, inputs: Sequence[gs.Tensor], *, suffix: str = "", bindings: Mapping[str, gs.Tensor] | None = None
    ) -> list[gs.Tensor]:
        """Copy the body with its inputs bound to ``inputs``; return the tensors holding its
        outputs (a bound input or an outer tensor where the body passes one through).

        ``suffix`` is appended to original names as a hint (``h_out`` -> ``h_out_t2``).
        """
        if len(inputs) != len(self.body.inputs):
            raise ValueError(f"body takes {len(self.body.inputs)} inputs, got {len(inputs)}")
        copier = _Copier(self.names, suffix, self._outer, bindings, hoist=self)
        copier.mapping.update((id(t), bound) for t, bound in zip(self.body.inputs, inputs))
        for node in self.body.nodes:
            constant = is_op(node, "Constant") and not node.inputs
            if constant and all(id(t) in self.hoisted for t in node.outputs):
                continue  # hoisted by an earlier copy
            self.target.nodes.append(copier.node(node, self.target, hoist=constant))
        return [copier.tensor(t, self.target) for t in self.body.outputs]

    def hoists(self, constant: gs.Constant) -> bool:
        """Initializers of the body itself are hoisted; those of nested subgraphs are not."""
        return id(getattr(constant, OWNER, None)) not in self._nested


def clone_graph(
    graph: gs.Graph, names: NameAllocator, *, suffix: str = "", bindings: Mapping[str, gs.Tensor] | None = None
) -> gs.Graph:
    """A detached copy of ``graph`` (a body, to be used as another node's attribute) with
    fresh names for everything it defines, its initializers included."""
    return _Copier(names, suffix, {id(t) for t in outer_captures(graph)}, bindings).graph(graph)


def _copy_constant(t: gs.Constant) -> gs.Constant:
    """A new Constant with ``t``'s values. Lazily loaded values get their own TensorProto:
    gs's exporter renames the proto it was loaded from, which would rename the original."""
    copy = t.copy()
    copy.data_location = t.data_location
    if isinstance(t._values, LazyValues):
        proto = type(t._values.tensor)()
        proto.CopyFrom(t._values.tensor)
        copy._values = type(t._values)(proto)
    return copy


class _Copier:
    """One copy of a body: original tensors (by id) -> their copies."""

    def __init__(self, names, suffix, outer: set[int], bindings, hoist: BodyInliner | None = None):
        self.names = names
        self.suffix = suffix
        self.outer = outer
        self.bindings = dict(bindings or {})
        self.hoist = hoist
        self.mapping: dict[int, gs.Tensor] = {}

    def fresh(self, name: str) -> str:
        return self.names.fresh(f"{name}{self.suffix}")

    def tensor(self, t: gs.Tensor, owner: gs.Graph, *, hoist: bool = False) -> gs.Tensor:
        """The copy of ``t`` (made on first sight); ``owner`` is the graph being filled."""
        key = id(t)
        if key in self.mapping:
            return self.mapping[key]
        if not t.name:  # an omitted optional input
            return gs.Variable.empty()
        if key in self.outer:
            return self.bindings.get(t.name, t)
        hoisted = self.hoist.hoisted if self.hoist is not None else {}
        if key in hoisted:
            return hoisted[key]
        if isinstance(t, gs.Constant):
            copy = _copy_constant(t)
            hoist = self.hoist is not None and self.hoist.hoists(t)
            setattr(copy, OWNER, self.hoist.target if hoist else owner)
        else:
            copy = gs.Variable(None, dtype=t.dtype, shape=None if t.shape is None else list(t.shape), type=t.type)
        # A hoisted value is shared by every copy: no per-copy suffix in its name.
        copy.name = self.names.fresh(t.name) if hoist else self.fresh(t.name)
        (hoisted if hoist else self.mapping)[key] = copy
        return copy

    def node(self, node: gs.Node, owner: gs.Graph, *, hoist: bool = False) -> gs.Node:
        attrs = type(node.attrs)()
        for key, value in node.attrs.items():
            if isinstance(value, gs.Graph):
                value = self.graph(value)
            elif isinstance(value, (list, tuple)) and any(isinstance(v, gs.Graph) for v in value):
                value = [self.graph(v) if isinstance(v, gs.Graph) else v for v in value]
            attrs[key] = value
        copy = gs.Node(
            node.op,
            name=(self.names.fresh if hoist else self.fresh)(node.name or node.op.lower()),
            attrs=attrs,
            inputs=[self.tensor(t, owner) for t in node.inputs],
            outputs=[self.tensor(t, owner, hoist=hoist) for t in node.outputs],
            domain=node.domain,
        )
        if hasattr(node, NODE_EXTRAS):  # doc string and metadata_props
            setattr(copy, NODE_EXTRAS, getattr(node, NODE_EXTRAS))
        return copy

    def graph(self, sub: gs.Graph) -> gs.Graph:
        """A copy of a (nested) graph: fresh inputs, values and initializers."""
        new = gs.Graph(name=sub.name, doc_string=sub.doc_string, opset=sub.opset, import_domains=sub.import_domains)
        new.inputs = [self.tensor(t, new) for t in sub.inputs]
        new.nodes = [self.node(n, new) for n in sub.nodes]
        new.outputs = [self.tensor(t, new) for t in sub.outputs]
        # Tags scanopt.ir reads on export (vars(): gs.Graph's getattr logs misses as errors).
        setattr(new, GRAPH_METADATA, vars(sub).get(GRAPH_METADATA, []))
        setattr(new, VALUE_INFO, [])  # the original's entries name the original's values
        return new
