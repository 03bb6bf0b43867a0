"""The local store (thicket.storage.store, `file://`): put-if-absent, no temporary files left, and
keys that cannot escape its folder."""

from __future__ import annotations

import pytest

from thicket.storage import open_store
from thicket.storage.store import StoreError


def test_put_if_absent_and_keys_cannot_escape(tmp_path):
    store = open_store(f"file://{tmp_path}")
    assert store.put("a/b.json", b"1", if_absent=True)
    assert not store.put("a/b.json", b"2", if_absent=True)
    assert store.get("a/b.json") == b"1"
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    with pytest.raises(StoreError):
        store.put("../outside", b"x")
