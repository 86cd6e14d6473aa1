"""What a model's Scans are, and what each pass would do with them (a dry run).

Used by ``scanopt inspect`` and by the optimize report, so both describe a Scan the
same way.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from scanopt.errors import printable_lines
from scanopt.graph import GraphLevel, editing, guard_branch, node_label, outer_captures
from scanopt.pass_api import PassContext, ScanPass, Skip, decide, scan_nodes
from scanopt.scan_view import ScanView


def describe_scan(node: gs.Node, view: ScanView, level: GraphLevel) -> dict:
    """A JSON-ready description of one Scan node."""
    body = node.attrs["body"]
    info = {
        "node": node_label(node),
        "graph_path": level.path,
        "depth": 0 if guard_branch(level.path) else level.depth,
        "version": view.version,
        "num_states": view.num_states,
        "num_scan_inputs": view.num_scan_inputs,
        "num_scan_outputs": view.num_scan_outputs,
        "scan_input_axes": list(view.input_axes),
        "scan_output_axes": list(view.output_axes),
        "scan_input_directions": list(view.input_directions),
        "scan_output_directions": list(view.output_directions),
        "trip_count": view.trip_count,
        "body_nodes": len(body.nodes),
        "body_ops": sorted({n.op for n in body.nodes}),
        "captures": [t.name for t in outer_captures(body)],
    }
    if view.batched:
        batch_dims = {node.inputs[i].shape[0] for i in range(len(node.inputs)) if _scan_input(view, node, i)}
        info["batch"] = _dim_text(batch_dims)
        info["sequence_lens"] = view.sequence_lens
    return info


def _scan_input(view: ScanView, node: gs.Node, index: int) -> bool:
    first_scan = len(node.inputs) - view.num_scan_inputs
    return index >= first_scan and node.inputs[index].shape is not None


def _dim_text(dims: set) -> object:
    known = [d for d in dims if d is not None]
    return known[0] if len(known) == 1 else (None if not known else sorted(map(str, known)))


def describe_scans(graph: gs.Graph, ctx: PassContext, passes: list[ScanPass] = ()) -> list[dict]:
    """Every Scan at every nesting level, with each pass's dry-run verdict.

    Inside :func:`editing` (nothing is edited, so nothing is re-sorted): the passes' look-ups
    of graph outputs and nodes use its indexes, one walk of the model in all instead of one
    per question (quadratic in the number of Scans)."""
    with editing(graph) as session:
        session.changed = False
        return _describe_all(graph, ctx, passes)


def _describe_all(graph: gs.Graph, ctx: PassContext, passes: list[ScanPass]) -> list[dict]:
    described = []
    for level, node in scan_nodes(graph):
        view = ScanView.from_gs(node, ctx.opset, ctx.shapes)
        info = describe_scan(node, view, level)
        verdicts = {}
        for scan_pass in passes:
            found = scan_pass.match(node, view, level, ctx)
            verdicts[scan_pass.name] = f"skip: {found.reason}" if isinstance(found, Skip) else _priced(scan_pass, node, view, found, level, ctx)
        if passes:
            info["passes"] = verdicts
        described.append(info)
    return described


def _priced(scan_pass: ScanPass, node: gs.Node, view: ScanView, found, level: GraphLevel, ctx: PassContext) -> str:
    """A match's verdict as optimize would give it: "would apply" only where the chooser
    (``ctx.chooser``) applies it, with its prediction."""
    estimate = decide(scan_pass, node, view, found, level, ctx)
    if estimate is None:
        return "would apply"
    if not estimate.apply:
        return f"matches, {estimate.note}"
    return f"would apply: {estimate.note}" if estimate.note else "would apply"


def format_scans(scans: list[dict]) -> str:
    """Text listing for ``scanopt inspect``."""
    if not scans:
        return "no Scan nodes in the graph or its bodies"
    lines = []
    for scan in scans:
        where = scan["graph_path"] or "main"
        lines.append(f"{scan['node']}  (in {where}, depth {scan['depth']})")
        lines.append(
            f"  Scan-{scan['version']}: N={scan['num_states']} states, M={scan['num_scan_inputs']} scan inputs, "
            f"K={scan['num_scan_outputs']} scan outputs, trip count "
            f"{scan['trip_count'] if scan['trip_count'] is not None else 'dynamic'}"
        )
        if scan["version"] == 8:
            lines.append(
                f"  batch {scan.get('batch') if scan.get('batch') is not None else '?'}, "
                f"sequence_lens {scan.get('sequence_lens') or 'absent'}, "
                f"directions {scan['scan_input_directions']}"
            )
        else:
            lines.append(
                f"  input axes {scan['scan_input_axes']} directions {scan['scan_input_directions']}; "
                f"output axes {scan['scan_output_axes']} directions {scan['scan_output_directions']}"
            )
        lines.append(f"  body: {scan['body_nodes']} nodes ({', '.join(scan['body_ops']) or 'none'})")
        if scan["captures"]:
            lines.append(f"  captures: {', '.join(scan['captures'])}")
        for name, verdict in scan.get("passes", {}).items():
            lines.append(f"  {name:<13} {verdict}")
    return printable_lines(lines)
