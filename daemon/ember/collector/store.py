"""The collector's profile store: one DuckDB file, columns made for profiles.

A profile is not kept as a blob: its samples become rows of ``samples``
(time, series, type, thread, leaf, values), and what the rows name, the
frames, stacks, threads and series, is interned under 64-bit content hashes
(intern.py) and written once; the rows name them by dense numbers
(numbers.py, leaves.py). A query over an hour of a fleet is then one
aggregation over columns instead of decoding every stored profile
(docs/storage.md has the measurements that chose DuckDB).

``profiles`` keeps one row per stored profile: its id (UNIQUE: a profile
sent twice is stored once), time, type and shape (sample types, period).
A request is stored whole or not at all. Retention deletes by age and, past
a size limit (blocks in use and the write-ahead log), oldest first, and
then the threads and series no row names (garbage.py).

A write the disk cannot take is refused before it starts (StorageFull, from
the free space), and any other write failure rolls back whole (StorageError)
while reads go on: the servicer answers a retryable status, and agents keep
the request spooled. A store of the older SQLite format is converted when
the collector opens it (legacy.py), and the old file is kept beside it; one
of schema 2 to 4 is upgraded in place (tables.create_or_upgrade).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import duckdb
import numpy as np
import numpy.typing as npt

from ..encode.folded import clean
from ..errors import StorageError
from ..httpserve import holding
from ..model import ProfileType
from . import garbage, merge
from .blocksums import BlockSums
from .cluster import Clusterer
from .ids import labels_json, series_id, thread_name_id, type_id
from .intern import Interner, Rows
from .leaves import PERFECT_BITS, Leaves
from .matchers import Matchers, Matches, selector
from .numbers import Numbers, numbered_rows
from .rollup import Seals, seal, unsealed
from .rows import Aggregate, Queue, Row, StoredProfile, Write, as_sent, rows_of, shape_of
from .tables import (
    check_disk,
    create_or_upgrade,
    delete_before,
    insert,
    load_interned,
    one,
    stack_frames,
    storage_error,
    stored_ids,
    used_bytes,
)

__all__ = ["Aggregate", "Row", "Store", "StoredProfile"]

log = logging.getLogger(__name__)

#: How long a measured store size stands (size_bytes)
SIZE_FRESH_S = 1.0
#: DuckDB's threads
THREADS = 2


class Store:
    def __init__(self, path: str | Path, memory_limit: str = "48MB"):
        self.path = str(path)
        self._lock = threading.Lock()
        self._reading = threading.Lock()   # one large read at a time (reading)
        self._clustering = threading.Lock()   # (close waits for a block's move)
        self._clusterer = Clusterer(THREADS, memory_limit)
        self._closed = False
        self._queue = Queue()   # writes waiting for the lock
        # bumped by every change: query caches key on it, and each sample row
        # keeps the generation of the write that stored it (``written``)
        self.generation = 0
        self._deleted = 0       # the generation of the last deletion
        self._written: dict[int, int] = {}   # series number -> the generation last writing it
        self._last_written = 0               # ... any series
        self._sized, self._grown = (-SIZE_FRESH_S, 0), 0    # size_bytes: (when, bytes)
        self.interner = Interner()
        self._series_labels: dict[int, dict[str, str]] = {}   # by series number
        self.matches = Matches()   # (what each selector matched: told when those change)
        self.series_nums, self.thread_nums = Numbers("series"), Numbers("threads")
        self.seen = garbage.Seen()   # each thread's and series' newest row, to forget them
        self._shapes: dict[int, list[tuple[str, ProfileType]]] = {}   # type id -> shapes
        self._types: dict[str, int] = {}
        self.thread_names: dict[int, str] = {}   # thread name id -> name (cleaned)
        self.leaves = Leaves()
        self.seals = Seals()
        self.block_sums = BlockSums()   # sealed blocks' sums merges read (blocksums.py)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            from .legacy import convert_if_legacy  # a store of the older format
            convert_if_legacy(Path(self.path))
        self._memory_limit = memory_limit
        self._open()

    def _open(self) -> None:
        try:
            self._db = duckdb.connect(self.path)
            # DuckDB's buffers (column blocks, the merges' tables): a fleet hour's
            # merges, one at a time (reading), run as fast at 64 MB as at 1 GB,
            # and at 48 MB as at 64 (which held 30-60 MB more RSS at the start)
            self._db.execute(f"SET memory_limit = '{self._memory_limit}'")
            self._db.execute(f"SET threads = {THREADS}")
            self._db.execute("SET preserve_insertion_order = false")
            self._db.execute(f"SET GLOBAL perfect_ht_threshold = {PERFECT_BITS}")
            create_or_upgrade(self._db, self.path)
            self._load()
        except duckdb.Error as exc:
            raise storage_error(f"{self.path}: cannot open the store", exc) from None

    def _load(self) -> None:
        """The interned ids and small tables, into memory."""
        db = self._db
        it, thread_nums, self._series_labels, sids, snums = load_interned(db)
        self.matches.changed()
        self.thread_nums.load(np.fromiter(it.threads, np.uint64, len(it.threads)), thread_nums)
        self.series_nums.load(sids, snums)
        self.thread_names = {thread_name_id(k[2]): clean(k[2]) for k in it.threads.values()}
        self._shapes, self._types = {}, {}
        for type_, tid_, shape in db.execute(
                "SELECT type, type_id, shape FROM profiles GROUP BY ALL "
                "ORDER BY min(time_ns)").fetchall():
            self._note_type(type_, int(tid_), shape)
        self.interner = it
        self.leaves.load(db)
        self.seals.load(db)
        self.seen.load(db)
        # on from the newest write stored (rows, seals): a generation stays unique
        self.generation = max(self.generation, int(one(db.execute(
            "SELECT greatest((SELECT COALESCE(max(written), 0) FROM samples), "
            "(SELECT COALESCE(max(written), 0) FROM seals))"))))
        self._deleted, self._sized = self.generation, (time.monotonic(), self._size())

    def _note_type(self, type_: str, tid: int, shape: str) -> None:
        self._types[type_] = tid
        shapes = self._shapes.setdefault(tid, [])
        if all(s != shape for s, _ in shapes):
            shapes.append((shape, shape_of(shape)))

    def close(self) -> None:
        with self._clustering, self._lock, contextlib.suppress(duckdb.Error):
            self._closed = True
            self._db.close()

    # --- writing ---
    def write(self, profiles: Sequence[StoredProfile],
              made: Sequence[tuple[str, Rows]] = ()) -> tuple[int, int]:
        """Store all or nothing; returns (stored, duplicates). ``made``: each
        profile's shape and rows, made by a worker (collector/workers.py).

        Writes that wait for one another go in one transaction (a group
        commit: the one that gets the lock writes every write queued by
        then, waiting briefly for more under load: rows.Queue). A request
        is still stored whole or not at all; a failure fails every request
        of its transaction, and each is retried."""
        mine = Write(profiles, made)
        self._queue.add(mine)
        with self._lock:
            while not mine.done:   # (a write held back is taken again: rows_of)
                batch, held = self._queue.take(), []
                try:
                    held = self._write(batch)
                except BaseException as exc:
                    for w in batch:
                        w.error = exc
                finally:
                    for w in batch:
                        w.done = w not in held
                    self._queue.add(*held)
        if mine.error is not None:
            raise mine.error
        return mine.result

    def _write(self, batch: list[Write]) -> list[Write]:
        """The batch in one transaction but the writes held for the next
        (returned: rows_of). Stored profile ids are looked up only when the
        insert meets one (a retry): 1 ms of a 7 ms write, every time."""
        now = time.time_ns()
        rows, meta, held = rows_of(self.interner, batch, set(), hold=True)
        if (held and not meta) or self._commit(rows, meta, now):
            return held
        batch = [w for w in batch if w not in held]
        have = stored_ids(self._db, [sp.profile_id for w in batch for sp in w.profiles])
        if not self._commit(*rows_of(self.interner, batch, have)[:2], now):
            raise StorageError("cannot store: a profile id is stored but not found")
        return held

    def _commit(self, rows: Rows, meta: list[tuple[StoredProfile, str]], now: int) -> bool:
        """Write the rows of a request in one transaction (under the lock).
        False, writing nothing, if one of its profiles is stored already."""
        incoming = sum(len(sp.data) for sp, _ in meta) * 4 + len(rows) * 64
        check_disk(self.path, incoming)
        cols = dict(rows.columns())   # (its own: the rows' arrays stay as they are)
        cols["leaf"], pending = self.leaves.ids(np.asarray(cols.pop("tname"), np.uint64),
                                                np.asarray(cols.pop("stack"), np.uint64))
        cols["written"] = np.full(len(rows), self.generation + 1, np.uint64)
        numbered, new_series, new_threads = numbered_rows(
            self.series_nums, self.thread_nums, rows, cols,
            [series_id(labels_json(sp.series_labels)) for sp, _ in meta])
        # a type stored with a second shape loses its roll-ups (rollup.py)
        unrolled = set()
        for sp, shape in meta:
            known = self._shapes.get(type_id(sp.type))
            if known and all(s != shape for s, _ in known):
                unrolled.add(type_id(sp.type))
        late = self.seals.late(cols, unrolled)
        if late is not None:   # (told before the commit: at worst a kept sum is read again)
            self.block_sums.touched(late["type"], late["span"], late["block"],
                                    self.generation + 1)
        try:
            self._db.execute("BEGIN TRANSACTION")
            for t in unrolled:
                self._db.execute("DELETE FROM rollups WHERE type = ?", (t,))
                self._db.execute("DELETE FROM seals WHERE type = ?", (t,))
            insert(self._db, rows, cols, pending, numbered, meta, now, late)
            self._db.execute("COMMIT")
        except duckdb.ConstraintException:  # (profiles' key, the only one)
            self._rollback()
            return False
        except BaseException as exc:
            self._rollback()
            if isinstance(exc, duckdb.Error):
                raise storage_error("cannot store", exc) from None
            raise
        # (after the commit: a write that failed leaves the seals as stored)
        self.seals.forget_types(unrolled)
        self.interner.commit(rows)
        self.leaves.commit(pending)
        self.series_nums.commit(new_series)
        self.thread_nums.commit(new_threads)
        self.seen.saw(cols, numbered.profile_series, [sp.time_ns for sp, _ in meta])
        for key in rows.new_threads.values():
            self.thread_names.setdefault(thread_name_id(key[2]), clean(key[2]))
        for sid, labels in rows.new_series.items():
            self._series_labels[numbered.series[sid]] = dict(json.loads(labels))
            self.matches.changed()
        for sp, shape in meta:
            self._note_type(sp.type, type_id(sp.type), shape)
        if meta:
            self.generation += 1
            for num in set(np.unique(cols["series"]).tolist()) | set(
                    numbered.profile_series.tolist()):
                self._written[num] = self.generation
            self._last_written = self.generation
        self._grown += incoming
        return True

    def append(self, rows: Rows, meta: list[tuple[StoredProfile, str]]) -> None:
        """Rows made by the caller (a benchmark's generated hour)."""
        with self._lock:
            if not self._commit(rows, meta, time.time_ns()):
                raise StorageError("a profile of these rows is stored already")

    def _rollback(self) -> None:
        try:
            self._db.execute("ROLLBACK")
        except duckdb.Error as exc:
            if "no transaction is active" not in str(exc):
                log.error("store: rollback failed (%s): opening the store again", exc)
                with contextlib.suppress(duckdb.Error):
                    self._db.close()
                with contextlib.suppress(StorageError):
                    self._open()

    # --- reading ---
    def series_matching(self, matchers: Matchers) -> list[int]:
        """The numbers of the series the matchers select (matchers.py)."""
        return self.matches.of(selector(matchers), self._series_labels)

    def generation_of(self, series: Sequence[int]) -> int:
        """The newest generation that changed what these series (numbers)
        hold: the last write to one of them, or a deletion (of any, or the
        store's opening). Query caches key on it, so a write to one host
        leaves the answers about the others as they were (a roll-up changes
        no answer: it bumps the store's generation, not this)."""
        if len(series) >= len(self._series_labels):
            newest = self._last_written
        else:
            written = self._written
            newest = max((written.get(s, 0) for s in series), default=0)
        return max(newest, self._deleted)

    def deleted_since(self, generation: int) -> bool:
        """Whether rows were deleted after ``generation`` (or the store opened)."""
        return self._deleted > generation

    def series_labels(self, num: int) -> dict[str, str]:
        """The labels of a series by its number."""
        return self._series_labels.get(num, {})

    def type_id(self, type_: str) -> int | None:
        return self._types.get(type_)

    def shapes(self, type_: str) -> list[ProfileType]:
        tid = self._types.get(type_)
        return [s for _, s in self._shapes.get(tid, [])] if tid is not None else []

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own for one reader thread."""
        with self._lock:
            return self._db.cursor()

    @contextlib.contextmanager
    def reading(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor of its own for a large read (a merge, the index's stacks, a
        range read back), while no other large read runs: one at a time holds
        DuckDB within ``memory_limit`` (a fleet hour's merge into 800,000 leaves
        holds tens of MB; two at once failed at 64 MB), and on two cores two
        merges at once are no faster. A request whose client left stops waiting."""
        with contextlib.closing(self.cursor()) as cur, holding(self._reading):
            yield cur

    def aggregate(self, start_ns: int, end_ns: int, matchers: Matchers,
                  type_: str, by_name: bool = False, value: int | None = None,
                  upto: int | None = None, gained: tuple[int, int] | None = None,
                  ended_before: int | None = None, raw: bool = False) -> Aggregate | None:
        """The samples of one type in a range, summed per (thread, stack),
        or per (thread name, stack) with ``by_name`` (all the flame graph
        needs, and far fewer groups over a fleet); None when no stored
        profile matches (merge.py). ``value``: only that sample type summed
        (each costs as much again over a fleet's hour); the others are None.

        These narrow the rows summed, not the count of profiles: ``upto``,
        those written by that generation (a tree is of one generation);
        ``gained`` (old end, old generation), those newer than the old end
        or written after the old generation; ``ended_before``, those ended
        before it: what a range gained or lost since a tree of another
        range and generation (collector/window.py). ``raw``: a few series'
        rows by name as read, not summed (Aggregate.rows: a tree sums them)."""
        return merge.aggregate(self, start_ns, end_ns, matchers, type_, by_name, value, upto,
                               gained, ended_before, raw)

    def timeline(self, start_ns: int, end_ns: int, matchers: Matchers, type_: str
                 ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                            npt.NDArray[np.int64]]:
        """(time_ns, series number, samples) of each profile of the range: arrays, in no order."""
        return merge.timeline(self, start_ns, end_ns, matchers, type_)

    def series_count(self) -> int:
        return len(self._series_labels)

    def query(self, start_ns: int, end_ns: int, matchers: Matchers,
              type_: str | None = None) -> list[Row]:
        """Each stored profile of the range whose labels match, as sent (rows.as_sent)."""
        return as_sent(self, start_ns, end_ns, matchers, type_)

    def stacks(self, ids: npt.NDArray[np.uint64]) -> dict[int, tuple[int, ...]]:
        """Frame ids (root first) of stacks."""
        with contextlib.closing(self.cursor()) as cur:
            sids, bounds, frames = stack_frames(cur, ids)
        return {sid: tuple(frames[a:b].tolist()) for sid, a, b
                in zip(sids.tolist(), bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)}

    def stored_leaves(self) -> npt.NDArray[np.uint32]:
        """The leaf id of every (thread name, stack) some sample row holds."""
        return merge.stored_leaves(self)

    def label_names(self) -> list[str]:
        return sorted({k for labels in list(self._series_labels.values()) for k in labels})

    def label_values(self, name: str) -> list[str]:
        return sorted({v for labels in list(self._series_labels.values())
                       if (v := labels.get(name)) is not None})

    def types(self) -> list[str]:
        return sorted(self._types)

    def count(self) -> int:
        with self._lock:
            return int(one(self._db.execute("SELECT COUNT(*) FROM profiles")))

    def size_bytes(self) -> int:
        """The database's blocks in use and its write-ahead log, in bytes:
        measured at most every ``SIZE_FRESH_S``, when the lock is free (each
        write asks first, and waited a transaction more for it), else the
        most the writes since can have added."""
        at, size = self._sized
        if time.monotonic() - at < SIZE_FRESH_S or not self._lock.acquire(blocking=False):
            return size + self._grown
        try:
            size = self._size()
            self._sized, self._grown = (time.monotonic(), size), 0
        except duckdb.Error:
            return 0
        finally:
            self._lock.release()
        return size

    def seal(self, now_ns: int) -> bool:
        """Roll up the next closed block not yet sealed of a type stored
        with one shape (rollup.unsealed: five-minute blocks first, oldest
        first), in a write of its own; False when none is left. One at a
        time: a block of a fleet is a third of a second of the store's lock
        or more, and writes wait for it."""
        for tid, shapes in list(self._shapes.items()):
            if len(shapes) != 1:
                continue
            with self._writing("sealing"):
                todo = unsealed(self._db, tid, now_ns, self.seals.blocks(tid))
                if not todo:
                    continue
                generation = self.generation + 1
                with self._reading:   # (a large read too)
                    self._db.execute("BEGIN TRANSACTION")
                    seal(self._db, tid, todo[0], generation,
                         len(shapes[0][1].sample_types))
                    self._db.execute("COMMIT")
                self.generation = generation
                self.seals.sealed(tid, todo[0], generation)
                return True
        return False

    def cluster(self) -> int | None:
        """One move of cluster.Clusterer.step on a cursor of its own, beside the writes (not
        under the store's lock); StorageError if it failed (a conflict, a full disk: retried)."""
        with self._clustering:
            if self._closed:
                return None
            try:
                with contextlib.closing(self.cursor()) as cur:
                    return self._clusterer.step(cur, self._reading)
            except duckdb.Error as exc:
                raise storage_error("clustering a block", exc) from None

    # --- retention ---
    def enforce_retention(self, max_age_s: float, max_bytes: int) -> tuple[int, int]:
        """Delete old profiles, then the oldest while over max_bytes.
        Returns (deleted by age, deleted by size)."""
        cutoff = time.time_ns() - int(max_age_s * 1e9)
        with self._writing("retention"):
            by_age = self._delete_before(cutoff)
            by_size = self._make_room(max_bytes, 0)
        return by_age, by_size

    def make_room(self, max_bytes: int, incoming: int = 0) -> int:
        """Before a write: delete the oldest profiles while the store and
        ``incoming`` more bytes are over max_bytes; returns how many."""
        if self.size_bytes() + incoming <= max_bytes:
            return 0
        with self._writing("making room"):
            return self._make_room(max_bytes, incoming)

    def _delete_before(self, cutoff: int) -> int:
        n = delete_before(self._db, cutoff)
        if n:
            self.seals.forget_before(cutoff)
            self.block_sums.forget_before(cutoff)
            self._db.execute("CHECKPOINT")
            self.generation += 1
            self._deleted = self.generation
            self._sized, self._grown = (time.monotonic(), self._size()), 0
            self.seen.forget(self._db, cutoff, self.interner, (self.thread_nums, self.series_nums),
                             self._series_labels, self._written)
            self.matches.changed()
        return n

    def _make_room(self, max_bytes: int, incoming: int) -> int:
        incoming = incoming if incoming <= max_bytes // 2 else 0
        deleted = 0
        if self._size() + incoming > max_bytes:
            self._db.execute("CHECKPOINT")  # recent writes are in the log
        while self._size() + incoming > max_bytes:
            n = int(one(self._db.execute("SELECT COUNT(*) FROM profiles")))
            if not n:
                break
            cutoff = one(self._db.execute(
                "SELECT max(time_ns) + 1 FROM (SELECT time_ns FROM profiles ORDER BY time_ns "
                "LIMIT ?)", (max(1, n // 10),)))
            deleted += self._delete_before(int(cutoff))
        return deleted

    def _size(self) -> int:
        """size_bytes, under the lock."""
        return used_bytes(self._db, self.path)

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """Under the lock; a DuckDB failure becomes StorageFull/StorageError."""
        with self._lock:
            try:
                yield
            except duckdb.Error as exc:
                self._rollback()
                raise storage_error(what, exc) from None


