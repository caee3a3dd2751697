"""The collector's profile store: one SQLite file.

``series`` holds each distinct label set once; ``profiles`` holds the gzip
pprof bytes with their time, type and profile id (UNIQUE: a profile sent
twice is stored once). Writes of one request happen in one transaction, so a
request is stored whole or not at all. Retention deletes by age and, past a
size limit, oldest first.

A full disk (or another write failure) refuses the write with StorageFull
or StorageError, rolled back whole, while reads go on: the servicer answers
a retryable status, and agents keep the request spooled. The size counted
against ``max_storage_size`` is the database file and its write-ahead log
together: with WAL, recent writes live in the log until a checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import StorageError, StorageFull

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    labels TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS profiles (
    id INTEGER PRIMARY KEY,
    series_id INTEGER NOT NULL REFERENCES series(id),
    profile_id TEXT NOT NULL UNIQUE,
    type TEXT NOT NULL,
    time_ns INTEGER NOT NULL,
    duration_ns INTEGER NOT NULL,
    received_ns INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS profiles_time ON profiles(time_ns);
CREATE INDEX IF NOT EXISTS profiles_series_time ON profiles(series_id, time_ns);
"""


@dataclass(frozen=True)
class StoredProfile:
    profile_id: str
    series_labels: tuple[tuple[str, str], ...]   # sorted, includes __name__
    type: str
    time_ns: int
    duration_ns: int
    samples: int          # sum of the first sample value (for timelines)
    data: bytes           # gzip pprof


@dataclass(frozen=True)
class Row:
    labels: dict[str, str]
    type: str
    time_ns: int
    duration_ns: int
    samples: int
    data: bytes


class Store:
    def __init__(self, path: str | Path):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False,
                                       isolation_level=None)
            new = not self._db.execute("PRAGMA page_count").fetchone()[0]
            if new:  # on an existing file it is a no-op that a full disk refuses
                self._db.execute("PRAGMA auto_vacuum = INCREMENTAL")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            if new or not self._has_schema():
                self._db.executescript(SCHEMA)
        except sqlite3.Error as exc:
            raise _storage_error(f"{self.path}: cannot open the store", exc) from None

    def _has_schema(self) -> bool:
        names = {n for (n,) in self._db.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'index')")}
        return {"series", "profiles", "profiles_time", "profiles_series_time"} <= names

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _series_id(self, labels: Sequence[tuple[str, str]]) -> int:
        key = json.dumps(sorted(labels), separators=(",", ":"))
        name = dict(labels).get("__name__", "")
        row = self._db.execute("SELECT id FROM series WHERE labels = ?", (key,)).fetchone()
        if row:
            return int(row[0])
        cur = self._db.execute("INSERT INTO series(name, labels) VALUES (?, ?)", (name, key))
        return int(cur.lastrowid or 0)

    def write(self, profiles: Sequence[StoredProfile]) -> tuple[int, int]:
        """Store all or nothing; returns (stored, duplicates)."""
        now = time.time_ns()
        stored = 0
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for p in profiles:
                    sid = self._series_id(p.series_labels)
                    cur = self._db.execute(
                        "INSERT OR IGNORE INTO profiles(series_id, profile_id, type, time_ns, "
                        "duration_ns, received_ns, samples, data) VALUES (?,?,?,?,?,?,?,?)",
                        (sid, p.profile_id, p.type, p.time_ns, p.duration_ns, now, p.samples,
                         p.data))
                    stored += cur.rowcount
                self._db.execute("COMMIT")
            except BaseException as exc:
                self._rollback()
                if isinstance(exc, sqlite3.Error):
                    raise _storage_error("cannot store", exc) from None
                raise
        return stored, len(profiles) - stored

    def _rollback(self) -> None:
        """Undo an open transaction (SQLite may have rolled back already: a
        full disk ends the transaction itself)."""
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error as exc:
                log.error("store: rollback failed: %s", exc)

    def _matching_series(self, matchers: dict[str, str]) -> dict[int, dict[str, str]]:
        out = {}
        for sid, labels_json in self._db.execute("SELECT id, labels FROM series"):
            labels = dict(json.loads(labels_json))
            if all(labels.get(k) == v for k, v in matchers.items()):
                out[sid] = labels
        return out

    def query(self, start_ns: int, end_ns: int, matchers: dict[str, str],
              type_: str | None = None) -> Iterator[Row]:
        """Profiles overlapping [start_ns, end_ns) whose labels match."""
        with self._lock:
            series = self._matching_series(matchers)
            if not series:
                return iter(())
            rows = self._db.execute(
                "SELECT series_id, type, time_ns, duration_ns, samples, data FROM profiles "
                "WHERE time_ns < ? AND time_ns + duration_ns >= ? "
                + ("AND type = ? " if type_ else "") + "ORDER BY time_ns",
                (end_ns, start_ns, type_) if type_ else (end_ns, start_ns)).fetchall()
        return iter([Row(series[sid], t, ts, d, n, data) for sid, t, ts, d, n, data in rows
                     if sid in series])

    def label_names(self) -> list[str]:
        names: set[str] = set()
        with self._lock:
            for (labels_json,) in self._db.execute("SELECT labels FROM series"):
                names.update(k for k, _ in json.loads(labels_json))
        return sorted(names)

    def label_values(self, name: str) -> list[str]:
        values: set[str] = set()
        with self._lock:
            for (labels_json,) in self._db.execute("SELECT labels FROM series"):
                v = dict(json.loads(labels_json)).get(name)
                if v is not None:
                    values.add(v)
        return sorted(values)

    def types(self) -> list[str]:
        with self._lock:
            return [t for (t,) in self._db.execute("SELECT DISTINCT type FROM profiles ORDER BY 1")]

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM profiles").fetchone()[0])

    def size_bytes(self) -> int:
        """The database file and its write-ahead log, in bytes."""
        if self.path == ":memory:":
            with self._lock:
                pages = self._db.execute("PRAGMA page_count").fetchone()[0]
                size = self._db.execute("PRAGMA page_size").fetchone()[0]
            return int(pages) * int(size)
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += os.stat(self.path + suffix).st_size
        return total

    def enforce_retention(self, max_age_s: float, max_bytes: int) -> tuple[int, int]:
        """Delete old profiles, then the oldest while over max_bytes.
        Returns (deleted by age, deleted by size)."""
        cutoff = time.time_ns() - int(max_age_s * 1e9)
        with self._writing("retention"):
            by_age = self._db.execute("DELETE FROM profiles WHERE time_ns < ?",
                                      (cutoff,)).rowcount
            self._db.execute("PRAGMA incremental_vacuum")
            by_size = self._make_room(max_bytes, 0)
            if by_age or by_size:
                self._db.execute("DELETE FROM series WHERE id NOT IN "
                                 "(SELECT DISTINCT series_id FROM profiles)")
        return by_age, by_size

    def make_room(self, max_bytes: int, incoming: int = 0) -> int:
        """Before a write: delete the oldest profiles while the store and
        ``incoming`` more bytes are over max_bytes; returns how many."""
        if self.size_bytes() + incoming <= max_bytes:
            return 0  # the common case: two stat calls
        with self._writing("making room"):
            return self._make_room(max_bytes, incoming)

    def _make_room(self, max_bytes: int, incoming: int) -> int:
        incoming = incoming if incoming <= max_bytes // 2 else 0
        deleted = 0
        if self.size_bytes() + incoming > max_bytes:  # recent writes are in the log
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        while self.size_bytes() + incoming > max_bytes:
            n = self._db.execute("SELECT COUNT(*) FROM profiles").fetchone()[0]
            if not n:
                break
            deleted += self._db.execute(
                "DELETE FROM profiles WHERE id IN (SELECT id FROM profiles ORDER BY time_ns "
                "LIMIT ?)", (max(1, n // 10),)).rowcount
            self._db.execute("PRAGMA incremental_vacuum")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return deleted

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """Under the lock; an SQLite failure becomes StorageFull/StorageError."""
        with self._lock:
            try:
                yield
            except sqlite3.Error as exc:
                self._rollback()
                raise _storage_error(what, exc) from None


def _storage_error(what: str, exc: sqlite3.Error) -> StorageError:
    """StorageFull for a full disk or database, StorageError otherwise."""
    name = getattr(exc, "sqlite_errorname", "")
    if name == "SQLITE_FULL" or "full" in str(exc):
        return StorageFull(f"{what}: the disk is full ({exc})")
    return StorageError(f"{what}: {exc}")
