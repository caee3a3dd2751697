"""A query's result read as numpy columns (collector/results.py): through
DuckDB's Arrow C stream where _arrow.c is built, each batch's columns as
arrays over its memory; the same rows as DuckDB's fetchnumpy gives, in
order, with the NULLs and types the stream reader leaves to it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import duckdb
import numpy as np
import pytest

from ember.collector import results

ROWS = 300_000   # (more than one batch of the stream's 131,072)


@pytest.fixture
def db() -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect(":memory:")
    con.execute("SET threads = 2")
    con.execute(f"CREATE TABLE t AS SELECT i::UINTEGER AS leaf, (i * 7)::BIGINT AS v, "
                f"(i % 3)::UTINYINT AS small, i::DOUBLE / 2 AS half, "
                f"CASE WHEN i % 5 = 0 THEN NULL ELSE i END::BIGINT AS holes, "
                f"'s' || i AS text FROM range({ROWS}) r(i)")
    yield con
    con.close()


def test_the_stream_reader_was_built() -> None:
    """The set-up installs a compiler and Python's headers (the build is
    optional: a failure would be silent)."""
    import ember.collector._arrow  # noqa: F401


def test_columns_are_fetchnumpy_s_in_batches_over_the_stream(
        db: duckdb.DuckDBPyConnection) -> None:
    sql = "SELECT leaf, v, small, half FROM t WHERE leaf % 2 = ? ORDER BY leaf"
    got = results.batches(db, sql, [1])
    want = db.execute(sql, [1]).fetchnumpy()
    assert got is not None and list(got) == ["leaf", "v", "small", "half"]
    assert len(got["leaf"]) > 1   # (read a batch at a time)
    for name, parts in got.items():
        joined = np.concatenate(parts)
        assert joined.dtype == want[name].dtype, name
        assert joined.tolist() == want[name].tolist(), name
        assert not any(p.flags.writeable for p in parts)   # (the batch's own memory)
    whole = results.columns(db, sql, [1])
    assert {k: v.tolist() for k, v in whole.items()} == {
        k: v.tolist() for k, v in want.items()}


def test_the_arrays_outlive_the_query_and_its_connection() -> None:
    con = duckdb.connect(":memory:")
    got = results.batches(con, f"SELECT i::BIGINT AS v FROM range({ROWS}) r(i)")
    con.close()
    assert got is not None
    assert np.concatenate(got["v"]).tolist() == list(range(ROWS))


def test_more_rows_than_asked_for_is_none_and_the_connection_is_free(
        db: duckdb.DuckDBPyConnection) -> None:
    assert results.batches(db, "SELECT leaf FROM t", most=ROWS - 1) is None
    got = results.batches(db, "SELECT leaf FROM t", most=ROWS)
    assert got is not None and sum(len(p) for p in got["leaf"]) == ROWS
    assert db.execute("SELECT count(*) FROM t").fetchall() == [(ROWS,)]


def test_an_empty_result_has_a_typed_empty_column(db: duckdb.DuckDBPyConnection) -> None:
    got = results.columns(db, "SELECT leaf, v FROM t WHERE leaf > ?", [ROWS])
    assert got["leaf"].dtype == np.uint32 and got["v"].dtype == np.int64
    assert len(got["leaf"]) == len(got["v"]) == 0


@pytest.mark.parametrize("column", ["holes", "text"])
def test_nulls_and_other_types_are_read_as_fetchnumpy_reads_them(
        db: duckdb.DuckDBPyConnection, column: str) -> None:
    sql = f"SELECT leaf, {column} FROM t ORDER BY leaf"
    got = results.columns(db, sql)
    want = db.execute(sql).fetchnumpy()
    assert got["leaf"].tolist() == want["leaf"].tolist()
    assert got[column].tolist() == want[column].tolist()
    if column == "holes":
        assert np.ma.is_masked(got[column]) and got[column].tolist()[0] is None


def test_a_query_failing_as_it_runs_raises_duckdb_s_error(
        db: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(duckdb.Error, match=r"Conversion|convert"):
        results.batches(db, "SELECT CAST(CASE WHEN leaf < 200000 THEN '1' ELSE 'x' END "
                            "AS INTEGER) AS n FROM t")
    assert db.execute("SELECT 1").fetchall() == [(1,)]


def test_an_interrupted_query_raises_duckdb_s_error(db: duckdb.DuckDBPyConnection) -> None:
    """As a merge stops when its client leaves (merge.py: on_cancel)."""
    cur = db.cursor()
    slow = ("SELECT a.leaf::BIGINT AS v FROM t a, t b WHERE a.leaf::BIGINT * b.leaf = 7 "
            "AND a.leaf::BIGINT + b.leaf > 0")
    done = threading.Event()

    def leave() -> None:   # (again, should one come before the query runs)
        while not done.wait(0.3):
            cur.interrupt()
    leaving = threading.Thread(target=leave)
    leaving.start()
    began = time.monotonic()
    try:
        with pytest.raises(duckdb.Error, match=r"INTERRUPT|nterrupt"):
            results.batches(cur, slow)
    finally:
        done.set()
        leaving.join()
    assert time.monotonic() - began < 30


def test_the_reader_refuses_what_is_not_a_stream_it_can_read() -> None:
    from ember.collector import _arrow
    with pytest.raises((TypeError, ValueError)):
        _arrow.read(object(), -1)
    con = duckdb.connect(":memory:")
    stream = con.sql("SELECT 1::INTEGER AS one").__arrow_c_stream__()
    got = _arrow.read(stream, -1)
    assert got is not None and got[0] == ["one"] and got[1] == ["i"]
    with pytest.raises(ValueError, match="already read"):
        _arrow.read(stream, -1)
    with pytest.raises(_arrow.Unread, match="format 'u'"):
        _arrow.read(con.sql("SELECT 'a' AS s").__arrow_c_stream__(), -1)
