"""Progress of a long run on stderr: each phase (load, each pass round, verification,
write) with its counter (Scans done / total) and the elapsed time.

Hand-written rather than tqdm or rich: the phases are not loops scanopt owns (a pass
reports from inside its own walk over the Scans through ``PassContext.progress``), the
output is one status line, and either library would be a new dependency (rich brings
pygments and markdown-it) for some forty lines. On a terminal the line is redrawn in
place at most ten times a second; elsewhere (``--progress`` into a file or a pipe) each
phase prints one line when it ends, so a log stays short, and a phase that counts Scans for
longer prints its counter every :data:`LOG_SECONDS` (timing 300 Scans said nothing for 35 s).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

REDRAW_SECONDS = 0.1
KEEP_SECONDS = 1.0  # on a terminal, a phase that took this long keeps its line; shorter ones are overwritten
LOG_SECONDS = 5.0  # not on a terminal: a counting phase's line at most this often


class Progress:
    """Called with a phase name (the pipeline's ``progress`` callback); ``count(done,
    total)`` updates the current phase's counter; ``close()`` ends the last phase."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None, clock=time.perf_counter):
        self.stream = stream if stream is not None else sys.stderr
        self.live = is_terminal(self.stream) if live is None else live
        self.clock = clock
        self.started = clock()
        self.phase: str | None = None
        self.phase_started = self.started
        self.done = self.total = None
        self.drawn = 0.0
        self.width = 0

    def __call__(self, phase: str) -> None:
        self._end()
        self.phase, self.phase_started, self.done, self.total = phase, self.clock(), None, None
        if self.live:
            self._draw()

    def count(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        if self.live and (done == total or self.clock() - self.drawn >= REDRAW_SECONDS):
            self._draw()
        elif not self.live and done < total and self.clock() - max(self.drawn, self.phase_started) >= LOG_SECONDS:
            self.stream.write(self.line() + "\n")
            self.stream.flush()
            self.drawn = self.clock()

    def close(self) -> None:
        self._end()

    def line(self) -> str:
        """The status line of the current phase."""
        now = self.clock()
        parts = [f"scanopt: {self.phase}"]
        if self.total:
            parts.append(f"{self.done}/{self.total} Scans")
        parts.append(f"{now - self.phase_started:.1f} s (total {now - self.started:.1f} s)")
        return "  ".join(parts)

    def _draw(self) -> None:
        text = self.line()
        self.stream.write("\r" + text.ljust(self.width))
        self.stream.flush()
        self.width, self.drawn = len(text), self.clock()

    def _end(self) -> None:
        if self.phase is None:
            return
        if not self.live:
            self.stream.write(self.line() + "\n")
        elif self.clock() - self.phase_started >= KEEP_SECONDS:
            self._draw()
            self.stream.write("\n")  # a slow phase keeps its line
            self.width = 0
        else:  # the next phase (or the report) overwrites it
            self.stream.write("\r" + " " * self.width + "\r")
            self.width = 0
        self.stream.flush()
        self.phase = None


def is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
