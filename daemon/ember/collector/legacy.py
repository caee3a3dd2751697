"""Stores of the first format (one SQLite file of gzip pprof blobs),
converted to the columnar store when a collector opens one.

The conversion reads every stored profile with the same bounds as a query
did, writes them into a new store beside the old file and, only when all are
in, moves the old file aside (``PATH.sqlite-v1``, kept: remove it once the
new store is trusted) and the new one into its place. A failure leaves the
old file as it was and the collector does not start, saying why. A row that
no query could read either is counted and logged, never the reason to stop.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from ..encode.pprof import from_proto
from ..errors import StorageError
from ..proto import profile_pb2 as pb
from .intern import MAX_VALUES
from .validate import DEFAULT_LIMITS, InvalidRequest, decompress, parse

log = logging.getLogger(__name__)

SQLITE_MAGIC = b"SQLite format 3\x00"
#: Where the old file goes once converted.
KEPT_SUFFIX = ".sqlite-v1"
BATCH = 200


def is_legacy(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def legacy_rows(path: Path) -> Iterator[tuple[tuple[tuple[str, str], ...], str, str, int, int,
                                              int, bytes]]:
    """(series labels, profile id, type, time, duration, samples, gzip pprof)
    of every profile in an old store, oldest first."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        series = {sid: tuple((k, v) for k, v in json.loads(labels))
                  for sid, labels in db.execute("SELECT id, labels FROM series")}
        for row in db.execute("SELECT series_id, profile_id, type, time_ns, duration_ns, "
                              "samples, data FROM profiles ORDER BY time_ns"):
            sid, pid, type_, t, d, n, data = row
            yield series.get(sid, (("__name__", ""),)), pid, type_, t, d, n, data
    finally:
        db.close()


def readable(data: bytes) -> pb.Profile:
    """A stored blob as a profile the store can take; InvalidRequest if a
    query could not have read it (rows stored before the write checks)."""
    p, _ = parse(decompress(data, DEFAULT_LIMITS.max_profile_size,
                            DEFAULT_LIMITS.max_gzip_members)[0], DEFAULT_LIMITS)
    try:
        _, samples = from_proto(p)
    except (IndexError, ValueError) as exc:  # a string index out of range, a pid not a number
        raise InvalidRequest(f"unreadable profile: {exc}") from None
    n = len(p.sample_type)
    if not 0 < n <= MAX_VALUES or any(len(s.values) != n for s in samples):
        raise InvalidRequest("sample values do not match the sample types")
    return p


def convert_if_legacy(path: Path) -> int:
    """Convert an old store at ``path`` in place; returns the profiles moved
    (0 when ``path`` is not an old store)."""
    if not is_legacy(path):
        return 0
    from .store import Store, StoredProfile
    new = path.with_name(path.name + ".converting")
    for leftover in (new, Path(f"{new}.wal")):
        leftover.unlink(missing_ok=True)  # an earlier attempt that did not finish
    started = time.monotonic()
    log.warning("%s is a store of the older SQLite format: converting it", path)
    moved = unreadable = 0
    try:
        store = Store(new)
        try:
            batch: list[StoredProfile] = []
            for labels, pid, type_, t, d, n, data in legacy_rows(path):
                try:
                    proto = readable(data)
                except InvalidRequest as exc:
                    unreadable += 1
                    log.warning("%s: profile %s cannot be read, left out: %s", path, pid, exc)
                    continue
                batch.append(StoredProfile(pid, labels, type_, t, d, n, data, proto))
                if len(batch) >= BATCH:
                    moved += store.write(batch)[0]
                    batch = []
            moved += store.write(batch)[0]
        finally:
            store.close()
    except (sqlite3.Error, StorageError) as exc:
        raise StorageError(f"{path}: converting the older store failed, it is left as it "
                           f"was: {exc}") from None
    kept = path.with_name(path.name + KEPT_SUFFIX)
    os.replace(path, kept)
    for suffix in ("-wal", "-shm"):  # its log goes with it: it may hold recent writes
        if Path(f"{path}{suffix}").exists():
            os.replace(f"{path}{suffix}", f"{kept}{suffix}")
    os.replace(new, path)
    log.warning("%s: converted %d profiles (%d unreadable, left out) in %.1f s; the old file "
                "is kept as %s", path, moved, unreadable, time.monotonic() - started, kept)
    return moved
