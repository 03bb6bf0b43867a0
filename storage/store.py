"""Object stores behind one small interface, chosen by URI scheme.

Keys are '/'-separated paths relative to the store's root URI. `put` is atomic:
a reader sees the whole object or nothing; with `if_absent` it is put-if-absent
(exactly one of several racing writers wins).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from thicket.errors import BadInput, NothingAnswers, ThicketError, Unavailable


class StoreError(ThicketError):
    """A storage failure with a one-line message for the user."""


class StoreConfigError(StoreError, BadInput):
    """The store cannot work as configured (bucket, credentials, region): rerunning will not help."""


class StoreUnavailable(StoreError, Unavailable):
    """The store did not answer, or kept failing transiently, until the retry deadline."""


class StoreNotAnswering(StoreConfigError, NothingAnswers):
    """Nothing listened at the endpoint for the whole start-up window."""


@dataclass(frozen=True)
class StorageSettings:
    """How to reach an object store; anything left None comes from the standard AWS environment."""

    endpoint_url: str | None = None
    region: str | None = None
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    access_key_id_env: str | None = None  # NAMES of environment variables, never the secrets
    secret_access_key_env: str | None = None
    session_token_env: str | None = None
    retry_deadline_s: float = 300.0
    startup_connect_s: float = 60.0  # check(): nothing listening this long means a wrong endpoint


class Store(ABC):
    uri: str
    reads_in_flight: int = 1  # get_many's concurrent gets: what pays off against this store's latency

    @abstractmethod
    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        """Write `data` at `key`. With if_absent, return False (writing nothing) if it exists."""

    @abstractmethod
    def get(self, key: str) -> bytes: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys under `prefix`, sorted."""

    @abstractmethod
    def delete(self, key: str) -> None: ...

    def remove_empty_folder(self, prefix: str) -> None:
        """Remove the folder `prefix` names if nothing is left in it (an object store has no
        folders: nothing to do)."""

    def get_many(self, keys: Sequence[str]) -> list[bytes]:
        """The objects at `keys`, in order, with up to reads_in_flight gets at a time."""
        if self.reads_in_flight <= 1 or len(keys) <= 1:
            return [self.get(key) for key in keys]
        with ThreadPoolExecutor(min(self.reads_in_flight, len(keys)), thread_name_prefix="store-get") as pool:
            return list(pool.map(self.get, keys))

    @abstractmethod
    def size(self, key: str) -> int:
        """The object's size in bytes (StoreError if it does not exist)."""

    def check(self) -> None:
        """Fail fast (StoreConfigError / StoreUnavailable) if the store cannot be used."""

    def retry_until(self, deadline: float) -> None:
        """From now on no call is retried past `deadline` (time.monotonic()): a stopping worker
        has its grace period, not retry_deadline_s. A store that does not retry ignores it."""


class LocalStore(Store):
    """A folder. Atomic puts: write a temporary file, fsync, then rename (or link,
    which fails if the target exists: put-if-absent)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.uri = self.root.as_uri()

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root != path and self.root not in path.parents:
            raise StoreError(f"key {key!r} escapes the store at {self.root}")
        return path

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".{uuid.uuid4().hex[:8]}.tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            if if_absent:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    return False
            else:
                os.replace(tmp, path)
            return True
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise StoreError(f"no object {key!r} in {self.uri}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> Iterator[str]:
        base = self._path(prefix) if prefix else self.root
        folder = base if base.is_dir() else base.parent
        if not folder.exists():
            return iter(())
        keys = (
            p.relative_to(self.root).as_posix()
            for p in folder.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )
        return iter(sorted(k for k in keys if k.startswith(prefix)))

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def remove_empty_folder(self, prefix: str) -> None:
        try:
            self._path(prefix).rmdir()
        except OSError:  # not empty, or not there: left as it is
            pass

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise StoreError(f"no object {key!r} in {self.uri}") from None

