"""SIGINT, SIGTERM and SIGHUP end a command the same way: the exception unwinds the run
(staging folders are removed on the way out, nothing is written) and the command line exits
128 + the signal's number (130 for Ctrl-C) with one line.

Light on purpose (standard library only): the command line installs these handlers before
it imports onnx, onnxruntime or graphsurgeon, so a signal during those seconds of imports
ends as cleanly as one during the work.

A handler records the signal and raises only where raising is safe:
- never inside the import system: an exception raised in importlib's module-lock callback
  is printed as "ignored" and lost, and one raised while an extension module initializes
  can leave it half built (a crash later). There the signal is delivered again every
  :data:`REDELIVER_SECONDS` until the outermost import has finished (imports are bounded);
- never while a run's outputs are renamed into place (:func:`committing`): the renames finish
  and the run has succeeded; a signal after that is recorded and changes nothing (exit 0);
- once per signal: a second one does not cut short the clean-up the first one started.
A signal whose exception was swallowed anyway (a ``__del__``, a weakref callback) is still
acted on before any output is renamed into place (:func:`check`) and when the command ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

# What a shell's kill, a closing terminal and Ctrl-C send.
HANDLED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
REDELIVER_SECONDS = 0.02
IMPORT_SYSTEM = ("<frozen importlib._bootstrap", "<frozen importlib._bootstrap_external")


class Interrupted(KeyboardInterrupt):
    """Raised by the handlers: a KeyboardInterrupt, so everything that cleans up after
    Ctrl-C cleans up after SIGTERM too."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _State:
    """The signal received (the first), whether its exception was raised, whether the run's
    outcome is settled (outputs renamed, or the command has returned), and how deep the
    sections are in which a signal waits (:func:`committing`)."""

    def __init__(self):
        self.received: int | None = None
        self.raised = False
        self.settled = False
        self.waiting = 0
        self.redelivery: threading.Timer | None = None


_state = _State()


def _in_import_system(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith(IMPORT_SYSTEM):
            return True
        frame = frame.f_back
    return False


def _redeliver(signum: int) -> None:
    state = _state
    if state.redelivery is None:
        def again():
            state.redelivery = None
            if signal.getsignal(signum) is _handle and not state.raised and not state.settled:
                os.kill(os.getpid(), signum)

        state.redelivery = threading.Timer(REDELIVER_SECONDS, again)
        state.redelivery.daemon = True
        state.redelivery.start()


def _handle(signum, frame):
    state = _state
    if state.settled or state.raised:
        return
    if state.received is None:
        state.received = signum
    if state.waiting:
        return  # committing() acts on it when its section ends
    if _in_import_system(frame):
        _redeliver(state.received)
        return
    state.raised = True
    raise Interrupted(state.received)


def check() -> None:
    """Raise :class:`Interrupted` if a signal came and its exception has not unwound the run
    (it was swallowed, or is waiting): called before a run's outputs become visible."""
    state = _state
    if state.received is not None and not state.settled:
        state.raised = True
        raise Interrupted(state.received)


@contextlib.contextmanager
def committing():
    """The renames that make a run's outputs visible: a signal before them ends the run with
    nothing written, one during them waits, and once they are done the run has succeeded
    (a later signal is recorded and ignored)."""
    check()
    _state.waiting += 1
    try:
        yield
        _state.settled = True
    finally:
        _state.waiting -= 1
    # an error in the renames propagates as it is; a signal that waited only adds nothing


@contextlib.contextmanager
def handled_signals(*, keep: bool = False):
    """Install the handlers for the duration, then restore the previous ones (``keep``: ignore
    the signals from then on: the program's own command line, whose outcome is settled when
    this ends and whose process exits next). A signal someone chose to ignore (``nohup`` ignores SIGHUP, a
    shell's background job SIGINT) stays ignored. Outside the main thread Python allows no
    handlers: nothing changes there."""
    global _state
    outer, _state = _state, _State()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in HANDLED:
            current = signal.getsignal(signum)
            if current is not signal.SIG_IGN:
                previous[signum] = current
                signal.signal(signum, _handle)
    try:
        yield
    finally:
        if keep:  # ignored, not merely recorded: Python's finalization resets a Python handler to the default
            _state.settled = True
            for signum in previous:
                signal.signal(signum, signal.SIG_IGN)
        else:
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
            if _state.redelivery is not None:
                _state.redelivery.cancel()
            _state = outer


def exit_code(exc: KeyboardInterrupt) -> int:
    """128 + the signal's number; a plain KeyboardInterrupt is SIGINT's 130."""
    return exc.exit_code if isinstance(exc, Interrupted) else 128 + signal.SIGINT


def describe(exc: KeyboardInterrupt) -> str:
    """'interrupted' for Ctrl-C, 'interrupted by SIGTERM' for the others."""
    if isinstance(exc, Interrupted) and exc.signum != signal.SIGINT:
        return f"interrupted by {signal.Signals(exc.signum).name}"
    return "interrupted"
