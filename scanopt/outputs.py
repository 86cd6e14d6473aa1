"""Writing every output of one run safely: all checked before anything is written, all
staged, then renamed into place.

A run declares what it read (the model, its external data files, feed files) and claims
each path it will write (the model, the model's ``.data`` file, a report, an npz). A claim
is refused with a one-line ScanoptError, before any work is written, when the path is a
directory, names one (``dir/``), is not a regular file (a FIFO or a device would be
replaced, or block), cannot be created in its directory, or is, by resolved path or by
inode (hard links), a file the run reads or another output of the same run.

:func:`write_outputs` then writes every claimed output into a staging folder beside it and
only when all of them are complete renames them into place, so a failure anywhere leaves
nothing. An existing output keeps its file mode. Staging folders are named
``.scanopt-staging-<pid>-<random>`` and hold a marker file (:data:`MARKER_NAME`, with
:data:`MARKER_TEXT`) written before anything else; one left behind by a killed run (SIGKILL
cannot be caught) is removed by a later run writing into the same folder once it is older
than :data:`STALE_AFTER_SECONDS`. Only a folder with both the name and the marker is
scanopt's: a user's ``.scanopt-defaults/`` is never touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from scanopt.errors import ScanoptError

STAGING_PREFIX = ".scanopt-staging-"
STAGING_NAME = re.compile(r"^\.scanopt-staging-\d+-[a-z0-9_]+$")
# Written first into every staging folder: what makes a folder with a staging name scanopt's.
MARKER_NAME = ".scanopt-staging-marker"
MARKER_TEXT = b"scanopt staging folder: removed when its run ends, or by a later run if that run was killed\n"
# A staging folder lives for the seconds a write takes; one untouched this long is a leftover.
STALE_AFTER_SECONDS = 3600

Writer = Callable[[str], None]


@dataclass(frozen=True)
class FileId:
    """A file as the OS sees it: its fully resolved path and, if it exists, its inode."""

    path: str
    inode: tuple[int, int] | None

    @classmethod
    def of(cls, path: str) -> "FileId":
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
        except OSError:
            return cls(real, None)
        return cls(real, (st.st_dev, st.st_ino))

    def same(self, other: "FileId") -> bool:
        return self.path == other.path or (self.inode is not None and self.inode == other.inode)


def file_kind(mode: int) -> str:
    """'a FIFO', 'a character device', ... for a stat mode that is not a regular file."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


class OutputPlan:
    """The files one run reads and the outputs it claims, checked against each other."""

    def __init__(self, reads: Iterable[tuple[str, str]] = (), *, committing: Callable = contextlib.nullcontext):
        self.committing = committing  # see write_outputs
        self._reads: list[tuple[str, FileId]] = []
        self._writes: list[tuple[str, str, FileId]] = []
        for label, path in reads:
            self.add_read(path, label)

    def add_read(self, path: str, label: str) -> None:
        self._reads.append((label, FileId.of(path)))

    def claim(self, path: str, label: str, *, may_replace: Iterable[str] = ()) -> str:
        """Check that ``path`` can be written as ``label`` (e.g. "OUT", "--report");
        return its absolute path. ``may_replace``: labels of read files it may replace
        (OUT with --in-place)."""
        check_output_path(path, label)
        target = FileId.of(path)
        allowed = set(may_replace)
        for read_label, read in self._reads:
            if target.same(read) and read_label not in allowed:
                raise ScanoptError(f"{path}: {label} is {read_label}, which this run reads; nothing written")
        for other_label, other_path, other in self._writes:
            if target.same(other):
                raise ScanoptError(f"{path}: {label} is the same file as {other_label} ({other_path}); nothing written")
        absolute = os.path.abspath(path)
        self._writes.append((label, absolute, target))
        return absolute

    @property
    def claimed(self) -> list[str]:
        return [path for _, path, _ in self._writes]

    def write(self, outputs: list[tuple[str, "Writer"]]) -> None:
        """:func:`write_outputs`, for claimed paths only (an unclaimed one is a bug here)."""
        unclaimed = [path for path, _ in outputs if os.path.abspath(path) not in self.claimed]
        if unclaimed:
            raise AssertionError(f"outputs written without being checked first: {unclaimed}")
        write_outputs(outputs, committing=self.committing)


def check_output_path(path: str, label: str = "output") -> None:
    """Fail before any work if ``path`` cannot be written as a regular file."""
    if path.endswith(os.sep) or (os.altsep and path.endswith(os.altsep)):
        raise ScanoptError(f"{path}: {label} ends with '{path[-1]}', so it names a directory; give a file name")
    absolute = os.path.abspath(path)
    directory, base = os.path.split(absolute)
    if not os.path.isdir(directory):
        raise ScanoptError(f"{path}: output directory does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ScanoptError(f"{path}: output directory is not writable")
    name_max = _limit(directory, "PC_NAME_MAX", 255)
    # the staged copy is written under this very name inside the staging folder
    if base == MARKER_NAME:
        raise ScanoptError(f"{path}: {label}'s file name is the one scanopt marks its staging folders with; choose another")
    if len(os.fsencode(base)) > name_max:
        raise ScanoptError(f"{path}: {label}'s file name is longer than this file system allows ({name_max} bytes)")
    path_max = _limit(directory, "PC_PATH_MAX", 4096)
    if len(os.fsencode(os.path.join(directory, STAGING_PREFIX + "0" * 24, base))) >= path_max:
        raise ScanoptError(f"{path}: {label}'s path is longer than this file system allows ({path_max} bytes)")
    try:
        st = os.stat(absolute)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ScanoptError(f"{path}: {label} cannot be checked ({exc.strerror})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = file_kind(st.st_mode)
        raise ScanoptError(f"{path}: {label} is {what}, not a regular file; scanopt only replaces regular files")


def _limit(directory: str, name: str, default: int) -> int:
    try:
        return os.pathconf(directory, name)
    except (OSError, ValueError, AttributeError):
        return default


def write_outputs(outputs: list[tuple[str, Writer]], *, committing: Callable = contextlib.nullcontext) -> None:
    """Write each ``(path, write)`` all or nothing: ``write(staged_path)`` writes the file
    (and any companion, such as external data, beside it) into a staging folder next to
    ``path``; once every output is staged, companions then main files are renamed into
    place, each keeping the mode of the file it replaces. The renames run inside
    ``committing()`` (the command line's: a signal waits until they are done, and the run
    has then succeeded)."""
    staged: list[tuple[str, str]] = []  # (staging folder, final path)
    try:
        for path, write in outputs:
            path = os.path.abspath(path)
            directory = os.path.dirname(path)
            remove_stale_staging(directory)
            try:
                folder = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=directory)
            except OSError as exc:
                raise ScanoptError(f"{path}: cannot write to its directory ({exc.strerror})") from None
            staged.append((folder, path))
            try:
                _write_marker(folder)
                write(os.path.join(folder, os.path.basename(path)))
            except OSError as exc:
                raise ScanoptError(f"{path}: cannot write ({exc.strerror or exc}); nothing written") from None
        with committing():
            _rename_into_place(staged)
    finally:
        for folder, _ in staged:
            shutil.rmtree(folder, ignore_errors=True)


def _rename_into_place(staged: list[tuple[str, str]]) -> None:
    for folder, path in staged:
        directory, base = os.path.split(path)
        names = sorted((n for n in os.listdir(folder) if n != MARKER_NAME), key=lambda name: name == base)  # companions first
        for name in names:
            _keep_mode(os.path.join(folder, name), os.path.join(directory, name))
        for name in names:
            try:
                os.replace(os.path.join(folder, name), os.path.join(directory, name))
            except OSError as exc:
                raise ScanoptError(f"{os.path.join(directory, name)}: cannot write ({exc.strerror or exc})") from None


def write_output(path: str, write: Writer) -> None:
    """One output, atomically (see :func:`write_outputs`)."""
    write_outputs([(path, write)])


def _write_marker(folder: str) -> None:
    with open(os.path.join(folder, MARKER_NAME), "wb") as handle:
        handle.write(MARKER_TEXT)


def _is_staging_folder(path: str, inside: list[os.DirEntry]) -> bool:
    """Name checked by the caller; here: nothing but files, and scanopt's marker among them."""
    if any(not item.is_file(follow_symlinks=False) for item in inside):
        return False
    if not any(item.name == MARKER_NAME for item in inside):
        return False
    try:
        with open(os.path.join(path, MARKER_NAME), "rb") as handle:
            return handle.read(len(MARKER_TEXT) + 1) == MARKER_TEXT
    except OSError:
        return False


def _keep_mode(staged: str, target: str) -> None:
    try:
        st = os.stat(target)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode):
        os.chmod(staged, stat.S_IMODE(st.st_mode))


def remove_stale_staging(directory: str, *, now: float | None = None) -> list[str]:
    """Remove staging folders of killed runs in ``directory``: named like scanopt's,
    holding scanopt's marker and nothing but files, untouched for :data:`STALE_AFTER_SECONDS`."""
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        if not STAGING_NAME.match(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            inside = list(os.scandir(entry.path))
            if not _is_staging_folder(entry.path, inside):
                continue
            newest = max([entry.stat(follow_symlinks=False).st_mtime] + [i.stat(follow_symlinks=False).st_mtime for i in inside])
        except OSError:
            continue
        if now - newest >= STALE_AFTER_SECONDS:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed
