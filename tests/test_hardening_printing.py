"""Strings taken from a model (names, op types, doc strings...) reach the terminal with
their control characters escaped: an ANSI escape cannot recolour or clear the screen, a
newline in a name cannot forge a line of output."""

from __future__ import annotations

import re

import onnx

import builders as b
from scanopt.errors import printable

EVIL_NODE = "scan\x1b[31m\nevil node line"
EVIL_OUT = "Y\x1b[2J\rfake\u202eline"
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")  # all but the newline


def _hostile(tmp_path):
    m = b.scan9_sum(steps=3)
    m.graph.node[0].name = EVIL_NODE
    m.graph.node[0].output[1] = EVIL_OUT
    m.graph.output[1].name = EVIL_OUT
    stray = m.graph.value_info.add()  # a warning naming it
    stray.CopyFrom(onnx.helper.make_tensor_value_info("ghost\x1b]0;title\x07\nline", onnx.TensorProto.FLOAT, [2]))
    path = tmp_path / "hostile.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def _clean(result):
    for stream in (result.out, result.err):
        assert not RAW.search(stream), repr(stream)
        assert not re.search(r"^(evil node line|line)", stream, re.M), stream  # no forged line


def test_printable_escapes_controls_and_keeps_text():
    assert printable("a\x1b[31mb\nc\u202e") == "a\\x1b[31mb\\nc\\u202e"
    assert printable(b"na\xffme") == "na\\xffme"
    assert printable("größe 日本") == "größe 日本"


def test_inspect_optimize_run_verify_escape_model_strings(cli, tmp_path):
    src = _hostile(tmp_path)
    for argv in (("inspect", src), ("optimize", src, tmp_path / "out.onnx", "-v"), ("run", src),
                 ("verify", src, src, "--seeds", "1")):
        result = cli(*argv)
        assert result.code == 0, (argv, result)
        _clean(result)
        if argv[0] in ("inspect", "optimize"):
            assert printable(EVIL_NODE) in result.out + result.err, argv
        if argv[0] in ("run", "verify"):
            assert printable(EVIL_OUT) in result.out, argv
    assert "ghost\\x1b]0;title\\x07\\nline" in cli("inspect", src).out  # the warning


def test_error_messages_escape_model_strings(cli, tmp_path):
    m = b.scan9_sum(steps=3)
    m.graph.node[0].input[1] = "X\x1b[0m\nscanopt: all good"
    path = tmp_path / "bad.onnx"
    path.write_bytes(m.SerializeToString())
    result = cli("optimize", path, tmp_path / "out.onnx")
    assert result.code == 2
    assert len(result.err.splitlines()) == 1
    assert "reads 'X\\x1b[0m\\nscanopt: all good'" in result.err
    _clean(result)
