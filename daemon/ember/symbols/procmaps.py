"""Processes and their memory maps, read from a /proc-like directory.

``ProcFS`` reads the live ``/proc`` or a fixture directory laid out the same
way (``<pid>/maps``, ``<pid>/stat``, ``<pid>/root/...``), so everything above
it runs in unit tests without root. ``ProcessTable`` remembers each process's
maps while it is alive, so samples of a process that exited before the drain
are still symbolized from the maps it had.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..cache import BoundedCache

log = logging.getLogger(__name__)

PF_KTHREAD = 0x00200000


@dataclass(frozen=True, slots=True)
class MapEntry:
    """One line of /proc/PID/maps."""

    start: int
    end: int
    perms: str
    offset: int
    dev: str
    inode: int
    path: str

    @property
    def executable(self) -> bool:
        return "x" in self.perms

    @property
    def file_backed(self) -> bool:
        return self.inode != 0 and self.path.startswith("/")

    @property
    def deleted(self) -> bool:
        return self.path.endswith(" (deleted)")


def parse_maps(text: str) -> list[MapEntry]:
    """Parse /proc/PID/maps; malformed lines are skipped, not fatal."""
    entries = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        try:
            lo, hi = parts[0].split("-", 1)
            entries.append(MapEntry(
                start=int(lo, 16), end=int(hi, 16), perms=parts[1], offset=int(parts[2], 16),
                dev=parts[3], inode=int(parts[4]), path=parts[5] if len(parts) > 5 else "",
            ))
        except ValueError:
            continue
    entries.sort(key=lambda m: m.start)
    return entries


@dataclass(frozen=True)
class Process:
    pid: int
    start_time: int                 # clock ticks since boot; tells PID reuse apart
    kernel_thread: bool
    exe: str | None
    maps: tuple[MapEntry, ...]
    _starts: tuple[int, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def build(cls, pid: int, start_time: int, kernel_thread: bool, exe: str | None,
              maps: Iterable[MapEntry]) -> Process:
        ordered = tuple(sorted(maps, key=lambda m: m.start))
        return cls(pid, start_time, kernel_thread, exe, ordered, tuple(m.start for m in ordered))

    def find(self, address: int) -> MapEntry | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address < self.maps[i].end:
            return self.maps[i]
        return None

    def find_many(self, addresses: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """find() of many addresses in one vectorized search: the index in
        maps of the mapping covering each, -1 where none does."""
        if not self.maps:
            return np.full(len(addresses), -1, dtype=np.int64)
        starts = np.array(self._starts, dtype=np.uint64)
        ends = np.array([m.end for m in self.maps], dtype=np.uint64)
        i = np.searchsorted(starts, addresses, side="right").astype(np.int64) - 1
        inside = (i >= 0) & (addresses < ends[np.maximum(i, 0)])
        return np.where(inside, i, -1)


def stat_fields(text: str) -> list[str]:
    """The fields of a /proc stat file after comm (which may contain spaces
    and ')'), from field 3 (state) on."""
    return text[text.rindex(")") + 2:].split()


def parse_stat(text: str) -> tuple[int, int]:
    """(flags, starttime) from /proc/PID/stat."""
    rest = stat_fields(text)
    # rest[0] is field 3 (state): flags is field 9, starttime field 22.
    return int(rest[6]), int(rest[19])


class ProcFS:
    """A /proc tree: the live one, or a fixture directory with the same layout."""

    def __init__(self, root: Path = Path("/proc")):
        self.root = root

    def pids(self) -> list[int]:
        """Every process now."""
        try:
            return [int(d.name) for d in self.root.iterdir() if d.name.isdigit()]
        except OSError:
            return []

    def read(self, pid: int) -> Process | None:
        base = self.root / str(pid)
        try:
            flags, start_time = parse_stat((base / "stat").read_text())
            maps_text = (base / "maps").read_text()
        except (OSError, ValueError, IndexError):
            return None
        kernel_thread = bool(flags & PF_KTHREAD)
        maps = parse_maps(maps_text)
        if not maps and not kernel_thread:
            return None  # a zombie or an exiting process: its maps are gone
        try:
            exe: str | None = os.readlink(base / "exe")
        except OSError:
            exe = None
        return Process.build(pid, start_time, kernel_thread, exe, maps)

    def start_time(self, pid: int) -> int | None:
        """The process's start time (clock ticks since boot), None if gone."""
        try:
            return parse_stat((self.root / str(pid) / "stat").read_text())[1]
        except (OSError, ValueError, IndexError):
            return None

    def object_candidates(self, pid: int, entry: MapEntry) -> list[Path]:
        """Where the object behind a mapping can be opened, best first: through
        the process's root (its mount namespace), then map_files (works for
        deleted files), then the plain path."""
        path = entry.path.removesuffix(" (deleted)")
        base = self.root / str(pid)
        return [base / "root" / path.lstrip("/"),
                base / "map_files" / f"{entry.start:x}-{entry.end:x}",
                Path(path)]


#: A noted process's maps are read again this much later (libraries mapped).
RECHECK_S = 0.01


class ProcessTable:
    """Maps of the processes seen in recent drains.

    ``refresh`` re-reads the given PIDs (maps change with dlopen and exec). A
    PID that cannot be read any more keeps the maps it had; ``expire`` forgets
    entries not refreshed for ``keep_rounds`` rounds, so a drain right after a
    process exited can still name its frames and the table stays bounded.

    Thread-safe: a ``ProcessWatcher`` thread reads new processes' maps while
    the controller drains and symbolizes.
    """

    def __init__(self, procfs: ProcFS | None = None, keep_rounds: int = 3,
                 max_processes: int = 1 << 16):
        self.procfs = procfs or ProcFS()
        self.keep_rounds = keep_rounds
        # pid -> (its process, the round it was last seen in), least recently
        # seen first: what the memory governor gives up first
        self._table: BoundedCache[int, tuple[Process, int]] = BoundedCache(
            "process_maps", max_processes, max_bytes=256 << 20, weigh=_process_bytes)
        self._recheck: dict[int, float] = {}   # pid -> when to read its maps again
        self._round = 0
        self._lock = threading.RLock()
        # called with each process whose maps are new or changed (outside the lock)
        self.listeners: list[Callable[[Process], None]] = []

    def refresh(self, pids: Iterable[int]) -> None:
        """Read the maps of pids again. A process whose maps did not change
        stays the same Process object: what was built from it (the
        symbolizer's frames) stays valid."""
        for pid in set(pids):
            proc = self.procfs.read(pid)  # outside the lock: /proc reads are slow
            changed = False
            with self._lock:
                known = self._table.get(pid)
                if proc is not None:
                    same = known is not None and known[0] == proc
                    changed = not same
                    self._table.put(pid, (known[0] if same and known else proc, self._round))
                elif known is not None:
                    self._table.put(pid, (known[0], self._round))
            if changed and proc is not None:
                for listener in self.listeners:
                    listener(proc)

    def noted(self, pids: Iterable[int], now: float) -> None:
        """Processes the kernel just noted (new, or just exec'd): read their
        maps now, and once more ``RECHECK_S`` later, when the dynamic loader
        has mapped the libraries."""
        pids = list(pids)
        self.refresh(pids)
        with self._lock:
            for pid in pids:
                self._recheck.setdefault(pid, now + RECHECK_S)

    def recheck(self, now: float) -> float | None:
        """Re-read the maps that are due; when the next one is due (or None)."""
        with self._lock:
            due = [pid for pid, t in self._recheck.items() if t <= now]
            for pid in due:
                del self._recheck[pid]
        if due:
            self.refresh(due)
        with self._lock:
            return min(self._recheck.values(), default=None)

    @property
    def round(self) -> int:
        return self._round

    def touch(self, pids: Iterable[int]) -> None:
        """Processes in this drain: keep the maps already read (the watcher
        re-reads them at exec; the symbolizer when an address misses them),
        read the ones not known yet."""
        with self._lock:
            new = []
            for pid in set(pids):
                entry = self._table.get(pid)
                if entry is None:
                    new.append(pid)
                else:
                    self._table.put(pid, (entry[0], self._round))
        self.refresh(new)

    def discover(self, pids: Iterable[int]) -> None:
        """Read the maps of PIDs not in the table yet (cheap to call often)."""
        with self._lock:
            new = [pid for pid in pids if pid not in self._table]
        self.refresh(new)

    def expire(self) -> None:
        """End a round: forget what was not refreshed in the last rounds."""
        with self._lock:
            self._round += 1
            for pid, (_, seen) in self._table.items():
                if self._round - seen > self.keep_rounds:
                    self._table.pop(pid)

    def get(self, pid: int) -> Process | None:
        with self._lock:
            entry = self._table.get(pid)
        if entry is None:
            self.refresh([pid])
            with self._lock:
                entry = self._table.get(pid)
        return entry[0] if entry else None

    def __len__(self) -> int:
        return len(self._table)


def _process_bytes(entry: tuple[Process, int]) -> int:
    """A MapEntry with its path string is about 250 bytes."""
    return 250 * len(entry[0].maps) + 200


#: How much the watcher thread raises its own priority above the process's
#: (nice steps; best effort: lowering nice below 0 needs CAP_SYS_NICE).
WATCHER_PRIORITY = 5


class ProcessWatcher:
    """A thread that reads a process's maps as soon as the kernel notes it
    (``wait(timeout)`` returns the PIDs noted, from the programs' rings), and
    again ``RECHECK_S`` later; the controller's drains cannot delay it, so a
    process living 30 ms is read while it lives.

    On a saturated machine that also takes being scheduled at once: the
    thread runs WATCHER_PRIORITY nice steps above the rest of ember where it
    may (as root; the agent's unit runs all of it at Nice=-5), and the
    session shortens the GIL's switch interval so a drain holding the GIL
    cannot keep it waiting for long."""

    def __init__(self, table: ProcessTable, wait: Callable[[float], list[int]],
                 max_wait: float = 1.0):
        self.table = table
        self.wait = wait
        self.max_wait = max_wait
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ember-procs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        _raise_priority(WATCHER_PRIORITY)
        while not self._stop.is_set():
            now = time.monotonic()
            due = self.table.recheck(now)
            timeout = self.max_wait if due is None else min(self.max_wait, max(0.0, due - now))
            try:
                fresh = self.wait(timeout)
            except Exception:  # a closed ring at shutdown
                if self._stop.is_set():
                    return
                raise
            if fresh:
                self.table.noted(fresh, time.monotonic())


def _raise_priority(steps: int) -> None:
    """Lower the calling thread's nice value by steps, if allowed."""
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):  # EACCES without CAP_SYS_NICE: as the process is
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) - steps)
