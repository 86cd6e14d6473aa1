"""--input-shape in both spellings: repeated flags, and onnxsim's several shapes after one
flag; IN and OUT are never taken for shapes, whichever side of the flag they stand."""

from __future__ import annotations

import os

import pytest

from scanopt.cli import build_parser
from scanopt.cli.deploy_args import split_input_shapes

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")
RNN = os.path.join(MODELS, "scan_rnn.onnx")  # X [seq, batch, 3], h_0 [batch, 4]


@pytest.mark.parametrize("argv", [
    ["optimize", "in.onnx", "out.onnx", "--input-shape", "X:100,8,3", "--input-shape", "h_0:8,4"],
    ["optimize", "in.onnx", "out.onnx", "--input-shape", "X:100,8,3", "h_0:8,4"],
    ["optimize", "--input-shape", "X:100,8,3", "h_0:8,4", "in.onnx", "out.onnx"],
    ["optimize", "in.onnx", "--input-shape", "X:100,8,3", "h_0:8,4", "out.onnx"],
    ["optimize", "--input-shape", "X:100,8,3", "h_0:8,4", "--threads", "1", "in.onnx", "out.onnx"],
])
def test_both_spellings_give_the_same_shapes_and_positionals(argv):
    args = build_parser().parse_args(split_input_shapes(argv))
    assert args.input_shape == ["X:100,8,3", "h_0:8,4"]
    assert (args.input, args.output) == ("in.onnx", "out.onnx")


def test_names_holding_colons_and_scalars_are_shapes():
    assert split_input_shapes(["--input-shape", "x:0:4,3", "s:", "m.onnx"]) == [
        "--input-shape=x:0:4,3", "--input-shape=s:", "m.onnx"]
    assert split_input_shapes(["--", "--input-shape", "X:1"]) == ["--", "--input-shape", "X:1"]


@pytest.mark.parametrize("order", ["before", "after"])
def test_onnxsim_form_runs_end_to_end(cli, tmp_path, order):
    out = tmp_path / "o.onnx"
    shapes = ["--input-shape", "X:20,2,3", "h_0:2,4"]
    argv = ["optimize", *shapes, RNN, out] if order == "before" else ["optimize", RNN, out, *shapes]
    result = cli(*argv, "--no-tune", "-q")
    assert result.code == 0, result.err
    assert out.exists()
