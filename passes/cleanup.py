"""cleanup: remove nodes whose outputs nobody reads, at every nesting level.

Runs last in the pipeline, after rewrites have left dead nodes and initializers
behind. A Scan none of whose outputs is read is removed entirely (reported). Graph
inputs and body signatures are never changed. Node order changes only where it is not
topologically sorted.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from scanopt.graph import cleanup, node_label, walk_graphs
from scanopt.pass_api import NodeOutcome, Pass, PassContext, ScanPassResult, register_pass, scan_nodes


@register_pass
class Cleanup(Pass):
    name = "cleanup"
    kind = "normalizer"
    order = 900  # last: drops what the others left unread
    summary = "remove dead nodes (including Scans whose outputs nobody reads) and sort"

    def __call__(self, graph: gs.Graph, ctx: PassContext) -> ScanPassResult:
        before = _snapshot(graph)
        scans_before = [(level.path, node) for level, node in scan_nodes(graph)]
        cleanup(graph)
        after = _snapshot(graph)
        alive = {id(node) for _, node in scan_nodes(graph)}
        outcomes = [
            NodeOutcome(self.name, node_label(node), path, True, "removed: none of its outputs is read")
            for path, node in scans_before
            if id(node) not in alive
        ]
        return ScanPassResult(graph, modified=before != after, outcomes=outcomes)


def _snapshot(graph: gs.Graph) -> list[tuple[int, ...]]:
    """Node identities per graph, in order: equal snapshots mean nothing changed."""
    return [tuple(id(n) for n in level.graph.nodes) for level in walk_graphs(graph)]
