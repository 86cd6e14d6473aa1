"""The deployment flags optimize, inspect and upgrade share: --input-shape, --threads,
--execution-provider, --tune/--no-tune; and --portable-runtime where --target is taken."""

from __future__ import annotations

import argparse
import re
import sys
from contextlib import contextmanager

from scanopt.cli.common import positive_int
from scanopt.deploy import merge_input_shapes


def add_deploy_arguments(parser: argparse.ArgumentParser, *, tune: bool = True) -> None:
    parser.add_argument("--input-shape", nargs="+", action="extend", default=[], metavar="NAME:D0,D1,...",
                        help="a shape the model will run at (repeatable, or several after one flag as onnxsim takes "
                             "them: --input-shape X:100,8,64 h0:8,4): the cost policy, the measurements and one verification seed use it; "
                             "the model's interface does not change (--inputs implies the shapes of its arrays)")
    parser.add_argument("--threads", type=positive_int, metavar="N",
                        help="intra-op threads the model will run with, which the choice of forms is made for; "
                             "N > 1 measures wall time (default: one thread, measured in thread CPU time)")
    add_provider_argument(parser, help="an onnxruntime execution provider the model will run with (repeatable, in "
                                       "priority order; full names or cpu, cuda, tensorrt, openvino, dml, coreml, ...): "
                                       "the forms are chosen for the first, measured where this onnxruntime runs it, "
                                       "else modelled for it (the report says which); default cpu")
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


def add_portable_runtime_argument(parser: argparse.ArgumentParser) -> None:
    """--portable-runtime NAME, beside a --target that offers portable."""
    from scanopt.portable import RUNTIMES

    parser.add_argument("--portable-runtime", action="append", choices=list(RUNTIMES), metavar="NAME",
                        help="with --target portable: a runtime the output must load and run, equal, in (repeatable: "
                             f"{', '.join(RUNTIMES)}; default all of them). Without openvino, forms OpenVINO's CPU "
                             "runtime cannot run (LinearAttention-27, native ops it misruns) are written too "
                             "(docs/execution-providers.md)")


def provider_name(text: str) -> str:
    """An argparse type: onnxruntime's full name of a provider (unknown: exit 2, one line)."""
    from scanopt.errors import ScanoptError
    from scanopt.providers import resolve

    try:
        return resolve([text])[0]
    except ScanoptError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_provider_argument(parser: argparse.ArgumentParser, *, help: str) -> None:
    parser.add_argument("--execution-provider", action="append", default=[], type=provider_name, metavar="NAME",
                        help=help)


@contextmanager
def session_providers(names):
    """Within the block, onnxruntime sessions use the ``--execution-provider`` list (scanopt run
    and verify); a provider this onnxruntime does not run is said on stderr in one line."""
    if not names:
        yield
        return
    from scanopt.engines import ort_providers
    from scanopt.providers import run_providers

    providers, line = run_providers(names)
    if line:
        print(f"scanopt: {line}", file=sys.stderr)
    with ort_providers(providers):
        yield


def deploy_options(args, feeds: list[dict] | None) -> dict:
    """options["input_shapes"], ["threads"], ["tune"], ["retune"], ["tune_seconds"],
    ["portable_runtimes"] from the flags."""
    options = {"input_shapes": merge_input_shapes(args.input_shape, feeds), "threads": args.threads}
    if getattr(args, "portable_runtime", None):
        if args.target != "portable":
            from scanopt.errors import ScanoptError

            raise ScanoptError("--portable-runtime needs --target portable")
        options["portable_runtimes"] = list(dict.fromkeys(args.portable_runtime))
    if args.execution_provider:
        options["execution_providers"] = list(args.execution_provider)
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


# NAME:D0,D1,... (a scalar: NAME:); the name may hold ':' (tf2onnx's "x:0")
_SHAPE = re.compile(r"[^-].*:\s*(\d+\s*(,\s*\d+\s*)*)?")


def split_input_shapes(argv: list[str]) -> list[str]:
    """``--input-shape a:1,2 b:3`` -> ``--input-shape=a:1,2 --input-shape=b:3``: each shape
    bound to its own flag, so the values after one flag stop at the first that is not a
    shape and positionals after them (IN, OUT) are never taken for shapes."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return out + argv[i:]
        if token == "--input-shape" and i + 1 < len(argv) and _SHAPE.fullmatch(argv[i + 1]):
            i += 1
            while i < len(argv) and _SHAPE.fullmatch(argv[i]):
                out.append(f"--input-shape={argv[i]}")
                i += 1
            continue
        out.append(token)
        i += 1
    return out
