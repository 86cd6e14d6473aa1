"""Errors that reach the user as one line on stderr and exit code 2.

Anything raised as a ScanoptError is a problem with the user's input or request,
never a bug in scanopt; the CLI prints ``scanopt: <message>`` and exits 2.

Messages carry strings taken from models (names, doc strings, op types, domains, paths):
:func:`printable` is the one place that makes such text safe for a terminal and a one-line
message, and every sink that prints messages or report lines goes through it.
"""

import re

# C0 and C1 controls (ESC starts ANSI sequences, newline and CR break a line), line and
# paragraph separators, bidirectional overrides (they reorder what a terminal shows), lone
# surrogates (they cannot be written as UTF-8).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: "re.Match[str]") -> str:
    char = match.group()
    return _SHORT.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def printable(text) -> str:
    """``text`` with every control character escaped as Python writes it (``\\x1b``,
    ``\\n``): safe to print on one line. Bytes (protobuf gives a string field that is not
    UTF-8 as bytes) are decoded with the invalid bytes shown as ``\\xff``."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "backslashreplace")
    text = str(text)
    return _UNPRINTABLE.sub(_escaped, text) if _UNPRINTABLE.search(text) else text


def printable_lines(lines) -> str:
    """Lines joined by newlines, each made :func:`printable` first (so a newline inside a
    name cannot start a line of its own)."""
    return "\n".join(printable(line) for line in lines)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


class ScanoptError(Exception):
    """A problem with the input or the request, reported as one line."""

    exit_code = 2


class InvalidModelError(ScanoptError):
    """The model is broken: unreadable, undefined names, malformed Scan attributes."""


class UnsupportedModelError(ScanoptError):
    """The model is valid ONNX but uses something scanopt cannot handle (opset, IR version)."""


class VerificationError(ScanoptError):
    """A rewrite failed numeric verification and --strict was given."""

    exit_code = 1


class InvalidArgumentError(ScanoptError, ValueError):
    """A library call got an argument it cannot use: an unknown option, pass or engine, a
    wrong type, seeds below 1. Raised before any work, instead of a silent no-op."""


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to a misspelled ``word``, else ''."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
