"""Never lose a user's file: every output is checked against every file read and against
each other before anything is written; outputs are staged and renamed all or none; only
regular files are read or replaced; staging leftovers of killed runs are cleaned up."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import onnx
import pytest

import builders as b
from scanopt.errors import ScanoptError
from scanopt.external_data import _key, _varint
from scanopt.outputs import MARKER_NAME, MARKER_TEXT, STAGING_NAME, STALE_AFTER_SECONDS, remove_stale_staging, write_outputs


def _save(path, model):
    path.write_bytes(model.SerializeToString())
    return path


def _snapshot(folder):
    """Every file's bytes and mode under ``folder`` (links as their targets)."""
    snap = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            full = os.path.join(root, name)
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode):
                with open(full, "rb") as handle:
                    snap[os.path.relpath(full, folder)] = (handle.read(), stat.S_IMODE(st.st_mode))
            else:
                snap[os.path.relpath(full, folder)] = stat.S_IFMT(st.st_mode)
    return snap


def _refused(result, *, expect):
    """Exit 2 with one line on stderr that says ``expect``."""
    assert result.code == 2, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scanopt: "), result.err
    assert expect in lines[0], lines[0]
    assert "Traceback" not in result.err


def _external(tmp_path, name="a.onnx", data="a.onnx.data"):
    """A model whose weights live in ``data`` beside it; returns its path."""
    m = b.scan9_sum(steps="T", weight=np.arange(2, dtype=np.float32))
    big = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    m.graph.initializer.append(onnx.numpy_helper.from_array(big, "big"))
    onnx.save_model(m, tmp_path / name, save_as_external_data=True, location=data, size_threshold=1024)
    return tmp_path / name


# -- the input is never destroyed -----------------------------------------------------------


@pytest.mark.parametrize("command", ["optimize", "upgrade"])
def test_report_onto_the_input_is_refused(cli, tmp_path, command):
    src = _save(tmp_path / "in.onnx", b.scan8_sum() if command == "upgrade" else b.scan9_sum())
    before = _snapshot(tmp_path)
    extra = ["--target-opset", "11"] if command == "upgrade" else []
    result = cli(command, src, tmp_path / "out.onnx", "--report", src, *extra)
    _refused(result, expect="--report is IN, which this run reads")
    assert _snapshot(tmp_path) == before


def test_report_onto_out_is_refused(cli, tmp_path):
    src = _save(tmp_path / "in.onnx", b.scan9_sum())
    before = _snapshot(tmp_path)
    _refused(cli("optimize", src, tmp_path / "out.onnx", "--report", tmp_path / "out.onnx"), expect="--report is the same file as OUT")
    assert _snapshot(tmp_path) == before


def test_report_through_a_symlink_to_out_is_refused(cli, tmp_path):
    src = _save(tmp_path / "in.onnx", b.scan9_sum())
    (tmp_path / "out.onnx").write_bytes(b"old")
    os.symlink(tmp_path / "out.onnx", tmp_path / "report.json")
    before = _snapshot(tmp_path)
    _refused(cli("optimize", src, tmp_path / "out.onnx", "--report", tmp_path / "report.json"), expect="same file as OUT")
    assert _snapshot(tmp_path) == before


def test_run_out_onto_the_model_is_refused(cli, tmp_path):
    src = _save(tmp_path / "in.onnx", b.scan9_sum())
    before = _snapshot(tmp_path)
    _refused(cli("run", src, "--out", src), expect="--out is MODEL, which this run reads")
    assert _snapshot(tmp_path) == before


def test_run_out_onto_its_own_feeds_is_refused(cli, tmp_path):
    src = _save(tmp_path / "in.onnx", b.no_scan_model())
    np.savez(tmp_path / "feeds.npz", a=np.ones(2, np.float32), b=np.ones(2, np.float32))
    np.save(tmp_path / "b.npy", np.ones(2, np.float32))
    before = _snapshot(tmp_path)
    _refused(cli("run", src, "--inputs", tmp_path / "feeds.npz", "--out", tmp_path / "feeds.npz"), expect="--out is --inputs")
    _refused(
        cli("run", src, "--inputs", tmp_path / "feeds.npz", "--input", f"b={tmp_path / 'b.npy'}", "--out", tmp_path / "b.npy"),
        expect="--out is --input b",
    )
    assert _snapshot(tmp_path) == before


def test_report_onto_the_feeds_is_refused(cli, tmp_path):
    src = _save(tmp_path / "in.onnx", b.no_scan_model())
    np.savez(tmp_path / "feeds.npz", a=np.ones(2, np.float32), b=np.ones(2, np.float32))
    before = _snapshot(tmp_path)
    result = cli("optimize", src, tmp_path / "out.onnx", "--inputs", tmp_path / "feeds.npz", "--report", tmp_path / "feeds.npz")
    _refused(result, expect="--report is --inputs")
    assert _snapshot(tmp_path) == before


def test_out_whose_data_file_is_the_inputs_data_is_refused(cli, tmp_path):
    """a.onnx keeps its weights in b.onnx.data: writing b.onnx would replace b.onnx.data."""
    src = _external(tmp_path, "a.onnx", "b.onnx.data")
    before = _snapshot(tmp_path)
    result = cli("optimize", src, tmp_path / "b.onnx")
    _refused(result, expect="OUT's external data file (b.onnx.data) is IN's external data")
    assert _snapshot(tmp_path) == before
    assert cli("inspect", src).code == 0  # IN still loads


def test_out_equal_to_the_inputs_data_file_is_refused(cli, tmp_path):
    src = _external(tmp_path)
    before = _snapshot(tmp_path)
    _refused(cli("optimize", src, tmp_path / "a.onnx.data"), expect="OUT is IN's external data")
    assert _snapshot(tmp_path) == before


def test_input_named_like_the_outputs_data_file_is_refused(cli, tmp_path):
    """IN x.onnx.data, OUT x.onnx: OUT's external data file would be IN."""
    src = _external(tmp_path, "x.onnx.data", "weights.bin")
    before = _snapshot(tmp_path)
    _refused(cli("optimize", src, tmp_path / "x.onnx"), expect="OUT's external data file (x.onnx.data) is IN")
    assert _snapshot(tmp_path) == before


def test_in_place_may_not_replace_the_models_external_data(cli, tmp_path):
    """Model and data file cannot be replaced in one atomic step: refused, not half done."""
    src = _external(tmp_path)
    before = _snapshot(tmp_path)
    _refused(cli("optimize", src, src, "--in-place"), expect="is IN's external data")
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("link", [os.link, os.symlink], ids=["hard link", "symlink"])
def test_out_linked_to_the_input_is_refused(cli, tmp_path, link):
    src = _save(tmp_path / "in.onnx", b.scan9_sum())
    link(src, tmp_path / "out.onnx")
    before = _snapshot(tmp_path)
    _refused(cli("optimize", src, tmp_path / "out.onnx"), expect="OUT is the input file")
    assert _snapshot(tmp_path) == before


def test_report_hard_linked_to_the_inputs_data_is_refused(cli, tmp_path):
    src = _external(tmp_path)
    os.link(tmp_path / "a.onnx.data", tmp_path / "r.json")
    # the data file now has two links, which loading refuses first: what matters is nothing is written
    before = _snapshot(tmp_path)
    result = cli("optimize", src, tmp_path / "out.onnx", "--report", tmp_path / "r.json")
    assert result.code == 2 and "Traceback" not in result.err
    assert _snapshot(tmp_path) == before


def test_in_place_still_replaces_the_model(cli, tmp_path):
    src = _save(tmp_path / "in.onnx", b.scan9_sum(steps=2))  # unrolled: the file changes
    before = src.read_bytes()
    result = cli("optimize", src, src, "--in-place")
    assert result.code == 0, result.err
    assert src.read_bytes() != before
    onnx.checker.check_model(onnx.load(src))


# -- half-written results -------------------------------------------------------------------


def test_unwritable_report_name_writes_nothing(cli, tmp_path):
    src = _save(tmp_path / "in.onnx", b.scan9_sum())
    before = _snapshot(tmp_path)
    result = cli("optimize", src, tmp_path / "out.onnx", "--report", tmp_path / ("r" * 300 + ".json"))
    _refused(result, expect="file name is longer than this file system allows")
    assert _snapshot(tmp_path) == before


def test_outputs_are_all_written_or_none(tmp_path):
    """The second output fails while staging: the first one, already staged, is not renamed."""
    (tmp_path / "first").write_bytes(b"old")

    def fail(staged):
        open(staged, "wb").close()
        raise OSError(28, "No space left on device")

    with pytest.raises(ScanoptError, match="No space left on device"):
        write_outputs([(str(tmp_path / "first"), lambda p: open(p, "wb").write(b"new")), (str(tmp_path / "second"), fail)])
    assert sorted(os.listdir(tmp_path)) == ["first"]
    assert (tmp_path / "first").read_bytes() == b"old"


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o604])
def test_existing_outputs_keep_their_mode(cli, tmp_path, mode):
    src = _save(tmp_path / "in.onnx", b.scan9_sum(steps=2))
    for name in ("out.onnx", "r.json"):
        (tmp_path / name).write_bytes(b"old")
        os.chmod(tmp_path / name, mode)
    result = cli("optimize", src, tmp_path / "out.onnx", "--report", tmp_path / "r.json")
    assert result.code == 0, result.err
    for name in ("out.onnx", "r.json"):
        assert (tmp_path / name).read_bytes() != b"old"
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == mode


@pytest.mark.parametrize("exists", [True, False])
def test_out_with_a_trailing_slash_is_an_error(cli, tmp_path, exists):
    src = _save(tmp_path / "in.onnx", b.scan9_sum())
    if exists:
        (tmp_path / "dir").mkdir()
    before = _snapshot(tmp_path)
    _refused(cli("optimize", src, str(tmp_path / "dir") + "/"), expect="names a directory")
    assert _snapshot(tmp_path) == before


def test_fifo_out_is_refused(cli, tmp_path):
    src = _save(tmp_path / "in.onnx", b.scan9_sum())
    os.mkfifo(tmp_path / "out.onnx")
    _refused(cli("optimize", src, tmp_path / "out.onnx"), expect="OUT is a FIFO, not a regular file")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "out.onnx").st_mode)
    _refused(cli("run", src, "--out", tmp_path / "out.onnx"), expect="--out is a FIFO")


def test_character_device_out_is_refused(cli, tmp_path):
    src = _save(tmp_path / "in.onnx", b.scan9_sum())
    device = tmp_path / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot create a device node here ({exc})")
    _refused(cli("optimize", src, device), expect="OUT is a character device, not a regular file")
    assert stat.S_ISCHR(os.lstat(device).st_mode)


KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys, time
    # a terminal's Ctrl-C: a shell that starts the suite in the background has its
    # children ignore SIGINT, and Python then installs no KeyboardInterrupt handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import scanopt.cli.optimize_cmd as cmd
    real = cmd.bytes_writer

    def slow_writer(data):
        write = real(data)
        def staged(path):
            with open(path, "wb") as handle:
                handle.write(data[: len(data) // 2])
            print("staged", flush=True)
            time.sleep(float(os.environ.get("PAUSE", "120")))
            write(path)
        return staged

    cmd.bytes_writer = slow_writer
    from scanopt.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


def test_staging_left_by_a_killed_run_is_removed_by_a_later_run(cli, tmp_path):
    src = _save(tmp_path / "in.onnx", b.scan9_sum(steps="T"))  # unchanged: written through bytes_writer
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, "optimize", str(src), str(out_dir / "m.onnx"), "-q", "--skip", "linrec"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "staged"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    leftovers = os.listdir(out_dir)
    assert len(leftovers) == 1 and STAGING_NAME.match(leftovers[0]), leftovers
    assert not (out_dir / "m.onnx").exists()
    (out_dir / ".scanopt-notes").mkdir()  # the user's, not a staging name
    # a fresh staging folder may be another run still writing: kept
    assert cli("optimize", src, out_dir / "m.onnx", "--skip", "linrec").code == 0
    assert leftovers[0] in os.listdir(out_dir)
    old = time.time() - STALE_AFTER_SECONDS - 60
    for root, dirs, files in os.walk(out_dir / leftovers[0]):
        for name in files:
            os.utime(os.path.join(root, name), (old, old))
    os.utime(out_dir / leftovers[0], (old, old))
    assert cli("optimize", src, out_dir / "m.onnx").code == 0
    assert sorted(os.listdir(out_dir)) == [".scanopt-notes", "m.onnx"]


def test_interrupted_write_leaves_nothing(tmp_path):
    src = _save(tmp_path / "in.onnx", b.scan9_sum(steps="T"))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, "optimize", str(src), str(out_dir / "m.onnx"), "-q", "--skip", "linrec"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout.readline().strip() == "staged"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "scanopt: interrupted"
    assert os.listdir(out_dir) == []


def test_concurrent_runs_to_one_output_give_one_valid_file(tmp_path):
    src = _save(tmp_path / "in.onnx", b.scan9_sum(steps=2))  # unrolled: a real rewrite each time
    out = tmp_path / "out.onnx"
    procs = [
        subprocess.Popen([sys.executable, "-m", "scanopt", "optimize", str(src), str(out), "-q"], stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    assert sorted(os.listdir(tmp_path)) == ["in.onnx", "out.onnx"]
    onnx.checker.check_model(onnx.load(out))
    alone = tmp_path / "alone.onnx"
    assert subprocess.run([sys.executable, "-m", "scanopt", "optimize", str(src), str(alone), "-q"]).returncode == 0
    assert alone.read_bytes() == out.read_bytes()  # byte-identical to a run on its own


def test_only_staging_shaped_folders_are_removed(tmp_path):
    old = time.time() - STALE_AFTER_SECONDS - 60
    for name in (".scanopt-staging-12-abc_9", ".scanopt-k2j4h5g1", ".scanopt-staging-7-x", ".scanopt-mine", "scanopt-staging-1-a"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_bytes(b"x")
        (tmp_path / name / MARKER_NAME).write_bytes(MARKER_TEXT)  # the name is what this test varies
    (tmp_path / ".scanopt-staging-7-x" / "sub").mkdir()  # holds a folder: not what scanopt stages
    for name in os.listdir(tmp_path):
        for inner in os.listdir(tmp_path / name):
            os.utime(tmp_path / name / inner, (old, old))
        os.utime(tmp_path / name, (old, old))
    removed = sorted(os.path.basename(p) for p in remove_stale_staging(str(tmp_path)))
    assert removed == [".scanopt-staging-12-abc_9"]
    assert sorted(os.listdir(tmp_path)) == [".scanopt-k2j4h5g1", ".scanopt-mine", ".scanopt-staging-7-x", "scanopt-staging-1-a"]


# -- reading: only regular files, bounded ----------------------------------------------------


def test_fifo_input_is_refused_without_blocking(cli, tmp_path):
    fifo = tmp_path / "in.onnx"
    os.mkfifo(fifo)

    def unblock():  # were the FIFO opened for reading, this lets the read end instead of hanging
        with open(fifo, "wb"):
            pass

    threading.Thread(target=unblock, daemon=True).start()
    _refused(cli("inspect", fifo), expect="is a FIFO, not a regular file")
    with open(fifo, "rb"):  # release the helper thread
        pass


def test_endless_device_input_is_refused(cli, tmp_path):
    os.symlink("/dev/zero", tmp_path / "zero.onnx")
    _refused(cli("optimize", tmp_path / "zero.onnx", tmp_path / "out.onnx"), expect="is a character device, not a regular file")
    assert sorted(os.listdir(tmp_path)) == ["zero.onnx"]


def test_input_over_the_protobuf_limit_is_refused_before_reading(cli, tmp_path):
    big = tmp_path / "big.onnx"
    with open(big, "wb") as handle:
        handle.truncate(2**31)  # sparse: no disk used
    _refused(cli("inspect", big), expect="2.0 GiB, over the 2.0 GiB one protobuf file can hold")


def test_fifo_external_data_is_refused(cli, tmp_path):
    src = _external(tmp_path)
    os.unlink(tmp_path / "a.onnx.data")
    os.mkfifo(tmp_path / "a.onnx.data")
    _refused(cli("inspect", src), expect="'a.onnx.data' is a FIFO, not a regular file")


@pytest.mark.parametrize(
    "kind, expect",
    [
        ("symlink", "is a symbolic link (as in a Hugging Face cache); copy the model with its data into one folder (cp -L)"),
        ("hard link", "is hard-linked elsewhere"),
        ("outside", "is not a path inside the model's folder"),
        ("absolute", "is not a path inside the model's folder"),
    ],
)
def test_external_data_outside_the_model_folder_is_refused(cli, tmp_path, kind, expect):
    folder = tmp_path / "m"
    folder.mkdir()
    src = _external(folder)
    model = onnx.load(src, load_external_data=False)
    real = folder / "a.onnx.data"
    if kind == "symlink":
        os.rename(real, tmp_path / "elsewhere.data")
        os.symlink(tmp_path / "elsewhere.data", real)
    elif kind == "hard link":
        os.link(real, tmp_path / "elsewhere.data")
    else:
        os.rename(real, tmp_path / "elsewhere.data")
        location = "../elsewhere.data" if kind == "outside" else str(tmp_path / "elsewhere.data")
        for tensor in onnx.external_data_helper._get_all_tensors(model):
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = location
        src.write_bytes(model.SerializeToString())
    _refused(cli("inspect", src), expect=expect)


def test_deep_nesting_names_the_parser_depth_limit(cli, tmp_path):
    src = tmp_path / "deep.onnx"
    src.write_bytes(_deeply_nested_scan_bytes(200))
    _refused(cli("inspect", src), expect="nest deeper than the protobuf parser's depth limit")


def _deeply_nested_scan_bytes(depth: int) -> bytes:
    """A Scan nested ``depth`` times, serialized by hand: onnx.helper cannot build one
    deeper than the parser's limit (copying a message re-parses it)."""

    def field(number, payload):  # a length-delimited field (the wire encoding write_serialized uses)
        return _key(number) + _varint(len(payload)) + payload

    body = b.sum_body().SerializeToString()
    empty = onnx.GraphProto()
    empty.CopyFrom(b.sum_body())
    del empty.node[:]
    shell = empty.SerializeToString()
    node = onnx.helper.make_node("Scan", ["s", "x"], ["s_next", "y"], num_scan_inputs=1).SerializeToString()
    attribute = onnx.AttributeProto(name="body", type=onnx.AttributeProto.GRAPH).SerializeToString()
    for _ in range(depth):  # GraphProto.node = 1, NodeProto.attribute = 5, AttributeProto.g = 6
        body = field(1, node + field(5, attribute + field(6, body))) + shell
    top = b.model(onnx.helper.make_graph([], "main", [], []), opset=11)
    top.ClearField("graph")
    return top.SerializeToString() + field(7, body)  # ModelProto.graph = 7
