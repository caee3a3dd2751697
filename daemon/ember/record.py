"""``ember record``: one profiling session from attach to profile.

The controller owns the lifecycle: validate, check the host, compile,
configure, attach, drain every ``drain_interval`` (so process maps are read
while processes live and maps never fill), and on stop (duration reached,
Ctrl-C, or the caller's ``until`` condition, such as a command that exited)
detach, drain a last time and return the profile. After each drain a
``progress`` callback, when given, hears how far the recording is.
``close`` is idempotent and runs on every path.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import abi
from .errors import UsageError
from .kernel.drain import DrainStats
from .model import (
    KIND_NAMES,
    PROFILE_KINDS,
    Profile,
    ProfileKind,
    Sample,
    merge_samples,
    profile_kind,
)
from .session import Session, SessionOptions
from .symbols import DEFAULT_DEBUG_DIRS
from .symbols.objects import ObjectCache
from .symbols.procmaps import ProcessTable, ProcFS
from .symbols.symbolizer import Symbolizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordOptions:
    mode: str = PROFILE_KINDS[0].name
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
    unwinder: str = "auto"         # how user stacks are walked (unwind.UNWINDERS)
    python_frames: bool = True     # CPython's frames in place of its interpreter loop
    lines: bool = False            # DWARF source lines and inlined frames
    debug_dirs: tuple[str, ...] = DEFAULT_DEBUG_DIRS

    def validate(self, proc: Path = Path("/proc")) -> None:
        if self.mode not in KIND_NAMES:
            raise UsageError(f"--mode must be one of {', '.join(KIND_NAMES)}, not {self.mode!r}")
        if self.duration is not None and self.duration <= 0:
            raise UsageError(f"--duration must be positive, not {self.duration}")
        if self.kind.clock:
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

    @property
    def kind(self) -> ProfileKind:
        return profile_kind(self.mode)

    def session_options(self) -> SessionOptions:
        """The session that records this: one kind, stacks all or none."""
        everything = frozenset(KIND_NAMES)
        return SessionOptions(
            kinds=(self.kind,), frequency=self.frequency,
            user_stacks=everything if self.user_stacks else frozenset(),
            kernel_stacks=everything if self.kernel_stacks else frozenset(),
            min_block_ns=self.min_block_us * 1000, max_block_ns=self.max_block_us * 1000,
            sample_ns=self.sample_us * 1000, state_mask=self.state_mask(),
            sys_exit=self.sys_exit_hook, include_self=self.include_self,
            unwinder=self.unwinder, python_frames=self.python_frames, preload_s=PRELOAD_S)


#: How long a recording of named PIDs waits for their unwind tables before
#: attaching (a few hundred ms in practice; the first samples are whole).
PRELOAD_S = 30.0


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


@dataclass(frozen=True)
class Progress:
    """How far a recording is: seconds since it started, seconds left (None
    without a duration), and the events (on-CPU samples, off-CPU blocks, ...)
    the kernel counted so far."""

    elapsed: float
    left: float | None
    events: int


class Recorder:
    def __init__(self, options: RecordOptions, procfs: ProcFS | None = None):
        self.options = options
        self.stats = RecordStats()
        self.symbolizer = Symbolizer(ProcessTable(procfs or ProcFS()),
                                     objects=ObjectCache(debug_dirs=options.debug_dirs),
                                     lines=options.lines)
        self.session = Session(options.session_options(), self.symbolizer)
        self.ptype = options.kind.profile_type(options.frequency)
        self._samples: list[Sample] = []
        self._started = False
        self._closed = False

    def start(self) -> None:
        o = self.options
        self.session.check_host()
        self.session.load()
        if o.pids:
            self.session.set_targets(abi.FILTER_PIDS, o.pids)
        self._t0_wall = time.time_ns()
        self._t0 = time.monotonic_ns()
        self.session.attach()
        self._started = True
        log.info("recording %s (%s)", o.mode,
                 f"pids {', '.join(map(str, o.pids))}" if o.pids else "all processes")

    def _absorb(self, final: bool, end_ns: int | None = None) -> None:
        self.stats.drains += 1
        for drained in self.session.drain(final=final, end_ns=end_ns):
            self.stats.drain.add(drained.result.stats)
            for _, samples in drained.samples:
                self._samples.extend(samples)
        if len(self._samples) > 50_000:
            self._samples = list(merge_samples(self._samples))

    def run(self, stop: threading.Event, until: Callable[[], bool] | None = None,
            progress: Callable[[Progress], None] | None = None,
            on_end: Callable[[], None] | None = None) -> Profile:
        """Record until the duration passes, ``stop`` is set or ``until()``
        is true (checked every ``maps_interval``), starting first unless
        ``start`` was called already. ``progress`` is called after every
        drain but the last; ``on_end`` as the recording ends, before the
        last drain (to stop a command at the end of its window, not a drain
        later)."""
        if not self._started:
            self.start()
        o = self.options
        now = time.monotonic()
        begin = now
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
                self.session.discover()
                if until is not None and until():
                    break
                if now >= next_drain:
                    self._absorb(final=False)
                    next_drain = now + o.drain_interval
                    if progress is not None:
                        progress(Progress(now - begin, None if deadline is None
                                          else max(0.0, deadline - now), self.stats.drain.events))
            if on_end is not None:
                on_end()
            return self.finish()
        finally:
            self.close()

    def finish(self) -> Profile:
        # The window ends now, before detaching: a thread blocked at this
        # moment is charged up to here, not for whatever it did after the
        # programs stopped seeing it.
        end = time.monotonic_ns()
        self.session.detach()
        self._absorb(final=True, end_ns=end)
        for stats in self.session.kernel_stats().values():
            self.stats.kernel = {s.name.lower(): v for s, v in stats.items()}
        comments = (f"ember record --mode {self.options.mode}",)
        return Profile(self.ptype, merge_samples(self._samples), self._t0_wall, end - self._t0,
                       labels={"host": os.uname().nodename}, comments=comments)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.session.close()
