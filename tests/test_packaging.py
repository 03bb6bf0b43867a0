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


def test_the_wheel_builds_quietly_and_ships_the_demo_policy(tmp_path):
    """A data folder inside a package that setuptools is not told about makes every install print
    a wall of warnings (and a later setuptools would leave it out of the wheel)."""
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "source"
    for name in ("jobs", "storage"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv is missing: `make venv` installs it into .venv"
    # An isolated build, with the setuptools a user's pip or uv would fetch (older ones stay quiet).
    built = subprocess.run([uv, "build", "--wheel", "-o", str(tmp_path / "wheel"), str(source)],
                           capture_output=True, text=True, check=True)
    log = built.stdout + built.stderr
    assert "is absent from the `packages` configuration" not in log
    assert "SetuptoolsDeprecationWarning" not in log
    (wheel,) = (tmp_path / "wheel").glob("thicket-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"thicket/training/demo_policy/model.safetensors", "thicket/training/demo_policy/tokenizer.json",
            "thicket/training/demo_model.py"} <= names
