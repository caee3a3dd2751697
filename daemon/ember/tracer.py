"""The BPF edge: compile ember's programs with bcc, attach them, and expose
their maps to the drainer. Everything bcc-specific lives here and in
bpfmaps.py; the rest of ember is plain Python.
"""

from __future__ import annotations

import ctypes as ct
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import abi
from .bpfmaps import BpfMap, PerCpuArray, StackMap
from .btfprog import BtfTracepoint
from .errors import BpfError

log = logging.getLogger(__name__)

# bcc's clang warns about the Debian kernel headers themselves; those are not
# ours to fix, and ember's own code is compiled with -Wall on top.
HEADER_NOISE = ("-Wno-duplicate-decl-specifier", "-Wno-ignored-attributes",
                "-Wno-address-of-packed-member", "-Wno-unknown-warning-option")


def bpf_source_dir() -> Path:
    """ember/bpf in an installed package (package data), bpf/ in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "bpf", here.parents[1] / "bpf"):
        if (candidate / "ember.h").is_file():
            return candidate
    raise BpfError(f"BPF sources not found next to {here}")


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def flatten_source(name: str, directory: Path | None = None) -> str:
    """The program's text with ember's own ``#include "x.h"`` lines inlined.

    bcc rewrites map operations (``m.lookup(...)``) only in the main file; in
    an included header they compile to indirect calls the verifier rejects. So
    the loader inlines local headers, with ``#line`` markers so compiler
    messages still name the right file and line. System includes (<...>) are
    left to bcc. Each header is inlined once (include guards would drop
    repeats anyway).
    """
    directory = directory or bpf_source_dir()
    seen: set[str] = set()

    def expand(fname: str) -> list[str]:
        path = directory / fname
        if not path.is_file():
            raise BpfError(f"BPF source {path} not found")
        seen.add(fname)
        out = [f'#line 1 "{fname}"']
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            m = _LOCAL_INCLUDE.match(line)
            if not m:
                out.append(line)
                continue
            if m.group(1) not in seen:
                out.extend(expand(m.group(1)))
            out.append(f'#line {lineno + 1} "{fname}"')
        return out

    return "\n".join(expand(name)) + "\n"


@dataclass(frozen=True)
class ProgramSpec:
    source: str                     # file in bpf/
    defines: dict[str, int] = field(default_factory=dict)

    def cflags(self, strict: bool = False) -> list[str]:
        flags = [f"-I{bpf_source_dir()}", *HEADER_NOISE]
        if strict:
            flags += ["-Wall", "-Werror"]
        flags += [f"-D{k}={v}" for k, v in sorted(self.defines.items())]
        return flags


def oncpu_spec(stack_entries: int = 16384, count_entries: int = 16384) -> ProgramSpec:
    return ProgramSpec("oncpu.c", {"EMBER_STACK_ENTRIES": stack_entries,
                                   "EMBER_COUNT_ENTRIES": count_entries,
                                   "EMBER_STACK_GENERATIONS": 2})


def offcpu_spec(stack_entries: int = 8192, count_entries: int = 16384,
                thread_entries: int = 32768) -> ProgramSpec:
    return ProgramSpec("offcpu.c", {"EMBER_STACK_ENTRIES": stack_entries,
                                    "EMBER_COUNT_ENTRIES": count_entries,
                                    "EMBER_THREAD_ENTRIES": thread_entries,
                                    "EMBER_STACK_GENERATIONS": 3})


def offcpu_sampled_spec(stack_entries: int = 8192, count_entries: int = 16384) -> ProgramSpec:
    """Duration-weighted off-CPU sampling (bpf/offcpu_sampled.c)."""
    return ProgramSpec("offcpu_sampled.c", {"EMBER_STACK_ENTRIES": stack_entries,
                                            "EMBER_COUNT_ENTRIES": count_entries,
                                            "EMBER_STACK_GENERATIONS": 3})


class Program:
    """One compiled BPF object (bcc module) with ember's maps.

    Implements drain.DrainMaps."""

    def __init__(self, spec: ProgramSpec, strict: bool = False):
        from bcc import BPF

        self.spec = spec
        self.generations = spec.defines.get("EMBER_STACK_GENERATIONS", 2)
        text = flatten_source(spec.source)
        try:
            self.bpf: Any = BPF(text=text.encode(), cflags=spec.cflags(strict))
        except Exception as exc:  # bcc raises bare Exception
            raise BpfError(f"compiling {spec.source} failed: {exc}") from exc
        self.config_map = self._map("ember_config", abi.Config)
        self.targets_map = self._map("ember_targets", ct.c_uint8, key=ct.c_uint32)
        self.cgroups_map = self._map("ember_cgroups", ct.c_uint8, key=ct.c_uint64)
        self.counts_map = self._map("ember_counts", abi.Value, key=abi.Key)
        self.stats_map = PerCpuArray("ember_stats", self._fd("ember_stats"), abi.STAT_MAX)
        self.stack_maps = [StackMap(f"ember_stacks_{i}", self._fd(f"ember_stacks_{i}"),
                                    self._max("ember_stacks_0"))
                           for i in range(self.generations)]
        self.pids_map = self._map("ember_pids", ct.c_uint64, key=ct.c_uint32)
        self.sampled = spec.source == "offcpu_sampled.c"
        # kernel stacks of sleeping threads (ids with TASK_STACK_BIT)
        self.task_stack_maps = [StackMap(f"ember_tstacks_{i}", self._fd(f"ember_tstacks_{i}"),
                                         self._max("ember_tstacks_0"))
                                for i in range(self.generations)] if self.sampled else []
        self._btf: list[BtfTracepoint] = []
        offcpu = spec.source == "offcpu.c"
        self.starts_map = self._map("ember_starts", abi.Start, key=ct.c_uint32) if offcpu else None
        self.wakes_map = self._map("ember_wakes", abi.Wake, key=ct.c_uint32) if offcpu else None
        self.runq_hist_map = (self._map("ember_runq_hist", ct.c_uint64, key=abi.HistKey)
                              if offcpu else None)
        self._attached = False

    # -- map plumbing --
    def _table(self, name: str) -> Any:
        try:
            return self.bpf.get_table(name.encode())
        except KeyError as exc:
            raise BpfError(f"map {name} missing from {self.spec.source}") from exc

    def _fd(self, name: str) -> int:
        return int(self._table(name).map_fd)

    def _max(self, name: str) -> int:
        return int(self._table(name).max_entries)

    def _map(self, name: str, value: Any, key: Any = ct.c_uint32) -> BpfMap:
        return BpfMap(name, self._fd(name), key, value, self._max(name))

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
    def attach_cpu_clock(self, frequency: int) -> None:
        from bcc import PerfSWConfig, PerfType

        try:
            self.bpf.attach_perf_event(ev_type=PerfType.SOFTWARE, ev_config=PerfSWConfig.CPU_CLOCK,
                                       fn_name=b"ember_on_cpu", sample_freq=frequency)
        except Exception as exc:
            raise BpfError(f"attaching the cpu-clock perf event failed: {exc}") from exc
        self._attached = True

    def attach_sched_switch(self) -> None:
        """sched_switch, and sched_waking (to split blocked from queued time)."""
        for tp, fn in ((b"sched:sched_waking", b"ember_sched_waking"),
                       (b"sched:sched_switch", b"ember_sched_switch")):
            try:
                self.bpf.attach_tracepoint(tp=tp, fn_name=fn)
            except Exception as exc:
                raise BpfError(f"attaching {tp.decode()} failed: {exc}") from exc
        self._attached = True

    def attach_sampled_offcpu(self, sys_exit: bool = False) -> None:
        """sched_switch, rseq_update and optionally sys_exit, as BTF
        tracepoints (offcpu_sampled.c)."""
        if not self._btf:
            hooks = ["rseq_update"] + (["sys_exit"] if sys_exit else [])
            self._btf = [BtfTracepoint(self.bpf, "ember_sampled_resume", tp) for tp in hooks]
            self._btf.append(BtfTracepoint(self.bpf, "ember_sampled_switch", "sched_switch"))
        for tp in self._btf:  # resume hooks first: a chosen block is never left waiting
            tp.attach()
        self._attached = True

    def detach(self) -> None:
        """Stop the programs; the maps stay readable until close()."""
        if not self._attached:
            return
        for tp in reversed(self._btf):
            tp.detach()
        for (ev_type, ev_config) in list(self.bpf.open_perf_events):
            self.bpf.detach_perf_event(ev_type=ev_type, ev_config=ev_config)
        for tp in list(self.bpf.tracepoint_fds):
            self.bpf.detach_tracepoint(tp)
        self._attached = False

    def close(self) -> None:
        self.detach()
        for tp in self._btf:
            tp.close()
        self.bpf.cleanup()

    # -- drain.DrainMaps --
    def write_epoch(self, epoch: int) -> None:
        cfg = self.config()
        cfg.epoch = epoch
        self.configure(cfg)

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

    def stack(self, slot: int, stack_id: int) -> tuple[int, ...] | None:
        if stack_id & abi.TASK_STACK_BIT and self.task_stack_maps:
            return self.task_stack_maps[slot].read(stack_id)
        return self.stack_maps[slot].read(stack_id)

    def clear_stacks(self, slot: int) -> None:
        self.stack_maps[slot].clear()
        if self.task_stack_maps:
            self.task_stack_maps[slot].clear()

    def stats(self) -> dict[abi.Stat, int]:
        values = self.stats_map.read_all()
        return {s: values[int(s)] for s in abi.Stat}

    def take_active_pids(self) -> list[int]:
        """Processes with events since the last call (the entries are consumed)."""
        entries = self.pids_map.lookup_batch()
        self.pids_map.delete_batch([ct.c_uint32(int(k)) for k, _ in entries])
        return [int(k) for k, _ in entries]

    def run_stats(self) -> tuple[int, int]:
        """(run_time_ns, run_cnt) of this object's programs, from the kernel's
        BPF statistics (zero unless kernel.bpf_stats_enabled=1)."""
        t = n = 0
        fds = [fn.fd for fn in self.bpf.funcs.values()] + [tp.prog_fd for tp in self._btf]
        for fd in fds:
            try:
                text = Path(f"/proc/self/fdinfo/{fd}").read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(":")
                if key == "run_time_ns":
                    t += int(value)
                elif key == "run_cnt":
                    n += int(value)
        return t, n


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
