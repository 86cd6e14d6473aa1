"""``scanopt upgrade --target-opset N IN OUT``: move a model to a newer opset, Scan-8 included."""

from __future__ import annotations

import argparse
import json

from scanopt.cli.common import add_job_arguments, job_progress, start_job, text_writer
from scanopt.cli.deploy_args import add_deploy_arguments, deploy_options
from scanopt.deploy import check_input_shapes
from scanopt.errors import ScanoptError, VerificationError, printable_lines
from scanopt.model_io import model_writer
from scanopt.emit import MIN_TARGET
from scanopt.migrate import migrate_verified
from scanopt.pipeline import declared_feeds
from scanopt.report import count_ops
from scanopt.validate import validate_model

EPILOG = f"""\
examples:
  scanopt upgrade --target-opset 17 bidaf.onnx bidaf.op17.onnx
  scanopt upgrade --target-opset 13 model.onnx out.onnx --report upgrade.json
  scanopt upgrade --target-opset 11 model.onnx out.onnx --strategy c --engine both

Every Scan-8 (at any nesting level) becomes an equivalent opset-9+ construction, the
cheapest that is correct: (a) batch 1 without sequence_lens: Squeeze/Unsqueeze around a
Scan-9; (b) a batch-polymorphic body: one Scan-9 over time with the batch inside
(sequence_lens by masking); (c) otherwise one Scan-9 per batch item over its own length.
onnx.version_converter then converts every other op. The result keeps the graph's input
and output names, types and shapes, and is verified numerically against the original
before it is written. Targets: {MIN_TARGET} up to the newest opset the installed onnxruntime loads.

exit codes: 0 ok, 1 the result is not equivalent or cannot be verified (no synthesized
input runs the original: pass --inputs; nothing written), 2 bad input, an op the
converter cannot convert, or usage (nothing written)
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "upgrade",
        help="move a model to a newer opset, rewriting opset-8 batched Scans",
        description="Move IN to opset N (Scan-8 nodes rewritten, the rest converted) and write the verified result to OUT.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_job_arguments(parser, verb="upgrade")
    parser.add_argument("--target-opset", type=int, required=True, metavar="N", help=f"the opset to move to ({MIN_TARGET} up to the newest onnxruntime loads)")
    add_deploy_arguments(parser, tune=False)
    parser.add_argument("--strategy", choices=("auto", "a", "b", "c"), default="auto", help="force one strategy for every Scan-8 (default: the cheapest correct one)")
    parser.set_defaults(func=run)


def run(args) -> int:
    with job_progress(args) as progress:
        return _run(args, progress)


def _run(args, progress) -> int:
    if progress is not None:
        progress(f"loading {args.input}")
    loaded, feeds, plan = start_job(args)
    if progress is not None:
        progress(f"moving {args.input} to opset {args.target_opset}" + ("" if args.no_verify else ", verified"))
    options = {} if args.strategy == "auto" else {"upgrade_strategy": args.strategy}
    deployment = deploy_options(args, feeds)
    declared = check_input_shapes(loaded.model, deployment["input_shapes"])
    options.update(deployment, input_shapes=declared)
    if declared and feeds is None and not args.no_verify:  # one verification seed at the declared shapes
        feeds = declared_feeds(loaded.model, declared, args.seeds, args.engine)
    try:
        migration = migrate_verified(
            loaded.model, args.target_opset, options=options, verify=not args.no_verify,
            inputs=feeds, engine=args.engine, seeds=args.seeds,
        )
    except ScanoptError as exc:
        raise type(exc)(f"{args.input}: {exc}") from None
    if migration.model is not loaded.model:
        try:  # never write a model scanopt would refuse to read (optimize rolls back instead)
            validate_model(migration.model, name="upgraded model")
        except ScanoptError as exc:
            raise VerificationError(f"{args.input}: {exc} (nothing written)") from None
    report = _report(migration, loaded.model)
    outputs = [(args.output, model_writer(migration.model, args.output, external_data=loaded.had_external_data or None))]
    if args.report:
        outputs.append((args.report, text_writer(json.dumps(report, indent=2) + "\n")))
    if progress is not None:
        progress(f"writing {args.output}")
    plan.write(outputs)
    if progress is not None:
        progress.close()
    if not args.quiet:
        print(_format(report))
        print(f"wrote {args.output} (opset {migration.target_opset})")
    return 0


def _report(migration, original) -> dict:
    before, after = count_ops(original), count_ops(migration.model)
    return {
        "source_opset": migration.source_opset,
        "target_opset": migration.target_opset,
        "scans": [o.to_dict() for o in migration.outcomes],
        "op_changes": {op: {"before": before[op], "after": after[op]} for op in sorted(set(before) | set(after)) if before[op] != after[op]},
        "verification": migration.verification,
    }


def _format(report: dict) -> str:
    lines = [f"opset {report['source_opset']} -> {report['target_opset']}"]
    if report["target_opset"] < report["source_opset"]:
        lines.append("every other op keeps its form at the lower opset: renumbered")
    elif not report["scans"]:
        lines.append("no Scan-8 nodes; the rest converted by onnx.version_converter")
    for scan in report["scans"]:
        where = "" if scan["graph"] == "main" else f" (in {scan['graph']})"
        lines.append(f"{scan['node']}{where}: {scan['detail']}")
    if report["op_changes"]:
        lines.append("ops: " + ", ".join(f"{op} {c['before']} -> {c['after']}" for op, c in report["op_changes"].items()))
    if report["verification"]:
        lines.append(f"verification: {report['verification']['summary']}")
    return printable_lines(lines)
