"""Staging cleanup removes only folders scanopt made: a staging name AND scanopt's marker
file inside. A user's ``.scanopt-defaults/`` (the legacy 8-character pattern) or a folder
that merely carries a staging name survives, however old."""

from __future__ import annotations

import os
import time

import pytest

import builders as b
from scanopt.errors import ScanoptError
from scanopt.outputs import MARKER_NAME, MARKER_TEXT, STALE_AFTER_SECONDS, check_output_path, remove_stale_staging, write_outputs


def _age(folder):
    old = time.time() - STALE_AFTER_SECONDS - 60
    for name in os.listdir(folder):
        os.utime(folder / name, (old, old))
    os.utime(folder, (old, old))


def _folder(root, name, files):
    (root / name).mkdir()
    for file, data in files.items():
        (root / name / file).write_bytes(data)
    _age(root / name)
    return root / name


def test_a_users_dot_scanopt_folder_survives_a_run(cli, tmp_path):
    src = tmp_path / "in.onnx"
    src.write_bytes(b.scan9_sum(steps="T").SerializeToString())
    mine = _folder(tmp_path, ".scanopt-defaults", {"settings.toml": b"threads = 1\n"})
    assert cli("optimize", src, tmp_path / "out.onnx", "-q").code == 0
    assert (mine / "settings.toml").read_bytes() == b"threads = 1\n"


@pytest.mark.parametrize("name, files", [
    (".scanopt-staging-12-abc_9", {"out.onnx": b"x"}),  # staging name, no marker
    (".scanopt-staging-12-abc_8", {"out.onnx": b"x", MARKER_NAME: b"something else"}),  # marker with other text
    (".scanopt-k2j4h5g1", {"out.onnx": b"x", MARKER_NAME: MARKER_TEXT}),  # marker, not a staging name
])
def test_folders_without_name_and_marker_are_kept(tmp_path, name, files):
    _folder(tmp_path, name, files)
    assert remove_stale_staging(str(tmp_path)) == []
    assert sorted(os.listdir(tmp_path / name)) == sorted(files)


def test_a_marked_stale_staging_folder_is_removed_and_a_fresh_one_kept(tmp_path):
    stale = _folder(tmp_path, ".scanopt-staging-12-abc_9", {"out.onnx": b"x", MARKER_NAME: MARKER_TEXT})
    (tmp_path / ".scanopt-staging-13-abc_9").mkdir()
    (tmp_path / ".scanopt-staging-13-abc_9" / MARKER_NAME).write_bytes(MARKER_TEXT)
    assert remove_stale_staging(str(tmp_path)) == [str(stale)]
    assert os.listdir(tmp_path) == [".scanopt-staging-13-abc_9"]


def test_every_staging_folder_carries_the_marker_and_the_marker_is_not_an_output(tmp_path):
    seen = []

    def write(staged):
        folder = os.path.dirname(staged)
        seen.append(sorted(os.listdir(folder)))
        with open(staged, "wb") as handle:
            handle.write(b"model")

    write_outputs([(str(tmp_path / "a.onnx"), write), (str(tmp_path / "b.json"), write)])
    assert seen == [[MARKER_NAME], [MARKER_NAME]]
    assert sorted(os.listdir(tmp_path)) == ["a.onnx", "b.json"]


def test_an_output_named_like_the_marker_is_refused(tmp_path):
    with pytest.raises(ScanoptError, match="marks its staging folders"):
        check_output_path(str(tmp_path / MARKER_NAME), "OUT")
