"""The wheel's contents, checked from pyproject.toml without building it: every data file kept
in a package folder must be shipped by a package-data glob, or an installed edge-remat fails
on the board when it reads it (story.txt once did). .ci/check-wheel builds and runs the wheel.
And what the commands write into a checkout is ignored by git."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from edge_remat.tomlfile import read_toml

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"edge_remat": REPO / "host" / "edge_remat",
            "edge_remat_agent": REPO / "agent" / "edge_remat_agent"}


def data_files(package_dir: Path) -> set:
    """Every file of the package that Python does not import: what only package-data ships."""
    return {path for path in package_dir.rglob("*")
            if path.is_file() and path.suffix not in (".py", ".pyc")
            and "__pycache__" not in path.parts}


def shipped_by_globs(package: str, package_dir: Path) -> set:
    """The files setuptools' package-data globs (relative to the package folder) pick up."""
    globs = read_toml(REPO / "pyproject.toml", "pyproject")["tool"]["setuptools"].get(
        "package-data", {}).get(package, [])
    return {path for pattern in globs for path in package_dir.glob(pattern) if path.is_file()}


def test_package_data_globs_ship_every_data_file():
    for package, package_dir in PACKAGES.items():
        left_out = data_files(package_dir) - shipped_by_globs(package, package_dir)
        assert not left_out, (f"{package}: not in pyproject.toml's package-data, so missing from "
                              f"the wheel: {sorted(str(p.relative_to(REPO)) for p in left_out)}")


def test_the_agents_bundled_data_is_among_the_files_checked():
    # Guards the check above against passing vacuously (a wrong folder finds no files).
    names = {path.name for path in data_files(PACKAGES["edge_remat_agent"])}
    assert {"digits.csv.gz", "story.txt"} <= names


def test_the_package_folders_are_the_ones_pyproject_finds():
    where = read_toml(REPO / "pyproject.toml", "pyproject")["tool"]["setuptools"]["packages"][
        "find"]["where"]
    assert sorted(str(path.parent.relative_to(REPO)) for path in PACKAGES.values()) == sorted(where)


def test_default_output_folders_are_ignored_in_a_checkout():
    # `edge-remat run`, `fleet plan` and the examples write these where they run (the checkout's
    # root, as the README runs them): outputs, never files to commit.
    from edge_remat.run.options import run_default

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    examples = [m.group(1) for path in (REPO / "examples").glob("*.py")
                for m in re.finditer(r'add_argument\("--out", default="([^"]+)"',
                                     path.read_text())]
    assert "digits-run" in examples  # the pattern still finds the examples' defaults
    folders = [run_default("out"), "edge-remat-fleet", "fleet-plans", "jetson-plans", *examples]
    for folder in folders:
        probe = f"{folder}/report.json"
        ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", probe])
        assert ignored.returncode == 0, f"{folder}/ is not in .gitignore"
