"""The ``scanopt`` command line: one module per subcommand, each with ``register`` and ``run``.

Every subcommand module defines ``register(subparsers)`` (adds its parser and sets
``func=run``) and ``run(args) -> int`` (the exit code). Errors meant for the user are
raised as :class:`scanopt.errors.ScanoptError` and printed here as one line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from scanopt.cli.interrupts import check, describe, exit_code, handled_signals
from scanopt.errors import ScanoptError, did_you_mean, printable

# Subcommand modules in the order --help lists them.
SUBCOMMANDS = ("optimize", "upgrade", "inspect", "run", "verify")

DESCRIPTION = """\
Rewrite ONNX Scan nodes into faster, more portable, equivalent forms and prove
each rewrite numerically before writing anything.

examples:
  scanopt optimize model.onnx model.opt.onnx --input-shape X:100,8,64   # the shapes it runs at
  scanopt optimize model.onnx model.opt.onnx --target portable          # every proven rewrite
  scanopt optimize model.onnx out.onnx --passes cleanup --report report.json
  scanopt inspect model.onnx --json
  scanopt run model.onnx --inputs feeds.npz --engine reference
  scanopt verify model.onnx model.opt.onnx --seeds 3

exit codes: 0 ok, 1 verification failed or impossible (verify, upgrade, optimize --strict),
2 bad input or usage, 128+N ended by signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP;
nothing written)
"""


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line instead of the usage block on errors, and names
    the closest flag, subcommand or choice to a misspelled one."""

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = super().parse_known_args(args, namespace)
        flags = [a for a in extras if a.startswith("-") and len(a) > 1]
        if flags:  # each (sub)parser judges its own flags: it knows which it has
            known = [o for o in self._option_string_actions if o.startswith("--")]
            hints = [f"{flag}{did_you_mean(flag.split('=', 1)[0], known)}" for flag in flags]
            self.error(f"unrecognized arguments: {' '.join(hints)}")
        return parsed, extras

    def error(self, message: str):  # noqa: D401 - argparse API
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice and "did you mean" not in message:
            options = [c.strip().strip("'") for c in choice.group(2).split(",")]
            message += did_you_mean(choice.group(1), options)
        self.exit(2, f"scanopt: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="scanopt",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from scanopt import __version__

    parser.add_argument("--version", action="version", version=f"scanopt {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in SUBCOMMANDS:  # a module missing from an install is an error, not a silently absent command
        importlib.import_module(f"scanopt.cli.{name}_cmd").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line; ``argv`` None: the process's own (its handlers then stay until exit,
    so a signal after the outcome is settled cannot turn into a traceback)."""
    with handled_signals(keep=argv is None):  # first, and before build_parser imports the heavy modules
        try:
            _tolerant_streams()
            _warm_up(sys.argv[1:] if argv is None else argv)
            code = _main(argv)
            check()  # a signal whose exception was swallowed on the way
            return code
        except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: staging removed on the way here
            print(f"scanopt: {describe(exc)}", file=sys.stderr)
            return exit_code(exc)


# Commands that run the user's model in onnxruntime at once: their first run happens in a child
# process (scanopt.isolated), which starts importing onnxruntime now, beside this one's imports.
RUNS_AT_ONCE = ("run", "verify")


def _warm_up(argv) -> None:
    words = [str(a) for a in argv]
    command = next((a for a in words if not a.startswith("-")), None)
    if command in RUNS_AT_ONCE and not any(a in ("reference", "--engine=reference") for a in words):
        from scanopt.isolated import warm_up

        warm_up()


def _tolerant_streams() -> None:
    """Write what the console can take: a character its encoding lacks (a redirected Windows
    console is cp1252; reports say ⊙ and →) becomes '?' instead of a UnicodeEncodeError
    ending the run after the model was written."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="replace")
        except (AttributeError, ValueError, OSError):  # not a TextIOWrapper, or already closed
            pass


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    from scanopt.cli.deploy_args import split_input_shapes

    args = parser.parse_args(split_input_shapes(sys.argv[1:] if argv is None else list(argv)))
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:
        # the reader (`head`, a pager) stopped reading: end quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by the closed pipe
    except ScanoptError as exc:
        print(f"scanopt: {printable(exc)}", file=sys.stderr)
        return exc.exit_code
    except MemoryError:  # anywhere: loading, inference, verification, writing (staged files are removed)
        print("scanopt: out of memory: the run needs more memory than this process may use; nothing written",
              file=sys.stderr)
        return 1
