"""SIGINT, SIGTERM and SIGHUP end a command the same way: the exception unwinds the run
(staging folders are removed on the way out, nothing is written) and the command line exits
128 + the signal's number (130 for Ctrl-C) with one line.

Light on purpose (standard library only): the command line installs these handlers before
it imports onnx, onnxruntime or graphsurgeon, so a signal during those seconds of imports
ends as cleanly as one during the work.
"""

from __future__ import annotations

import contextlib
import signal
import threading

# What a shell's kill, a closing terminal and Ctrl-C send.
HANDLED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class Interrupted(KeyboardInterrupt):
    """Raised by the handlers: a KeyboardInterrupt, so everything that cleans up after
    Ctrl-C cleans up after SIGTERM too."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise(signum, frame):
    raise Interrupted(signum)


@contextlib.contextmanager
def handled_signals():
    """Turn the handled signals into :class:`Interrupted` for the duration, then restore the
    previous handlers. A signal someone chose to ignore (``nohup`` ignores SIGHUP, a shell's
    background job SIGINT) stays ignored. Outside the main thread Python allows no handlers:
    nothing changes there."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in HANDLED:
            current = signal.getsignal(signum)
            if current is not signal.SIG_IGN:
                previous[signum] = current
                signal.signal(signum, _raise)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def exit_code(exc: KeyboardInterrupt) -> int:
    """128 + the signal's number; a plain KeyboardInterrupt is SIGINT's 130."""
    return exc.exit_code if isinstance(exc, Interrupted) else 128 + signal.SIGINT


def describe(exc: KeyboardInterrupt) -> str:
    """'interrupted' for Ctrl-C, 'interrupted by SIGTERM' for the others."""
    if isinstance(exc, Interrupted) and exc.signum != signal.SIGINT:
        return f"interrupted by {signal.Signals(exc.signum).name}"
    return "interrupted"
