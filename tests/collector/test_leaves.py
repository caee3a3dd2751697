"""Dense leaf ids (collector/leaves.py): one id per (thread name, stack),
numbered without gaps, kept across restarts and failed writes, and given
to a store of schema 2 as it opens, with every answer unchanged."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import numpy as np
import pytest

from ember.collector import leaves, merge, tables
from ember.collector.api import Api
from ember.collector.ids import frame_id, stack_id, thread_name_id
from ember.collector.matchers import selector
from ember.collector.store import Store
from ember.collector.validate import INT64_MAX
from ember.errors import StorageError
from tests.support.profiles import write_fleet
from tests.support.store import answers, check_ids, to_schema_4

S = 10**9
T0 = 1_700_000_000 * S
ALL = {"from": ["0"], "to": [str(INT64_MAX)]}
#: The samples columns of schema 2, as its collector created them.
SCHEMA_2_SAMPLES = ["time_ns", "end_ns", "series", "type", "thread", "tname", "stack",
                    "v0", "v1", "v2", "v3"]


def test_ids_are_dense_and_kept_across_writes_and_restarts(tmp_path: Path) -> None:
    path = tmp_path / "db.duckdb"
    store = Store(path)
    rng = random.Random(3)
    counts = []
    for at in range(5):
        write_fleet(store, rng, T0 + at * S)
        counts.append(check_ids(store))
    assert counts == sorted(counts) and counts[0] > 10
    before = answers(store)
    store.close()
    store = Store(path)
    try:
        assert check_ids(store) == counts[-1]
        assert answers(store) == before
        write_fleet(store, rng, T0 + 9 * S)
        assert check_ids(store) > counts[-1]
    finally:
        store.close()


def test_a_merge_by_leaf_sums_what_the_rows_hold(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.duckdb")
    rng = random.Random(4)
    want: dict[tuple[int, int], list[int]] = {}
    for at in range(4):
        for prof in write_fleet(store, rng, T0 + at * S):
            for smp in prof.samples:
                key = (thread_name_id(smp.thread_name),
                       stack_id([frame_id(f) for f in smp.frames]))
                sums = want.setdefault(key, [0, 0])
                sums[0] += smp.values[0]
                sums[1] += smp.values[1]
    agg = store.aggregate(0, INT64_MAX, selector({}), store.types()[0], by_name=True)
    assert agg is not None and agg.leaf is not None
    assert agg.thread is None and agg.stack is None   # the leaf ids name them
    thread, stack = store.leaves.pairs(agg.leaf)
    got = {(t, s): [a, b] for t, s, a, b in zip(thread.tolist(), stack.tolist(),
                                                agg.values[0].tolist(), agg.values[1].tolist(),
                                                strict=True)}
    assert got == want and len(got) > 50
    store.close()


def test_a_failed_write_gives_out_no_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(tmp_path / "db.duckdb")
    rng = random.Random(5)
    write_fleet(store, rng, T0)
    n = check_ids(store)
    real = tables._append

    def failing(db: duckdb.DuckDBPyConnection, table: str, cols: dict[str, object]) -> None:
        if table == "samples":
            raise duckdb.IOException("the disk went away")
        real(db, table, cols)

    monkeypatch.setattr(tables, "_append", failing)
    with pytest.raises(StorageError, match="the disk went away"):
        write_fleet(store, rng, T0 + S)
    assert check_ids(store) == n
    monkeypatch.setattr(tables, "_append", real)
    write_fleet(store, rng, T0 + 2 * S)
    assert check_ids(store) > n
    store.close()


def to_schema_2(path: Path) -> None:
    """A store as the schema-2 collector left it: no leaves, no leaf column."""
    to_schema_4(path)
    db = duckdb.connect(str(path))
    db.execute("SET preserve_insertion_order = true")
    db.execute("CREATE TABLE old AS SELECT * EXCLUDE (leaf, written) FROM samples")
    db.execute("DROP TABLE samples")
    db.execute("ALTER TABLE old RENAME TO samples")
    db.execute("DROP TABLE leaves")
    db.execute("UPDATE meta SET value = '2' WHERE key = 'schema'")
    cols = [r[0] for r in db.execute("DESCRIBE samples").fetchall()]
    assert cols == SCHEMA_2_SAMPLES
    db.close()


def test_a_store_of_schema_2_is_upgraded_with_nothing_lost(tmp_path: Path) -> None:
    path = tmp_path / "db.duckdb"
    store = Store(path)
    rng = random.Random(6)
    for at in range(6):
        write_fleet(store, rng, T0 + at * S)
    before = answers(store)
    rows = store.count()
    store.close()
    to_schema_2(path)
    store = Store(path)
    try:
        with store.cursor() as cur:
            assert cur.execute("SELECT value FROM meta WHERE key = 'schema'").fetchall() == [
                ("6",)]
        check_ids(store)
        assert store.count() == rows
        assert answers(store) == before
        write_fleet(store, rng, T0 + 7 * S)   # and it takes writes as a new store does
        check_ids(store)
    finally:
        store.close()


def test_a_store_of_schema_3_gets_its_written_column_with_nothing_lost(tmp_path: Path) -> None:
    path = tmp_path / "db.duckdb"
    store = Store(path)
    rng = random.Random(8)
    for at in range(4):
        write_fleet(store, rng, T0 + at * S)
    before, rows, generation = answers(store), store.count(), store.generation
    store.close()
    to_schema_4(path)
    db = duckdb.connect(str(path))
    db.execute("ALTER TABLE samples DROP COLUMN written")
    db.execute("UPDATE meta SET value = '3' WHERE key = 'schema'")
    db.close()
    store = Store(path)
    try:
        assert store.count() == rows and answers(store) == before
        with store.cursor() as cur:
            assert cur.execute("SELECT DISTINCT written FROM samples").fetchall() == [(0,)]
        write_fleet(store, rng, T0 + 5 * S)
        with store.cursor() as cur:
            assert cur.execute("SELECT max(written) FROM samples").fetchall() == [(1,)]
    finally:
        store.close()
    store = Store(path)   # opened again: the generations go on from the newest row's
    try:
        assert store.generation == 1 < generation
        write_fleet(store, rng, T0 + 6 * S)
        with store.cursor() as cur:
            assert cur.execute("SELECT max(written) FROM samples").fetchall() == [(2,)]
    finally:
        store.close()


def test_a_store_of_an_unknown_schema_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "db.duckdb"
    Store(path).close()
    db = duckdb.connect(str(path))
    db.execute("UPDATE meta SET value = '9' WHERE key = 'schema'")
    db.close()
    with pytest.raises(StorageError, match="a store of schema 9, not 6"):
        Store(path)


def test_sums_from_the_rows_are_the_store_s_own_to_the_last_unit() -> None:
    rng = np.random.default_rng(3)
    n = 50_000
    leaf = rng.integers(0, 700, n).astype(np.uint32)
    leaf[leaf == 5] = 6                              # a leaf without rows
    small = rng.integers(0, 10, n).astype(np.int64)  # zero-valued rows too
    big = rng.integers(0, 1 << 62, n).astype(np.int64)
    big[leaf == 9] = (1 << 63) - 1                   # sums past 2^63: capped
    mid = rng.integers(1 << 31, 1 << 40, n).astype(np.int64)
    ids, (s_small, s_big, s_mid) = leaves.sum_by_leaf([(leaf, [small, big, mid])], 3)
    exact: dict[int, list[int]] = {}
    for i, a, b, c in zip(leaf.tolist(), small.tolist(), big.tolist(), mid.tolist(),
                          strict=True):
        got = exact.setdefault(i, [0, 0, 0])
        got[0] += a
        got[1] += b
        got[2] += c
    assert ids.tolist() == sorted(exact)
    assert 5 not in exact
    assert s_small.tolist() == [exact[i][0] for i in sorted(exact)]
    assert s_big.tolist() == [min(exact[i][1], INT64_MAX) for i in sorted(exact)]
    assert s_mid.tolist() == [exact[i][2] for i in sorted(exact)]
    # one leaf's sum past 2^53 from values below 2^42: float64 at once would round
    heavy = (rng.integers(0, 1 << 20, 8192) * 2 + 1 + (1 << 41)).astype(np.int64)
    ids, (s_heavy,) = leaves.sum_by_leaf([(np.zeros(8192, np.uint32), [heavy])], 1)
    assert s_heavy.tolist() == [sum(heavy.tolist())] and s_heavy[0] > 1 << 53
    with pytest.raises(ValueError):
        leaves.sum_by_leaf([(np.zeros(leaves.RAW_ROWS, np.uint32), []),
                            (np.zeros(1, np.uint32), [])], 0)


def test_a_few_series_merged_from_their_rows_answer_as_the_grouped_merge(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One process of eight: summed from its rows (leaves.raw_rows: the
    tree sums them into its nodes), and the same with DuckDB's GROUP BY:
    every view alike."""
    store = Store(":memory:")
    rng = random.Random(11)
    for i in range(4):
        write_fleet(store, rng, T0 + i * S, pids=(10, 11, 12, 13, 14, 15, 16, 17))
    one_host = {**ALL, "match": ["host=h1", "pid=13"]}
    calls = []
    real = leaves.raw_rows
    monkeypatch.setattr(merge, "raw_rows", lambda *a: calls.append(1) or real(*a))
    fast = [Api(store).handle(path, {**one_host, **extra})[:2]
            for path, extra in (("/api/v1/tree", {"max_nodes": ["20000"]}),
                                ("/api/v1/top", {"limit": ["1000"]}))]
    assert calls, "the rows were not summed here"
    monkeypatch.setattr(merge, "raw_rows", lambda *a: None)
    grouped = [Api(store).handle(path, {**one_host, **extra})[:2]
               for path, extra in (("/api/v1/tree", {"max_nodes": ["20000"]}),
                                   ("/api/v1/top", {"limit": ["1000"]}))]
    assert fast == grouped
    assert all(code == 200 and len(body) > 200 for code, body in fast)
