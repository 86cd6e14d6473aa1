"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import os
import sys

from scanopt.errors import ScanoptError


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
