"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager

from scanopt.errors import ScanoptError, printable
from scanopt.cli.feeds import feed_files
from scanopt.model_io import LoadedModel, external_data_name, load
from scanopt.cli.interrupts import committing
from scanopt.outputs import FileId, OutputPlan, Writer


def comma_list(text: str) -> list[str]:
    """``a,b , c`` -> ['a', 'b', 'c'] (for --passes / --skip)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def positive_int(text: str) -> int:
    """An argparse type for counts such as --seeds: 0 or less is a usage error (exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def info(message: str) -> None:
    """Progress and notes go to stderr, so stdout stays clean for reports and JSON."""
    print(printable(message), file=sys.stderr, flush=True)


def add_job_arguments(parser: argparse.ArgumentParser, *, verb: str) -> None:
    """IN, OUT and the verification/output options that optimize and upgrade share."""
    parser.add_argument("input", metavar="IN", help=f"model to {verb} (never modified)")
    parser.add_argument("output", metavar="OUT", help="where to write the result")
    parser.add_argument("--report", metavar="FILE.json", help="also write the report as JSON")
    parser.add_argument("--no-verify", action="store_true", help="skip numeric verification (not recommended)")
    parser.add_argument("--inputs", metavar="FILE.npz", help="verify on these inputs instead of synthesized ones")
    parser.add_argument("--engine", choices=("auto", "ort", "reference", "both"), default="auto", help="verification engine (default: auto)")
    parser.add_argument("--seeds", type=positive_int, default=2, metavar="N", help="synthesized input sets to verify on (default 2)")
    parser.add_argument("--in-place", action="store_true", help="allow OUT to be IN (replaced atomically)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    parser.add_argument("-v", "--verbose", action="store_true", help="show progress and every pass's verdict on every Scan")
    parser.add_argument("--progress", action="store_true",
                        help="show each phase with its counters and time on stderr also when stderr is not a terminal "
                             "(on a terminal it is shown anyway; -q hides it)")


@contextmanager
def job_progress(args):
    """The job's scanopt.progress.Progress on stderr, closed when the job ends, or None:
    shown on a terminal, with --progress or -v anywhere, never with -q."""
    from scanopt.progress import Progress, is_terminal

    if args.quiet or not (args.progress or args.verbose or is_terminal(sys.stderr)):
        yield None
        return
    progress = Progress(sys.stderr)
    try:
        yield progress
    finally:
        progress.close()


def input_files(loaded: LoadedModel, label: str = "IN") -> list[tuple[str, str]]:
    """(label, path) of every file a loaded model was read from, for an OutputPlan."""
    return [(label, loaded.files[0])] + [(f"{label}'s external data", f) for f in loaded.files[1:]]


def claim_model_output(plan: OutputPlan, path: str, *, in_place: bool = False, input_path: str | None = None,
                       writes_data: bool = False) -> None:
    """Claim OUT and the external data file that may be written beside it. ``writes_data``
    (the model keeps weights in external data, so OUT.data will be written): an OUT.data that
    exists without an OUT beside it is someone else's file, not an earlier output's, and
    is refused rather than overwritten."""
    if input_path and not in_place and FileId.of(path).same(FileId.of(input_path)):
        raise ScanoptError(f"{path}: OUT is the input file; pass --in-place to replace it")
    plan.claim(path, "OUT", may_replace=("IN",) if in_place else ())
    data = os.path.join(os.path.dirname(os.path.abspath(path)), external_data_name(path))
    plan.claim(data, f"OUT's external data file ({os.path.basename(data)})")
    if writes_data and os.path.lexists(data) and not os.path.lexists(path):
        raise ScanoptError(
            f"{data}: exists, and no {os.path.basename(path)} beside it owns it; scanopt writes OUT's weights "
            "there and will not overwrite a file that is not an earlier OUT's (remove it or choose another OUT); "
            "nothing written"
        )


def start_job(args) -> tuple[LoadedModel, list[dict] | None, OutputPlan]:
    """Load IN, read --inputs, check every output path against every file read and each
    other, all before any work: (loaded model, feeds or None, the output plan)."""
    loaded = load(args.input)
    plan = OutputPlan(input_files(loaded) + feed_files(args.inputs), committing=committing)
    claim_model_output(plan, args.output, in_place=args.in_place, input_path=args.input,
                       writes_data=loaded.had_external_data)
    if args.report:
        plan.claim(args.report, "--report")
    feeds = None
    if args.inputs:
        from scanopt.inputs import load_feeds

        feeds = [load_feeds(loaded.model, npz=args.inputs)]
    return loaded, feeds, plan


def text_writer(text: str) -> Writer:
    """A writer for a text file (a JSON report)."""

    def write(staged: str) -> None:
        with open(staged, "w", encoding="utf-8") as handle:
            handle.write(text)

    return write
