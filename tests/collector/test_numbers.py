"""Series and threads named by dense numbers in the sample rows
(collector/numbers.py): numbered in the order the store first held them,
kept across restarts and failed writes, and given to a store of schema 4
as it opens, with every answer and the rows' order unchanged."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import numpy as np
import pytest

from ember.collector import tables
from ember.collector.intern import Rows
from ember.collector.numbers import Numbers, numbered_rows
from ember.collector.store import Store
from ember.errors import StorageError
from tests.support.profiles import write_fleet
from tests.support.store import answers, check_ids, to_schema_4

S = 10**9
T0 = 1_700_000_000 * S


def check_numbers(store: Store) -> tuple[int, int]:
    """Each table's numbers are 0..n-1 over distinct ids, every row names
    a number the tables hold, and the in-memory views agree; returns
    (series, threads)."""
    out = []
    with store.cursor() as cur:
        for table, nums in (("series", store.series_nums), ("threads", store.thread_nums)):
            got = cur.execute(f"SELECT id, num FROM {table} ORDER BY num").fetchall()
            assert [n for _, n in got] == list(range(len(got)))
            assert len({i for i, _ in got}) == len(got)
            assert nums.ids.tolist() == [i for i, _ in got]
            out.append(len(got))
        orphans = cur.execute(
            "SELECT COUNT(*) FROM samples s WHERE s.series NOT IN (SELECT num FROM series) "
            "OR s.thread NOT IN (SELECT num FROM threads)").fetchone()
        assert orphans == (0,)
    return out[0], out[1]


def rows_in_order(path: Path) -> list[tuple[int, int, int]]:
    db = duckdb.connect(str(path), read_only=True)
    try:
        return [(int(a), int(b), int(c)) for a, b, c in db.execute(
            "SELECT time_ns, leaf, v0 FROM samples ORDER BY rowid").fetchall()]
    finally:
        db.close()


def test_numbers_follow_first_appearance_and_wait_for_the_commit() -> None:
    n = Numbers("series")
    ids = np.array([30, 10, 30, 20, 10], np.uint64)
    got, pending = n.nums(ids)
    assert got.tolist() == [0, 1, 0, 2, 1]
    assert pending.ids.tolist() == [30, 10, 20] and len(n) == 0
    again, _ = n.nums(np.array([20], np.uint64))
    assert again.tolist() == [0]          # nothing committed: given again
    n.commit(pending)
    got, pending = n.nums(np.array([40, 20, 30], np.uint64))
    assert got.tolist() == [3, 2, 0] and pending.ids.tolist() == [40]
    with pytest.raises(RuntimeError):     # two writes cannot both give out 3
        stale = n.nums(np.array([50], np.uint64))[1]
        n.commit(pending)
        n.commit(stale)
    # a table's numbers may have gaps (threads forgotten: garbage.py), never twice the same
    with pytest.raises(ValueError, match="not distinct"):
        Numbers("threads").load(np.array([1, 2], np.uint64), np.array([2, 2]))
    gaps = Numbers("threads")
    gaps.load(np.array([7, 9], np.uint64), np.array([0, 2]))
    assert gaps.ids.tolist() == [7, 0, 9] and gaps.num(9) == 2 and gaps.num(0) is None
    got, pending = gaps.nums(np.array([9, 11], np.uint64))
    assert got.tolist() == [2, 3]         # new ones after the highest held
    gaps.commit(pending)
    gaps.forget(np.array([2]))            # 9's rows deleted: 9 is unknown again
    assert gaps.num(9) is None and gaps.num(11) == 3
    got, pending = gaps.nums(np.array([9], np.uint64))
    assert got.tolist() == [4]            # back: a new number, 2 not given again
    gaps.commit(pending)
    gaps.forget(np.array([2]))            # the old number again: 9 keeps its new one
    assert gaps.num(9) == 4


def test_a_row_naming_an_unknown_series_is_refused() -> None:
    rows = Rows()
    cols = {"series": np.array([7], np.uint64), "thread": np.array([8], np.uint64)}
    rows.new_threads[8] = (1, 1, "main", ())
    with pytest.raises(StorageError, match="names a series neither stored nor sent"):
        numbered_rows(Numbers("series"), Numbers("threads"), rows, cols, [])


def test_numbers_are_kept_across_restarts_and_failed_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "db.duckdb"
    store = Store(path)
    rng = random.Random(2)
    write_fleet(store, rng, T0)
    first = check_numbers(store)
    real = tables._append

    def failing(db: duckdb.DuckDBPyConnection, table: str, cols: dict[str, object]) -> None:
        if table == "samples":
            raise duckdb.IOException("the disk went away")
        real(db, table, cols)

    monkeypatch.setattr(tables, "_append", failing)
    with pytest.raises(StorageError, match="the disk went away"):
        write_fleet(store, rng, T0 + S, pids=(20, 21))   # new series and threads
    assert check_numbers(store) == first
    monkeypatch.setattr(tables, "_append", real)
    store.close()
    store = Store(path)
    try:
        assert check_numbers(store) == first
        write_fleet(store, rng, T0 + 2 * S, pids=(20, 21))
        series, threads = check_numbers(store)
        assert series == first[0] + 2 and threads >= first[1]
    finally:
        store.close()


def test_a_store_of_schema_4_is_numbered_with_nothing_lost(tmp_path: Path) -> None:
    path = tmp_path / "db.duckdb"
    store = Store(path)
    rng = random.Random(9)
    for at in range(5):
        write_fleet(store, rng, T0 + at * S, pids=(10, 11, 12, 13))
    before, profiles = answers(store), store.count()
    store.close()
    to_schema_4(path)
    order = rows_in_order(path)
    store = Store(path)
    try:
        with store.cursor() as cur:
            assert cur.execute("SELECT value FROM meta WHERE key = 'schema'").fetchall() == [
                ("6",)]
            assert [r[0] for r in cur.execute("DESCRIBE samples").fetchall()] == [
                "time_ns", "end_ns", "series", "type", "thread", "v0", "v1", "v2", "v3",
                "leaf", "written"]
        check_numbers(store)
        check_ids(store)
        assert store.count() == profiles
        assert answers(store) == before
        write_fleet(store, rng, T0 + 6 * S, pids=(10, 14))   # and it takes writes
        check_numbers(store)
    finally:
        store.close()
    assert rows_in_order(path)[:len(order)] == order   # the rows kept their order


def test_an_upgrade_that_cannot_number_a_row_leaves_the_store_as_it_was(
        tmp_path: Path) -> None:
    path = tmp_path / "db.duckdb"
    store = Store(path)
    write_fleet(store, random.Random(1), T0)
    store.close()
    to_schema_4(path)
    db = duckdb.connect(str(path))
    db.execute("DELETE FROM threads WHERE id = (SELECT min(id) FROM threads)")
    rows = db.execute("SELECT COUNT(*) FROM samples").fetchone()
    db.close()
    with pytest.raises(StorageError, match="name a series or thread the store does not hold"):
        Store(path)
    db = duckdb.connect(str(path))
    try:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("4",)
        assert db.execute("SELECT COUNT(*) FROM samples").fetchone() == rows
        assert "tname" in [r[0] for r in db.execute("DESCRIBE samples").fetchall()]
    finally:
        db.close()
