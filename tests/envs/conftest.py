"""The env servers the env tests share: one per test module (module scope)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.env_server import FAMILIES, started
from thicket.envs.process import EnvServerProcess


@pytest.fixture(scope="module")
def server() -> Iterator[EnvServerProcess]:
    s = started(FAMILIES)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def small_server() -> Iterator[EnvServerProcess]:
    """Three instances at most, idle ones reaped after 1 s, frozenlake refusing steps once done."""
    s = started(["textcraft", "frozenlake"], "--max-instances", "3", "--idle-timeout", "1",
                "--refuse-after-done", "frozenlake")
    yield s
    s.stop()
