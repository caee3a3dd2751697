"""Sealed blocks' rows grouped by series (collector/cluster.py): every row
moved once and in order, no answer changed, through late writes, writes
while the rows move, and retention cutting a clustered block."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ember.collector import cluster, merge
from ember.collector.api import Api
from ember.collector.rollup import BLOCK_NS
from ember.collector.store import Store
from tests.support.profiles import write_fleet
from tests.support.store import T0, seal_all

S = 10**9
PIDS = tuple(range(10, 18))     # eight series, over two hosts
QUESTIONS = [("/api/v1/tree", {"max_nodes": ["20000"]}),
             ("/api/v1/tree", {"max_nodes": ["20000"], "match": ["host=h0"]}),
             ("/api/v1/tree", {"match": ["pid=13"], "search": ["fn3"]}),
             ("/api/v1/top", {"limit": ["1000"], "match": ["host=h1"]}),
             ("/api/v1/profile", {"format": ["folded"], "match": ["host=h0"]})]


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    """Two stores given the same writes: the first is clustered."""
    a, b = Store(tmp_path / "a.duckdb"), Store(tmp_path / "b.duckdb")
    yield a, b
    a.close()
    b.close()


def write_both(stores: tuple[Store, ...], seed: int, at_s: range) -> None:
    for s in stores:
        rng = random.Random(seed)
        for at in at_s:
            write_fleet(s, rng, T0 + at * S, pids=PIDS)


def answers(store: Store) -> list[Any]:
    """Each question over the whole time and over ranges cutting blocks,
    from an API with nothing cached."""
    out = []
    for lo, hi in ((0, T0 + 10 * 3600 * S), (T0 + 70 * S, T0 + 700 * S)):
        api = Api(store)
        for path, extra in QUESTIONS:
            code, body, _ = api.handle(path, {"from": [str(lo)], "to": [str(hi)], **extra})
            out.append((code, body))
    return out


def rows(store: Store) -> list[tuple[Any, ...]]:
    with store.cursor() as cur:
        return cur.execute("SELECT * FROM samples ORDER BY ALL").fetchall()


def clustered(store: Store) -> set[int]:
    with store.cursor() as cur:
        return {int(b) for (b,) in cur.execute("SELECT block FROM clustered").fetchall()}


def five_minute_seals(store: Store) -> set[int]:
    with store.cursor() as cur:
        return {int(b) for (b,) in cur.execute("SELECT block FROM seals WHERE span = ?",
                                               (BLOCK_NS,)).fetchall()}


def cluster_all(store: Store) -> int:
    moved = 0
    while (n := store.cluster()) is not None:
        moved += n
    return moved


def physical(store: Store, block: int) -> list[tuple[int, int]]:
    """(series, time) of a block's rows in the order they are stored."""
    with store.cursor() as cur:
        return cur.execute("SELECT series, time_ns FROM samples WHERE time_ns >= ? AND "
                           "time_ns < ? ORDER BY rowid", (block, block + BLOCK_NS)).fetchall()


def test_rows_move_once_in_series_order_and_no_answer_changes(
        stores: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = stores
    write_both(stores, 1, range(0, 20 * 60, 30))
    seal_all(a)
    seal_all(b)
    with a.cursor() as cur:   # several moves a block, each of a few times
        (most,), = cur.execute("SELECT max(n) FROM (SELECT COUNT(*) n FROM samples "
                               "GROUP BY time_ns)").fetchall()
    monkeypatch.setattr(cluster, "CHUNK_ROWS", 3 * most)
    before, generation = rows(a), a.generation
    blocks = five_minute_seals(a)
    assert len(blocks) >= 4
    in_blocks = sum(1 for r in before if any(k <= r[0] < k + BLOCK_NS for k in blocks))
    with a.cursor() as cur:
        (tid,), = cur.execute("SELECT DISTINCT type FROM samples").fetchall()
        slices = {k: cluster.chunks(cur, tid, k) for k in blocks}
    assert sum(len(v) > 1 for v in slices.values()) >= 3
    assert all(lo < hi for v in slices.values() for lo, hi in v[:-1]), slices
    assert cluster_all(a) == in_blocks
    assert clustered(a) == blocks
    assert a.cluster() is None                       # none left
    assert rows(a) == before and a.generation == generation
    for k in blocks:   # each slice of the block's times in (series, time) order
        order = physical(a, k)
        key = [(next(i for i, (lo, hi) in enumerate(slices[k]) if lo <= t <= hi), s, t)
               for s, t in order]
        assert key == sorted(key) and len({s for s, _ in order}) == len(PIDS)
    assert answers(a) == answers(b)


def settings(cur: Any) -> tuple[str, str, str | None]:
    return cur.execute("SELECT current_setting('threads'), current_setting('memory_limit'), "
                       "current_setting('operator_memory_limit')").fetchall()[0]


def as_duckdb_says(threads: int, memory: str, sorts: str | None = None
                   ) -> tuple[str, str, str | None]:
    """The settings as DuckDB shows them once set (``sorts``: the
    connection's operator memory, else DuckDB's default)."""
    import duckdb
    with duckdb.connect() as db:
        db.execute(f"SET threads = {threads}")
        db.execute(f"SET memory_limit = '{memory}'")
        if sorts is not None:
            db.execute(f"SET operator_memory_limit = '{sorts}'")
        return settings(db)


def test_a_block_moves_whole_on_one_thread_and_the_store_gets_its_settings_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.collector.store import THREADS
    a = Store(tmp_path / "a.duckdb", memory_limit="48MB")
    write_both((a,), 8, range(0, 16 * 60, 30))
    seal_all(a)
    with a.cursor() as cur:
        per_block = dict(cur.execute(f"SELECT time_ns // {BLOCK_NS} * {BLOCK_NS}, COUNT(*) "
                                     "FROM samples GROUP BY ALL").fetchall())
    blocks = five_minute_seals(a)
    real, during = cluster.move, []

    def watched(cur: Any, *args: Any, **kw: Any) -> int:
        during.append(settings(cur))
        return real(cur, *args, **kw)
    monkeypatch.setattr(cluster, "move", watched)
    moved = []
    while (n := a.cluster()) is not None:
        moved.append(n)
    assert sorted(moved) == sorted(per_block[k] for k in blocks)   # one move a block
    assert during == [as_duckdb_says(cluster.MOVE_THREADS, cluster.MOVE_MEMORY,
                                     cluster.MOVE_SORT_MEMORY)] * len(blocks)
    with a.cursor() as cur:
        assert settings(cur) == as_duckdb_says(THREADS, "48MB")
    a.close()


def test_late_rows_and_retention_after_clustering(stores: tuple[Store, Store]) -> None:
    a, b = stores
    write_both(stores, 2, range(0, 25 * 60, 40))
    for s in stores:
        seal_all(s)
    cluster_all(a)
    write_both(stores, 3, range(100, 400, 90))       # late rows into clustered blocks
    assert answers(a) == answers(b)
    cut = T0 // BLOCK_NS * BLOCK_NS + 2 * BLOCK_NS + 100 * S   # inside a block
    for s in stores:
        with s._writing("test"):
            s._delete_before(cut)
    assert clustered(a) == {k for k in five_minute_seals(a) if k >= cut}
    assert answers(a) == answers(b)
    for s in stores:                  # the cut block: sealed again, then clustered
        seal_all(s)
    assert cluster_all(a) > 0 and clustered(a) == five_minute_seals(a)
    assert answers(a) == answers(b) and rows(a) == rows(b)


def test_writes_while_the_rows_move_are_kept(stores: tuple[Store, Store],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "CHUNK_ROWS", 50)
    a, b = stores
    write_both(stores, 4, range(0, 20 * 60, 30))
    for s in stores:
        seal_all(s)
    moving = threading.Thread(target=cluster_all, args=(a,))
    moving.start()
    write_both(stores, 5, range(5, 15 * 60, 45))     # into the blocks being moved
    moving.join()
    cluster_all(a)
    assert rows(a) == rows(b)
    assert answers(a) == answers(b)


def test_a_conflict_leaves_the_block_for_later(stores: tuple[Store, Store],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.errors import StorageError
    a, _ = stores
    write_both((a,), 6, range(0, 12 * 60, 30))
    seal_all(a)
    before = rows(a)
    with a.cursor() as cur:
        own = settings(cur)
    real = cluster.move
    calls = 0

    def failing(*args: Any, **kw: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 2:   # the second range of the first block
            import duckdb
            raise duckdb.TransactionException("conflict (test)")
        return real(*args, **kw)
    monkeypatch.setattr(cluster, "CHUNK_ROWS", 200)
    monkeypatch.setattr(cluster, "move", failing)
    with pytest.raises(StorageError):
        cluster_all(a)
    assert calls == 2
    with a.cursor() as cur:   # the store's own settings again
        assert settings(cur) == own
    assert clustered(a) == set() and rows(a) == before
    cluster_all(a)
    assert clustered(a) == five_minute_seals(a) and rows(a) == before


def test_series_named_as_constants_or_as_a_list_answer_alike(
        stores: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge of a few series names them as constants (DuckDB's scan then
    skips the row groups of others); of many, as a list parameter with
    their range (merge.INLINE_SERIES). Both ways, clustered or not, and
    with a second shape beside (its count names the series too)."""
    a, b = stores
    write_both(stores, 7, range(0, 12 * 60, 30))
    for s in stores:
        seal_all(s)
    cluster_all(a)
    inline = answers(a)
    monkeypatch.setattr(merge, "INLINE_SERIES", 0)
    assert "unnest" in merge.in_series([3, 7])[0] and merge.in_series([3, 7])[1] == [[3, 7]]
    assert answers(a) == inline == answers(b)
    for s in stores:   # a second shape of the type (another rate): merges count it apart
        write_fleet(s, random.Random(8), T0 + 200 * S, pids=(12, 13), hz=50)
    assert answers(a) == answers(b)
    monkeypatch.setattr(merge, "INLINE_SERIES", 256)
    assert answers(a) == answers(b)
