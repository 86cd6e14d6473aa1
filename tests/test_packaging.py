"""The wheel ships every package: setup.py discovers them (passes/ as scanopt.passes,
subpackages such as passes/fuse/ included). `.ci/run` builds and runs the real wheel; this
is the fast check that no folder of Python code is left out."""

from __future__ import annotations

import importlib.util
import os

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _setup_module():
    spec = importlib.util.spec_from_file_location("scanopt_setup", os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # setup() itself only runs as __main__
    return module


def _python_folders(folder: str, installed_as: str) -> dict[str, str]:
    """installed package name -> folder, for every folder holding .py files."""
    found = {}
    for root, dirs, files in os.walk(os.path.join(ROOT, folder)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        if any(f.endswith(".py") for f in files):
            relative = os.path.relpath(root, os.path.join(ROOT, folder))
            name = installed_as if relative == "." else f"{installed_as}.{relative.replace(os.sep, '.')}"
            found[name] = root
    return found


def test_every_folder_of_python_code_is_an_installed_package():
    setup = _setup_module()
    wanted = {**_python_folders("scanopt", "scanopt"), **_python_folders("passes", "scanopt.passes")}
    missing_init = [folder for folder in wanted.values() if not os.path.exists(os.path.join(folder, "__init__.py"))]
    assert missing_init == []  # find_packages would skip them
    assert sorted(setup.discovered_packages()) == sorted(wanted)
    assert {"scanopt.cli", "scanopt.passes", "scanopt.reference"} <= set(wanted)



def test_the_loop_free_passes_import_by_their_old_paths_too():
    """vectorize, hoist and lift moved into passes/loopfree/ (issue 21): the old paths give the same modules."""
    import scanopt.passes.hoist as old_hoist
    import scanopt.passes.lift as old_lift
    import scanopt.passes.loopfree.hoist as hoist
    import scanopt.passes.loopfree.lift as lift
    import scanopt.passes.loopfree.vectorize as vectorize
    from scanopt.passes.vectorize import Vectorize

    assert old_hoist is hoist and old_lift is lift and Vectorize is vectorize.Vectorize
