"""Unwind tables of the profiled processes, in the kernel's maps.

The programs walk a process's user stack from CFI rows when its executable
mappings are in ``ember_unwind_procs``; each mapping points at its object's
rows in ``ember_unwind_rows``, one array for every object. This module keeps
both: an object's rows are written once (an object is loaded by identity:
build id, else device and inode) and shared by every process mapping it; a
process's entry lists its executable mappings sorted by address, with the
bias from its addresses to the object's.

Bounded and visible: the rows array has a fixed size (from bpf_map_memory).
When an object does not fit, tables no live process uses are evicted, oldest
first, never the ones in use; if it still does not fit, its mapping gets no
rows and the walk takes its frames by frame pointers. Every outcome is
counted (``LoaderStats``), and the processes' ``ember_unwind_procs`` entries
go when the processes do (``sweep``).

Building a table takes 50-150 ms for a big object (python3.11, libcrypto;
the disk cache makes it a few ms after), more than the process watcher may
spend, so it runs on a worker thread of its own: ``submit`` never blocks.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .. import abi
from ..cache import BoundedCache
from ..errors import EmberError
from ..symbols.elf import ElfSymbols
from ..symbols.procmaps import MapEntry, Process, ProcFS
from .tables import DiskUnwindCache, UnwindTable, build_table

log = logging.getLogger(__name__)

ROW_BYTES = 12  # a packed ember_unwind_row
_SCAN = "scan"  # a worker job: every process of the host


class UnwindTarget(Protocol):
    """One program's unwind maps (kernel/maps.UnwindMaps)."""

    @property
    def row_capacity(self) -> int: ...
    @property
    def process_capacity(self) -> int: ...
    def write_rows(self, start: int, rows: bytes) -> None: ...
    def set_process(self, pid: int, proc: abi.UnwindProc) -> None: ...
    def forget_process(self, pid: int) -> None: ...
    def set_python(self, pid: int, value: abi.PyProc) -> None: ...
    def forget_python(self, pid: int) -> None: ...


class RuntimeFinder(Protocol):
    """Language runtimes whose frames BPF walks too (runtimes/cpython.py):
    asked at each load of a process's tables."""

    def bpf_value(self, proc: Process) -> abi.PyProc | None: ...
    def forget(self, pids: Iterable[int]) -> None: ...


@dataclass
class LoaderStats:
    """What the loader did, for /metrics and the bench."""

    tables_loaded: int = 0          # objects whose rows were written
    tables_evicted: int = 0         # unused objects dropped to make room
    tables_failed: dict[str, int] = field(default_factory=dict)  # by reason
    rows_loaded: int = 0            # rows in the array now
    processes: int = 0              # processes with tables now
    processes_dropped: int = 0      # not loaded: the process map was full
    mappings_dropped: int = 0       # executable mappings past UNWIND_MAPPINGS
    build_seconds: float = 0.0      # spent building or reading tables


@dataclass
class _Object:
    """An object whose rows are in the array."""

    start: int
    count: int
    users: set[int] = field(default_factory=set)
    last_used: float = 0.0


@dataclass(frozen=True)
class _Known:
    """What the loader keeps of an object, loaded or not: its headers
    (where it was opened, its load segments, its build id), never its rows
    (they live in the kernel; an evicted object is read again, from the disk
    cache when there is one)."""

    elf: ElfSymbols | None             # None: no usable table (counted in tables_failed)


class RowAllocator:
    """First fit over [0, capacity): objects take contiguous row ranges."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.free: list[tuple[int, int]] = [(0, capacity)] if capacity else []

    def take(self, n: int) -> int | None:
        for i, (start, size) in enumerate(self.free):
            if size >= n:
                if size == n:
                    del self.free[i]
                else:
                    self.free[i] = (start + n, size - n)
                return start
        return None

    def give(self, start: int, n: int) -> None:
        self.free.append((start, n))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for s, size in self.free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((s, size))
        self.free = merged


def _reason(exc: EmberError) -> str:
    """A metric label for why an object has no table: the error's label."""
    return exc.label


def _object_key(entry: MapEntry) -> tuple[str, int]:
    return entry.dev, entry.inode


class TableLoader:
    """Loads the tables of processes into every program's unwind maps."""

    def __init__(self, targets: Sequence[UnwindTarget], cache_dir: Path | None = None,
                 procfs: ProcFS | None = None, runtimes: RuntimeFinder | None = None):
        if not targets:
            raise ValueError("no unwind maps to load into")
        self.targets = list(targets)
        self.disk = DiskUnwindCache(cache_dir) if cache_dir is not None else None
        self.procfs = procfs or ProcFS()
        self.rows = RowAllocator(min(t.row_capacity for t in self.targets))
        self.max_processes = min(t.process_capacity for t in self.targets)
        self.stats = LoaderStats()
        # CPython processes: their frames walked too (runtimes/)
        self.runtimes = runtimes
        self._known: BoundedCache[tuple[str, int], _Known] = BoundedCache(
            "unwind_objects", 1 << 14)
        self._loaded: dict[tuple[str, int], _Object] = {}
        self._processes: dict[int, tuple[int, set[tuple[str, int]]]] = {}  # pid -> start, objects
        # objects that did not fit, with the value of _freed then: tried
        # again only once some table has lost its last user
        self._no_room: dict[tuple[str, int], int] = {}
        self._freed = 0
        self._lock = threading.Lock()
        # a process to load, _SCAN (every process of the host), or None (stop)
        self._queue: queue.Queue[Process | str | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._exclude: set[int] = set()

    # --- the worker ---
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ember-unwind", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=10)

    def submit(self, proc: Process) -> None:
        """Load proc's tables soon (on the worker thread)."""
        if proc.kernel_thread or not proc.maps:
            return
        self._idle.clear()
        self._queue.put(proc)

    def submit_all(self, exclude: Iterable[int] = ()) -> None:
        """Load the tables of every process of the host soon (at start: their
        first samples are whole stacks, and the tables' memory is what the
        host needs), except those in exclude (ember itself)."""
        self._exclude = set(exclude)
        self._idle.clear()
        self._queue.put(_SCAN)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every submitted process is loaded (True) or timeout."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        """Processes with events first: the host-wide scan takes one process
        at a time, whenever no submitted process waits (a busy process
        noted by its first sample must not wait for the whole host)."""
        scan: list[int] = []
        while True:
            try:
                job = self._queue.get(block=not scan)
            except queue.Empty:
                self._scan_one(scan.pop())
                job = ""
            if job is None:
                return
            if job == _SCAN:
                scan = sorted(set(self.procfs.pids()) - self._exclude, reverse=True)
            elif isinstance(job, Process):
                self._load_logged(job)
            if not scan and self._queue.empty():
                self._idle.set()

    def _scan_one(self, pid: int) -> None:
        with self._lock:
            if pid in self._processes:
                return  # loaded already, from its events
        proc = self.procfs.read(pid)
        if proc is not None and not proc.kernel_thread:
            self._load_logged(proc)

    def _load_logged(self, proc: Process) -> None:
        try:
            self.load(proc)
        except EmberError as exc:
            log.warning("unwind tables of pid %d: %s", proc.pid, exc)
        except Exception:  # never kill the worker: the walk falls back to frame pointers
            log.exception("unwind tables of pid %d", proc.pid)

    # --- loading ---
    def load(self, proc: Process) -> None:
        """Write proc's mappings (and any object rows not loaded yet)."""
        with self._lock:
            known = self._processes.get(proc.pid)
            if known is None and len(self._processes) >= self.max_processes:
                self.stats.processes_dropped += 1
                return
        entries = [m for m in proc.maps if m.executable]
        if len(entries) > abi.UNWIND_MAPPINGS:
            self.stats.mappings_dropped += len(entries) - abi.UNWIND_MAPPINGS
            entries = entries[:abi.UNWIND_MAPPINGS]
        value = abi.UnwindProc()
        used: set[tuple[str, int]] = set()
        for i, entry in enumerate(entries):
            m = value.maps[i]
            m.start, m.end = entry.start, entry.end
            if not entry.file_backed or entry.deleted:
                continue  # JIT, anonymous, vdso: frame pointers
            key = _object_key(entry)
            elf = self._know(proc.pid, entry, key).elf
            vaddr = (elf.vaddr_of_mapping(entry.offset, entry.executable)
                     if elf is not None else None)
            if elf is None or vaddr is None:
                continue
            obj = self._place(key, elf)
            if obj is None:
                continue
            m.bias = (entry.start - vaddr) & 0xFFFF_FFFF_FFFF_FFFF
            m.row_start, m.row_count = obj.start, obj.count
            used.add(key)
        value.count = len(entries)
        with self._lock:
            now = time.monotonic()
            for key in used:
                self._loaded[key].users.add(proc.pid)
                self._loaded[key].last_used = now
            old = self._processes.get(proc.pid)
            self._processes[proc.pid] = (proc.start_time, used)
            if old is not None:
                for key in old[1] - used:
                    self._release(key, proc.pid)
            self.stats.processes = len(self._processes)
        for t in self.targets:
            t.set_process(proc.pid, value)
        if self.runtimes is not None:
            py = self.runtimes.bpf_value(proc)
            for t in self.targets:
                if py is not None:
                    t.set_python(proc.pid, py)
                else:  # not (or no longer, after an exec) an interpreter
                    t.forget_python(proc.pid)

    def _know(self, pid: int, entry: MapEntry, key: tuple[str, int]) -> _Known:
        """Open the object once: where, and its load segments."""
        info = self._known.get(key)
        if info is not None:
            return info
        info = _Known(None)
        for path in self.procfs.object_candidates(pid, entry):
            try:
                elf = ElfSymbols(path, symbols=False)
            except EmberError as exc:
                if isinstance(exc.__cause__, FileNotFoundError):
                    continue
                self._failed(_reason(exc))
                log.debug("no unwind table for %s: %s", entry.path, exc)
                break
            info = _Known(elf)
            break
        else:
            self._failed("unreadable")
        self._known.put(key, info)
        return info

    def _table(self, path: Path, elf: ElfSymbols) -> UnwindTable:
        """From the disk cache by build id, else built (and stored)."""
        if self.disk is not None and elf.build_id:
            table = self.disk.load(elf.build_id, str(path))
            if table is not None:
                return table
        table = build_table(path, elf=elf)
        if self.disk is not None:
            self.disk.store(table)
        return table

    def _failed(self, reason: str) -> None:
        self.stats.tables_failed[reason] = self.stats.tables_failed.get(reason, 0) + 1

    def _place(self, key: tuple[str, int], elf: ElfSymbols) -> _Object | None:
        """The object's rows in the array: loaded now if they were not."""
        with self._lock:
            obj = self._loaded.get(key)
            if obj is not None:
                return obj
            if self._no_room.get(key) == self._freed:
                return None  # nothing was given up since it did not fit
        t0 = time.monotonic()
        try:
            table = self._table(Path(elf.path), elf)
        except EmberError as exc:
            self._failed(_reason(exc))
            log.debug("no unwind table for %s: %s", elf.path, exc)
            self._known.put(key, _Known(None))
            return None
        finally:
            self.stats.build_seconds += time.monotonic() - t0
        if not table.row_count:
            self._failed("empty")
            self._known.put(key, _Known(None))
            return None
        with self._lock:
            n = table.row_count
            start = self.rows.take(n)
            while start is None and self._evict_one():
                start = self.rows.take(n)
            if start is None:
                self._failed("full")
                self._no_room[key] = self._freed
                return None
            self._no_room.pop(key, None)
            obj = _Object(start, n)
            self._loaded[key] = obj
        for t in self.targets:
            t.write_rows(start, table.rows)
        self.stats.tables_loaded += 1
        self.stats.rows_loaded += n
        return obj

    def _evict_one(self) -> bool:
        """Drop the least recently used object no process uses (lock held)."""
        unused = [(o.last_used, k) for k, o in self._loaded.items() if not o.users]
        if not unused:
            return False
        _, key = min(unused)
        obj = self._loaded.pop(key)
        self.rows.give(obj.start, obj.count)
        self.stats.tables_evicted += 1
        self.stats.rows_loaded -= obj.count
        return True

    def _release(self, key: tuple[str, int], pid: int) -> None:
        obj = self._loaded.get(key)
        if obj is not None:
            obj.users.discard(pid)
            obj.last_used = time.monotonic()
            if not obj.users:
                self._freed += 1

    # --- processes that went away ---
    def forget(self, pids: Iterable[int]) -> None:
        for pid in pids:
            with self._lock:
                entry = self._processes.pop(pid, None)
                if entry is None:
                    continue
                for key in entry[1]:
                    self._release(key, pid)
                self.stats.processes = len(self._processes)
            for t in self.targets:
                t.forget_process(pid)
            if self.runtimes is not None:
                self.runtimes.forget([pid])

    def sweep(self) -> None:
        """Forget processes that exited (or whose PID was reused)."""
        with self._lock:
            pids = list(self._processes.items())
        gone = []
        for pid, (start_time, _) in pids:
            proc_start = self.procfs.start_time(pid)
            if proc_start is None or proc_start != start_time:
                gone.append(pid)
        self.forget(gone)

    @property
    def pids(self) -> list[int]:
        with self._lock:
            return list(self._processes)
