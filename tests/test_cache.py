"""The one bounded cache type: bounds, eviction order, shrinking, and the
registry the memory governor reads."""

from __future__ import annotations

import gc
import threading

import pytest

from ember import cache
from ember.cache import BoundedCache


def test_needs_a_bound() -> None:
    with pytest.raises(ValueError, match="needs max_entries or max_bytes"):
        BoundedCache("unbounded")


def test_oldest_first_by_entries() -> None:
    c: BoundedCache[int, str] = BoundedCache("t", 3)
    for i in range(5):
        c.put(i, str(i))
    assert [k for k, _ in c.items()] == [2, 3, 4] and c.evictions == 2
    assert c.get(2) == "2" and c.get(0) is None
    c.put(2, "again")  # a put makes the entry the newest
    c.put(5, "5")
    assert [k for k, _ in c.items()] == [4, 2, 5]


def test_lru_read_refreshes() -> None:
    c: BoundedCache[int, int] = BoundedCache("t", 2, lru=True)
    c.put(1, 1)
    c.put(2, 2)
    assert c.get(1) == 1
    c.put(3, 3)
    assert 1 in c and 2 not in c and 3 in c


def test_bytes_bound_with_weights_and_keep() -> None:
    c: BoundedCache[str, bytes] = BoundedCache("t", max_bytes=100, weigh=len, keep=1)
    c.put("a", b"x" * 60)
    c.put("b", b"x" * 30)
    assert c.size_bytes() == 90
    c.put("c", b"x" * 50)  # 140 > 100: a goes
    assert [k for k, _ in c.items()] == ["b", "c"] and c.size_bytes() == 80
    c.put("huge", b"x" * 500)  # alone over the bound, but kept
    assert [k for k, _ in c.items()] == ["huge"]


def test_stored_none_is_a_value() -> None:
    c: BoundedCache[str, int | None] = BoundedCache("t", 4, lru=True)
    c.put("bad", None)
    assert "bad" in c and c.get("bad") is None and "other" not in c


def test_shrink_lowers_the_bound_not_below_the_floor() -> None:
    c: BoundedCache[int, int] = BoundedCache("t", 10_000, floor=100)
    for i in range(1000):
        c.put(i, i)
    released = c.shrink(0.5)
    assert len(c) == 500 and c.max_entries == 500 and released == 500 * c.entry_bytes
    assert min(k for k, _ in c.items()) == 500  # the oldest went
    c.shrink(0.99)
    assert len(c) == 100 and c.max_entries == 100
    b: BoundedCache[int, bytes] = BoundedCache("t", max_bytes=10 << 20, weigh=len)
    for i in range(8):
        b.put(i, bytes(1 << 20))
    b.shrink(0.5)
    assert b.size_bytes() <= 4 << 20 and b.max_bytes == 4 << 20


def test_entries_that_grow_are_weighed_again() -> None:
    c: BoundedCache[str, list[int]] = BoundedCache("t", max_bytes=1000, weigh=len)
    v = [1, 2]
    c.put("v", v)
    v.extend(range(100))
    assert c.size_bytes() == 102


def test_registry_sees_live_caches_by_name() -> None:
    c: BoundedCache[int, int] = BoundedCache("test_registry_cache", 10, entry_bytes=7)
    hidden: BoundedCache[int, int] = BoundedCache("test_hidden", 10, register=False)
    c.put(1, 1)
    hidden.put(1, 1)
    assert c in cache.live() and hidden not in cache.live()
    assert cache.sizes()["test_registry_cache"] == (7, 0)
    del c
    gc.collect()
    assert "test_registry_cache" not in cache.sizes()


def test_puts_from_threads_keep_the_bound() -> None:
    c: BoundedCache[tuple[int, int], int] = BoundedCache("t", 500)

    def fill(t: int) -> None:
        for i in range(5000):
            c.put((t, i), i)
            c.get((t, i - 1))

    threads = [threading.Thread(target=fill, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(c) == 500 and len(c.items()) == 500
