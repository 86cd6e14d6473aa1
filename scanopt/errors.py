"""Errors that reach the user as one line on stderr and exit code 2.

Anything raised as a ScanoptError is a problem with the user's input or request,
never a bug in scanopt; the CLI prints ``scanopt: <message>`` and exits 2.
"""


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
