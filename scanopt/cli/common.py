"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import os
import sys

from scanopt.errors import ScanoptError
from scanopt.model_io import LoadedModel, load, write_atomically


def comma_list(text: str) -> list[str]:
    """``a,b , c`` -> ['a', 'b', 'c'] (for --passes / --skip)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def add_formatter(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def same_file(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.abspath(a) == os.path.abspath(b)


def check_output_path(path: str) -> None:
    """Fail before any work if the output cannot be written there."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ScanoptError(f"{path}: output directory does not exist")
    if not os.access(directory, os.W_OK):
        raise ScanoptError(f"{path}: output directory is not writable")
    if os.path.isdir(path):
        raise ScanoptError(f"{path}: is a directory")


def info(message: str) -> None:
    """Progress and notes go to stderr, so stdout stays clean for reports and JSON."""
    print(message, file=sys.stderr, flush=True)


def add_job_arguments(parser: argparse.ArgumentParser, *, verb: str) -> None:
    """IN, OUT and the verification/output options that optimize and upgrade share."""
    parser.add_argument("input", metavar="IN", help=f"model to {verb} (never modified)")
    parser.add_argument("output", metavar="OUT", help="where to write the result")
    parser.add_argument("--report", metavar="FILE.json", help="also write the report as JSON")
    parser.add_argument("--no-verify", action="store_true", help="skip numeric verification (not recommended)")
    parser.add_argument("--inputs", metavar="FILE.npz", help="verify on these inputs instead of synthesized ones")
    parser.add_argument("--engine", choices=("auto", "ort", "reference", "both"), default="auto", help="verification engine (default: auto)")
    parser.add_argument("--seeds", type=int, default=2, metavar="N", help="synthesized input sets to verify on (default 2)")
    parser.add_argument("--in-place", action="store_true", help="allow OUT to be IN (replaced atomically)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    parser.add_argument("-v", "--verbose", action="store_true", help="show progress and every pass's verdict")


def start_job(args) -> tuple[LoadedModel, list[dict] | None]:
    """Check paths before any work, load IN, read --inputs: (loaded model, feeds or None)."""
    if same_file(args.input, args.output) and not args.in_place:
        raise ScanoptError(f"{args.output}: OUT is the input file; pass --in-place to replace it")
    loaded = load(args.input)
    check_output_path(args.output)
    if args.report:
        check_output_path(args.report)
    feeds = None
    if args.inputs:
        from scanopt.inputs import load_feeds

        feeds = [load_feeds(loaded.model, npz=args.inputs)]
    return loaded, feeds


def write_text(path: str, text: str) -> None:
    """Write a text file (a JSON report) atomically."""

    def write(staged: str) -> None:
        with open(staged, "w", encoding="utf-8") as handle:
            handle.write(text)

    write_atomically(path, write)
