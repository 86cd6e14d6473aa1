"""Package discovery that pyproject.toml alone cannot express: ``passes/`` installs as
``scanopt.passes``, and every subpackage of either tree (``scanopt/cli``,
``passes/fuse/`` ...) is found without being listed, so a wheel never misses one."""

from setuptools import find_packages, setup

# installed package -> source folder
SOURCES = {"scanopt": "scanopt", "scanopt.passes": "passes"}


def discovered_packages() -> list[str]:
    found = []
    for package, folder in SOURCES.items():
        found += [package] + [f"{package}.{sub}" for sub in find_packages(folder)]
    return found


if __name__ == "__main__":
    setup(package_dir=SOURCES, packages=discovered_packages())
