"""The store on a real full disk: a write is refused as StorageFull (not
SQLite's 'cannot rollback'), rolled back whole, reads go on, the store
opens again on the full disk (no traceback at restart), and writes resume
once there is room."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ember.collector.store import Store, StoredProfile
from ember.errors import StorageFull
from tests.support.disks import fill, tiny_filesystem

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a filesystem needs root")


def profile(i: int) -> StoredProfile:
    return StoredProfile(f"p{i}", (("__name__", "ember_cpu"), ("pid", str(i))), "t", 10**18 + i,
                         10**9, 1, os.urandom(2000))


def test_a_full_disk_refuses_writes_and_keeps_reads(tmp_path: Path) -> None:
    with tiny_filesystem(tmp_path / "fs", "1m") as fs:
        store = Store(fs / "db.sqlite")
        store.write([profile(0)])
        filler = fill(fs)
        with pytest.raises(StorageFull, match="the disk is full"):
            for i in range(1, 1000):  # whatever room SQLite had left
                store.write([profile(i), profile(10_000 + i)])
        stored = store.count()
        assert stored % 2 == 1  # requests stored whole or not at all (1 + pairs)
        assert len(list(store.query(0, 2 * 10**18, {}))) == stored
        store.close()
        again = Store(fs / "db.sqlite")  # a restart on the full disk
        assert again.count() == stored and again.label_values("pid")[:1] == ["0"]
        filler.unlink()
        again.write([profile(5000)])
        assert again.count() == stored + 1
        again.close()
