"""``ember record``: one profiling session from attach to profile.

The controller owns the lifecycle: validate, check the host, compile,
configure, attach, drain every ``drain_interval`` (so process maps are read
while processes live and maps never fill), and on stop (duration reached or
Ctrl-C) detach, drain a last time and return the profile. ``close`` is
idempotent and runs on every path.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import abi
from .errors import SymbolizationError, UsageError
from .kernel import preflight as host
from .kernel.drain import Drainer, DrainStats
from .kernel.program import (
    Program,
    offcpu_sampled_spec,
    offcpu_spec,
    oncpu_spec,
    self_tgid,
    wait_new_processes,
)
from .model import (
    OFFCPU_TYPE,
    OFFWAKE_TYPE,
    RUNQ_TYPE,
    WAKEUP_TYPE,
    Profile,
    ProfileType,
    Sample,
    cpu_type,
    merge_samples,
)
from .stacks import MODE_OF, SampleBuilder
from .symbols.debuginfo import DEFAULT_DEBUG_DIRS
from .symbols.kallsyms import KernelSymbols
from .symbols.procmaps import ProcessTable, ProcessWatcher, ProcFS
from .symbols.symbolizer import ObjectCache, Symbolizer

log = logging.getLogger(__name__)

MODES = ("cpu", "offcpu", "runqlat", "wakeup", "offwake")
TYPES = {"cpu": None, "offcpu": OFFCPU_TYPE, "runqlat": RUNQ_TYPE, "wakeup": WAKEUP_TYPE,
         "offwake": OFFWAKE_TYPE}


@dataclass(frozen=True)
class RecordOptions:
    mode: str = "cpu"
    pids: tuple[int, ...] = ()
    duration: float | None = None
    frequency: int = 99
    kernel_stacks: bool = True
    user_stacks: bool = True
    min_block_us: int = 1
    max_block_us: int = 0          # 0: no upper limit
    sample_us: int = 1000          # off-CPU duration-weighted sampling threshold (0: all)
    sys_exit_hook: bool = False    # sampled off-CPU: user stacks at sys_exit too (no rseq)
    state: int | None = None       # bcc offcputime semantics: 0 = runnable only
    drain_interval: float = 1.0
    maps_interval: float = 0.1     # how often new processes' maps are read
    include_self: bool = False
    lines: bool = False            # DWARF source lines and inlined frames
    debug_dirs: tuple[str, ...] = DEFAULT_DEBUG_DIRS

    def validate(self, proc: Path = Path("/proc")) -> None:
        if self.mode not in MODES:
            raise UsageError(f"--mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.duration is not None and self.duration <= 0:
            raise UsageError(f"--duration must be positive, not {self.duration}")
        if self.mode == "cpu":
            limit = max_sample_rate()
            if not 1 <= self.frequency <= limit:
                raise UsageError(f"--frequency must be between 1 and {limit} Hz "
                                 f"(kernel.perf_event_max_sample_rate), not {self.frequency}")
        if self.min_block_us < 0 or self.max_block_us < 0:
            raise UsageError("--min-block-us and --max-block-us cannot be negative")
        if not 0 <= self.sample_us <= 4_000_000:
            raise UsageError(f"--sample-us must be between 0 and 4000000, not {self.sample_us}")
        if self.max_block_us and self.max_block_us < self.min_block_us:
            raise UsageError(f"--max-block-us {self.max_block_us} is below "
                             f"--min-block-us {self.min_block_us}")
        if self.state is not None and not 0 <= self.state < abi.STATE_RUNNABLE:
            raise UsageError(f"--state must be a mask below {abi.STATE_RUNNABLE:#x}, "
                             f"not {self.state}")
        if not (self.kernel_stacks or self.user_stacks):
            raise UsageError("at least one of user and kernel stacks is needed")
        for pid in self.pids:
            if pid <= 0 or not (proc / str(pid)).is_dir():
                raise UsageError(f"no process with PID {pid}")

    def state_mask(self) -> int:
        if self.state is None:
            return 0
        return abi.STATE_RUNNABLE if self.state == 0 else self.state

    def profile_type(self) -> ProfileType:
        return TYPES[self.mode] or cpu_type(self.frequency)


def max_sample_rate() -> int:
    try:
        return int(Path("/proc/sys/kernel/perf_event_max_sample_rate").read_text())
    except (OSError, ValueError):
        return 100000


@dataclass
class RecordStats:
    drains: int = 0
    drain: DrainStats = field(default_factory=DrainStats)
    kernel: dict[str, int] = field(default_factory=dict)


class Recorder:
    def __init__(self, options: RecordOptions, procfs: ProcFS | None = None):
        self.options = options
        self.ptype = options.profile_type()
        self.program: Program | None = None
        self.watcher: ProcessWatcher | None = None
        self.stats = RecordStats()
        self._samples: list[Sample] = []
        self._closed = False
        self.symbolizer = Symbolizer(ProcessTable(procfs or ProcFS()),
                                     objects=ObjectCache(debug_dirs=options.debug_dirs),
                                     lines=options.lines)
        self.builder = SampleBuilder(self.symbolizer, self.ptype)
        # off-CPU with duration-weighted sampling (offcpu_sampled.c); the
        # exact program (offcpu.c) for --sample-us 0 and the kinds that need
        # the wakeup (runqlat, wakeup, offwake)
        self.sampled = options.mode == "offcpu" and options.sample_us > 0

    def start(self) -> None:
        o = self.options
        # the sampled off-CPU program uses BTF tracepoints: no tracefs needed
        host.preflight(tracepoints=not (o.mode == "cpu" or self.sampled))
        if o.kernel_stacks:
            try:
                self.symbolizer.kernel = KernelSymbols()
            except SymbolizationError as exc:
                log.warning("%s", exc)
        spec = oncpu_spec() if o.mode == "cpu" else (
            offcpu_sampled_spec() if self.sampled else offcpu_spec())
        self.program = Program(spec)
        cfg = abi.Config(
            epoch=0,
            filter=abi.FILTER_PIDS if o.pids else 0,
            self_tgid=0 if o.include_self else self_tgid(),
            stack_flags=(abi.STACK_USER if o.user_stacks else 0)
            | (abi.STACK_KERNEL if o.kernel_stacks else 0),
            state_mask=o.state_mask(),
            min_block_ns=o.min_block_us * 1000,
            max_block_ns=o.max_block_us * 1000,
            sample_ns=o.sample_us * 1000,
            modes=MODE_OF.get(o.mode, 0),
        )
        self.program.configure(cfg)
        if o.pids:
            self.program.set_targets(o.pids)
        self.drainer = Drainer(self.program)
        self._t0_wall = time.time_ns()
        self._t0 = time.monotonic_ns()
        # new processes' maps are read as soon as the kernel notes them
        program = self.program
        self.watcher = ProcessWatcher(self.symbolizer.processes,
                                      lambda t: wait_new_processes([program], t))
        self.watcher.start()
        if o.mode == "cpu":
            self.program.attach_cpu_clock(o.frequency)
        elif self.sampled:
            self.program.attach_sampled_offcpu(sys_exit=o.sys_exit_hook)
        else:
            self.program.attach_sched_switch()
        log.info("recording %s (%s)", o.mode,
                 f"pids {', '.join(map(str, o.pids))}" if o.pids else "all processes")

    def _absorb(self, final: bool, end_ns: int | None = None) -> None:
        assert self.program is not None
        o = self.options
        result = self.drainer.drain(final=final, now_ns=end_ns,
                                    min_ns=o.min_block_us * 1000, max_ns=o.max_block_us * 1000)
        self.stats.drains += 1
        d = self.stats.drain
        d.records += result.stats.records
        d.events += result.stats.events
        d.total_ns += result.stats.total_ns
        d.stacks_missing += result.stats.stacks_missing
        d.stacks_truncated += result.stats.stacks_truncated
        self._samples.extend(self.builder.build(result.records))
        if len(self._samples) > 50_000:
            self._samples = list(merge_samples(self._samples))

    def run(self, stop: threading.Event) -> Profile:
        """Record until the duration passes or ``stop`` is set (starting first
        unless ``start`` was called already)."""
        if self.program is None:
            self.start()
        assert self.program is not None
        o = self.options
        now = time.monotonic()
        deadline = now + o.duration if o.duration is not None else None
        next_drain = now + o.drain_interval
        try:
            while True:
                now = time.monotonic()
                wake = min(next_drain, now + o.maps_interval,
                           deadline if deadline is not None else next_drain)
                # new processes' maps are read as soon as the kernel notes them
                if stop.wait(max(0.0, wake - now)):
                    break
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                # Read the maps of processes seen since the last look while
                # they are alive: a process may exit before the next drain.
                self.symbolizer.processes.discover(self.program.take_active_pids())
                if now >= next_drain:
                    self._absorb(final=False)
                    next_drain = now + o.drain_interval
            return self.finish()
        finally:
            self.close()

    def finish(self) -> Profile:
        assert self.program is not None
        # The window ends now, before detaching: a thread blocked at this
        # moment is charged up to here, not for whatever it did after the
        # programs stopped seeing it.
        end = time.monotonic_ns()
        self.program.detach()
        if self.watcher is not None:
            self.watcher.stop()
        self._absorb(final=True, end_ns=end)
        self.stats.kernel = {s.name.lower(): v for s, v in self.program.stats().items()}
        comments = (f"ember record --mode {self.options.mode}",)
        return Profile(self.ptype, merge_samples(self._samples), self._t0_wall, end - self._t0,
                       labels={"host": os.uname().nodename}, comments=comments)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.watcher is not None:
            self.watcher.stop()
        if self.program is not None:
            self.program.close()
