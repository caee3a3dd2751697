"""Dense ids for the store's (thread name, stack) pairs: the column the
flame graph's merge groups by.

Every view starts from the samples of a range summed per (thread name,
stack). Grouped by those two 64-bit hashes, a fleet's hour (25M rows into
800,000 groups) takes DuckDB about a second; grouped by one small dense
integer it takes a third of that, because DuckDB then sums into an array
indexed by the id (its "perfect hash" aggregate, for ids below
2^PERFECT_BITS) instead of a hash table. So each distinct pair gets the next
id the first time a write holds it (``leaves`` table, ``samples.leaf``).

Ids belong to one store (the content hashes stay the ids other stores
share); the query index maps them to its nodes with one array lookup. Ids
are never reused: a pair whose rows retention deleted keeps its id, and the
table grows with the distinct pairs ever stored (20 bytes each).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import duckdb
import numpy as np
import numpy.typing as npt

from . import scatter
from .results import batches

_MIX = np.uint64(0x9E3779B97F4A7C15)
#: DuckDB sums into an array when the grouped ids span at most 2^this.
PERFECT_BITS = 20


def leaf_keys(tname: npt.NDArray[np.uint64], stack: npt.NDArray[np.uint64]
              ) -> npt.NDArray[np.uint64]:
    """One 64-bit key per (thread name, stack), as the query index keys them."""
    with np.errstate(over="ignore"):
        return stack ^ (tname * _MIX)


class Leaves:
    """The store's leaf ids in memory: id -> (thread name, stack), and the
    sorted keys that find a pair's id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tname = np.zeros(0, np.uint64)    # by id
        self.stack = np.zeros(0, np.uint64)
        self._keys = np.zeros(0, np.uint64)    # sorted
        self._ids = np.zeros(0, np.uint32)     # the id of each sorted key

    def __len__(self) -> int:
        return len(self.tname)

    def load(self, db: duckdb.DuckDBPyConnection) -> None:
        # placed by id here: DuckDB's ORDER BY of a fleet's 800,000 held 60 MB
        # of its heap for good
        got = db.execute("SELECT id, tname, stack FROM leaves").fetchnumpy()
        ids = np.asarray(got["id"], np.int64)
        tname, stack = np.zeros(len(ids), np.uint64), np.zeros(len(ids), np.uint64)
        seen = np.zeros(len(ids), bool)
        inside = (ids >= 0) & (ids < len(ids))
        seen[ids[inside]] = True
        if not (inside.all() and seen.all()):
            raise duckdb.InvalidInputException("the leaves table's ids are not 0..n-1")
        tname[ids], stack[ids] = got["tname"], got["stack"]
        del got
        keys = leaf_keys(tname, stack)
        order = np.argsort(keys, kind="stable")
        with self._lock:
            self.tname, self.stack = tname, stack
            self._keys, self._ids = keys[order], order.astype(np.uint32)

    def ids(self, tname: npt.NDArray[np.uint64], stack: npt.NDArray[np.uint64]
            ) -> tuple[npt.NDArray[np.uint32], Pending]:
        """The id of each row's pair, numbering the pairs not seen before
        after the known ones; ``Pending`` holds those until ``commit`` (a
        write that rolls back leaves the ids as they were)."""
        keys = leaf_keys(tname, stack)
        with self._lock:
            out = np.zeros(len(keys), np.uint32)
            found = np.zeros(len(keys), bool)
            if len(self._keys):
                pos = np.searchsorted(self._keys, keys)
                pos[pos == len(self._keys)] = 0
                found = self._keys[pos] == keys
                out[found] = self._ids[pos[found]]
            new_keys, first, inverse = np.unique(keys[~found], return_index=True,
                                                 return_inverse=True)
            base = len(self.tname)
            if base + len(new_keys) > 1 << 32:
                raise OverflowError("more than 2^32 distinct (thread name, stack) pairs")
            new_ids = np.arange(base, base + len(new_keys), dtype=np.uint32)
            out[~found] = new_ids[inverse.reshape(-1)]
            missing = np.flatnonzero(~found)[first]
            return out, Pending(base, new_keys, new_ids, tname[missing], stack[missing])

    def commit(self, p: Pending) -> None:
        """Make a written ``Pending``'s ids known (after its transaction)."""
        if not len(p.ids):
            return
        with self._lock:
            if p.base != len(self.tname):
                raise RuntimeError("leaf ids were given out by two writes at once")
            self.tname = np.concatenate([self.tname, p.tname])
            self.stack = np.concatenate([self.stack, p.stack])
            at = np.searchsorted(self._keys, p.keys)
            self._keys = np.insert(self._keys, at, p.keys)
            self._ids = np.insert(self._ids, at, p.ids)

    def pairs(self, ids: npt.NDArray[np.uint32]) -> tuple[npt.NDArray[np.uint64],
                                                         npt.NDArray[np.uint64]]:
        """(thread name, stack) of ids."""
        with self._lock:
            tname, stack = self.tname, self.stack
        return tname[ids], stack[ids]


class Pending:
    """Ids given to new pairs by one write, not yet committed."""

    def __init__(self, base: int, keys: npt.NDArray[np.uint64], ids: npt.NDArray[np.uint32],
                 tname: npt.NDArray[np.uint64], stack: npt.NDArray[np.uint64]):
        self.base, self.keys, self.ids, self.tname, self.stack = base, keys, ids, tname, stack

    def columns(self) -> dict[str, npt.NDArray[np.generic]]:
        return {"id": self.ids, "tname": self.tname, "stack": self.stack}


def upgrade(db: duckdb.DuckDBPyConnection) -> None:
    """A store of schema 2 (no leaf ids) given them, in one transaction:
    every distinct (thread name, stack) numbered, and ``samples`` written
    again with its ``leaf`` column (a fleet's hour: seconds, once)."""
    db.execute("BEGIN TRANSACTION")
    try:
        db.execute("CREATE TABLE leaves AS SELECT (row_number() OVER (ORDER BY tname, stack) - 1)"
                   "::UINTEGER AS id, tname, stack FROM (SELECT DISTINCT tname, stack "
                   "FROM samples)")
        db.execute("CREATE TABLE samples_v3 AS SELECT s.*, l.id AS leaf FROM samples s "
                   "JOIN leaves l USING (tname, stack)")
        before = db.execute("SELECT COUNT(*) FROM samples").fetchone()
        after = db.execute("SELECT COUNT(*) FROM samples_v3").fetchone()
        if before != after:
            raise duckdb.InvalidInputException(
                f"upgrade: {after} rows written for {before} read")
        db.execute("DROP TABLE samples")
        db.execute("ALTER TABLE samples_v3 RENAME TO samples")
        db.execute("UPDATE meta SET value = '3' WHERE key = 'schema'")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


#: A merge of at most this many rows (for a few of the series) is summed here
#: from the rows themselves: DuckDB's grouping of one host's hour (1.25M
#: rows into 527,000 leaves) took 92-143 ms; reading the rows takes about
#: 40 ms and summing them 14-21.
RAW_ROWS = 1 << 21
_INT64_MAX = (1 << 63) - 1


def sum_by_leaf(parts: Sequence[tuple[npt.NDArray[np.uint32], Sequence[npt.NDArray[np.int64]]]],
                columns: int) -> tuple[npt.NDArray[np.uint32], list[npt.NDArray[np.int64]]]:
    """The leaves of at most ``RAW_ROWS`` rows, in parts (a query's batches:
    each its leaves and a values array per column), ascending, and each
    values column summed per leaf, exactly (capped at 2^63 - 1, as the
    store's own sums are; values are never negative). A column whose total
    is below 2^53 is summed in float64 at once (every partial sum is
    exact); any other in its 32-bit halves, each exact up to 2^53 (2^21
    rows of 2^32)."""
    rows = sum(len(leaf) for leaf, _ in parts)
    if rows > RAW_ROWS:
        raise ValueError(f"{rows} rows, at most {RAW_ROWS} summed here")
    if scatter.IN_C:   # one exact loop a column (a third of bincount's time)
        return scatter.sum_per_index(parts, columns)
    leaf = np.concatenate([np.zeros(0, np.uint32), *(ix for ix, _ in parts)])
    values = [np.concatenate([np.zeros(0, np.int64), *(vs[c] for _, vs in parts)])
              for c in range(columns)]
    idx = leaf.astype(np.intp)
    # (marked in a bool array: a third cheaper than counting in an int64 one)
    mark = np.zeros(int(leaf.max(initial=0)) + 1, bool)
    mark[idx] = True
    present = np.flatnonzero(mark)
    sums = []
    for v in values:
        if not len(v) or (int(v.max()) < 1 << 42 and int(v.sum()) < 1 << 53):
            sums.append(np.bincount(idx, weights=v)[present].astype(np.int64))
            continue
        lo = np.bincount(idx, weights=v & 0xFFFFFFFF)[present].astype(np.uint64)
        hi = np.bincount(idx, weights=v >> 32)[present].astype(np.uint64)
        total = np.minimum((np.minimum(hi, 1 << 31) << np.uint64(32)) + lo,
                           np.uint64(_INT64_MAX))
        sums.append(total.astype(np.int64))
    return present.astype(np.uint32), sums


def raw_rows(cur: duckdb.DuckDBPyConnection, where: str, args: list[object],
             columns: list[str]
             ) -> list[tuple[npt.NDArray[np.uint32], tuple[npt.NDArray[np.int64], ...]]] | None:
    """The rows of ``samples`` ``where`` holds, for a few of the series:
    in DuckDB's batches (results.py), each its leaf ids and a values array
    per column; None (nothing read past ``RAW_ROWS`` + 1 rows) when there
    are more."""
    got = batches(cur, f"SELECT leaf, {', '.join(columns)} FROM samples WHERE {where} "
                  f"LIMIT {RAW_ROWS + 1}", args, RAW_ROWS)
    if got is None:
        return None
    return [(leaf, tuple(np.asarray(c[k], np.int64) for c in got.values()))
            for k, leaf in enumerate(got.pop("leaf"))]


def raw_sums(cur: duckdb.DuckDBPyConnection, where: str, args: list[object],
             columns: list[str]) -> dict[str, npt.NDArray[np.generic]] | None:
    """``SELECT leaf, sum(c)... FROM samples WHERE where GROUP BY leaf`` for
    a few of the series: ``raw_rows`` summed (``grouped``), or None when
    there are more rows than it reads."""
    parts = raw_rows(cur, where, args, columns)
    return None if parts is None else grouped(parts, columns)


def grouped(parts: Sequence[tuple[npt.NDArray[np.uint32], Sequence[npt.NDArray[np.int64]]]],
            columns: list[str]) -> dict[str, npt.NDArray[np.generic]]:
    """Rows in parts (``raw_rows``) summed per leaf, as DuckDB's
    ``GROUP BY leaf`` gives them: the leaf ids, then each column's sums."""
    ids, sums = sum_by_leaf(parts, len(columns))
    return {"leaf": ids, **dict(zip(columns, sums, strict=True))}
