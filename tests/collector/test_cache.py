"""The query API's caches are bounded by bytes as well as entries, keep the
newest entry however large, and show their sizes in the collector's metrics."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from ember import cache
from ember.collector import arena
from ember.collector.cache import Cache
from ember.collector.server import Collector
from ember.config import CollectorConfig
from tests.support.profiles import write_fleet

S = 10**9


def test_entries_past_the_byte_bound_go_oldest_first() -> None:
    cache: Cache[bytes] = Cache("collector_test", size=100, max_bytes=250, weigh=len)
    for i in range(3):
        cache.get(0, (i,), lambda: bytes(100))
    made: list[int] = []

    def make(i: int) -> bytes:
        made.append(i)
        return bytes(100)
    for i in (2, 1, 0):   # 1 and 2 were kept (200 bytes); 0 went first
        cache.get(0, (i,), lambda i=i: make(i))   # type: ignore[misc]
    assert made == [0]


def test_the_newest_entry_stays_however_large() -> None:
    cache: Cache[bytes] = Cache("collector_test", size=8, max_bytes=10, weigh=len)
    big = bytes(1000)
    assert cache.get(0, ("a",), lambda: big) is big
    assert cache.get(0, ("a",), lambda: b"made again") is big


def test_a_newer_generation_of_a_query_drops_its_older_entry() -> None:
    cache: Cache[bytes] = Cache("collector_test", size=100, max_bytes=10_000, weigh=len)
    for q in ("tree", "top"):
        cache.get(1, (q,), lambda: bytes(100))
    assert cache._items.size_bytes() == 200
    cache.get(2, ("tree",), lambda: bytes(100))    # after a write to what it reads
    assert sorted(k for k, _ in cache._items.items()) == [(1, "top"), (2, "tree")]
    # a request that began before the write gets its answer, which is not kept
    late = b"of generation 1"
    assert cache.get(1, ("tree",), lambda: late) is late
    assert sorted(k for k, _ in cache._items.items()) == [(1, "top"), (2, "tree")]
    assert cache.get(2, ("tree",), lambda: b"made again") == bytes(100)
    assert cache.get(1, ("top",), lambda: b"made again") == bytes(100)


def test_a_write_leaves_the_answers_about_other_series_as_they_were(tmp_path: Path) -> None:
    """Store.generation_of: the tree and answer of one host are made again
    after a write to that host or a deletion, not after a write to another."""
    c = Collector(CollectorConfig(storage=str(tmp_path / "db.duckdb")))
    try:
        t0 = (time.time_ns() // S - 600) * S
        rng = random.Random(3)
        for at in (0, 20):
            write_fleet(c.store, rng, t0 + at * S, pids=(10, 11))   # hosts h0 and h1
        merged: list[str] = []
        c.api.windows.on_tree = merged.append
        q = {"from": [str(t0 - S)], "to": [str(t0 + 100 * S)]}
        views = [("/api/v1/tree", {**q, "match": ["host=h0"]}),
                 ("/api/v1/top", {**q, "match": ["host=h1"]})]

        def ask() -> list[bytes]:
            out = []
            for path, query in views:
                code, body, _ = c.api.handle(path, query)
                assert code == 200, body
                out.append(body)
            return out
        first = ask()
        assert len(merged) == 2
        write_fleet(c.store, rng, t0 + 10 * S, pids=(13,))   # host h1 only
        again = ask()
        assert len(merged) == 3 and again[0] == first[0] and again[1] != first[1]
        assert ask() == again and len(merged) == 3
        with c.store._writing("test"):
            c.store._delete_before(t0 + 5 * S)
        ask()
        assert len(merged) == 5
    finally:
        c.close()


def test_one_entry_is_made_once_for_requests_at_once() -> None:
    cache: Cache[int] = Cache("collector_test", size=4)
    calls = []
    gate = threading.Event()

    def slow() -> int:
        calls.append(1)
        gate.wait(5)
        return 7
    got: list[int | None] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get(0, ("k",), slow)))
               for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join()
    assert got == [7] * 4 and len(calls) == 1


def test_the_collector_reports_its_caches(tmp_path: Path) -> None:
    c = Collector(CollectorConfig(storage=str(tmp_path / "db.duckdb")))
    try:
        t0 = (time.time_ns() // S - 600) * S
        write_fleet(c.store, random.Random(1), t0)
        code, body, _ = c.api.handle("/api/v1/tree", {"since": ["1h"]})
        assert code == 200, body
        text = c.handle("/metrics", {}, "")[1].decode()
        shown = {line.split('"')[1]: int(float(line.split()[-1])) for line in text.splitlines()
                 if line.startswith("ember_collector_cache_bytes{")}
        assert shown == {name: size for name, (size, _) in cache.sizes().items()
                         if name.startswith("collector_")} | {
            "collector_arrays": arena.stats().kept_bytes}
        node_bytes = 8 * len(c.api.index)   # the one tree made: its totals
        assert c.api.cache._items.size_bytes() == node_bytes
        assert c.api.windows._latest.size_bytes() == node_bytes
        assert c.api.rendered._items.size_bytes() == len(body)
        assert c.api.sums._items.size_bytes() > 0
    finally:
        c.close()
