"""A bounded on-disk queue of export requests, oldest first.

Every request is written here before it is sent and deleted only once the
backend accepted it, so a crash, a restart or an unreachable backend loses
nothing. Files are written atomically (temporary file, fsync, rename).

What can go wrong, and what the spool does (docs/reliability.md):

- **Over its size limit**: the oldest requests are dropped, and counted.
- **The disk is full** (or the write fails otherwise: read-only, quota,
  I/O error): the request is held in memory instead, up to ``memory_max``
  bytes; past that the oldest held requests are dropped, and counted. Held
  requests are sent like the others, and written to disk as soon as a write
  succeeds again, so the spool recovers by itself when space returns.
- **An entry that cannot be read** (another user's file, a directory in a
  file's place, a read error): it is moved into ``quarantine/`` below the
  spool, logged once and counted, and the queue goes on. At most
  ``QUARANTINE_KEEP`` entries are kept there, the oldest removed first.

Entries are named ``<put time ns>-<pid>-<seq>.<suffix>``, so names sort by
age and a name tells how long its request has waited.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".writeraw"
QUARANTINE = "quarantine"
#: Quarantined entries kept for a person to look at; older ones are removed.
QUARANTINE_KEEP = 64
#: Default ceiling of requests held in memory while the disk refuses writes.
MEMORY_MAX = 32 << 20


@dataclass(frozen=True)
class Dropped:
    requests: int
    bytes: int
    profiles: int


NOTHING = Dropped(0, 0, 0)


@dataclass(frozen=True)
class Entry:
    """One queued request: a file, or held in memory (``path`` names it
    either way; ``held`` says which)."""

    path: Path
    data: bytes
    held: bool = False


def put_time_ns(name: str) -> int:
    """When the request named ``name`` was put (0 when the name is not ours)."""
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else 0


class Spool:
    def __init__(self, directory: str | Path, max_bytes: int,
                 count_profiles: Callable[[bytes], int] | None = None,
                 memory_max: int = MEMORY_MAX, suffix: str = SUFFIX,
                 on_quarantine: Callable[[], None] = lambda: None,
                 on_write_error: Callable[[], None] = lambda: None):
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.memory_max = memory_max
        self.suffix = suffix
        self.count_profiles = count_profiles or (lambda _data: 1)
        self.on_quarantine, self.on_write_error = on_quarantine, on_write_error
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._ready = threading.Condition(self._lock)
        #: requests the disk refused, by name, oldest first
        self._held: dict[str, bytes] = {}
        #: entries that could not be read nor moved away: skipped
        self._stuck: set[str] = set()
        self.write_errors = 0      # writes the disk refused
        self.quarantined = 0       # entries moved aside (or skipped) unread
        self.last_write_error = ""
        self._memory_drops = 0     # in the current run of refused writes (for the log)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in self.dir.glob(f".*{self.suffix}.tmp"):
            with contextlib.suppress(OSError):
                stale.unlink()  # a write interrupted by a crash

    def _files(self) -> list[Path]:
        return sorted(f for f in self.dir.glob(f"*{self.suffix}") if f.name not in self._stuck)

    def _name(self) -> str:
        return f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):06d}{self.suffix}"

    # --- writing ---
    def put(self, data: bytes) -> Dropped:
        """Store one request: on disk, or held in memory when the disk
        refuses; drop the oldest while over a limit."""
        return self.put_named(self._name(), data)

    def put_named(self, name: str, data: bytes) -> Dropped:
        """put() under a given name (a request split in place keeps its turn)."""
        with self._lock:
            self._unhold()
            if self._held or not self._write(name, data):
                self._held[name] = data  # behind what is held already: order kept
                dropped = self._enforce_memory()
            else:
                dropped = self._enforce_limit()
            self._ready.notify_all()
            return dropped

    def _write(self, name: str, data: bytes) -> bool:
        """Write one file atomically; False (and the reason noted) when the
        disk refuses."""
        tmp = self.dir / f".{name}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            tmp.rename(self.dir / name)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            self.write_errors += 1
            self.on_write_error()
            reason = errno.errorcode.get(exc.errno or 0, "error")
            if not self.last_write_error:
                log.error("spool %s: cannot write (%s); holding requests in memory "
                          "(up to %d bytes) until it can", self.dir, exc.strerror or exc,
                          self.memory_max)
            self.last_write_error = reason
            return False
        if self.last_write_error:
            log.warning("spool %s: writing again (%d held requests dropped meanwhile)",
                        self.dir, self._memory_drops)
            self.last_write_error = ""
            self._memory_drops = 0
        return True

    def _unhold(self) -> None:
        """Move held requests to disk, oldest first, while it accepts them."""
        while self._held:
            name = next(iter(self._held))
            if not self._write(name, self._held[name]):
                return
            del self._held[name]

    def _enforce_memory(self) -> Dropped:
        total = sum(len(d) for d in self._held.values())
        n = b = p = 0
        for name in list(self._held)[:-1]:  # never drop the request just held
            if total <= self.memory_max:
                break
            data = self._held.pop(name)
            with contextlib.suppress(Exception):
                p += self.count_profiles(data)
            total -= len(data)
            n, b = n + 1, b + len(data)
        if n:
            before, self._memory_drops = self._memory_drops, self._memory_drops + n
            if not before or self._memory_drops // 100 > before // 100:  # 1st, every 100th
                log.warning("spool %s: held requests over %d bytes of memory: dropped the "
                            "oldest (%d so far while the disk refuses writes)", self.dir,
                            self.memory_max, self._memory_drops)
        return Dropped(n, b, p)

    def _enforce_limit(self) -> Dropped:
        files = self._files()
        sizes = {}
        for f in files:
            with contextlib.suppress(OSError):
                sizes[f] = f.stat().st_size
        total = sum(sizes.values())
        n = b = p = 0
        for f in files[:-1]:  # never drop the request just written
            if total <= self.max_bytes:
                break
            size = sizes.get(f, 0)
            with contextlib.suppress(Exception):
                p += self.count_profiles(f.read_bytes())
            try:
                f.unlink()
            except FileNotFoundError:
                pass
            except OSError:
                continue  # cannot remove it: the quarantine takes it when it comes up
            total -= size
            n, b = n + 1, b + size
        if n:
            log.warning("spool over %d bytes: dropped the %d oldest requests", self.max_bytes, n)
        return Dropped(n, b, p)

    # --- reading ---
    def oldest(self, timeout: float | None = None) -> Entry | None:
        """The oldest request, waiting up to timeout for one to arrive. An
        entry that cannot be read is quarantined and skipped."""
        with self._lock:
            files = self._files()
            if not files and not self._held and timeout:
                self._ready.wait(timeout)
                files = self._files()
            held = next(iter(self._held), None)
            for f in files:
                if held is not None and held < f.name:
                    break
                try:
                    return Entry(f, f.read_bytes())
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    self._quarantine(f, exc.strerror or str(exc))
            if held is not None:
                return Entry(self.dir / held, self._held[held], held=True)
            return None

    def oldest_age_ns(self) -> int:
        """How long the oldest waiting request has waited (0: none)."""
        with self._lock:
            names = [f.name for f in self._files()[:1]] + list(self._held)[:1]
        if not names:
            return 0
        return max(0, time.time_ns() - put_time_ns(min(names)))

    # --- removing ---
    def remove(self, entry: Entry) -> None:
        with self._lock:
            if entry.held:
                self._held.pop(entry.path.name, None)
                return
            try:
                entry.path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:  # e.g. the directory turned read-only
                self._quarantine(entry.path, f"cannot remove: {exc.strerror or exc}")

    def quarantine(self, entry: Entry, reason: str) -> None:
        """Set aside a request that will never be sent (unreadable, corrupt)."""
        with self._lock:
            if entry.held:
                self._held.pop(entry.path.name, None)
                self._count_quarantined()
                log.error("spool %s: dropping held request %s: %s", self.dir,
                          entry.path.name, reason)
                return
            self._quarantine(entry.path, reason)

    def _quarantine(self, path: Path, reason: str) -> None:
        where = self.dir / QUARANTINE
        try:
            where.mkdir(mode=0o700, exist_ok=True)
            path.rename(where / path.name)
        except OSError as exc:
            self._stuck.add(path.name)
            self._count_quarantined()
            log.error("spool %s: skipping %s (%s); it cannot be moved to %s either: %s",
                      self.dir, path.name, reason, where, exc.strerror or exc)
            return
        self._count_quarantined()  # once it is moved: whoever reads the count finds it there
        log.error("spool %s: moved %s to %s: %s", self.dir, path.name, where, reason)
        kept = sorted(where.iterdir())
        for old in kept[:max(0, len(kept) - QUARANTINE_KEEP)]:
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    old.unlink()

    def _count_quarantined(self) -> None:
        self.quarantined += 1
        self.on_quarantine()

    def persist(self) -> Dropped:
        """At exit: write what is held in memory to disk; what the disk still
        refuses is lost, and returned to be counted."""
        with self._lock:
            self._unhold()
            lost = list(self._held.values())
            self._held.clear()
        if lost:
            log.error("spool %s: %d requests held in memory are lost at exit (%s)", self.dir,
                      len(lost), self.last_write_error)
        profiles = 0
        for data in lost:
            with contextlib.suppress(Exception):
                profiles += self.count_profiles(data)
        return Dropped(len(lost), sum(len(d) for d in lost), profiles)

    def wake(self) -> None:
        with self._lock:
            self._ready.notify_all()

    def stats(self) -> tuple[int, int]:
        """(requests, bytes) waiting, on disk and held in memory."""
        with self._lock:
            files = self._files()
            held = list(self._held.values())
        total = sum(len(d) for d in held)
        for f in files:
            with contextlib.suppress(OSError):
                total += f.stat().st_size
        return len(files) + len(held), total

    def held_bytes(self) -> int:
        with self._lock:
            return sum(len(d) for d in self._held.values())
