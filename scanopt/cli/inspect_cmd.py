"""``scanopt inspect MODEL``: list every Scan and what each pass would do with it."""

from __future__ import annotations

import argparse
import json

from scanopt.cli.common import comma_list
from scanopt.cli.deploy_args import add_deploy_arguments, add_portable_runtime_argument, deploy_options
from scanopt.chooser import Chooser
from scanopt.cost import TARGETS
from scanopt.errors import printable
from scanopt.graph import NameAllocator
from scanopt.inspect import describe_scans, format_scans
from scanopt.ir import import_model
from scanopt.model_io import load
from scanopt.pass_api import PassContext, ScanPass
from scanopt.pipeline import deploy_decisions, select_passes
from scanopt.shapes import ShapeTable, shared_inference
from scanopt.validate import default_opset

EPILOG = """\
examples:
  scanopt inspect model.onnx
  scanopt inspect model.onnx --json > scans.json
  scanopt inspect model.onnx --passes fuse
  scanopt inspect model.onnx --input-shape X:100,8,64   # the verdicts at that shape (measured)
  scanopt inspect model.onnx --target portable   # what optimize --target portable would apply
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="list every Scan (nested ones too) and what each pass would do",
        description="List every Scan node at every nesting level with its attributes, "
        "the outer values its body captures, and each pass's dry-run verdict.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", metavar="MODEL")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--passes", type=comma_list, metavar="A,B", help="passes to ask (default: all)")
    parser.add_argument("--target", choices=list(TARGETS), default="onnxruntime",
                        help="the cost policy that decides what would apply, as in optimize (default onnxruntime)")
    add_portable_runtime_argument(parser)
    add_deploy_arguments(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    loaded = load(args.model)
    chosen = select_passes(args.passes)
    options = dict(deploy_options(args, None), target=args.target)
    with shared_inference():  # the measurements and the ShapeTable below infer the model once
        options, _ = deploy_decisions(loaded.model, chosen, options, None)
        graph = import_model(loaded.model)
        scans = _described(loaded.model, graph, options, chosen)
    if args.json:
        print(json.dumps({"model": args.model, "scans": scans, "warnings": loaded.warnings}, indent=2))
    else:
        print(f"{args.model}: {len(scans)} Scan node{'s' if len(scans) != 1 else ''}")
        print(format_scans(scans))
        for warning in loaded.warnings:
            print(f"warning: {printable(warning)}")
    return 0


def _described(model, graph, options: dict, chosen) -> list[dict]:
    ctx = PassContext(
        opset=default_opset(model) or 0, names=NameAllocator(graph), shapes=ShapeTable(model),
        options=options, selected=tuple(p.name for p in chosen), chooser=Chooser.from_options(options),
    )
    return describe_scans(graph, ctx, [p for p in chosen if isinstance(p, ScanPass)])
