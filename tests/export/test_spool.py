from __future__ import annotations

from pathlib import Path

from ember.export.spool import Spool


def test_oldest_first_and_survives_reopen(tmp_path: Path) -> None:
    s = Spool(tmp_path, 1 << 20)
    for i in range(3):
        s.put(b"req%d" % i)
    again = Spool(tmp_path, 1 << 20)  # an agent restart
    seen = []
    while (item := again.oldest()) is not None:
        seen.append(item[1])
        again.remove(item[0])
    assert seen == [b"req0", b"req1", b"req2"]
    assert again.stats() == (0, 0)


def test_limit_drops_oldest_and_counts(tmp_path: Path) -> None:
    s = Spool(tmp_path, 2500, count_profiles=lambda data: 7)
    for _ in range(2):
        assert s.put(b"x" * 1000).requests == 0
    dropped = s.put(b"y" * 1000)
    assert (dropped.requests, dropped.bytes, dropped.profiles) == (1, 1000, 7)
    assert s.stats() == (2, 2000)
    item = s.oldest()
    assert item is not None and item[1] == b"x" * 1000
    big = s.put(b"z" * 5000)  # larger than the limit alone: kept, the rest dropped
    assert big.requests == 2 and s.stats() == (1, 5000)


def test_interrupted_writes_are_cleaned(tmp_path: Path) -> None:
    (tmp_path / ".123.writeraw.tmp").write_bytes(b"half")
    s = Spool(tmp_path, 1 << 20)
    assert s.stats() == (0, 0) and not list(tmp_path.glob("*.tmp"))
