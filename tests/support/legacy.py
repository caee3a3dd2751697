"""Stores of the first format (one SQLite file of gzip pprof blobs), written
as collectors before the columnar store wrote them (its schema, verbatim)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from ember.collector.store import StoredProfile

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


def write_legacy(path: Path, profiles: Sequence[StoredProfile]) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")
    db.execute("PRAGMA journal_mode = WAL")
    db.executescript(SCHEMA)
    for p in profiles:
        key = json.dumps(sorted(p.series_labels), separators=(",", ":"))
        db.execute("INSERT OR IGNORE INTO series(name, labels) VALUES (?, ?)",
                   (dict(p.series_labels).get("__name__", ""), key))
        (sid,) = db.execute("SELECT id FROM series WHERE labels = ?", (key,)).fetchone()
        db.execute("INSERT INTO profiles(series_id, profile_id, type, time_ns, duration_ns, "
                   "received_ns, samples, data) VALUES (?,?,?,?,?,?,?,?)",
                   (sid, p.profile_id, p.type, p.time_ns, p.duration_ns, time.time_ns(),
                    p.samples, p.data))
    db.close()  # leaves the write-ahead log in place only if another holds it
