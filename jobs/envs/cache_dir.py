"""Generated env data (games, catalogues) cached on disk and shared by processes: each family's
cache folder, and folders published whole, by one atomic rename."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def cache_root(family: str, variable: str) -> Path:
    """$variable, else ~/.cache/thicket/<family>."""
    env = os.environ.get(variable)
    return Path(env) if env else Path.home() / ".cache" / "thicket" / family


@dataclass
class Publication:
    work: Path  # the folder to write into
    published: bool = False  # after the block: whether `work` became the target (else another copy won)


@contextlib.contextmanager
def publishing(target: Path, marker: str) -> Iterator[Publication]:
    """A fresh folder beside `target` to write into, renamed to `target` when the block ends
    without an error, so its files appear together. Where another process published `target`
    first (its `marker` file exists), that copy is kept. The work folder never outlives the block."""
    target.parent.mkdir(parents=True, exist_ok=True)
    # mkdir honours the umask: the published folder is as readable as the cache folder
    publication = Publication(target.parent / f".{target.name}.{uuid.uuid4().hex}")
    publication.work.mkdir()
    try:
        yield publication
        try:
            os.rename(publication.work, target)
            publication.published = True
        except OSError:
            if not (target / marker).exists():
                raise
    finally:
        shutil.rmtree(publication.work, ignore_errors=True)
