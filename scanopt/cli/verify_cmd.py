"""``scanopt verify ORIGINAL CANDIDATE``: are two models numerically equivalent?"""

from __future__ import annotations

import argparse
import json
import textwrap

from scanopt.cli.common import positive_int
from scanopt.cli.deploy_args import add_provider_argument, session_providers
from scanopt.cli.feeds import user_feeds
from scanopt.cli.run_cmd import add_input_arguments
from scanopt.errors import printable
from scanopt.model_io import load
from scanopt.verify import ENGINE_CHOICES, SPREAD_FACTOR, TOLERANCES, SignatureMismatchError, compare_models

def _tolerance_lines() -> str:
    listed = ", ".join(f"{name} {r:g}/{a:g}" for name, (r, a) in TOLERANCES.items())
    return textwrap.fill(listed, width=84, initial_indent="  ", subsequent_indent="  ")


EPILOG = f"""\
examples:
  scanopt verify model.onnx model.opt.onnx
  scanopt verify model.onnx model.opt.onnx --inputs feeds.npz --engine both
  scanopt verify model.onnx model.opt.onnx --seeds 5 --rtol 1e-3 --atol 1e-4 --json

Both models run on the same inputs (given, or synthesized for seeds 0..N-1; inputs
not given are synthesized per seed to agree with the given ones) and every
output must match: same dtype and shape, values within |got - expected| <= atol +
rtol * |expected|, NaN where the original has NaN. Default rtol/atol per dtype:
{_tolerance_lines()}
integers and bool exactly; an output they fail passes within {SPREAD_FACTOR}x the original's own
onnxruntime-vs-reference disagreement (see the README). --rtol/--atol replace them
for every floating dtype, with no widening.
--engine auto uses onnxruntime when it loads both models, else the reference
executor; both runs each engine on each model and also compares the engines.

exit codes: 0 equivalent, 1 not equivalent (also: outputs or inputs of another name,
dtype, rank or count), 2 bad input or usage
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check that two models compute the same outputs",
        description="Compare every output of CANDIDATE with ORIGINAL on the same inputs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("original", metavar="ORIGINAL", help="the reference model")
    parser.add_argument("candidate", metavar="CANDIDATE", help="the model to check against it")
    add_input_arguments(parser)
    parser.add_argument("--engine", choices=ENGINE_CHOICES, default="auto", help="default: auto")
    parser.add_argument("--seeds", type=positive_int, default=3, metavar="N", help="synthesized input sets (default 3)")
    parser.add_argument("--rtol", type=float, metavar="X", help="relative tolerance for floating outputs")
    parser.add_argument("--atol", type=float, metavar="Y", help="absolute tolerance for floating outputs")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_provider_argument(parser, help="run onnxruntime sessions with this execution provider (repeatable, in priority "
                                       "order; full names or cpu, cuda, ...; one it does not offer here is said in one "
                                       "line and the CPU runs instead); default cpu")
    parser.set_defaults(func=run)


def run(args) -> int:
    with session_providers(args.execution_provider):
        return _run(args)


def _run(args) -> int:
    feeds = None
    if args.inputs or args.input:  # inputs not given are synthesized per seed to match the given ones
        engine = "reference" if args.engine == "reference" else "ort"
        feeds, _ = user_feeds(
            load(args.original).model, npz=args.inputs, arrays=args.input, seeds=range(args.seeds), engine=engine
        )
    try:
        result = compare_models(
            args.original,
            args.candidate,
            inputs=feeds,
            engine=args.engine,
            seeds=args.seeds,
            rtol=args.rtol,
            atol=args.atol,
        )
    except SignatureMismatchError as exc:  # outputs of another dtype, rank or count: not equivalent
        summary = f"NOT equivalent: {exc}"
        if args.json:
            print(json.dumps({"passed": False, "engine": None, "summary": summary, "notes": [], "sizes": {},
                              "comparisons": []}, indent=2))
        else:
            print(f"FAILED: {printable(exc)}")
        return 1
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result.format())
    return 0 if result.passed else 1
