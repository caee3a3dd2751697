"""The store on a real full disk: a write is refused as StorageFull, before
it starts when the free space says so and rolled back whole when the disk
fills under it; reads go on, the store opens again on the full disk (no
traceback at restart), and writes resume once there is room."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ember.collector.store import Store, StoredProfile
from ember.collector.validate import DEFAULT_LIMITS, INT64_MAX, check_request
from ember.errors import StorageFull
from ember.proto import profilestore_pb2 as ps
from tests.support.collector import series
from tests.support.disks import fill, tiny_filesystem

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a filesystem needs root")

BASE = check_request(ps.WriteRawRequest(series=[series(50)]), DEFAULT_LIMITS, time.time_ns())[0]


def profile(i: int) -> StoredProfile:
    return replace(BASE, profile_id=f"p{i}",
                   series_labels=(("__name__", "ember_cpu"), ("pid", str(i))),
                   time_ns=10**18 + i)


def samples(store: Store) -> int:
    agg = store.aggregate(0, INT64_MAX, {}, BASE.type)
    return 0 if agg is None else int(agg.values[0].sum())


def test_a_full_disk_refuses_writes_and_keeps_reads(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    per_profile = BASE.samples   # (the sum of its samples' first values)
    with tiny_filesystem(tmp_path / "fs", "32m") as fs:
        store = Store(fs / "db.duckdb")
        store.write([profile(0)])
        filler = fill(fs)
        # the free space says no: refused before anything is written
        with pytest.raises(StorageFull, match="the disk is full"):
            store.write([profile(1), profile(2)])
        assert store.count() == 1 and samples(store) == per_profile
        # the disk fills under the write itself (as when another process
        # takes the space between the check and the write)
        monkeypatch.setattr("ember.collector.store.check_disk", lambda path, incoming: None)
        os.truncate(filler, max(0, filler.stat().st_size - (96 << 10)))
        refused = 0
        for i in range(3, 200):
            try:
                store.write([profile(i), profile(1000 + i)])
            except StorageFull as exc:
                refused += 1
                assert "No space left on device" in str(exc)  # DuckDB's own failure
                break
        assert refused, "the disk never filled"
        stored = store.count()
        assert stored % 2 == 1  # requests stored whole or not at all (1 + pairs)
        assert samples(store) == stored * per_profile  # reads go on, and agree
        store.close()
        again = Store(fs / "db.duckdb")  # a restart on the full disk
        assert again.count() == stored and samples(again) == stored * per_profile
        assert again.label_values("pid")[:1] == ["0"]
        filler.unlink()
        monkeypatch.undo()
        again.write([profile(5000)])
        assert again.count() == stored + 1
        again.close()
