"""Object stores by URI (`open_store`): local folders and S3. What thicket keeps on them, the tree
shards and their commit protocol, is `thicket.shards`.

`open_store` lives here, above both kinds of store: `store` (the protocol, local folders) knows
nothing of `s3`, which builds on it.
"""

from __future__ import annotations

from urllib.parse import urlparse

from thicket.storage.store import LocalStore, StorageSettings, Store, StoreConfigError


def open_store(uri: str, settings: StorageSettings | None = None) -> Store:
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return LocalStore(parsed.netloc + parsed.path if parsed.scheme == "file" else uri)
    if parsed.scheme == "s3":
        from thicket.storage.s3 import (
            S3Store,  # boto3 is slow to import: only when needed
        )

        return S3Store(uri, settings or StorageSettings())
    raise StoreConfigError(f"unsupported storage URI {uri!r}: expected a local path, file:// or s3://bucket/prefix")


__all__ = ["open_store"]
