"""One loaded BPF program: built by build.py (bcc, in a child process),
attached here through plain system calls (syscalls.py), its maps exposed to
the drainer (maps.py). What it is, loads and attaches comes from its row in
programs.py. The rest of ember is plain Python.
"""

from __future__ import annotations

import ctypes as ct
import logging
import os
import select
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .. import abi
from ..errors import BpfError
from . import syscalls
from .build import build
from .drain import CUT_REASONS, Stack
from .maps import BpfMap, PerCpuArray, RingBuffer, RowArray, StackMap, UnwindMaps, read_ustack
from .programs import Hook, ProgramKind

log = logging.getLogger(__name__)


class Program:
    """One built BPF object with ember's maps.

    Implements drain.DrainMaps."""

    def __init__(self, kind: ProgramKind, stack_entries: int | None = None,
                 count_entries: int | None = None, strict: bool = False,
                 unwind_rows: int = 0):
        self.kind = kind
        self.spec = kind.spec(stack_entries, count_entries, unwind_rows)
        self.generations = kind.generations
        self.built = build(self.spec, strict)
        self._attach_fds: list[int] = []
        self._iter_link: int | None = None
        # stacks of blocks put in by the daemon (CENSUS_STACK_BIT ids)
        self.census_stacks: dict[int, Stack] = {}
        try:
            self._open_maps()
        except BpfError:
            self.built.close()
            raise

    @property
    def name(self) -> str:
        return self.kind.name

    @property
    def block_sampling(self) -> bool:
        return self.kind.block_sampling

    def _open_maps(self) -> None:
        self.config_map = self._map("ember_config", abi.Config)
        self.targets_map = self._map("ember_targets", ct.c_uint8, key=ct.c_uint32)
        self.cgroups_map = self._map("ember_cgroups", ct.c_uint8, key=ct.c_uint64)
        self.counts_map = self._map("ember_counts", abi.Value, key=abi.Key)
        self.stats_map = PerCpuArray("ember_stats", self._fd("ember_stats"), abi.STAT_MAX)
        self.stack_maps = [StackMap(f"ember_stacks_{i}", self._fd(f"ember_stacks_{i}"),
                                    self._max("ember_stacks_0"))
                           for i in range(self.generations)]
        self.pids_map = self._map("ember_pids", ct.c_uint64, key=ct.c_uint32)
        self.new_pids = RingBuffer("ember_new_pids", self._fd("ember_new_pids"),
                                   self._max("ember_new_pids"))
        # kernel stacks of sleeping threads (ids with TASK_STACK_BIT)
        self.task_stack_maps = [StackMap(f"ember_tstacks_{i}", self._fd(f"ember_tstacks_{i}"),
                                         self._max("ember_tstacks_0"))
                                for i in range(self.generations)] if self.block_sampling else []
        blocks = self.kind.tracks_blocks
        self.starts_map = self._map("ember_starts", abi.Start, key=ct.c_uint32) if blocks else None
        self.wakes_map = self._map("ember_wakes", abi.Wake, key=ct.c_uint32) if blocks else None
        self.runq_hist_map = (self._map("ember_runq_hist", ct.c_uint64, key=abi.HistKey)
                              if blocks else None)
        self.bounds_map = self._map("ember_bounds", ct.c_uint64, key=ct.c_uint32) \
            if blocks or self.block_sampling else None
        self.crossed_map = self._map("ember_crossed", abi.Crossed, key=ct.c_uint32) \
            if blocks else None
        # the table unwinder, when compiled in: its stacks and tables
        self.unwind: UnwindMaps | None = None
        self.ustack_maps: list[BpfMap] = []
        if "ember_unwind_rows" in self.built.maps:
            self.ustack_maps = [self._map(f"ember_ustacks_{i}", abi.UStack)
                                for i in range(self.generations)]
            self.unwind = UnwindMaps(
                RowArray("ember_unwind_rows", self._fd("ember_unwind_rows"),
                         self._max("ember_unwind_rows")),
                self._map("ember_unwind_procs", abi.UnwindProc),
                self._map("ember_py_procs", abi.PyProc))

    # -- map plumbing --
    def _entry(self, name: str) -> tuple[int, int]:
        try:
            return self.built.maps[name]
        except KeyError:
            raise BpfError(f"map {name} missing from {self.spec.source}") from None

    def _fd(self, name: str) -> int:
        return self._entry(name)[0]

    def _max(self, name: str) -> int:
        return self._entry(name)[1]

    def _map(self, name: str, value: Any, key: Any = ct.c_uint32) -> BpfMap:
        return BpfMap(name, self._fd(name), key, value, self._max(name))

    def map_memory(self) -> dict[str, int]:
        """Kernel memory of each map, from the kernel's own accounting."""
        return {name: syscalls.map_memory(fd) for name, (fd, _) in self.built.maps.items()}

    # -- configuration --
    def configure(self, cfg: abi.Config) -> None:
        self.config_map.update(ct.c_uint32(0), cfg)

    def config(self) -> abi.Config:
        cfg = self.config_map.lookup(ct.c_uint32(0))
        assert cfg is not None
        return cfg  # type: ignore[no-any-return]

    def set_targets(self, pids: Iterable[int]) -> None:
        _sync_set(self.targets_map, set(pids), ct.c_uint32)

    def set_cgroups(self, cgroup_ids: Iterable[int]) -> None:
        _sync_set(self.cgroups_map, set(cgroup_ids), ct.c_uint64)

    # -- attach --
    def attach(self, frequency: int = 99, optional: Collection[str] = ()) -> None:
        """Attach every hook of the program's row, in order (the exec hook
        first); an optional hook only if its point is in ``optional``.
        ``frequency``: samples per second per CPU of a perf_event hook. On a
        failure, what was attached is detached again."""
        try:
            for hook in self.kind.all_hooks():
                if not hook.optional or hook.point in optional:
                    self.attach_hook(hook, frequency)
        except OSError as exc:
            self.detach()
            raise BpfError(f"attaching {_where(hook)} failed: {exc}") from None

    def attach_hook(self, hook: Hook, frequency: int = 99) -> None:
        """Attach one hook (attach() does all of them, in order; this is for
        measuring a program with one hook left out)."""
        prog = self._prog(hook)
        if hook.point == "perf_event":
            for cpu in syscalls.online_cpus():
                fd = syscalls.perf_event_open(syscalls.PERF_TYPE_SOFTWARE,
                                              syscalls.PERF_COUNT_SW_CPU_CLOCK, cpu,
                                              freq=frequency)
                self._attach_fds.append(fd)
                syscalls.perf_attach_bpf(fd, prog)
        elif hook.point.startswith("iter/"):
            # kept past detach(): the final drain still reads it
            if self._iter_link is None:
                self._iter_link = syscalls.iter_link(prog)
        elif hook.point.startswith("tracepoint/"):
            _, category, name = hook.point.split("/")
            fd = syscalls.perf_event_open(syscalls.PERF_TYPE_TRACEPOINT,
                                          syscalls.tracepoint_id(category, name), 0, period=1)
            self._attach_fds.append(fd)
            syscalls.perf_attach_bpf(fd, prog)
        else:  # tp_btf: its BTF id names the tracepoint
            self._attach_fds.append(syscalls.raw_tracepoint_open(prog))

    def _prog(self, hook: Hook) -> int:
        try:
            return self.built.progs[hook.label]
        except KeyError:
            raise BpfError(f"{hook.function} ({hook.load_kind}) not in {self.spec.source}") \
                from None

    def detach(self) -> None:
        """Stop the programs (close their events and links, newest first);
        the maps stay readable until close()."""
        while self._attach_fds:
            os.close(self._attach_fds.pop())

    def put_block(self, tid: int, start: abi.Start) -> bool:
        """Put in a block the program did not see begin (a thread already
        blocked when it was attached): it is timed from start.ts and counted
        when the thread wakes, as if the program had seen it. The exact
        program takes start's stacks; the sampled one walks them at the
        wakeup. False when the thread is gone (or the map is full)."""
        if self.starts_map is not None:
            try:  # never over a block the program saw begin
                syscalls.map_update(self.starts_map.fd, ct.c_uint32(tid), start,
                                    syscalls.BPF_NOEXIST)
            except OSError:
                return False
            return True
        with self._task_block(tid) as found:
            if found is None:
                return False
            fd, key = found
            try:
                seen = abi.Block()
                try:
                    syscalls.map_lookup(fd, key, seen)
                    if seen.ts or seen.weight_ns:
                        return False  # the program saw this block begin
                except OSError:
                    pass  # no storage yet: the program never saw the thread
                syscalls.map_update(fd, key, abi.Block(ts=start.ts, charged=start.ts,
                                                       state=start.state))
                return True
            except OSError:
                return False

    def take_back_block(self, tid: int, start_ts: int) -> None:
        """Undo put_block for a thread that ran meanwhile (its block was over
        before it went in): remove it if it is still the one put in."""
        if self.starts_map is not None:
            started = self.starts_map.lookup(ct.c_uint32(tid))
            if started is not None and started.ts == start_ts:
                self.starts_map.delete(ct.c_uint32(tid))
            return
        with self._task_block(tid) as found:
            if found is None:
                return
            fd, key = found
            try:
                seen = abi.Block()
                syscalls.map_lookup(fd, key, seen)
                if seen.ts == start_ts and not seen.weight_ns:
                    syscalls.map_update(fd, key, abi.Block())
            except OSError:
                pass

    @contextmanager
    def _task_block(self, tid: int) -> Iterator[tuple[int, ct.c_int] | None]:
        """The sampled program's task storage map and thread tid's key in it
        (a thread pidfd, open for the block); None: no such map or thread."""
        if "ember_blocks" not in self.built.maps:
            yield None
            return
        try:
            pidfd = syscalls.pidfd_open(tid, thread=True)
        except OSError:
            yield None
            return
        try:
            yield self._fd("ember_blocks"), ct.c_int(pidfd)
        finally:
            os.close(pidfd)

    def census(self) -> list[abi.Thread]:
        """Run the census program's task iterator once: a struct
        ember_thread per thread it kept."""
        return self._iterate(abi.Thread)

    def in_flight(self) -> Sequence[abi.InFlight]:
        """The sampled program's blocks in flight, charged up to the
        boundary in effect (its task iterator claims them: run it once per
        boundary)."""
        return self._iterate(abi.InFlight) if self.block_sampling else []

    def _iterate(self, record: Any) -> list[Any]:
        if self._iter_link is None:
            raise BpfError(f"{self.name}: no task iterator attached")
        try:
            data = syscalls.iter_read(self._iter_link)
        except OSError as exc:
            raise BpfError(f"{self.name}: reading its task iterator failed: "
                           f"{exc.strerror}") from None
        size = ct.sizeof(record)
        return [record.from_buffer_copy(data, i) for i in range(0, len(data) - size + 1, size)]

    def close(self) -> None:
        self.detach()
        if self._iter_link is not None:
            os.close(self._iter_link)
            self._iter_link = None
        self.new_pids.close()
        if self.unwind is not None:
            self.unwind.close()
        self.built.close()

    # -- drain.DrainMaps --
    def write_epoch(self, epoch: int) -> None:
        cfg = self.config()
        cfg.epoch = epoch
        self.configure(cfg)

    @property
    def charges_in_flight(self) -> bool:
        return self.bounds_map is not None

    def write_bound(self, epoch: int, ns: int) -> None:
        if self.bounds_map is not None:
            self.bounds_map.update(ct.c_uint32(epoch % abi.BOUNDS), ct.c_uint64(ns))

    def crossed(self) -> Sequence[tuple[int, abi.Crossed]]:
        if self.crossed_map is None:
            return []
        return [(int(k), v) for k, v in self.crossed_map.lookup_batch()]

    def delete_crossed(self, tids: Sequence[int]) -> None:
        if self.crossed_map is not None and tids:
            self.crossed_map.delete_batch([ct.c_uint32(t) for t in tids])

    def counts(self) -> Sequence[tuple[abi.Key, abi.Value]]:
        return self.counts_map.lookup_batch()

    def delete_counts(self, keys: Sequence[abi.Key]) -> None:
        deleted = self.counts_map.delete_batch(keys)
        if deleted != len(keys):
            log.warning("deleted %d of %d drained counts", deleted, len(keys))

    def starts(self) -> Sequence[tuple[int, abi.Start]]:
        if self.starts_map is None:
            return []
        # a c_uint32 array indexes to int
        return [(int(k), v) for k, v in self.starts_map.lookup_batch()]

    def wakes(self) -> Sequence[tuple[int, abi.Wake]]:
        if self.wakes_map is None:
            return []
        return [(int(k), v) for k, v in self.wakes_map.lookup_batch()]

    def runq_histogram(self) -> dict[int, list[int]]:
        """pid -> counts per log2-microsecond slot (cumulative since load)."""
        out: dict[int, list[int]] = {}
        if self.runq_hist_map is None:
            return out
        for k, v in self.runq_hist_map.lookup_batch():
            slots = out.setdefault(int(k.pid), [0] * abi.RUNQ_HIST_SLOTS)
            slots[min(int(k.slot), abi.RUNQ_HIST_SLOTS - 1)] += int(v)
        return out

    def stack(self, slot: int, stack_id: int) -> Stack | None:
        if stack_id & abi.TASK_STACK_BIT and self.task_stack_maps:
            ips = self.task_stack_maps[slot].read(stack_id)
        elif stack_id & abi.USTACK_BIT and self.ustack_maps:
            walked = read_ustack(self.ustack_maps[slot], stack_id)
            if walked is None:
                return None
            return Stack(walked[0], cut=CUT_REASONS.get(walked[1]))
        elif stack_id & abi.CENSUS_STACK_BIT and not stack_id & abi.USTACK_BIT:
            return self.census_stacks.get(stack_id)
        else:
            ips = self.stack_maps[slot].read(stack_id)
        return None if ips is None else Stack(ips)

    def clear_stacks(self, slot: int) -> None:
        self.stack_maps[slot].clear()
        if self.task_stack_maps:
            self.task_stack_maps[slot].clear()
        if self.ustack_maps:
            m = self.ustack_maps[slot]
            m.delete_batch([ct.c_uint32(int(k.value)) for k in list(m.keys())])

    def stats(self) -> dict[abi.Stat, int]:
        values = self.stats_map.read_all()
        return {s: values[int(s)] for s in abi.Stat}

    def take_new_pids(self) -> list[int]:
        """Processes noted since the last call, from the ring (cheap: no
        system call when there is nothing)."""
        return [int.from_bytes(r[:4], "little") for r in self.new_pids.consume() if len(r) >= 4]

    def take_active_pids(self) -> list[int]:
        """Processes with events since the last call (the entries are consumed)."""
        entries = self.pids_map.lookup_batch()
        self.pids_map.delete_batch([ct.c_uint32(int(k)) for k, _ in entries])
        return [int(k) for k, _ in entries]

    def run_stats(self) -> tuple[int, int]:
        """(run_time_ns, run_cnt) of this object's programs, from the kernel's
        BPF statistics (zero unless kernel.bpf_stats_enabled=1)."""
        t = n = 0
        for fd in self.built.progs.values():
            dt, dn = syscalls.prog_stats(fd)
            t += dt
            n += dn
        return t, n


def wait_new_processes(programs: Sequence[Program], timeout: float) -> list[int]:
    """Block up to timeout seconds for processes the programs see for the
    first time; their PIDs (possibly none)."""
    rings = [p.new_pids for p in programs]
    if rings:
        select.select(rings, [], [], max(0.0, timeout))
    else:
        time.sleep(max(0.0, timeout))
    return [pid for p in programs for pid in p.take_new_pids()]


def _sync_set(m: BpfMap, wanted: set[int], ctype: Any) -> None:
    """Make a key -> 1 map hold exactly the wanted keys (adds first, so a key
    kept across the update is never missing)."""
    for key in wanted:
        m.update(ctype(key), ct.c_uint8(1))
    for key in list(m.keys()):
        if key.value not in wanted:
            m.delete(ctype(key.value))


def self_tgid() -> int:
    return os.getpid()


def _where(hook: Hook) -> str:
    """A hook's attach point as error messages name it."""
    if hook.point == "perf_event":
        return "the cpu-clock perf event"
    if hook.point.startswith("tracepoint/"):
        return ":".join(hook.point.split("/")[1:])
    return hook.point
