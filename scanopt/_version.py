"""The version of this source tree: the one place to change it (pyproject.toml reads it,
CHANGELOG.md's top entry names it; tests/test_docs.py checks the three agree)."""

VERSION = "0.2.0.dev0"
