"""The disk cache of measured choices: N identical Scans and every re-run cost one measurement.

A key holds everything a measurement depends on: the Scan's extracted subgraph (its
structure, attributes and input/weight shapes and dtypes; weight values only for small
tensors, which can be sizes or constants a rewrite reads), the candidate passes and
their options, scanopt's own code (a hash of its sources: a choice measured before a
rewrite changed is measured again), onnxruntime's version, the CPU model and the thread count. Entries are small
JSON files written atomically and read back with suspicion (a cache folder is anyone's to
edit): only a regular file of at most :data:`MAX_BYTES` is read (a FIFO, a device or a
symlink to one is refused before a byte is read), and an entry whose JSON does not have the
expected types is ignored with one note and measured again. Location: ``options["tune_cache"]``, else ``$SCANOPT_CACHE_DIR``,
else ``$XDG_CACHE_HOME/scanopt``, else ``~/.cache/scanopt``; ``"off"`` disables it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import stat
import tempfile
from functools import lru_cache

import onnx

FORMAT = 1
SMALL = 64  # elements: weights up to this size enter the key by value
MAX_BYTES = 1 << 20  # an entry is a few hundred bytes; anything bigger is not one of ours


def cache_dir(options: dict) -> str | None:
    where = options.get("tune_cache") or os.environ.get("SCANOPT_CACHE_DIR")
    if not where:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        where = os.path.join(base, "scanopt")
    return None if where == "off" else where


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of scanopt's and its passes' source files: the forms a measurement timed are
    what this code writes, so a changed pass (an upgrade, a local edit) invalidates them."""
    import scanopt
    import scanopt.passes

    digest = hashlib.sha256()
    for root in [*scanopt.__path__, *scanopt.passes.__path__]:
        for folder, subfolders, files in os.walk(root):
            subfolders.sort()
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode())
                try:
                    with open(path, "rb") as handle:
                        digest.update(handle.read())
                except OSError:
                    digest.update(b"?")
    return digest.hexdigest()[:16]


def signature(model: onnx.ModelProto) -> str:
    """A hash of ``model``'s structure: every value and node name replaced by its order of
    appearance (two layers built alike hash alike), big weights by dtype and shape only
    (their values are not copied: a Scan's weights can be large)."""
    from scanopt.protos import walk_proto_graphs

    digest = hashlib.sha256()
    for opset in model.opset_import:
        digest.update(f"{opset.domain}:{opset.version};".encode())
    names: dict[str, str] = {}

    def canonical(name: str) -> str:
        return names.setdefault(name, f"v{len(names)}") if name else ""

    graph = onnx.GraphProto()
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    graph.node.extend(model.graph.node)  # nodes and bodies: weights live in the initializers
    for value in list(graph.input) + [t for t in model.graph.initializer]:
        canonical(value.name)
    for g in walk_proto_graphs(graph):
        g.name, g.doc_string = "", ""  # a body's name is a name too: twins named apart hash alike
        for value in list(g.input) + list(g.output) + list(g.value_info):
            value.name = canonical(value.name)
        for t in g.initializer:
            t.name = canonical(t.name)
        for node in g.node:
            node.name, node.doc_string = "", ""
            node.input[:] = [canonical(n) for n in node.input]
            node.output[:] = [canonical(n) for n in node.output]
    digest.update(graph.SerializeToString(deterministic=True))
    for tensor in model.graph.initializer:
        count = 1
        for d in tensor.dims:
            count *= d
        digest.update(f"{canonical(tensor.name)}:{tensor.data_type}:{list(tensor.dims)};".encode())
        if count <= SMALL and tensor.data_location != onnx.TensorProto.EXTERNAL:
            light = onnx.TensorProto()
            light.CopyFrom(tensor)
            light.name = ""
            digest.update(light.SerializeToString(deterministic=True))
    return digest.hexdigest()


def digest(value) -> str:
    """A short stable hash of a JSON-able value."""
    return hashlib.sha256(json.dumps(value, default=str).encode()).hexdigest()[:32]


def key(sub: onnx.ModelProto, candidates: list[str], options: dict, threads: int | None,
        providers: list[str] | None = None) -> str:
    """``providers``: a session provider list other than the CPU's (scanopt.providers), which
    enters the key with the onnxruntime build's device; the CPU's keys are unchanged."""
    import onnxruntime as ort

    relevant = {k: v for k, v in options.items() if isinstance(v, (int, float, str, bool)) and k not in
                ("tune", "retune", "tune_seconds", "tune_scan_seconds", "tune_cache", "target", "threads")}
    parts = [FORMAT, code_fingerprint(), signature(sub), sorted(candidates), sorted(relevant.items()), ort.__version__,
             cpu_model(),
             threads or "default"]
    if providers:
        parts += [list(providers), ort.get_device()]
    return digest(parts)


def load(directory: str | None, entry: str, check, notes: list[str] | None = None, label: str = "") -> dict | None:
    """The cached entry, or None when there is none or it is unusable. ``check(data)`` gives
    the reason an entry of the right format is malformed, or None; a malformed or unreadable
    entry adds one line to ``notes`` (prefixed with ``label``) and the caller measures again."""
    if directory is None:
        return None
    path = os.path.join(directory, entry + ".json")
    try:
        data = json.loads(read_regular(path))
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        if data.get("format") != FORMAT:
            return None  # another format: not an error, a stale entry
        reason = check(data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError, UnicodeDecodeError) as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
    if reason is None:
        return data
    if notes is not None:
        notes.append(f"{label}cache entry {path} ignored ({reason}); measured again")
    return None


def read_regular(path: str) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most MAX_BYTES, else OSError. The
    open never blocks (O_NONBLOCK: a FIFO opens at once) and fstat judges what was opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError("not a regular file")
        if info.st_size > MAX_BYTES:
            raise OSError(f"{info.st_size} bytes, over the {MAX_BYTES} of an entry")
        chunks, size = [], 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_BYTES:
            raise OSError(f"over the {MAX_BYTES} bytes of an entry")
        return b"".join(chunks)
    finally:
        os.close(fd)


def is_number(value, most: float = 1e9) -> bool:
    """A finite number in [0, most] that is not a bool (JSON ``true`` is an int to Python);
    a huge integer (10**400, no float holds it) is not one."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return 0 <= float(value) <= most
    except OverflowError:
        return False


def mistyped(data: dict, fields: dict) -> str | None:
    """The first of ``fields`` ({key: (types, what)}) that ``data`` lacks or holds with another
    type, as a reason; None when all are there and typed."""
    for name, (types, what) in fields.items():
        if name not in data:
            return f"no '{name}'"
        value = data[name]
        if not isinstance(value, types) or isinstance(value, bool):  # no field of an entry is a bool
            return f"'{name}' is not {what}"
    return None


def store(directory: str | None, entry: str, data: dict) -> None:
    """Write atomically; a cache that cannot be written only costs a re-measurement."""
    if directory is None:
        return
    try:
        os.makedirs(directory, exist_ok=True)
        fd, staged = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(dict(data, format=FORMAT), handle, indent=1, sort_keys=True)
        os.replace(staged, os.path.join(directory, entry + ".json"))
    except OSError:
        pass
