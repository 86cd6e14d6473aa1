"""``scanopt optimize IN OUT``: run the pipeline, verify, write atomically."""

from __future__ import annotations

import argparse
import textwrap
import time

from scanopt import before_after
from scanopt.cli.common import add_job_arguments, comma_list, job_progress, start_job, text_writer
from scanopt.cli.deploy_args import add_deploy_arguments, add_portable_runtime_argument, deploy_options
from scanopt.errors import ScanoptError, VerificationError, did_you_mean
from scanopt.isolated import OnnxruntimeCrashError, crash_watch, warm_up
from scanopt.model_io import bytes_writer, model_writer, read_regular_file, PROTOBUF_LIMIT
from scanopt.pipeline import optimize, select_passes
from scanopt.protos import attribute_graphs, walk_proto_graphs

EPILOG = """\
examples:
  scanopt optimize model.onnx out.onnx --input-shape X:100,8,64 --threads 1
  scanopt optimize model.onnx out.onnx --input-shape X:100,8,64 h0:8,32   # onnxsim's form
  scanopt optimize model.onnx out.onnx --target portable   # every proven rewrite, for other backends
  scanopt optimize model.onnx out.onnx --target portable --portable-runtime onnxruntime   # LinearAttention too
  scanopt optimize model.onnx model.opt.onnx   # no shapes: a form must win over a range of sizes
  scanopt optimize model.onnx out.onnx --no-tune     # same output on every machine
  scanopt optimize model.onnx out.onnx --passes upgrade,canonicalize --report report.json
  scanopt optimize model.onnx out.onnx --skip unroll --inputs feeds.npz --strict
  scanopt optimize model.onnx model.onnx --in-place
  scanopt optimize big.onnx out.onnx --pass-option vectorize_max_bytes=268435456

{order}

exit codes: 0 ok (also when a rewrite was rolled back), 1 a rewrite was rolled back
and --strict was given (nothing written), 2 bad input or usage (nothing written)
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "optimize",
        help="rewrite Scan nodes into faster equivalent forms",
        description="Rewrite the Scan nodes of IN and write the verified result to OUT.",
        epilog=EPILOG.replace("{order}", _order_paragraph()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_job_arguments(parser, verb="optimize")
    parser.add_argument("--passes", type=comma_list, metavar="A,B", help=f"passes to run (default: all of {', '.join(available_passes())})")
    parser.add_argument("--skip", type=comma_list, default=[], metavar="A,B", help="passes not to run")
    parser.add_argument("--target-opset", type=int, metavar="N", help="opset to move the model to (lets upgrade rewrite Scan-8); default: keep the model's opset")
    parser.add_argument("--unroll-max", type=int, metavar="N", help="unroll Scans of at most N static steps (default: the unroll pass's measured default)")
    parser.add_argument("--target", choices=["onnxruntime", "portable"], default="onnxruntime", help="onnxruntime (default): per Scan, the form measured (or, where it cannot be, modelled) fastest on onnxruntime CPU; portable: prefer native ops and loop-free forms regardless, among those every --portable-runtime runs (default: onnxruntime and OpenVINO's CPU runtime; docs/execution-providers.md)")
    add_portable_runtime_argument(parser)
    add_deploy_arguments(parser)
    parser.add_argument("--pass-option", action="append", default=[], metavar="KEY=VALUE",
                        help="set a pass's tunable (repeatable): " + "; ".join(f"{k}: {h}" for k, (_, h) in tunables().items()))
    parser.add_argument("--strict", action="store_true", help="exit 1 and write nothing if any rewrite was rolled back")
    parser.set_defaults(func=run)


def tunables() -> dict[str, tuple[type, str]]:
    """Every registered pass's user-settable options: key -> (type, help)."""
    return {key: spec for p in select_passes() for key, spec in p.tunables.items()}


def _pass_option(text: str) -> tuple[str, object]:
    """KEY=VALUE of --pass-option, checked against the passes' tunables."""
    key, sep, value = text.partition("=")
    known = tunables()
    if not sep or key not in known:
        raise ScanoptError(f"--pass-option {text}: expected KEY=VALUE with KEY one of {', '.join(known)}"
                           + did_you_mean(key, known))
    kind = known[key][0]
    try:
        parsed = kind(value)
    except ValueError:
        raise ScanoptError(f"--pass-option {key}: '{value}' is not {'an integer' if kind is int else kind.__name__}") from None
    if isinstance(parsed, int) and parsed < 0:
        raise ScanoptError(f"--pass-option {key} must be 0 or more")
    return key, parsed


def available_passes() -> list[str]:
    """The registered passes in pipeline order: what --passes and --skip accept."""
    return [p.name for p in select_passes()]


def _order_paragraph() -> str:
    return textwrap.fill(
        f"Passes run in the order {', '.join(available_passes())}, repeated until nothing "
        "changes. Every rewrite is verified numerically against the original before anything "
        "is written; a rewrite that fails is rolled back and reported.",
        width=84,
    )


def run(args) -> int:
    with job_progress(args) as progress:
        return _run(args, progress)


def _run(args, progress) -> int:
    started = time.perf_counter()
    if progress is not None:
        progress(f"loading {args.input}")
    loaded, feeds, plan = start_job(args)
    if _has_loops(loaded.model):  # it will be run: the child that runs it first starts importing onnxruntime now
        warm_up()
    with crash_watch() as crashes:
        result, report = optimize(
            loaded.model,
            passes=args.passes,
            skip=args.skip,
            verify=not args.no_verify,
            inputs=feeds,
            engine=args.engine,
            seeds=args.seeds,
            options=_pass_options(args, feeds),
            progress=progress,
            validated=loaded.warnings,  # load validated it already
        )
    if crashes:  # verification met it, and the pipeline took it for "cannot verify": the model is the problem
        raise OnnxruntimeCrashError(f"{args.input}: {crashes[0]}; nothing written")
    report.warnings = loaded.warnings + [w for w in report.warnings if w not in loaded.warnings]
    rolled_back = bool(report.verification and report.verification.get("rolled_back"))
    if args.strict and rolled_back:
        if not args.quiet:
            print(report.format(verbose=args.verbose))
        raise VerificationError(f"{args.input}: {report.verification['summary']} (--strict: nothing written)")
    if result is loaded.model and not loaded.had_external_data and not loaded.sorted_nodes:
        writer = bytes_writer(read_regular_file(args.input, what="model", limit=PROTOBUF_LIMIT))
    else:
        writer = model_writer(result, args.output, external_data=loaded.had_external_data or None)
    outputs = [(args.output, writer)]
    if args.report:
        outputs.append((args.report, text_writer(report.to_json() + "\n")))
    if progress is not None:
        progress(f"writing {args.output}")
    plan.write(outputs)
    if progress is not None:
        progress.close()
    if not args.quiet:
        if report.modified:
            report.before_after = before_after.table(loaded.model, result, time.perf_counter() - started)
        print(report.format(verbose=args.verbose))
        state = "optimized" if report.modified else "unchanged"
        print(f"wrote {args.output} ({state})")
    return 0


def _has_loops(model) -> bool:
    """Whether ``model`` holds a Scan or Loop (in a graph or a function): what optimize rewrites,
    verifies and times, running it in onnxruntime."""
    graphs = list(walk_proto_graphs(model.graph))
    for function in model.functions:
        graphs += [g for node in function.node for a in node.attribute for top in attribute_graphs(a)
                   for g in walk_proto_graphs(top)]
        graphs.append(function)
    return any(node.op_type in ("Scan", "Loop") for g in graphs for node in g.node)


def _pass_options(args, feeds=None) -> dict:
    """Options passes read from PassContext.options; absent ones keep the pass defaults."""
    options = {"target": args.target}
    options.update(_pass_option(text) for text in args.pass_option)
    options.update(deploy_options(args, feeds))
    if args.target_opset is not None:
        options["target_opset"] = args.target_opset
    if args.unroll_max is not None:
        if args.unroll_max < 0:
            raise ScanoptError("--unroll-max must be 0 or more")
        options["unroll_max"] = args.unroll_max
    return options
