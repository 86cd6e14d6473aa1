"""The optimization report: per Scan node, what each pass did or why not.

One Report per run, shown as text by the CLI and as JSON with ``--report``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import onnx

from scanopt.errors import printable_lines
from scanopt.pass_api import NodeOutcome
from scanopt.protos import walk_proto_graphs


@dataclass
class PassTiming:
    name: str
    seconds: float
    modified: bool


@dataclass
class Report:
    scans: list[dict] = field(default_factory=list)  # from scanopt.inspect.describe_scans
    outcomes: list[NodeOutcome] = field(default_factory=list)
    ops_before: Counter = field(default_factory=Counter)
    ops_after: Counter = field(default_factory=Counter)
    passes: list[str] = field(default_factory=list)
    timings: list[PassTiming] = field(default_factory=list)
    rounds: int = 0
    modified: bool = False
    verification: dict | None = None
    warnings: list[str] = field(default_factory=list)
    tuning: list[str] = field(default_factory=list)  # --tune: per node, the forms timed and the one kept

    def add_outcomes(self, outcomes: list[NodeOutcome]) -> None:
        """Record outcomes once each: a fixpoint round repeats the same skips."""
        seen = set(self.outcomes)  # NodeOutcome is frozen: hashable
        for outcome in outcomes:
            if outcome not in seen:
                seen.add(outcome)
                self.outcomes.append(outcome)

    def op_changes(self) -> dict[str, tuple[int, int]]:
        ops = sorted(set(self.ops_before) | set(self.ops_after))
        return {
            op: (self.ops_before[op], self.ops_after[op])
            for op in ops
            if self.ops_before[op] != self.ops_after[op]
        }

    def to_dict(self) -> dict:
        return {
            "modified": self.modified,
            "passes": self.passes,
            "rounds": self.rounds,
            "scans": self.scans,
            "outcomes": [o.to_dict() for o in self.outcomes],
            "op_changes": {op: {"before": b, "after": a} for op, (b, a) in self.op_changes().items()},
            "timings": [{"pass": t.name, "seconds": round(t.seconds, 4), "modified": t.modified} for t in self.timings],
            "verification": self.verification,
            "tuning": self.tuning,
            "warnings": self.warnings,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def format(self, *, verbose: bool = False) -> str:
        """Human-readable report: one block per Scan node, then op-count changes."""
        lines = []
        if not self.scans and not self.outcomes:  # Loop outcomes (loop_to_scan) come without a Scan
            lines.append("no Scan nodes in the graph or its bodies; nothing to do")
        for scan in self.scans:
            lines.append(f"{scan['node']}  [{scan_summary(scan)}]")
            mine = [o for o in self.outcomes if o.node == scan["node"] and o.path == scan["graph_path"]]
            shown = [o for o in mine if o.applied or verbose]
            for o in shown:
                lines.append(f"  {o.pass_name:<13} {'applied' if o.applied else 'skipped'}: {o.detail}")
                if o.expected:
                    lines.append(f"  {'':<13} {o.expected}")
            if not any(o.applied for o in mine):
                lines.append("  unchanged" + ("" if verbose or not mine else f" ({_reasons(mine)})"))
        extra = [o for o in self.outcomes if not any(o.node == s["node"] and o.path == s["graph_path"] for s in self.scans)]
        for o in extra:
            lines.append(f"{o.node}: {o.pass_name} {'applied' if o.applied else 'skipped'}: {o.detail}")
        changes = self.op_changes()
        if changes:
            lines.append("ops: " + ", ".join(f"{op} {b} -> {a}" for op, (b, a) in changes.items()))
        for line in self.tuning:
            lines.append(f"tuned {line}")
        if self.verification is not None:
            seconds = self.verification.get("seconds")
            took = f" [{seconds:.2f} s]" if seconds is not None else ""
            lines.append(f"verification: {self.verification.get('summary', '')}{took}")
        for warning in self.warnings:
            lines.append(f"warning: {warning}")
        return printable_lines(lines)


def _reasons(outcomes: list[NodeOutcome]) -> str:
    return "; ".join(f"{o.pass_name}: {o.detail}" for o in outcomes)


def scan_summary(scan: dict) -> str:
    """One line: where the Scan is and its shape of iteration."""
    version = f"Scan-{scan['version']}"
    if scan.get("migrated_from") is not None:  # --target-opset: the model's Scan was an older version
        version = f"Scan-{scan['migrated_from']} -> {version}"
    parts = [scan["graph_path"] or "main", version]
    parts.append(f"N={scan['num_states']} M={scan['num_scan_inputs']} K={scan['num_scan_outputs']}")
    parts.append(f"T={scan['trip_count'] if scan['trip_count'] is not None else '?'}")
    return ", ".join(parts)


def count_ops(model: onnx.ModelProto) -> Counter:
    """Op types over every graph of the model, bodies included."""
    return Counter(node.op_type for graph in walk_proto_graphs(model.graph) for node in graph.node)
