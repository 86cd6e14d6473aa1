"""The optimization report: per Scan node, what each pass did or why not.

One Report per run, shown as text by the CLI and as JSON with ``--report``. The text fits
a screen whatever the model's size: a summary (Scans found, rewritten per form, left with
their reasons grouped and counted, the expected or measured speed-up, verification) by
default, after a block per Scan when there are few (what was applied) or with ``verbose``
(every pass's verdict). Grouping reads structured fields (pass,
applied, the cost policy's speed-up, whether it declined) and the pass's own detail with
the names masked, never the cost policy's note text.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections import Counter
from dataclasses import dataclass, field

import onnx

from scanopt.errors import printable, printable_lines
from scanopt.pass_api import NodeOutcome, is_emitted
from scanopt.protos import model_nodes

WIDTH = 100  # the longest line the text report prints
TOP_REASONS = 3  # reasons shown per pass for the Scans left
FEW_SCANS = 6  # up to this many Scans, each one's applied rewrites are listed by default too
# passes that tidy a Scan and keep it a Scan; any other applied pass replaced the loop
KEEPS_SCAN = ("loop_to_scan", "upgrade", "canonicalize", "hoist", "cleanup", "portable")
# passes whose skips say nothing about why a Scan stays a loop ("already canonical")
TIDY = ("loop_to_scan", "canonicalize", "hoist", "cleanup", "portable")
WENT_WITH_ANOTHER = "replaced by another Scan's rewrite (its bidirectional partner, say)"
NOISE_FLOOR = 0.95  # a speed-up above it is "about as fast" (scanopt.cost.NOISE)


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
    before_after: list[str] = field(default_factory=list)  # the CLI's table (scanopt.before_after), in place of the ops line
    input_ranges: dict = field(default_factory=dict)  # PassContext.input_ranges of the run
    loop_reads: list = field(default_factory=list)  # PassContext.loop_reads of the run
    target: str = ""  # --execution-provider: the provider the forms were ranked for, and how (scanopt.providers)

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
            "summary": self.summary(),
            "passes": self.passes,
            "rounds": self.rounds,
            "scans": self.scans,
            "outcomes": [o.to_dict() for o in self.outcomes],
            "op_changes": {op: {"before": b, "after": a} for op, (b, a) in self.op_changes().items()},
            "timings": [{"pass": t.name, "seconds": round(t.seconds, 4), "modified": t.modified} for t in self.timings],
            "verification": self.verification,
            "tuning": self.tuning,
            "warnings": self.warnings,
        } | ({"target": self.target} if self.target else {})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    # -- the summary ------------------------------------------------------------------

    def summary(self) -> dict:
        """Counts behind the text summary: Scans found, replaced per form, tidied, left and
        why (per pass, reasons grouped), speed-ups per pass."""
        per_scan = self._per_scan()
        replaced, tidied, left = Counter(), Counter(), []
        for scan in self.scans:
            mine = per_scan.get(_key(scan), [])
            applied = [o for o in mine if o.applied]
            forms = [o for o in applied if o.pass_name not in KEEPS_SCAN]
            if forms:
                replaced[_form(forms[-1])] += 1
                continue
            if scan.get("kept") is False:  # no rewrite of its own, yet gone (scanopt.pipeline marks it)
                replaced[WENT_WITH_ANOTHER] += 1
                continue
            for name in dict.fromkeys(o.pass_name for o in applied):  # once per Scan, however many rounds
                tidied[name] += 1
            left.append((scan, mine))
        reasons: dict[str, Counter] = {}
        for scan, mine in left:
            last = {o.pass_name: o for o in mine}  # a later round's word replaces an earlier one's
            for o in last.values():
                if o.applied or o.pass_name in TIDY or (o.pass_name == "upgrade" and scan["version"] != 8):
                    continue
                reasons.setdefault(o.pass_name, Counter())[_reason(o)] += 1
        speed: dict[str, list] = {}
        for o in self.outcomes:
            if o.applied and o.speedup is not None:
                speed.setdefault(o.pass_name, []).append((o.speedup, o.measured))
        return {
            "scans": len(self.scans),
            "nested": sum(1 for s in self.scans if s.get("depth", 0) > 0),
            "from_loops": sum(1 for s in self.scans if s.get("from_loop")),
            "replaced": dict(replaced.most_common()),
            "tidied": dict(tidied.most_common()),
            "left": len(left),
            "left_reasons": {p: [{"scans": n, "reason": r} for r, n in c.most_common()]
                             for p, c in sorted(reasons.items(), key=lambda item: self._rank(item[0]))},
            "speedups": {p: {"scans": len(v), "min": min(s for s, _ in v), "max": max(s for s, _ in v),
                             "measured": all(m for _, m in v)} for p, v in speed.items()},
        }

    def format(self, *, verbose: bool = False) -> str:
        """The text report: the summary, and with ``verbose`` one block per Scan before it."""
        lines = []
        if not self.scans and not self.outcomes:  # Loop outcomes (loop_to_scan) come without a Scan
            lines.append("no Scan nodes in the graph or its bodies; nothing to do")
        elif verbose or len(self.scans) <= FEW_SCANS:
            lines += self._per_node_lines(skips=verbose)
            lines.append("")
        if self.scans:
            lines += self._summary_lines()
        changes = self.op_changes()
        if changes and not self.before_after:
            lines += _wrapped("ops: " + ", ".join(f"{op} {b} -> {a}" for op, (b, a) in changes.items()), "     ")
        if self.target:
            lines += _wrapped(f"target {self.target}", "  ")
        for line in self.tuning:
            lines += _wrapped(f"tuned {line}", "  ")
        if self.verification is not None:
            seconds = self.verification.get("seconds")
            took = f" [{seconds:.2f} s]" if seconds is not None else ""
            lines += _wrapped(f"verification: {self.verification.get('summary', '')}{took}", "  ")
            failed = (self.verification.get("details") or {}).get("summary", "") if self.verification.get("rolled_back") else ""
            if failed.startswith("NOT equivalent"):  # why the rolled-back rewrites failed
                lines += _wrapped(f"  why: {failed}", "    ")
        for warning in self.warnings:
            lines += _wrapped(f"warning: {warning}", "  ")
        lines += self.before_after
        if self.scans and not verbose:
            lines.append("every pass's verdict on every Scan: -v, or --report FILE.json")
        return printable_lines(lines)

    def _summary_lines(self) -> list[str]:
        s = self.summary()
        notes = [f"{s['nested']} nested in bodies"] if s["nested"] else []
        if s["from_loops"]:
            notes.append(f"{s['from_loops']} from {'a Loop' if s['from_loops'] == 1 else 'Loops'}")
        nested = f" ({'; '.join(notes)})" if notes else ""
        lines = [f"{_scans(s['scans'])} found{nested}: {s['scans'] - s['left']} replaced, {s['left']} still a Scan"]
        for form, n in s["replaced"].items():
            lines.append(f"  {n:>5}  {form}")
        if s["tidied"]:
            lines.append("  tidied, still Scans: " + ", ".join(f"{_tidied(p)} {n}" for p, n in s["tidied"].items()))
        if s["left_reasons"]:
            lines.append(f"why {'these' if s['left'] != 1 else 'it'} stay{'' if s['left'] != 1 else 's'} a Scan"
                         " (each pass's reason, counted per Scan):")
        for name, reasons in s["left_reasons"].items():
            for i, item in enumerate(reasons[:TOP_REASONS]):
                head = f"  {name if i == 0 else '':<12}{item['scans']:>5}  "
                lines += _wrapped(head + item["reason"], " " * len(head), most=2)
            if len(reasons) > TOP_REASONS:
                rest = sum(item["scans"] for item in reasons[TOP_REASONS:])
                lines.append(f"  {'':<12}{rest:>5}  ({len(reasons) - TOP_REASONS} other reasons: -v)")
        for name, sp in s["speedups"].items():
            how = "measured" if sp["measured"] else "expected"
            lines.append(f"speed: {name} {how} {_speed_range(sp['min'], sp['max'])} ({_scans(sp['scans'])})")
        return lines

    # -- per Scan -----------------------------------------------------------------------

    def _rank(self, pass_name: str) -> int:
        """A pass's place in the pipeline order (the run's passes are listed in it)."""
        return self.passes.index(pass_name) if pass_name in self.passes else len(self.passes)

    def _per_scan(self) -> dict[tuple, list[NodeOutcome]]:
        """Each Scan's outcomes, in pipeline order (a later round's after an earlier one's)."""
        grouped: dict[tuple, list[NodeOutcome]] = {}
        for o in self.outcomes:
            grouped.setdefault((o.node, o.path), []).append(o)
        for outcomes in grouped.values():
            outcomes.sort(key=lambda o: self._rank(o.pass_name))
        return grouped

    def _per_node_lines(self, skips: bool) -> list[str]:
        """A block per Scan: what each pass applied (and, with ``skips``, why others did not)."""
        lines = []
        per_scan = self._per_scan()
        for scan in self.scans:
            lines += _wrapped(f"Scan '{scan['node']}' ({scan_summary(scan)})", "    ")
            mine = per_scan.get(_key(scan), [])
            if not any(o.applied for o in mine) and scan.get("kept") is False:
                lines.append(f"  {WENT_WITH_ANOTHER}")
            elif not skips and not any(o.applied for o in mine):
                lines.append("  unchanged")
            for o in mine:
                if o.applied or skips:
                    lines += _wrapped(f"  {o.pass_name:<13} {'applied' if o.applied else 'skipped'}: {_detail(o)}", " " * 16)
        known = {_key(s) for s in self.scans}
        # other nodes (Loops, functions) have no summary of their own: what was done shows, and
        # why not for one nothing was done to (a Loop that stays a Loop)
        changed = {(o.node, o.path) for o in self.outcomes if o.applied}
        for o in self.outcomes:
            if (o.node, o.path) not in known and (o.applied or skips or (o.node, o.path) not in changed
                                                  and not is_emitted(o)):
                lines += _wrapped(f"{o.node}: {o.pass_name} {'applied' if o.applied else 'skipped'}: {_detail(o)}", "  ")
        return lines


def _key(scan: dict) -> tuple[str, str]:
    return scan["node"], scan["graph_path"]


def _masked(text: str) -> str:
    """``text`` with quoted names masked: the same outcome on two Scans reads the same."""
    return re.sub(r"'[^']*'", "'…'", text)


def _first_clause(text: str) -> str:
    for stop in (" (", "; ", ": "):
        text = text.split(stop, 1)[0]
    return text


def _form(outcome: NodeOutcome) -> str:
    """What a replaced Scan became: the applied detail's first clause ("fused into RNN")."""
    return f"{outcome.pass_name}: {_first_clause(_masked(outcome.detail))}"


def _reason(outcome: NodeOutcome) -> str:
    """A skip's reason with names masked; a decline by the cost policy from its numbers."""
    if outcome.declined_for_speed and outcome.speedup is not None:
        how = "measured" if outcome.measured else "predicted"
        if outcome.kept and outcome.kept != "loop":
            return f"{how} {outcome.speedup:.2f}x the loop's speed; {outcome.kept} {how} faster"
        if outcome.speedup < NOISE_FLOOR:
            # the provider the verdict was modelled for (scanopt.cost names it: "on onnxruntime CUDA (modelled")
            where = re.search(r" on (onnxruntime \w+) \(modelled", outcome.detail or "")
            on = where.group(1) if where else "onnxruntime CPU"
            return f"{how} slower on {on} ({outcome.speedup:.2f}x; --target portable applies it)"
        if outcome.speedup <= 1.05:
            return f"{how} about as fast as the loop ({outcome.speedup:.2f}x): no clear gain"
        margin = "this machine's noise" if outcome.measured else "the model's error margin or not at every size"
        return f"{how} {outcome.speedup:.2f}x, within {margin}: loop kept"
    return _masked(outcome.detail)


def _detail(outcome: NodeOutcome) -> str:
    """One outcome's text: the pass's detail, with the speed-up worded from its number."""
    if outcome.declined_for_speed:
        return _reason(outcome)
    if outcome.applied and outcome.speedup is not None:
        how = "measured" if outcome.measured else "expected"
        return f"{outcome.detail}; {how} {_speed(outcome.speedup)}"
    return outcome.detail


def _speed(speedup: float) -> str:
    if speedup >= 1.05:
        return f"{speedup:.2f}x faster"
    if speedup > NOISE_FLOOR:
        return f"about as fast ({speedup:.2f}x)"
    return f"{speedup:.2f}x (slower)"


def _speed_range(low: float, high: float) -> str:
    if abs(high - low) < 0.005:
        return _speed(low)
    return f"{low:.2f}x to {high:.2f}x"


def _scans(n: int) -> str:
    return f"{n} Scan{'' if n == 1 else 's'}"


def _tidied(pass_name: str) -> str:
    return {"loop_to_scan": "converted from a Loop", "upgrade": "upgraded", "canonicalize": "canonicalized", "hoist": "hoisted", "cleanup": "cleaned",
            "portable": "written for portable runtimes"}.get(
        pass_name, pass_name)


def _cut(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 1] + "…"


def _wrapped(line: str, indent: str, most: int | None = None) -> list[str]:
    """``line`` wrapped at WIDTH, continued after ``indent``; at most ``most`` lines. Escaped
    first: wrapping would turn a newline inside a model's name into a space."""
    line = printable(line)
    lines = textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False) or [line]
    if most is not None and len(lines) > most:
        lines = lines[:most]
        lines[-1] = _cut(lines[-1] + " …")
    return lines


def scan_summary(scan: dict) -> str:
    """Where the Scan is and what it iterates, in words."""
    version = f"Scan-{scan['version']}"
    if scan.get("migrated_from") is not None:  # --target-opset: the model's Scan was an older version
        version = f"Scan-{scan['migrated_from']} -> {version}"
    where = "main graph" if not scan["graph_path"] else f"in {scan['graph_path']}"
    steps = scan["trip_count"]
    length = "dynamic length" if steps is None else f"{steps} step{'' if steps == 1 else 's'}"
    counts = [_count(scan["num_states"], "state"), _count(scan["num_scan_inputs"], "scan input"),
              _count(scan["num_scan_outputs"], "scan output")]
    return f"{where}; {version}: {', '.join(counts)}, {length}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def count_ops(model: onnx.ModelProto) -> Counter:
    """Op types over every graph of the model, bodies included, and each model-local function's
    body once (a Scan inside a function counts before it is inlined or rewritten there)."""
    return Counter(node.op_type for node in model_nodes(model))
