"""A profiling session: what ``ember record`` and the agent share.

A session plans which BPF programs serve the profile kinds asked for (one
program can serve several: run queue, wakeup and off-wake come from one),
checks the host, builds and configures the programs, attaches them, reads
new processes' maps while they live (a watcher thread fed by the programs'
rings), and drains: each program's maps into records, the records into
samples of each kind. What happens to the samples is the caller's: ``ember
record`` accumulates them into one profile; the agent labels, encodes and
ships them every interval.

Order of a session's life: ``check_host``, ``load``, (``set_targets``),
``attach``, then ``discover`` and ``drain`` as often as wanted, ``detach``
and a final ``drain(final=True)``, ``close``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from . import abi
from .errors import BpfError, SymbolizationError, UsageError
from .kernel import preflight
from .kernel.drain import Drainer, DrainResult
from .kernel.program import Program, self_tgid, wait_new_processes
from .kernel.programs import (
    DEFAULT_MAP_MEMORY,
    PROGRAMS,
    SYS_EXIT_HOOK,
    ProgramKind,
    map_entries,
)
from .model import KIND_NAMES, ProfileKind, Sample
from .runtimes.cpython import Interpreters
from .runtimes.pycode import PythonNames
from .stacks import SampleBuilder
from .symbols.kallsyms import KernelSymbols
from .symbols.procmaps import Process, ProcessWatcher
from .symbols.symbolizer import Symbolizer
from .threads import Census
from .unwind import UNWINDERS
from .unwind.loader import LoaderStats, TableLoader
from .unwind.remote import RemoteUnwinder

log = logging.getLogger(__name__)

#: The GIL switch interval while attached (Python's default: 5 ms).
GIL_SWITCH_S = 0.0005



@dataclass(frozen=True)
class SessionOptions:
    """What to record and how: the settings ``ember record``'s flags and the
    agent's configuration both come down to."""

    kinds: tuple[ProfileKind, ...]
    frequency: int = 99                  # on-CPU samples per second per CPU
    user_stacks: frozenset[str] = frozenset(KIND_NAMES)    # kinds that walk user stacks
    kernel_stacks: frozenset[str] = frozenset(KIND_NAMES)  # ... and kernel stacks
    min_block_ns: int = 1000             # off-CPU: shorter blocks are ignored
    max_block_ns: int = 0                # off-CPU: longer blocks are ignored (0: none)
    sample_ns: int = 1_000_000           # off-CPU sampling threshold (0: every block)
    state_mask: int = 0                  # off-CPU: only these thread states (0: all)
    sys_exit: bool = False               # sampled off-CPU: user stacks at sys_exit too
    include_self: bool = False           # profile ember's own process too
    map_memory: int = DEFAULT_MAP_MEMORY  # kernel memory for all BPF maps
    unwinder: str = "auto"               # how user stacks are walked (unwind.UNWINDERS)
    python_frames: bool = True           # CPython's frames in table-walked stacks
    unwind_cache_dir: str = ""           # unwind tables on disk by build id ("": none)
    preload_s: float = 0.0               # attach waits this long for the target PIDs' tables
    before_start: bool = True            # off-CPU: threads blocked when it starts, too

    def plan(self) -> list[tuple[ProgramKind, tuple[ProfileKind, ...]]]:
        """Each program to run, in the table's order, with the kinds it makes
        here. A kind with an exact program uses it when sampling is off."""
        wanted: dict[str, list[ProfileKind]] = {}
        for kind in self.kinds:
            program = kind.exact_program if kind.exact_program and not self.sample_ns \
                else kind.program
            wanted.setdefault(program, []).append(kind)
        plan = [(p, tuple(wanted[p.name])) for p in PROGRAMS if p.name in wanted]
        for _, kinds in plan:
            if not self.stack_flags(kinds):
                raise UsageError(f"{kinds[0].name} records neither user nor kernel stacks "
                                 "(user_stacks, kernel_stacks)")
        return plan

    def stack_flags(self, kinds: Iterable[ProfileKind]) -> int:
        """Which stacks a program walks: those any of its kinds asks for."""
        names = {k.name for k in kinds}
        return ((abi.STACK_USER if names & self.user_stacks else 0)
                | (abi.STACK_KERNEL if names & self.kernel_stacks else 0))

    def bpf_config(self, kinds: Collection[ProfileKind]) -> abi.Config:
        """ember_config of a program making ``kinds`` (epoch 0, no filter)."""
        return abi.Config(
            epoch=0, filter=0, self_tgid=0 if self.include_self else self_tgid(),
            stack_flags=self.stack_flags(kinds), state_mask=self.state_mask,
            modes=sum(k.mode for k in kinds), min_block_ns=self.min_block_ns,
            max_block_ns=self.max_block_ns, sample_ns=self.sample_ns)

    @property
    def optional_hooks(self) -> frozenset[str]:
        return frozenset([SYS_EXIT_HOOK] if self.sys_exit else [])


@dataclass
class Pipeline:
    """One loaded program and what turns its maps into samples."""

    program: Program
    drainer: Drainer
    builders: list[SampleBuilder]

    @property
    def name(self) -> str:
        return self.program.name


@dataclass
class Drained:
    """One program's drain: its records, and the samples of each kind."""

    program: Program
    result: DrainResult
    samples: list[tuple[SampleBuilder, list[Sample]]] = field(default_factory=list)
    seconds: float = 0.0      # draining and building samples


class Session:
    def __init__(self, options: SessionOptions, symbolizer: Symbolizer):
        self.options = options
        self.plan = options.plan()
        self.symbolizer = symbolizer
        self.pipelines: list[Pipeline] = []
        self.watcher: ProcessWatcher | None = None
        self.unwind: TableLoader | None = None
        # CPython processes found by the loader, their frames named here
        self.python = PythonNames(Interpreters(symbolizer.processes.procfs))
        self._target_pids: set[int] = set()
        self._filtered = False
        self.attached = False
        self._closed = False
        self.census: Census | None = None   # threads blocked before the start
        # user stacks of threads not running (sampled blocks in flight)
        self.remote = RemoteUnwinder(symbolizer.processes.procfs,
                                     python=self._python_value if options.python_frames
                                     else None)

    @property
    def kinds(self) -> list[ProfileKind]:
        return [k for _, kinds in self.plan for k in kinds]

    def programs(self) -> dict[str, Program]:
        """Loaded programs by name (the BPF metrics read them at scrape time)."""
        return {p.name: p.program for p in self.pipelines}

    # --- start ---
    def check_host(self) -> None:
        """Fail early, with one clear line, on what the programs need; read
        kernel symbols when kernel stacks are asked for."""
        preflight.preflight(tracepoints=any(p.needs_tracefs for p, _ in self.plan))
        if self.options.kernel_stacks & {k.name for k in self.kinds}:
            try:
                self.symbolizer.kernel = KernelSymbols()
            except SymbolizationError as exc:
                log.warning("%s", exc)

    def load(self) -> None:
        """Build every program, sized from the map budget, and configure it;
        start loading unwind tables when the table walker is in."""
        o = self.options
        if o.unwinder not in UNWINDERS:
            raise UsageError(f"unwinder {o.unwinder!r}: one of {', '.join(UNWINDERS)}")
        unwind = o.unwinder != "fp"
        entries = map_entries(o.map_memory, [p for p, _ in self.plan], unwind=unwind)
        for kind, kinds in self.plan:
            sizes = entries[kind.name]
            program = self._build(kind, sizes.stacks, sizes.counts, sizes.unwind_rows)
            drainer = Drainer(program, walk_user=self.remote.walk)
            self.pipelines.append(Pipeline(program, drainer, [
                SampleBuilder(self.symbolizer, k, o.frequency, self.python) for k in kinds]))
            program.configure(o.bpf_config(kinds))
        if o.before_start and any(self._times_blocks(p) for p in self.pipelines):
            try:
                self.census = Census(self.symbolizer.processes.procfs, o.include_self,
                                     self.remote)
            except BpfError as exc:
                log.warning("threads blocked before the start will not be seen: the thread "
                            "census does not load here: %s", exc)
        targets = [p.program.unwind for p in self.pipelines if p.program.unwind is not None]
        if targets:
            self.unwind = TableLoader(targets, Path(o.unwind_cache_dir)
                                      if o.unwind_cache_dir else None,
                                      self.symbolizer.processes.procfs,
                                      self.python.interpreters if o.python_frames else None)
            self.unwind.start()
            self.symbolizer.processes.listeners.append(self.unwind.submit)

    def _build(self, kind: ProgramKind, stacks: int, counts: int, rows: int) -> Program:
        try:
            return Program(kind, stack_entries=stacks, count_entries=counts, unwind_rows=rows)
        except BpfError as exc:
            if not rows or self.options.unwinder != "auto":
                raise
            log.warning("the table unwinder does not load here; frame pointers only: %s", exc)
            return Program(kind, stack_entries=stacks, count_entries=counts)

    def set_targets(self, filter_: int, pids: Iterable[int] = (),
                    cgroups: Iterable[int] = ()) -> None:
        """Profile only these processes and cgroups (filter: abi.FILTER_* bits
        of the rules that apply; 0: every process)."""
        pids, cgroups = set(pids), set(cgroups)
        self._target_pids = pids if filter_ & abi.FILTER_PIDS else set()
        self._filtered = bool(filter_)
        for p in self.pipelines:
            p.program.set_targets(pids)
            p.program.set_cgroups(cgroups)
            cfg = p.program.config()
            cfg.filter = filter_
            p.program.configure(cfg)

    def attach(self) -> None:
        """Start reading new processes' maps, then attach every program."""
        # The watcher thread must get the GIL within a fraction of a
        # millisecond of a new process's exec, even while a drain runs: a
        # process living 30 ms on a busy machine is gone otherwise.
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        programs = [p.program for p in self.pipelines]
        self.watcher = ProcessWatcher(self.symbolizer.processes,
                                      lambda t: wait_new_processes(programs, t))
        self.watcher.start()
        if self.unwind is not None and self._target_pids:
            # the named processes' tables first: their first samples are whole
            for pid in self._target_pids:
                proc = self.symbolizer.processes.get(pid)
                if proc is not None:
                    self.unwind.submit(proc)
            if self.options.preload_s and not self.unwind.wait_idle(self.options.preload_s):
                log.warning("unwind tables still loading after %.0fs", self.options.preload_s)
        elif self.unwind is not None and not self._filtered:
            # the whole host: every process's tables, in the background
            self.unwind.submit_all(exclude=() if self.options.include_self else [os.getpid()])
        start = time.monotonic_ns()  # off-CPU time is charged from here
        for p in self.pipelines:
            p.drainer.begin(start)
            p.program.attach(self.options.frequency, self.options.optional_hooks)
        self.attached = True
        # threads blocked now that the programs did not see block: timed from now
        self._put_blocked(time.monotonic_ns())

    def _python_value(self, proc: Process) -> abi.PyProc | None:
        return self.python.interpreters.bpf_value(proc)

    def target_pids(self) -> set[int] | None:
        """The processes targeted by PID (None: every process, or targets
        by command or cgroup, which the census does not tell apart)."""
        return set(self._target_pids) if self._filtered and self._target_pids else None

    @staticmethod
    def _times_blocks(p: Pipeline) -> bool:
        return p.program.kind.tracks_blocks or p.program.block_sampling

    def _put_blocked(self, start: int) -> None:
        """Threads of the targets blocked now: into the off-CPU programs,
        timed from start (threads.py)."""
        if self.census is None or (self._filtered and not self._target_pids):
            return  # comm and cgroup targets: their processes are not known here
        self.census.set_pids(self._target_pids if self._filtered else None)
        o = self.options
        for p, (_, kinds) in zip(self.pipelines, self.plan, strict=True):
            if not self._times_blocks(p):
                continue
            flags = o.stack_flags(kinds)
            try:
                n = self.census.put_blocked([p.program], start, o.state_mask,
                                            bool(flags & abi.STACK_USER),
                                            bool(flags & abi.STACK_KERNEL), p.drainer.epoch)
            except BpfError as exc:
                log.warning("threads blocked before the start: %s", exc)
                return
            log.debug("%s: %d threads blocked before the start", p.name, n)

    def reconfigure(self, options: SessionOptions) -> None:
        """New run-time settings for the programs already attached (SIGHUP):
        the epoch and the target filter stay as they are."""
        if options.plan() != self.plan:
            raise UsageError("the profile kinds and programs cannot change while attached")
        self.options = options
        for p, (_, kinds) in zip(self.pipelines, self.plan, strict=True):
            cfg = options.bpf_config(kinds)
            cfg.epoch = p.drainer.epoch
            cfg.filter = p.program.config().filter
            p.program.configure(cfg)

    # --- running ---
    def discover(self) -> None:
        """Read the maps of processes with events that the watcher's ring
        missed (it was full: new_pids_full)."""
        for p in self.pipelines:
            self.symbolizer.processes.discover(p.program.take_active_pids())

    def drain(self, final: bool = False, end_ns: int | None = None) -> list[Drained]:
        """Drain every program and build its kinds' samples. With ``final``
        (programs detached) and ``end_ns`` (monotonic), blocks still in
        progress are charged up to end_ns."""
        o = self.options
        exited = self.python.interpreters.retired()  # named in this drain, then forgotten
        # every program flipped first: their boundaries one moment, the
        # window's end (drain.Drainer.flip)
        flips = [p.drainer.flip(final=final, now_ns=end_ns) for p in self.pipelines]
        if self.unwind is not None and not final:
            self.unwind.sweep()
        out = []
        for p, flip in zip(self.pipelines, flips, strict=True):
            t0 = time.monotonic()
            result = p.drainer.collect(flip, min_ns=o.min_block_ns, max_ns=o.max_block_ns)
            drained = Drained(p.program, result)
            for builder in p.builders:
                drained.samples.append((builder, builder.build(result.records)))
            drained.seconds = flip.seconds + time.monotonic() - t0
            out.append(drained)
        self.python.interpreters.drop_retired(exited)
        self.python.forget(exited)
        return out

    def unwind_stats(self) -> tuple[LoaderStats, int] | None:
        """The table loader's counters and its row capacity (None: no tables)."""
        if self.unwind is None:
            return None
        return self.unwind.stats, self.unwind.rows.capacity

    def kernel_stats(self) -> dict[str, dict[abi.Stat, int]]:
        """Each program's own counters (never reset)."""
        return {p.name: p.program.stats() for p in self.pipelines}

    # --- stop ---
    def detach(self) -> None:
        """Stop the programs, then the watcher (it may take a while to notice:
        the programs must not count meanwhile); the maps stay readable."""
        for p in self.pipelines:
            p.program.detach()
        self.attached = False
        if self.watcher is not None:
            self.watcher.stop()

    def close(self) -> None:
        """Idempotent; runs on every path."""
        if self._closed:
            return
        self._closed = True
        if self.watcher is not None:
            self.watcher.stop()
        if self.unwind is not None:
            self.unwind.stop()
        if self.census is not None:
            self.census.close()
        for p in self.pipelines:
            p.program.close()

