"""Every package under jobs/ (and storage/) ships in the wheel: pyproject.toml lists packages
by hand, and an editable install would hide one left out until an image or a pip install
from the wheel imports it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed_in_pyproject():
    found = set()
    for name, folder in SETUPTOOLS["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            if "__pycache__" in init.parts or any(part.startswith(".") for part in init.relative_to(base).parts):
                continue
            parts = init.parent.relative_to(base).parts
            found.add(".".join((name, *parts)))
    assert found - set(SETUPTOOLS["packages"]) == set(), "add these to [tool.setuptools] packages"
