"""The store's tables, and how model objects become their rows and back.

``samples`` is the big one: a row per (profile, thread, stack) with the
profile's time and series, up to MAX_VALUES values and the store generation
of the write that stored it (``written``). Everything it names
is interned (intern.py) in ``frames``, ``stacks``, ``threads`` and
``series``; the rows name a series or thread by its dense number (``num``,
numbers.py) and a (thread name, stack) by its dense leaf id (``leaves``,
leaves.py). ``profiles`` keeps a row per stored profile (its
id makes a profile sent twice stored once), with its series' number, its
type and shape (sample types and period) as JSON.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import numpy.typing as npt

from ..errors import StorageError, StorageFull
from ..model import Frame, FrameKind, Mapping
from .cluster import TABLES as CLUSTERED
from .ids import type_id
from .intern import MAX_VALUES, Interner, Rows
from .leaves import upgrade
from .numbers import upgrade as number_rows_of
from .rollup import TABLES as ROLLUPS
from .rollup import upgrade as add_spans

if TYPE_CHECKING:
    from .leaves import Pending
    from .numbers import Numbered
    from .rows import StoredProfile

log = logging.getLogger(__name__)

#: Space kept free on the store's disk beyond a write's own size: a commit
#: writes its log first, and a checkpoint may need room for a few blocks.
DISK_MARGIN = 8 << 20

SCHEMA_VERSION = "6"
#: the sample rows' columns (schema 5 and on)
SAMPLES = f"""(
    time_ns BIGINT, end_ns BIGINT,
    series UINTEGER,                               -- series.num
    type UBIGINT,
    thread UINTEGER,                               -- threads.num
    {", ".join(f"v{i} BIGINT" for i in range(MAX_VALUES))},
    leaf UINTEGER,                                 -- leaves.id of (thread name, stack)
    written UBIGINT                                -- the store generation that wrote it
)"""
PROFILES = """(
    profile_id VARCHAR PRIMARY KEY, series UINTEGER, type VARCHAR, type_id UBIGINT,
    shape VARCHAR, time_ns BIGINT, duration_ns BIGINT, received_ns BIGINT,
    samples BIGINT, bytes BIGINT)"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key VARCHAR, value VARCHAR);
CREATE TABLE IF NOT EXISTS series (id UBIGINT, name VARCHAR, labels VARCHAR, num UINTEGER);
CREATE TABLE IF NOT EXISTS frames (
    id UBIGINT, name VARCHAR, kind VARCHAR, has_mapping BOOLEAN,
    map_start UBIGINT, map_limit UBIGINT, map_offset UBIGINT, map_path VARCHAR,
    build_id VARCHAR, has_functions BOOLEAN,
    address UBIGINT, system_name VARCHAR, file VARCHAR, line BIGINT, inlined BOOLEAN);
CREATE TABLE IF NOT EXISTS stacks (id UBIGINT, frames BLOB);   -- frame ids, root first
CREATE TABLE IF NOT EXISTS threads (id UBIGINT, pid BIGINT, tid BIGINT, name VARCHAR,
                                    labels VARCHAR, num UINTEGER);
CREATE TABLE IF NOT EXISTS profiles {PROFILES};
CREATE TABLE IF NOT EXISTS samples {SAMPLES};
CREATE TABLE IF NOT EXISTS leaves (id UINTEGER, tname UBIGINT, stack UBIGINT);
{ROLLUPS}"""


def create_or_upgrade(db: duckdb.DuckDBPyConnection, path: str) -> None:
    """The tables made in a new store, or an older store's upgraded."""
    if not one(db.execute("SELECT COUNT(*) FROM information_schema.tables "
                          "WHERE table_name = 'samples'")):
        db.execute(SCHEMA)
        db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
    version = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    if version == ("2",):
        log.warning("store %s: numbering its stacks (schema 3, once)", path)
        upgrade(db)
        version = ("3",)
    if version == ("3",):
        # which write stored each row (collector/window.py slides a tree
        # through writes inside its range by it); rows stored before: 0
        db.execute("BEGIN TRANSACTION")
        db.execute("ALTER TABLE samples ADD COLUMN written UBIGINT DEFAULT 0")
        db.execute("UPDATE meta SET value = '4' WHERE key = 'schema'")
        db.execute("COMMIT")
        version = ("4",)
    if version == ("4",):
        log.warning("store %s: numbering its series and threads (schema 5, once)", path)
        number_rows_of(db, SAMPLES, PROFILES)
        version = ("5",)
    if version == ("5",):
        # roll-ups of three lengths (rollup.py): those made before are of
        # five-minute blocks; and a collector of schema 5, which would read
        # every length as five minutes, refuses the store from now on
        db.execute("BEGIN TRANSACTION")
        add_spans(db)
        db.execute("UPDATE meta SET value = '6' WHERE key = 'schema'")
        db.execute("COMMIT")
    elif version != (SCHEMA_VERSION,):
        raise StorageError(f"{path}: a store of schema {version and version[0]}, "
                           f"not {SCHEMA_VERSION}: a newer collector wrote it")
    db.execute(ROLLUPS)   # (derived: made empty where missing, filled by sealing)
    db.execute(CLUSTERED)


def one(cur: duckdb.DuckDBPyConnection) -> Any:
    """The one value a query answers."""
    row = cur.fetchone()
    if row is None:
        raise duckdb.InvalidInputException("the query answered no row")
    return row[0]


def frame_of_row(row: tuple[Any, ...]) -> Frame:
    (_, name, kind, has_mapping, start, limit, offset, path, build_id, has_functions,
     address, system_name, file, line, inlined) = row
    mapping = (Mapping(int(start), int(limit), int(offset), path, build_id, bool(has_functions))
               if has_mapping else None)
    return Frame(name, FrameKind(kind), mapping, int(address), system_name, file, int(line),
                 bool(inlined))


def frame_columns(frames: dict[int, Frame]) -> dict[str, Any]:
    fs = list(frames.values())
    n = len(fs)

    def col(get: Any, dtype: Any) -> Any:
        return np.array([get(f) for f in fs], dtype=dtype)

    def mcol(get: Any, default: Any, dtype: Any) -> Any:
        return col(lambda f: default if f.mapping is None else get(f.mapping), dtype)

    return {
        "id": np.fromiter(frames, np.uint64, n),
        "name": col(lambda f: f.name, object), "kind": col(lambda f: str(f.kind), object),
        "has_mapping": col(lambda f: f.mapping is not None, bool),
        "map_start": mcol(lambda m: m.start, 0, np.uint64),
        "map_limit": mcol(lambda m: m.limit, 0, np.uint64),
        "map_offset": mcol(lambda m: m.offset, 0, np.uint64),
        "map_path": mcol(lambda m: m.path, "", object),
        "build_id": mcol(lambda m: m.build_id, "", object),
        "has_functions": mcol(lambda m: m.has_functions, False, bool),
        "address": col(lambda f: f.address, np.uint64),
        "system_name": col(lambda f: f.system_name, object),
        "file": col(lambda f: f.file, object), "line": col(lambda f: f.line, np.int64),
        "inlined": col(lambda f: f.inlined, bool)}


def storage_error(what: str, exc: duckdb.Error) -> StorageError:
    """StorageFull for a full disk, StorageError otherwise."""
    text = str(exc)
    if "No space left" in text or "disk is full" in text.lower():
        return StorageFull(f"{what}: the disk is full ({text})")
    return StorageError(f"{what}: {text}")


def check_disk(path: str, incoming: int) -> None:
    """StorageFull before a write the disk has no room for: DuckDB's own
    failure to write may leave the database unusable until it is opened
    again, so it is not the way to find out."""
    if path == ":memory:":
        return
    try:
        st = os.statvfs(Path(path).parent)
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if free < incoming + DISK_MARGIN:
        raise StorageFull(f"the disk is full ({free} bytes free, "
                          f"{incoming + DISK_MARGIN} needed)")


def insert(db: duckdb.DuckDBPyConnection, rows: Rows, cols: dict[str, Any],
           pending: Pending, numbered: Numbered, meta: list[tuple[StoredProfile, str]],
           now: int, rollups: dict[str, Any] | None = None) -> None:
    """A write's rows into their tables, in the caller's transaction
    (``cols``: the sample rows, naming series and threads by number;
    ``rollups``: what they add to sealed blocks, rollup.py)."""
    # (series and threads as columns too: executemany ran a statement a row,
    # 10% of the writer's time at a fleet's 100 writes a second)
    if rows.new_series:
        series = list(rows.new_series.items())
        _append(db, "series", {
            "id": np.array([sid for sid, _ in series], np.uint64),
            "name": np.array([dict(json.loads(k)).get("__name__", "") for _, k in series],
                             dtype=object),
            "labels": np.array([k for _, k in series], dtype=object),
            "num": np.array([numbered.series[sid] for sid, _ in series], np.uint32)})
    if rows.new_frames:
        _append(db, "frames", frame_columns(rows.new_frames))
    if rows.new_stacks:
        _append(db, "stacks", {
            "id": np.fromiter(rows.new_stacks, np.uint64, len(rows.new_stacks)),
            "frames": np.array([array("Q", f).tobytes() for f in rows.new_stacks.values()],
                               dtype=object)})
    if rows.new_threads:
        threads = list(rows.new_threads.items())
        _append(db, "threads", {
            "id": np.array([t for t, _ in threads], np.uint64),
            "pid": np.array([k[0] for _, k in threads], np.int64),
            "tid": np.array([k[1] for _, k in threads], np.int64),
            "name": np.array([k[2] for _, k in threads], dtype=object),
            "labels": np.array([json.dumps(k[3]) for _, k in threads], dtype=object),
            "num": np.array([numbered.threads[t] for t, _ in threads], np.uint32)})
    if meta:
        ps = [sp for sp, _ in meta]
        _append(db, "profiles", {
            "profile_id": np.array([sp.profile_id for sp in ps], dtype=object),
            "series": numbered.profile_series,
            "type": np.array([sp.type for sp in ps], dtype=object),
            "type_id": np.array([type_id(sp.type) for sp in ps], np.uint64),
            "shape": np.array([shape for _, shape in meta], dtype=object),
            "time_ns": np.array([sp.time_ns for sp in ps], np.int64),
            "duration_ns": np.array([sp.duration_ns for sp in ps], np.int64),
            "received_ns": np.full(len(ps), now, np.int64),
            "samples": np.array([min(sp.samples, (1 << 63) - 1) for sp in ps], np.int64),
            "bytes": np.array([len(sp.data) for sp in ps], np.int64)})
    if len(pending.ids):
        _append(db, "leaves", pending.columns())
    if len(rows):
        _append(db, "samples", cols)
    if rollups is not None:
        _append(db, "rollups", rollups)

def _append(db: duckdb.DuckDBPyConnection, table: str, cols: dict[str, Any]) -> None:
    """Insert ``cols`` (numpy arrays) into ``table``. DuckDB reads them as
    the local variable ``_incoming`` (its scan of Python objects by name):
    registering them as a view and dropping it again cost 1.4 ms an insert,
    and a write makes three to six."""
    _incoming = cols  # (read by name by the query)
    names = ", ".join(cols)
    db.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM _incoming")


def stack_frames(cur: duckdb.DuckDBPyConnection, ids: npt.NDArray[np.uint64]) -> tuple[
        npt.NDArray[np.uint64], npt.NDArray[np.int64], npt.NDArray[np.uint64]]:
    """(stack ids, bounds, frame ids) of the stored stacks among ``ids``:
    stack ``i``'s frames, root first, are ``frames[bounds[i]:bounds[i + 1]]``.
    As arrays: the index build reads 43,000 stacks at a time, which as
    tuples of Python ints took 52 MB."""
    cur.register("_ids", {"id": ids})
    try:
        got = cur.execute("SELECT s.id, s.frames FROM stacks s SEMI JOIN _ids USING (id)"
                          ).fetchnumpy()
    finally:
        cur.unregister("_ids")
    blobs = got["frames"]
    bounds = np.zeros(len(blobs) + 1, np.int64)
    np.cumsum(np.fromiter((len(b) for b in blobs), np.int64, len(blobs)) // 8, out=bounds[1:])
    frames = np.frombuffer(b"".join(blobs), np.uint64) if len(blobs) else np.zeros(0, np.uint64)
    return np.asarray(got["id"], np.uint64), bounds, frames


def stored_ids(db: duckdb.DuckDBPyConnection, ids: list[str]) -> set[str]:
    """Which of the profile ids ``ids`` are stored."""
    try:
        return {r[0] for r in db.execute(
            "SELECT profile_id FROM profiles WHERE profile_id IN "
            "(SELECT unnest(?::VARCHAR[]))", (ids,)).fetchall()}
    except duckdb.Error as exc:
        raise storage_error("cannot store", exc) from None


def used_bytes(db: duckdb.DuckDBPyConnection, path: str) -> int:
    """The database's blocks in use and its write-ahead log, in bytes."""
    row = db.execute("PRAGMA database_size").fetchone()
    used = int(row[2]) * int(row[4]) if row else 0
    if path != ":memory:":
        with contextlib.suppress(OSError):
            used += os.stat(path + ".wal").st_size
    return used


def delete_before(db: duckdb.DuckDBPyConnection, cutoff: int) -> int:
    """Delete the profiles and rows older than ``cutoff`` (ns) in one
    transaction, with the roll-ups of the blocks that lost rows (sealed
    again from what is left); returns how many profiles."""
    n = int(one(db.execute("SELECT COUNT(*) FROM profiles WHERE time_ns < ?", (cutoff,))))
    if n:
        db.execute("BEGIN TRANSACTION")
        for table, column in (("samples", "time_ns"), ("profiles", "time_ns"),
                              ("rollups", "block"), ("seals", "block"),
                              ("clustered", "block")):
            db.execute(f"DELETE FROM {table} WHERE {column} < ?", (cutoff,))
        db.execute("COMMIT")
    return n


def load_interned(db: duckdb.DuckDBPyConnection) -> tuple[
        Interner, npt.NDArray[np.int64], dict[int, dict[str, str]], npt.NDArray[np.uint64],
        npt.NDArray[np.int64]]:
    """What a store keeps in memory of its interned tables: the interner
    (frames, stack ids, threads, series), each thread's number (in the
    interner's order), each series' labels by number, and the series' ids
    and numbers."""
    it = Interner()
    for row in db.execute("SELECT * FROM frames").fetchall():
        it.frames[int(row[0])] = frame_of_row(row)
    it.stacks.add_array(np.asarray(db.execute("SELECT id FROM stacks").fetchnumpy()["id"],
                                   np.uint64))
    nums: list[int] = []
    for tid, pid, t, name, labels, num in db.execute("SELECT * FROM threads").fetchall():
        it.threads[int(tid)] = (int(pid), int(t), name,
                                tuple((a, b) for a, b in json.loads(labels)))
        nums.append(num)
    series_labels: dict[int, dict[str, str]] = {}
    ids, snums = [], []
    for sid, _, labels, num in db.execute("SELECT * FROM series").fetchall():
        it.series[labels] = int(sid)
        series_labels[int(num)] = dict(json.loads(labels))
        ids.append(int(sid))
        snums.append(num)
    return (it, np.array(nums, np.int64), series_labels, np.array(ids, np.uint64),
            np.array(snums, np.int64))
