"""Everything is in pyproject.toml; this only ships the repository's profiles/ and
device_configs/ inside the host package of a wheel (edge_remat/shipped/, read by
edge_remat/shipped.py), so that an installed edge-remat finds them outside the repository."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithData(build_py):
    def run(self):
        super().run()
        for name in ("profiles", "device_configs"):
            if (ROOT / name).is_dir() and not self.editable_mode:
                shutil.copytree(ROOT / name, Path(self.build_lib) / "edge_remat" / "shipped" / name,
                                dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithData})
