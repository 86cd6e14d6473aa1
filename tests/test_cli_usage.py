"""Small things users hit on the command line: partial --input feeds, unreadable feed
files, --seeds 0, a closed stdout pipe, the pass list in --help."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
from onnx import helper as h

import builders as b
from scanopt.cli.optimize_cmd import available_passes


def _add_model(tmp_path, dim="n"):
    graph = h.make_graph(
        [h.make_node("Add", ["a", "b"], ["c"], name="add")], "main", [b.vi("a", [dim]), b.vi("b", [dim])], [b.vi("c", [dim])]
    )
    path = tmp_path / "add.onnx"
    path.write_bytes(b.model(graph).SerializeToString())
    return path


def _one_line_error(result, expect):
    assert result.code == 2, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0] and "Traceback" not in result.err, result.err


def test_input_alone_synthesizes_the_others_with_its_sizes(cli, tmp_path):
    src = _add_model(tmp_path)
    a = np.arange(5, dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    out = tmp_path / "out.npz"
    for seed in (0, 1, 2):  # whatever size a seed would draw for n, b follows a
        result = cli("run", src, "--input", f"a={tmp_path / 'a.npy'}", "--seed", seed, "--out", out)
        assert result.code == 0, result.err
        with np.load(out) as saved:
            assert saved["c"].shape == (5,)
    result = cli("run", src, "--input", f"a={tmp_path / 'a.npy'}", "--engine", "reference")
    assert result.code == 0 and "inputs (given; b synthesized, seed 0):" in result.out


def test_input_alone_with_a_scan(cli, tmp_path):
    src = tmp_path / "scan.onnx"
    src.write_bytes(b.scan9_sum(steps="T").SerializeToString())
    x = np.arange(14, dtype=np.float32).reshape(7, 2)
    np.save(tmp_path / "x.npy", x)
    result = cli("run", src, "--input", f"X={tmp_path / 'x.npy'}", "--out", tmp_path / "o.npz")
    assert result.code == 0, result.err
    with np.load(tmp_path / "o.npz") as saved:
        y = saved["Y"]
    assert y.shape == (7, 2)
    np.testing.assert_allclose(np.diff(y, axis=0), x[1:], rtol=1e-6)  # a running sum of the given X


def test_verify_with_a_partial_input_runs_every_seed(cli, tmp_path):
    src = _add_model(tmp_path)
    np.save(tmp_path / "a.npy", np.ones(3, np.float32))
    result = cli("verify", src, src, "--input", f"a={tmp_path / 'a.npy'}", "--seeds", 3)
    assert result.code == 0, result.err
    assert len(re.findall(r"inputs #\d", result.out)) == 3


def test_input_name_the_model_lacks_is_still_an_error(cli, tmp_path):
    src = _add_model(tmp_path)
    np.save(tmp_path / "z.npy", np.ones(3, np.float32))
    _one_line_error(cli("run", src, "--input", f"Z={tmp_path / 'z.npy'}"), "unknown input name(s) 'Z'")


@pytest.mark.parametrize("flag", ["--input", "--inputs"])
def test_empty_feed_file_is_one_line(cli, tmp_path, flag):
    src = _add_model(tmp_path)
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    arg = f"a={empty}" if flag == "--input" else str(empty)
    _one_line_error(cli("run", src, flag, arg), "empty file")


def test_fifo_feed_file_is_refused_without_blocking(cli, tmp_path):
    src = _add_model(tmp_path)
    fifo = tmp_path / "a.npy"
    os.mkfifo(fifo)
    threading.Thread(target=lambda: open(fifo, "wb").close(), daemon=True).start()  # no hang if opened
    _one_line_error(cli("run", src, "--input", f"a={fifo}"), "is a FIFO, not a regular file")
    open(fifo, "rb").close()


@pytest.mark.parametrize("command", ["optimize", "upgrade", "verify"])
@pytest.mark.parametrize("seeds", ["0", "-1", "two"])
def test_seeds_below_one_is_a_usage_error_everywhere(cli, tmp_path, command, seeds):
    src = tmp_path / "m.onnx"
    src.write_bytes(b.scan8_sum().SerializeToString())
    args = {"optimize": [src, tmp_path / "o.onnx"], "upgrade": [src, tmp_path / "o.onnx", "--target-opset", "11"], "verify": [src, src]}
    result = cli(command, *args[command], "--seeds", seeds)
    _one_line_error(result, "argument --seeds:")
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("argv", [["inspect", "--json"], ["verify", "--json"], ["run"]])
def test_a_closed_stdout_pipe_ends_quietly(tmp_path, argv):
    src = tmp_path / "m.onnx"
    src.write_bytes(b.scan_in_loop().SerializeToString())
    command, *flags = argv
    models = [src, src] if command == "verify" else [src]
    proc = subprocess.Popen(
        [sys.executable, "-m", "scanopt", command, *map(str, models), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    proc.stdout.close()  # the reader is gone before anything is written, as `| head -0` would be
    err = proc.stderr.read()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 141


def test_help_lists_exactly_the_registered_passes(cli, tmp_path):
    result = cli("optimize", "--help")
    help_text = " ".join(result.out.split())
    listed = re.search(r"passes to run \(default: all of ([a-z_, ]+)\)", help_text).group(1).split(", ")
    assert listed == available_passes()
    order = re.search(r"Passes run in the order ([a-z_, ]+), repeated", help_text).group(1).split(", ")
    assert order == listed
    src = tmp_path / "m.onnx"
    src.write_bytes(b.scan9_sum(steps="T").SerializeToString())
    for name in listed:  # every pass the help names is one --passes accepts
        assert cli("optimize", src, tmp_path / "o.onnx", "--passes", name, "--no-verify", "-q").code == 0
    _one_line_error(cli("optimize", src, tmp_path / "o.onnx", "--passes", "no_such_pass"), "unknown pass no_such_pass")


def test_every_subcommand_is_registered_and_a_missing_one_is_an_error(monkeypatch):
    """A subcommand module missing from an install must not vanish from the CLI silently."""
    import importlib

    import scanopt.cli as cli

    parser = cli.build_parser()
    actions = [a for a in parser._actions if a.dest == "command"]
    assert sorted(actions[0].choices) == sorted(cli.SUBCOMMANDS)

    real = importlib.import_module

    def without_run(name, *args, **kwargs):
        if name == "scanopt.cli.run_cmd":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", without_run)
    with pytest.raises(ModuleNotFoundError):
        cli.build_parser()


def test_run_over_the_feed_budget_exits_1_as_its_help_says(tmp_path):
    """`run --help` lists the exit codes; the memory-budget refusal is exit 1, not 2."""
    graph = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"], name="relu")], "main", [b.vi("x", [10**12, 2])], [b.vi("y", [10**12, 2])]
    )
    path = tmp_path / "big.onnx"
    path.write_bytes(b.model(graph).SerializeToString())
    done = subprocess.run([sys.executable, "-m", "scanopt", "run", str(path)], capture_output=True, text=True)
    assert done.returncode == 1, done
    assert "budget" in done.stderr and "--inputs" in done.stderr
    helped = subprocess.run([sys.executable, "-m", "scanopt", "run", "--help"], capture_output=True, text=True)
    assert "1 synthesized inputs would exceed the memory budget" in " ".join(helped.stdout.split())
