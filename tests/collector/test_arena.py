"""The allocator that keeps large freed arrays (collector/arena.py): what
numpy gets from it reads and writes as numpy's own, a kept block is given
again (zeroed where numpy asks for zeros), and it keeps no more than its
limit. Each test runs in a thread of its own: the allocator is set per
thread, and the test runner's own arrays keep numpy's."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ember.collector import arena
from ember.collector.api import Api
from ember.collector.store import Store
from tests.support.profiles import write_fleet

pytestmark = pytest.mark.skipif(not arena.BUILT, reason="the install built no _arena")

MB = 1 << 20


def in_thread(fn: Callable[[], Any]) -> Any:
    """fn's result, run on a thread of its own that uses the allocator."""
    out: list[Any] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            assert arena.use()
            out.append(fn())
        except BaseException as exc:   # (re-raised in the test's thread)
            err.append(exc)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def handler_name(a: np.ndarray[Any, Any] | None = None) -> str:
    from numpy._core.multiarray import get_handler_name
    return str(get_handler_name(a) if a is not None else get_handler_name())


@pytest.fixture(autouse=True)
def limit() -> Iterator[None]:
    arena.set_limit(0)   # (nothing kept from before)
    arena.set_limit(arena.LIMIT)
    yield
    arena.set_limit(arena.LIMIT)


def test_a_thread_uses_it_only_once_asked() -> None:
    names: list[str] = []
    plain = threading.Thread(target=lambda: names.append(handler_name()))
    plain.start()
    plain.join()
    assert names == ["default_allocator"]
    assert in_thread(lambda: (handler_name(), arena.use())) == ("ember_arena", False)


def test_large_arrays_are_kept_and_given_again_zeroed() -> None:
    def run() -> tuple[Any, ...]:
        a = np.zeros(5 * MB // 8, np.int64)
        assert handler_name(a) == "ember_arena"
        a[:] = -1
        before = arena.stats()
        del a
        freed = arena.stats()
        b = np.zeros(5 * MB // 8, np.int64)   # the block a had, zeroed
        return before, freed, arena.stats(), int(np.count_nonzero(b))
    before, freed, after, nonzero = in_thread(run)
    block = freed.kept_bytes - before.kept_bytes   # (a's, with its header: 64 KB pages)
    assert 5 * MB < block < 6 * MB and block % (64 << 10) == 0
    assert after.reuses == freed.reuses + 1
    assert after.mappings == freed.mappings
    assert after.kept_bytes == before.kept_bytes
    assert nonzero == 0


def test_small_arrays_and_their_values_are_as_numpy_makes_them() -> None:
    def run() -> list[bool]:
        rng = np.random.default_rng(7)
        checks = []
        for n in (0, 1, 17, 1000, MB // 8 - 1, MB // 2, 3 * MB):   # either side of 4 MB
            v = rng.integers(-(1 << 62), 1 << 62, n, dtype=np.int64)
            w = v.copy()
            w[::3] += 1
            checks.append(bool(np.array_equal(np.sort(w), np.sort(v + (np.arange(n) % 3 == 0)))))
            checks.append(np.zeros(n, np.int64).sum() == 0 and np.ones(n).sum() == n)
        return checks
    assert all(in_thread(run))


def test_resizing_keeps_what_fits_either_way() -> None:
    def run() -> tuple[int, int, int, int]:
        a = np.arange(300_000, dtype=np.int64)   # 2.4 MB: malloc's
        a.resize(1_200_000, refcheck=False)      # 9.6 MB: a mapping
        grown = int(a[:300_000].sum()), int(np.count_nonzero(a[300_000:]))
        a.resize(1_100_000, refcheck=False)      # within its block
        a.resize(1_000, refcheck=False)          # back to malloc
        return *grown, int(a.sum()), len(a)
    assert in_thread(run) == (sum(range(300_000)), 0, sum(range(1_000)), 1_000)


def test_it_keeps_no_more_than_its_limit() -> None:
    arena.set_limit(8 * MB)

    def run() -> tuple[int, int]:
        arrays = [np.ones(5 * MB // 8, np.int64) for _ in range(4)]   # 5.1 MB blocks
        del arrays
        kept = arena.stats().kept_bytes
        arena.set_limit(0)
        return kept, arena.stats().kept_bytes
    kept, after = in_thread(run)
    assert 5 * MB < kept < 6 * MB   # the last one freed: a second would pass 8 MB
    assert after == 0


def test_threads_share_the_kept_blocks_safely() -> None:
    errors: list[str] = []

    def worker(seed: int) -> None:
        arena.use()
        rng = np.random.default_rng(seed)
        for _ in range(40):
            n = int(rng.integers(MB // 2, 3 * MB))
            a = np.full(n, seed, np.int64)
            if int(a.min()) != seed or int(a.max()) != seed:
                errors.append(f"thread {seed} saw another's values")
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = arena.stats()
    assert s.kept_bytes <= arena.LIMIT and s.mapped_bytes >= s.kept_bytes


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="not negative"):
        arena.set_limit(-1)


def test_the_query_api_sets_it_for_the_thread_a_request_runs_on(tmp_path: Path) -> None:
    api = Api(Store(tmp_path / "db.duckdb"))
    try:
        write_fleet(api.store, random.Random(1), (time.time_ns() // 10**9 - 600) * 10**9)
        names: list[str] = []

        def ask() -> None:
            before = handler_name()
            code, _, _ = api.handle("/api/v1/tree", {"since": ["1h"]})
            names.extend([before, handler_name(), str(code)])
        t = threading.Thread(target=ask)
        t.start()
        t.join()
        assert names == ["default_allocator", "ember_arena", "200"]
    finally:
        api.store.close()
