"""Dense numbers for the series and threads the sample rows name.

A series or thread is interned under its 64-bit content hash (intern.py),
the id every store shares; the ``series`` and ``threads`` tables keep it.
The sample rows name them by a dense number instead (``num``, given in the
order the store first held each), because the rows are the store: a
random 64-bit hash in every row does not compress, and the four hash
columns of schema 4 (series, thread, thread name, stack) were 800 MB of a
fleet hour's 813, where the numbers, bit-packed by DuckDB, take a byte or
two a row (the thread name and stack are the leaf's: leaves.py). The
whole hour is 207 MB, and filtering one host's rows by series reads a
byte a row instead of eight.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt

from ..errors import StorageError
from .intern import MAX_VALUES, Rows

U64 = npt.NDArray[np.uint64]
U32 = npt.NDArray[np.uint32]


@dataclass(frozen=True)
class Pending:
    """Numbers given to new ids by one write, not yet committed."""

    base: int
    ids: U64     # the new ids, in the order of their numbers from ``base``


@dataclass(frozen=True)
class Numbered:
    """The numbers one write gives: its new series' and threads' (id ->
    number), and each of its profiles' series number."""

    series: dict[int, int]
    threads: dict[int, int]
    profile_series: U32


class Numbers:
    """id -> dense number and back, for one table (series or threads)."""

    def __init__(self, what: str):
        self.what = what
        self._lock = threading.Lock()
        self._num: dict[int, int] = {}
        self.ids = np.zeros(0, np.uint64)     # by number

    def __len__(self) -> int:
        return len(self.ids)

    def load(self, ids: U64, nums: npt.NDArray[np.integer]) -> None:
        """The table's (id, num) pairs; ValueError unless the numbers are
        distinct and below 2^32 (with gaps where rows were forgotten:
        garbage.py; a gap's id reads 0), and the ids distinct."""
        nums = np.asarray(nums, np.int64)
        if len(nums) and (len(np.unique(nums)) != len(nums) or int(nums.min()) < 0
                          or int(nums.max()) >= 1 << 32):
            raise ValueError(f"the {self.what} table's numbers are not distinct 32-bit numbers")
        ids = np.asarray(ids, np.uint64)
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"the {self.what} table holds an id twice")
        by_num = np.zeros(int(nums.max(initial=-1)) + 1, np.uint64)
        by_num[nums] = ids
        with self._lock:
            self.ids = by_num
            self._num = dict(zip(ids.tolist(), nums.tolist(), strict=True))

    def forget(self, nums: npt.NDArray[np.integer]) -> None:
        """Numbers whose rows are deleted: their ids are unknown again (one
        that comes back gets a new number; ``ids`` keeps the old one, for a
        reader that still holds a row of it)."""
        nums = np.asarray(nums, np.int64)
        with self._lock:
            for i, num in zip(self.ids[nums].tolist(), nums.tolist(), strict=True):
                if self._num.get(i) == num:
                    del self._num[i]

    def num(self, id_: int) -> int | None:
        return self._num.get(id_)

    def nums(self, ids: U64) -> tuple[U32, Pending]:
        """The number of each id, numbering the ids not known yet after the
        known ones, in order of first appearance; ``Pending`` holds those
        until ``commit`` (a write that rolls back leaves the numbers as
        they were)."""
        uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        with self._lock:
            got = [self._num.get(i, -1) for i in uniq.tolist()]
            base = len(self.ids)
        out = np.array(got, np.int64)
        new = np.flatnonzero(out < 0)
        new = new[np.argsort(first[new], kind="stable")]
        out[new] = base + np.arange(len(new))
        if base + len(new) > 1 << 32:
            raise OverflowError(f"more than 2^32 {self.what}")
        return out.astype(np.uint32)[inverse.reshape(-1)], Pending(base, uniq[new])

    def commit(self, p: Pending) -> None:
        """Make a written ``Pending``'s numbers known (after its transaction)."""
        if not len(p.ids):
            return
        with self._lock:
            if p.base != len(self.ids):
                raise RuntimeError(f"{self.what} numbers were given out by two writes at once")
            self._num.update(zip(p.ids.tolist(), range(p.base, p.base + len(p.ids)),
                                 strict=True))
            self.ids = np.concatenate([self.ids, p.ids])


def numbered_rows(series_nums: Numbers, thread_nums: Numbers, rows: Rows,
                  cols: dict[str, Any], profile_series: list[int]
                  ) -> tuple[Numbered, Pending, Pending]:
    """A write's sample rows (``cols``) made to name their series and
    threads by number, the new ones numbered: (the write's numbers, and
    each table's pending ones). ``profile_series``: the series id of each
    of its profiles. StorageError if a row names a series or thread that
    is neither stored nor sent with it."""
    n, m = len(cols["series"]), len(profile_series)
    # (a series or thread sent with no row naming it is numbered too)
    series, new_series = series_nums.nums(np.concatenate([
        np.asarray(cols["series"], np.uint64), np.array(profile_series, np.uint64),
        np.fromiter(rows.new_series, np.uint64, len(rows.new_series))]))
    cols["series"] = series[:n]
    threads, new_threads = thread_nums.nums(np.concatenate([
        np.asarray(cols["thread"], np.uint64),
        np.fromiter(rows.new_threads, np.uint64, len(rows.new_threads))]))
    cols["thread"] = threads[:n]
    for pending, sent, what in ((new_series, rows.new_series, "series"),
                                (new_threads, rows.new_threads, "thread")):
        if any(i not in sent for i in pending.ids.tolist()):
            raise StorageError(f"cannot store: a row names a {what} neither stored nor sent")
    return (Numbered(_given(new_series), _given(new_threads), series[n:n + m]),
            new_series, new_threads)


def _given(p: Pending) -> dict[int, int]:
    return {i: p.base + k for k, i in enumerate(p.ids.tolist())}


def upgrade(db: duckdb.DuckDBPyConnection, samples: str, profiles: str) -> None:
    """A store of schema 4 given schema 5, in one transaction: each series
    and thread numbered (in the order of their ids), and ``samples`` and
    ``profiles`` written again naming them by number, without the thread
    name and stack columns (the leaf's). The rows keep their order (their
    time order is what lets a range skip blocks); the row counts are
    compared before the old tables are dropped. ``samples``, ``profiles``:
    the new tables' columns."""
    db.execute("SET preserve_insertion_order = true")
    db.execute("BEGIN TRANSACTION")
    try:
        for table in ("series", "threads"):
            db.execute(f"ALTER TABLE {table} ADD COLUMN num UINTEGER")
            db.execute(f"UPDATE {table} SET num = n.num FROM (SELECT id, (row_number() OVER "
                       f"(ORDER BY id) - 1)::UINTEGER AS num FROM {table}) n "
                       f"WHERE {table}.id = n.id")
        values = ", ".join(f"s.v{i}" for i in range(MAX_VALUES))
        db.execute(f"CREATE TABLE samples_v5 {samples}")
        db.execute(f"INSERT INTO samples_v5 SELECT s.time_ns, s.end_ns, se.num, s.type, "
                   f"th.num, {values}, s.leaf, s.written FROM samples s "
                   "LEFT JOIN series se ON se.id = s.series "
                   "LEFT JOIN threads th ON th.id = s.thread ORDER BY s.rowid")
        db.execute(f"CREATE TABLE profiles_v5 {profiles}")
        db.execute("INSERT INTO profiles_v5 SELECT p.profile_id, se.num, p.type, p.type_id, "
                   "p.shape, p.time_ns, p.duration_ns, p.received_ns, p.samples, p.bytes "
                   "FROM profiles p LEFT JOIN series se ON se.id = p.series")
        for table in ("samples", "profiles"):
            before = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
            after = db.execute(f"SELECT COUNT(*) FROM {table}_v5").fetchone()
            if before != after:
                raise duckdb.InvalidInputException(
                    f"upgrade: {after} {table} rows written for {before} read")
        orphans = db.execute("SELECT COUNT(*) FROM samples_v5 WHERE series IS NULL OR "
                             "thread IS NULL").fetchone()
        if orphans != (0,):
            raise duckdb.InvalidInputException(
                f"upgrade: {orphans and orphans[0]} sample rows name a series or thread "
                "the store does not hold")
        for table in ("samples", "profiles"):
            db.execute(f"DROP TABLE {table}")
            db.execute(f"ALTER TABLE {table}_v5 RENAME TO {table}")
        db.execute("UPDATE meta SET value = '5' WHERE key = 'schema'")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    finally:
        db.execute("SET preserve_insertion_order = false")
