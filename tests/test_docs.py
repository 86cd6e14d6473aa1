"""The docs stay true to the tool.

Every ``scanopt ...`` command shown in a code block of README.md or docs/*.md is run (in a
temporary folder, on the committed samples; commands of one file in order, so a command
may read what an earlier one wrote), or, where it names placeholder files, parsed; a few
claims the examples make are checked on what they wrote. And the flags: every flag a doc
gives a subcommand exists in that subcommand's parser, and the synopsis of docs/cli.md
names exactly the flags each parser has (a new flag without docs fails here).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import numpy as np
import onnx
import pytest

from scanopt.cli import SUBCOMMANDS, build_parser
from scanopt.cli.deploy_args import split_input_shapes

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
COMMAND = re.compile(r"^(?:\$ )?(?:pip install [^&]*&& )?(?:scanopt|python -m scanopt) (.*)$")


def blocks(path: Path) -> list[tuple[int, str]]:
    """(line, command text) of each scanopt command in the file's code blocks; a synopsis
    continued on indented lines is joined; a trailing ``# comment`` is dropped."""
    found: list[tuple[int, str]] = []
    fence = False
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if line.startswith("```"):
            fence = not fence
            continue
        if not fence:
            continue
        match = COMMAND.match(line.strip())
        if match:
            found.append((number, match.group(1).split("  #")[0].strip()))
        elif found and found[-1][0] + 1 == number and line.startswith(" ") and line.strip().startswith(("[", "-")):
            found[-1] = (number, found[-1][1] + " " + line.strip())
    return found


def subparsers() -> dict:
    parser = build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return dict(action.choices)


def long_flags(parser) -> set[str]:
    return {o for o in parser._option_string_actions if o.startswith("--")} - {"--help"}


def flags_in(text: str, parser) -> set[str]:
    """The long flags a command text names (short ones mapped to their long form)."""
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))
    for short in re.findall(r"(?<![\w-])(-[a-z])(?![\w-])", text):
        action = parser._option_string_actions.get(short)
        named |= {o for o in (action.option_strings if action else [short]) if o.startswith("--")} or {short}
    return named


def all_commands() -> list[tuple[str, int, str]]:
    return [(path.relative_to(ROOT).as_posix(), line, text) for path in DOCS for line, text in blocks(path)]


def test_the_docs_show_commands_of_every_subcommand():
    shown = {text.split()[0] for _, _, text in all_commands()}
    assert set(SUBCOMMANDS) <= shown, set(SUBCOMMANDS) - shown


@pytest.mark.parametrize("where,line,text", all_commands(), ids=lambda v: str(v)[:60])
def test_every_flag_a_doc_gives_a_command_exists(where, line, text):
    words = text.split()
    if words[0] == "...":
        return
    if words[0].startswith("--"):  # scanopt --version
        assert words[0] in build_parser()._option_string_actions, (where, line, text)
        return
    parser = subparsers()[words[0]]
    unknown = flags_in(text, parser) - set(parser._option_string_actions)
    assert not unknown, f"{where}:{line}: {words[0]} has no {sorted(unknown)}"


def test_the_synopsis_names_every_flag_of_every_subcommand_and_no_other():
    synopsis: dict[str, str] = {}  # the first command of each subcommand: the synopsis block
    for _, text in blocks(ROOT / "docs" / "cli.md"):
        synopsis.setdefault(text.split()[0], text)
    assert set(SUBCOMMANDS) <= set(synopsis)
    for name, parser in subparsers().items():
        named = flags_in(synopsis[name], parser)
        assert named == long_flags(parser), (name, sorted(named ^ long_flags(parser)))


def test_the_inline_examples_in_the_cli_reference_name_real_flags():
    """`optimize --strict`, `run --out`: spans that give a subcommand a flag."""
    parsers = subparsers()
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for command, rest in re.findall(r"`(?:scanopt )?(optimize|upgrade|inspect|run|verify) (--[^`]*)`", text):
        unknown = flags_in(rest, parsers[command]) - set(parsers[command]._option_string_actions)
        assert not unknown, (command, rest)


# ------------------------------------------------------------------ running the examples
def _claims(tmp: Path, out: str) -> dict:
    """What the examples say they do, checked on what they wrote (command text -> check)."""
    def ops(name):
        return {n.op_type for n in onnx.load(tmp / name).graph.node}

    return {
        "optimize models/scan_rnn.onnx scan_rnn.opt.onnx --input-shape X:100,8,3":
            lambda: "RNN" in ops("scan_rnn.opt.onnx") and "Scan" not in ops("scan_rnn.opt.onnx"),
        "optimize models/cells/torch_scan_gru.onnx gru.opt.onnx --input-shape x:100,8,3":
            lambda: "fused into GRU" in out and "1 Scan found: 1 replaced" in out and "GRU" in ops("gru.opt.onnx"),
        "verify models/cells/torch_scan_gru.onnx gru.opt.onnx": lambda: "PASSED" in out,
        "inspect models/cells/torch_scan_gru.onnx --input-shape x:100,8,3":
            lambda: "fuse          would apply" in out and "linrec        skip" in out,
        "optimize models/scan_rnn.onnx out.onnx -v": lambda: "Scan" in ops("out.onnx") and "predicted slower" in out,
        "optimize models/scan_rnn.onnx rnn.opt.onnx --input-shape X:100,8,3 --report report.json":
            lambda: "fused into RNN" in out and json.loads((tmp / "report.json").read_text())["modified"] is True,
        "optimize models/scan_rnn.onnx rnn.portable.onnx --target portable --no-tune -q":
            lambda: out == "" and "RNN" in ops("rnn.portable.onnx"),
        "inspect models/scan_rnn.onnx --json": lambda: json.loads(out)["scans"][0]["node"] == "scan_rnn",
        "run models/scan_rnn.onnx --seed 1 --out outputs.npz": lambda: len(np.load(tmp / "outputs.npz").files) == 2,
        "verify models/scan_rnn.onnx rnn.portable.onnx --seeds 3": lambda: "PASSED" in out,
        "upgrade models/scan8_sum.onnx scan8_sum.o17.onnx --target-opset 17":
            lambda: onnx.load(tmp / "scan8_sum.o17.onnx").opset_import[0].version == 17,
    }


def _runnable(argv: list[str]) -> bool:
    """A command runs when the models it reads are committed samples (or written by an earlier
    example of the same file); one that names placeholders (IN.onnx, old.onnx) is parsed only."""
    if any(w.startswith("[") for w in argv):
        return False
    reads = [w for w in argv[1:] if not w.startswith("-")][:2 if argv[0] == "verify" else 1]
    return bool(reads) and reads[0].startswith("models/") and all(
        w.startswith("models/") or os.path.exists(w) for w in reads)


@pytest.mark.parametrize("doc", [p for p in DOCS if blocks(p)], ids=lambda p: p.name)
def test_every_command_in_the_docs_runs_and_does_what_it_says(doc, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    checked = 0
    for line, text in blocks(doc):
        argv = shlex.split(text)
        if argv[0] not in SUBCOMMANDS:
            continue
        if not _runnable(argv):
            if not any(w.startswith("[") for w in argv):  # a placeholder command: it must parse
                build_parser().parse_args(split_input_shapes(argv))
            continue
        real = [str(ROOT / w) if w.startswith("models/") else w for w in argv]
        result = cli(*real)
        where = f"{doc.name}:{line}: scanopt {text}"
        assert result.code == 0, f"{where}\n{result.err}"
        assert "Traceback" not in result.err, where
        claim = _claims(tmp_path, result.out).get(text)
        if claim is not None:
            assert claim(), f"{where}: does not do what the doc says\n{result.out}"
            checked += 1
    assert checked or doc.name not in ("README.md", "cli.md"), f"{doc.name}: no example's claim was checked"


def test_every_claim_belongs_to_a_command_the_docs_still_show(tmp_path):
    shown = {text for _, _, text in all_commands()}
    stale = set(_claims(tmp_path, "")) - shown
    assert not stale, stale


def test_version_is_the_package_version(cli):
    import scanopt

    result = cli("--version")
    assert result.code == 0 and result.out.strip() == f"scanopt {scanopt.__version__}"


def test_the_readme_stays_short_and_links_only_to_files_that_exist():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"
    assert os.path.exists(ROOT / "docs" / "cli.md")


def test_one_version_everywhere():
    """scanopt/_version.py is the one place; pyproject reads it, the changelog's top entry names it."""
    import scanopt
    from scanopt._version import VERSION

    assert 'version = { attr = "scanopt._version.VERSION" }' in (ROOT / "pyproject.toml").read_text()
    top = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M).group(1)
    assert VERSION.split(".dev")[0] == top, (VERSION, top)
    assert scanopt.__version__ == VERSION  # a checkout: the metadata of another install is not this copy's
