"""What retention leaves behind: the threads no sample row names any more.

Retention deletes profiles and their sample rows (tables.delete_before),
but the threads those rows named stayed in the ``threads`` table and in
memory (the interner's ``threads`` and the store's thread numbers, a few
hundred bytes each). A fleet's threads come and go: every process started
and every thread a pool makes anew is a thread (pid, tid, name, labels), so
a collector left running held every thread it had ever seen.

``ThreadsSeen`` keeps the newest row time of each thread number: read from
the rows when the store opens (one grouping of the ``thread`` column) and
raised by every write. Every deletion is of the rows older than a cutoff,
so a thread whose newest row is older than the cutoff has no row left, and
``forget`` deletes it from the table and from memory in the same pass,
without reading the rows again.

A forgotten thread's number is not given again while the store is open
(the table's numbers then have gaps: numbers.py reads them so). A thread
that comes back is new again: its next write stores it under a new
number. Workers never remember threads (each profile sends its own:
workers.py), so they need no word of it.

Stacks and frames stay: which of those are unused takes reading every
sample row's leaf and every stack's frames (2-3 s for a fleet hour).
"""

from __future__ import annotations

import logging

import duckdb
import numpy as np
import numpy.typing as npt

from .intern import Interner
from .numbers import Numbers

log = logging.getLogger(__name__)

#: The newest row time of a thread no row names (yet), and of a number
#: no thread has (any more).
NEVER, FORGOTTEN = np.iinfo(np.int64).min, np.iinfo(np.int64).max


class ThreadsSeen:
    """The newest sample row time (ns) of each thread number."""

    def __init__(self) -> None:
        self.newest = np.zeros(0, np.int64)

    def load(self, db: duckdb.DuckDBPyConnection) -> None:
        held = np.asarray(db.execute("SELECT num FROM threads").fetchnumpy()["num"], np.int64)
        got = db.execute("SELECT thread, max(time_ns) AS newest FROM samples "
                         "WHERE thread IS NOT NULL GROUP BY thread").fetchnumpy()
        nums = np.asarray(got["thread"], np.int64)
        self.newest = np.full(max(int(held.max(initial=-1)), int(nums.max(initial=-1))) + 1,
                              FORGOTTEN, np.int64)
        self.newest[held] = NEVER
        self.newest[nums] = np.asarray(got["newest"], np.int64)

    def _grow(self, size: int) -> None:
        if size > len(self.newest):
            grown = np.full(max(size, 2 * len(self.newest)), NEVER, np.int64)
            grown[:len(self.newest)] = self.newest
            self.newest = grown

    def saw(self, nums: npt.NDArray[np.generic], times: npt.NDArray[np.generic]) -> None:
        """Rows of these thread numbers were written at these times."""
        if len(nums):
            at = np.asarray(nums, np.intp)
            self._grow(int(at.max()) + 1)
            np.maximum.at(self.newest, at, np.asarray(times, np.int64))

    def forget(self, db: duckdb.DuckDBPyConnection, cutoff_ns: int, interner: Interner,
               numbers: Numbers) -> int:
        """After the rows older than ``cutoff_ns`` were deleted: delete the
        threads left with no row, from the table and from memory (in a
        transaction of its own, under the store's lock); how many."""
        self._grow(len(numbers))
        gone = np.flatnonzero(self.newest[:len(numbers)] < cutoff_ns)
        if not len(gone):
            return 0
        db.execute("BEGIN TRANSACTION")
        try:
            db.execute("DELETE FROM threads WHERE num IN (SELECT unnest(?::UINTEGER[]))",
                       [gone.tolist()])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        for tid in numbers.ids[gone].tolist():
            interner.threads.pop(tid, None)
        numbers.forget(gone)
        self.newest[gone] = FORGOTTEN
        log.info("store: %d threads no stored row names any more forgotten", len(gone))
        return len(gone)
