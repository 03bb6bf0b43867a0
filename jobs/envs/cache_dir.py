"""Generated env data (games, catalogues) cached on disk and shared by processes: each family's
cache folder, and folders published whole, by one atomic rename."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path


def cache_root(family: str, variable: str) -> Path:
    """$variable, else ~/.cache/thicket/<family>."""
    env = os.environ.get(variable)
    return Path(env) if env else Path.home() / ".cache" / "thicket" / family


# One lock per folder being generated in this process, so that two envs (threads) asking for
# the same missing folder generate it once: the second waits, then finds the first's.
_GENERATING: dict[Path, threading.Lock] = {}
_GENERATING_GUARD = threading.Lock()


@contextlib.contextmanager
def generating_once(target: Path) -> Iterator[None]:
    with _GENERATING_GUARD:
        lock = _GENERATING.setdefault(target, threading.Lock())
    with lock:
        yield


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


def cached_folder(target: Path, marker: str, build: Callable[[Path], str], log: logging.Logger) -> Path:
    """`target`, built on first use: `build(work)` writes the folder's files into `work` and
    returns how it made them (logged), then the folder is published whole (`publishing`).
    Built once per process however many threads ask (`generating_once`); where another
    process publishes first, its copy is kept. `marker`: the file whose presence means done."""
    if (target / marker).exists():
        return target
    with generating_once(target):
        if (target / marker).exists():  # another thread of this process made it meanwhile
            return target
        started = time.monotonic()
        with publishing(target, marker) as publication:
            how = build(publication.work)
        name = f"{target.parent.name}/{target.name}"
        if publication.published:
            log.info("%s: %s generated (%s) in %.1f s", log.name.rsplit(".", 1)[-1], name, how,
                     time.monotonic() - started)
        else:
            log.info("%s: %s: another process published it first; its copy is kept", log.name.rsplit(".", 1)[-1], name)
    return target
