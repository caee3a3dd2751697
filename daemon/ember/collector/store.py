"""The collector's profile store: one SQLite file.

``series`` holds each distinct label set once; ``profiles`` holds the gzip
pprof bytes with their time, type and profile id (UNIQUE: a profile sent
twice is stored once). Writes of one request happen in one transaction, so a
request is stored whole or not at all. Retention deletes by age and, past a
size limit, oldest first.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

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
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # effective on a new file
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.executescript(SCHEMA)

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
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for p in profiles:
                    sid = self._series_id(p.series_labels)
                    cur = self._db.execute(
                        "INSERT OR IGNORE INTO profiles(series_id, profile_id, type, time_ns, "
                        "duration_ns, received_ns, samples, data) VALUES (?,?,?,?,?,?,?,?)",
                        (sid, p.profile_id, p.type, p.time_ns, p.duration_ns, now, p.samples,
                         p.data))
                    stored += cur.rowcount
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return stored, len(profiles) - stored

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
        with self._lock:
            pages = self._db.execute("PRAGMA page_count").fetchone()[0]
            size = self._db.execute("PRAGMA page_size").fetchone()[0]
        return int(pages) * int(size)

    def enforce_retention(self, max_age_s: float, max_bytes: int) -> tuple[int, int]:
        """Delete old profiles, then the oldest while over max_bytes.
        Returns (deleted by age, deleted by size)."""
        cutoff = time.time_ns() - int(max_age_s * 1e9)
        with self._lock:
            by_age = self._db.execute("DELETE FROM profiles WHERE time_ns < ?", (cutoff,)).rowcount
            self._db.execute("PRAGMA incremental_vacuum")
        by_size = 0
        while self.size_bytes() > max_bytes:
            with self._lock:
                n = self._db.execute("SELECT COUNT(*) FROM profiles").fetchone()[0]
                if not n:
                    break
                chunk = max(1, n // 10)
                by_size += self._db.execute(
                    "DELETE FROM profiles WHERE id IN (SELECT id FROM profiles ORDER BY time_ns "
                    "LIMIT ?)", (chunk,)).rowcount
                self._db.execute("PRAGMA incremental_vacuum")
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        with self._lock:
            self._db.execute("DELETE FROM series WHERE id NOT IN "
                             "(SELECT DISTINCT series_id FROM profiles)")
        return by_age, by_size
