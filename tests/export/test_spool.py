from __future__ import annotations

import os
from pathlib import Path

import pytest

from ember.export.spool import QUARANTINE, QUARANTINE_KEEP, Spool
from tests.support.disks import fill, tiny_filesystem


def test_oldest_first_and_survives_reopen(tmp_path: Path) -> None:
    s = Spool(tmp_path, 1 << 20)
    for i in range(3):
        s.put(b"req%d" % i)
    again = Spool(tmp_path, 1 << 20)  # an agent restart
    seen = []
    while (entry := again.oldest()) is not None:
        seen.append(entry.data)
        again.remove(entry)
    assert seen == [b"req0", b"req1", b"req2"]
    assert again.stats() == (0, 0)


def test_limit_drops_oldest_and_counts(tmp_path: Path) -> None:
    s = Spool(tmp_path, 2500, count_profiles=lambda data: 7)
    for _ in range(2):
        assert s.put(b"x" * 1000).requests == 0
    dropped = s.put(b"y" * 1000)
    assert (dropped.requests, dropped.bytes, dropped.profiles) == (1, 1000, 7)
    assert s.stats() == (2, 2000)
    entry = s.oldest()
    assert entry is not None and entry.data == b"x" * 1000
    big = s.put(b"z" * 5000)  # larger than the limit alone: kept, the rest dropped
    assert big.requests == 2 and s.stats() == (1, 5000)


def test_interrupted_writes_are_cleaned(tmp_path: Path) -> None:
    (tmp_path / ".123.writeraw.tmp").write_bytes(b"half")
    s = Spool(tmp_path, 1 << 20)
    assert s.stats() == (0, 0) and not list(tmp_path.glob("*.tmp"))


def test_an_unreadable_entry_is_quarantined_and_the_queue_goes_on(tmp_path: Path) -> None:
    s = Spool(tmp_path, 1 << 20)
    s.put(b"first")
    (tmp_path / "00000000000000000001-1-000000.writeraw").mkdir()  # a directory, oldest
    entry = s.oldest()
    assert entry is not None and entry.data == b"first"
    assert s.quarantined == 1
    assert (tmp_path / QUARANTINE / "00000000000000000001-1-000000.writeraw").is_dir()
    s.remove(entry)
    assert s.oldest() is None and s.stats() == (0, 0)


def test_quarantine_keeps_the_newest(tmp_path: Path) -> None:
    s = Spool(tmp_path, 1 << 20)
    for i in range(QUARANTINE_KEEP + 5):
        (tmp_path / f"{i + 1:020d}-1-000000.writeraw").mkdir()
    assert s.oldest() is None
    kept = sorted(p.name for p in (tmp_path / QUARANTINE).iterdir())
    assert len(kept) == QUARANTINE_KEEP and kept[-1].startswith(f"{QUARANTINE_KEEP + 5:020d}")
    assert s.quarantined == QUARANTINE_KEEP + 5


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small filesystem needs root")
def test_a_full_disk_holds_requests_in_memory_and_recovers(tmp_path: Path) -> None:
    with tiny_filesystem(tmp_path / "fs") as fs:
        s = Spool(fs / "spool", 1 << 20, count_profiles=lambda data: 3, memory_max=10_000)
        s.put(b"on disk")
        filler = fill(fs)
        dropped = [s.put(bytes([i]) * 3000) for i in range(5)]  # no crash: held
        assert s.write_errors >= 1 and s.last_write_error == "ENOSPC"
        # 5 x 3,000 bytes held under a 10,000 byte ceiling: the 2 oldest go, counted
        assert sum(d.requests for d in dropped) == 2
        assert sum(d.profiles for d in dropped) == 6
        assert s.held_bytes() == 9000 and s.stats() == (4, 9000 + len(b"on disk"))
        # oldest first across disk and memory
        order = []
        while (entry := s.oldest()) is not None:
            order.append(entry.data[:1])
            if len(order) == 2:
                break
            s.remove(entry)
        assert order == [b"o", bytes([2])]
        filler.unlink()  # space returns: the next put writes what was held first
        assert s.put(b"after").requests == 0
        assert s.held_bytes() == 0 and s.last_write_error == ""
        names = sorted(p.name for p in (fs / "spool").iterdir())
        assert len(names) == 3 + 1  # 3 held, written back, and the new one (the first removed)
        datas = [(fs / "spool" / n).read_bytes()[:1] for n in names]
        assert datas == [bytes([2]), bytes([3]), bytes([4]), b"a"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small filesystem needs root")
def test_held_requests_are_written_or_counted_at_exit(tmp_path: Path) -> None:
    with tiny_filesystem(tmp_path / "fs") as fs:
        s = Spool(fs / "spool", 1 << 20, count_profiles=lambda data: 2)
        filler = fill(fs)
        s.put(b"a" * 100)
        s.put(b"b" * 100)
        lost = s.persist()
        assert (lost.requests, lost.bytes, lost.profiles) == (2, 200, 4)
        s.put(b"c" * 100)
        filler.unlink()
        assert s.persist().requests == 0
        assert [p.read_bytes() for p in sorted((fs / "spool").iterdir())] == [b"c" * 100]
