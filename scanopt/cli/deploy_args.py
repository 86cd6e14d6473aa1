"""The deployment flags optimize, inspect and upgrade share: --input-shape, --threads, --tune/--no-tune."""

from __future__ import annotations

import argparse

from scanopt.cli.common import positive_int
from scanopt.deploy import merge_input_shapes


def add_deploy_arguments(parser: argparse.ArgumentParser, *, tune: bool = True) -> None:
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME:D0,D1,...",
                        help="a shape the model will run at (repeatable; onnxsim's --overwrite-input-shape syntax, "
                             "e.g. X:100,8,64): the cost policy, the measurements and one verification seed use it; "
                             "the model's interface does not change (--inputs implies the shapes of its arrays)")
    parser.add_argument("--threads", type=positive_int, metavar="N",
                        help="intra-op threads the model will run with, which the choice of forms is made for; "
                             "N > 1 measures wall time (default: one thread, measured in thread CPU time)")
    if tune:
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--tune", dest="tune", action="store_const", const=True, default=None,
                           help="measure each Scan's candidate forms (the default where the deployment shapes are known)")
        group.add_argument("--no-tune", dest="tune", action="store_const", const=False,
                           help="never measure: decide by the analytic cost model with its committed constants "
                                "(output independent of the machine)")
        parser.add_argument("--retune", action="store_true",
                            help="measure every Scan again, ignoring and overwriting the cached choices")
        parser.add_argument("--tune-seconds", type=float, metavar="S",
                            help="time budget for measuring, per model (default 30; 2 per distinct Scan)")


def deploy_options(args, feeds: list[dict] | None) -> dict:
    """options["input_shapes"], ["threads"], ["tune"], ["retune"], ["tune_seconds"] from the flags."""
    options = {"input_shapes": merge_input_shapes(args.input_shape, feeds), "threads": args.threads}
    if getattr(args, "tune", None) is not None:
        options["tune"] = args.tune
    if getattr(args, "retune", False):
        options["retune"] = True
    if getattr(args, "tune_seconds", None) is not None:
        if args.tune_seconds <= 0:
            from scanopt.errors import ScanoptError

            raise ScanoptError("--tune-seconds must be more than 0")
        options["tune_seconds"] = args.tune_seconds
    return options
