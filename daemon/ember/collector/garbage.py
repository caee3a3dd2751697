"""What retention leaves behind: the threads and series no row names any more.

Retention deletes profiles and their sample rows (tables.delete_before),
but the threads and series those rows named stayed in their tables and in
memory (the interner, the store's numbers, a series' labels: a few hundred
bytes to a kilobyte each). A fleet's threads and series come and go: every
process started and every thread a pool makes anew is a thread (pid, tid,
name, labels), and every pod a deployment replaces is a series (its labels
name the pod). A collector left running held every one it had ever seen,
and each query's label match went through all the series.

``Seen`` keeps the newest row time of each thread number (from the sample
rows) and series number (from the profiles): read with one grouping of a
column when the store opens, then raised by every write. Every deletion is
of what is older than a cutoff, so a thread or series whose newest row is
older than the cutoff has no row left, and ``forget`` deletes it from its
table and from memory in the same pass, without reading the rows again.

A forgotten number is not given again while the store is open (the
table's numbers then have gaps: numbers.py reads them so). A thread or
series that comes back is new again: its next write stores it under a new
number. Workers never remember threads or series (each profile sends its
own: workers.py), so they need no word of it.

Stacks and frames stay: which of those are unused takes reading every
sample row's leaf and every stack's frames (2-3 s for a fleet hour), and a
stack gone from the table under a leaf id the query index has placed
would have to be placed again if it came back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt

from .ids import labels_json
from .intern import Interner
from .numbers import Numbers

log = logging.getLogger(__name__)

#: The newest row time of a number no row names (yet), and of a number
#: nothing has (any more).
NEVER, FORGOTTEN = np.iinfo(np.int64).min, np.iinfo(np.int64).max
#: Each table forgotten from: the rows its numbers' newest times are read from.
NEWEST_OF = {
    "threads": "SELECT thread, max(time_ns) FROM samples WHERE thread IS NOT NULL "
               "GROUP BY thread",
    "series": "SELECT series, max(time_ns) FROM profiles WHERE series IS NOT NULL "
              "GROUP BY series",
}


class Newest:
    """The newest row time (ns) of each number of one table."""

    def __init__(self) -> None:
        self.at = np.zeros(0, np.int64)

    def load(self, db: duckdb.DuckDBPyConnection, table: str) -> None:
        held = np.asarray(db.execute(f"SELECT num FROM {table}").fetchnumpy()["num"], np.int64)
        nums, newest = (np.asarray(c, np.int64)
                        for c in db.execute(NEWEST_OF[table]).fetchnumpy().values())
        self.at = np.full(max(int(held.max(initial=-1)), int(nums.max(initial=-1))) + 1,
                          FORGOTTEN, np.int64)
        self.at[held] = NEVER
        self.at[nums] = newest

    def _grow(self, size: int) -> None:
        if size > len(self.at):
            grown = np.full(max(size, 2 * len(self.at)), NEVER, np.int64)
            grown[:len(self.at)] = self.at
            self.at = grown

    def saw(self, nums: npt.NDArray[Any], times: npt.NDArray[Any]) -> None:
        """Rows of these numbers were written at these times."""
        if len(nums):
            at = np.asarray(nums, np.intp)
            self._grow(int(at.max()) + 1)
            np.maximum.at(self.at, at, np.asarray(times, np.int64))

    def gone(self, given: int, cutoff_ns: int) -> npt.NDArray[np.intp]:
        """The numbers (of the ``given`` first) with no row from ``cutoff_ns`` on."""
        self._grow(given)
        return np.flatnonzero(self.at[:given] < cutoff_ns)


class Seen:
    """Each thread's and series' newest row, to forget those with none left."""

    def __init__(self) -> None:
        self.threads, self.series = Newest(), Newest()

    def load(self, db: duckdb.DuckDBPyConnection) -> None:
        self.threads.load(db, "threads")
        self.series.load(db, "series")

    def saw(self, cols: dict[str, Any], profile_series: npt.NDArray[Any],
            profile_times: Sequence[int]) -> None:
        """A write's rows (numbered) and its profiles' series and times."""
        self.threads.saw(cols["thread"], cols["time_ns"])
        self.series.saw(profile_series, np.array(profile_times, np.int64))

    def forget(self, db: duckdb.DuckDBPyConnection, cutoff_ns: int, interner: Interner,
               numbers: tuple[Numbers, Numbers], series_labels: dict[int, dict[str, str]],
               written: dict[int, int]) -> tuple[int, int]:
        """After the rows older than ``cutoff_ns`` were deleted: delete the
        threads and series left with no row, from their tables (in a
        transaction of its own, under the store's lock: ``Store._writing``) and from memory
        (``numbers``: the thread and the series numbers; a series' labels
        and last write, by number); how many of each."""
        thread_nums, series_nums = numbers
        threads = self.threads.gone(len(thread_nums), cutoff_ns)
        series = self.series.gone(len(series_nums), cutoff_ns)
        if not len(threads) and not len(series):
            return 0, 0
        # (as tables.delete_before: a failure is rolled back by the store's _writing)
        db.execute("BEGIN TRANSACTION")
        for table, nums in (("threads", threads), ("series", series)):
            db.execute(f"DELETE FROM {table} WHERE num IN (SELECT unnest(?::UINTEGER[]))",
                       [nums.tolist()])
        db.execute("COMMIT")
        for tid in thread_nums.ids[threads].tolist():
            interner.threads.pop(tid, None)
        for num in series.tolist():
            labels = series_labels.pop(num, None)
            written.pop(num, None)
            if labels is not None:
                interner.series.pop(labels_json(labels.items()), None)
        thread_nums.forget(threads)
        series_nums.forget(series)
        self.threads.at[threads] = FORGOTTEN
        self.series.at[series] = FORGOTTEN
        log.info("store: forgot %d threads and %d series no stored row names any more",
                 len(threads), len(series))
        return len(threads), len(series)
