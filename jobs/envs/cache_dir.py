"""Generated env data (games, catalogues) cached on disk and shared by processes: each family's
cache folder, and folders published whole, by one atomic rename."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("thicket.envs")


def cache_root(family: str, variable: str) -> Path:
    """$variable, else ~/.cache/thicket/<family>."""
    env = os.environ.get(variable)
    return Path(env) if env else Path.home() / ".cache" / "thicket" / family


@contextlib.contextmanager
def publishing(target: Path, marker: str) -> Iterator[Path]:
    """A fresh folder beside `target` to write into, renamed to `target` when the block ends
    without an error, so its files appear together. Where another process published `target`
    first (its `marker` file exists), that copy is kept. The work folder never outlives the block."""
    target.parent.mkdir(parents=True, exist_ok=True)
    # mkdir honours the umask: the published folder is as readable as the cache folder
    work = target.parent / f".{target.name}.{uuid.uuid4().hex}"
    work.mkdir()
    try:
        yield work
        try:
            os.rename(work, target)
        except OSError:
            if not (target / marker).exists():
                raise
            log.info("%s/%s: another process published it first; its copy is kept", target.parent.name, target.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
