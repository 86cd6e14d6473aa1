"""A misspelled flag, subcommand or choice gets the closest valid one (issue 22), still as
one line and exit 2 with nothing written."""

from __future__ import annotations

import pytest

import builders as b


@pytest.mark.parametrize("args, hint", [
    (["optimze", "{src}", "{out}"], "invalid choice: 'optimze'"),
    (["optimize", "{src}", "{out}", "--reprot", "r.json"], "--reprot (did you mean '--report'?)"),
    (["optimize", "{src}", "{out}", "--unroll-maxx=3"], "--unroll-maxx=3 (did you mean '--unroll-max'?)"),
    (["optimize", "{src}", "{out}", "--engine", "onnxrt"], "invalid choice: 'onnxrt'"),
    (["upgrade", "--target-opset", "13", "{src}", "{out}", "--strategi", "a"], "(did you mean '--strategy'?)"),
    (["inspect", "{src}", "--jsn"], "--jsn (did you mean '--json'?)"),
    (["--verison"], "--verison (did you mean '--version'?)"),
])
def test_a_misspelled_flag_or_command_names_the_closest_one(cli, tmp_path, args, hint):
    import onnx

    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(b.scan9_sum(), src)
    result = cli(*[a.format(src=src, out=out) for a in args])
    assert result.code == 2 and hint in result.err and len(result.err.strip().splitlines()) == 1, result.err
    if "invalid choice" in hint:
        expected = {"optimze": "optimize", "onnxrt": "ort"}[hint.split("'")[1]]
        assert f"(did you mean '{expected}'?)" in result.err
    assert not out.exists()


def test_a_stray_positional_is_refused_without_a_guess(cli, tmp_path):
    import onnx

    src = tmp_path / "in.onnx"
    onnx.save(b.scan9_sum(), src)
    result = cli("optimize", src, tmp_path / "out.onnx", "extra")
    assert result.code == 2 and "unrecognized arguments: extra" in result.err and "did you mean" not in result.err
