"""Threads that were blocked before ember looked, from a census of threads.

The off-CPU programs time a block from the switch-out they see. A thread
already blocked when they attach (a hung service, a process asleep since
before the record began) would show nothing until it wakes, and never if it
does not. At the start, ``Census.put_blocked`` finds such threads (the
census program, bpf/census.c), walks their stacks as they are (kernel stack
from the census, user stack from the registers they entered the kernel
with, unwind/remote.py) and puts their blocks into the programs timed from
the start, with the state bit ``STATE_BEFORE_START``: samples built from
them carry the marker frame ``[blocked since before the start]``.

The exact program takes those stacks and charges the block in every drain
like its own. The sampled program charges it like its own too (its drains'
iterator walks the kernel stack of a block in flight, the daemon the user
stack), and walks the stacks itself when the thread wakes.

``Dumper`` turns a census into what ``ember dump`` prints and the agent's
``/threads`` answers: each thread's state, the kernel function it blocked
in, for how long, and its stack (kernel, then native user frames), the
longest-blocked first. A running thread's user registers are those of its
last kernel entry: no user stack is shown for a thread running right now.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from . import abi
from .errors import BpfError, SymbolizationError
from .kernel.census import SchedClock, ThreadNow, needs_task_clock, threads
from .kernel.drain import STACK_NOT_REQUESTED, Stack
from .kernel.program import Program, self_tgid
from .kernel.programs import program_kind
from .model import Frame, profile_kind
from .runtimes.cpython import Interpreters
from .runtimes.pycode import PythonNames
from .stacks import SampleBuilder
from .symbols.kallsyms import KernelSymbols
from .symbols.procmaps import ProcessTable, ProcFS, stat_fields
from .symbols.symbolizer import Symbolizer
from .unwind.remote import RemoteUnwinder

log = logging.getLogger(__name__)

NOT_REQUESTED = Stack(problem=STACK_NOT_REQUESTED)
#: The states a thread can be blocked in (not exiting, not runnable).
BLOCKED_STATES = (abi.STATE_INTERRUPTIBLE | abi.STATE_UNINTERRUPTIBLE | abi.STATE_STOPPED
                  | abi.STATE_TRACED | abi.STATE_PARKED | abi.STATE_IDLE)


class Census:
    """The census program, loaded, and what it is read for."""

    def __init__(self, procfs: ProcFS | None = None, include_self: bool = False,
                 unwinder: RemoteUnwinder | None = None):
        self.program = Program(program_kind("census"))
        self.include_self = include_self
        self.clock = SchedClock()
        self.procfs = procfs or ProcFS()
        self.unwinder = unwinder or RemoteUnwinder(self.procfs)
        self._next_id = 0
        self.start_ns = 0  # threads blocked before this are marked so
        try:
            self.program.configure(abi.Config(self_tgid=0 if include_self else self_tgid()))
            self.program.attach()
        except BpfError:
            self.program.close()
            raise

    def close(self) -> None:
        self.program.close()

    def set_pids(self, pids: Iterable[int] | None) -> None:
        """Look at these processes only (None: every process)."""
        cfg = self.program.config()
        if pids is None:
            cfg.filter = 0
        else:
            self.program.set_targets(pids)
            cfg.filter = abi.FILTER_PIDS
        self.program.configure(cfg)

    def take(self) -> list[ThreadNow]:
        """Every thread of the processes looked at, now."""
        # off the CPU and back: the reader's runqueue clock, the census's
        # "now" on that clock, is then as fresh as it gets
        time.sleep(0.0002)
        raw = self.program.census()
        if needs_task_clock(raw):
            self.clock.calibrate()
        return threads(raw, self.clock)

    def user_stack(self, t: ThreadNow) -> Stack:
        if t.kernel_thread:
            return Stack(problem="unavailable")
        return self.unwinder.walk(t.pid, t.ip, t.sp, t.bp, t.tid)

    # --- at the start ---
    def put_blocked(self, programs: Sequence[Program], start_ns: int, state_mask: int,
                    user: bool, kernel: bool, epoch: int = 0) -> int:
        """Put the blocks of the threads blocked now into the off-CPU
        programs, timed from start_ns; how many threads."""
        self.start_ns = start_ns
        put: dict[int, ThreadNow] = {}
        # blocked before the programs attached (after: the block is theirs)
        blocked = [t for t in self.take() if self._wanted(t, state_mask)
                   and (t.since_ns is None or t.since_ns < start_ns)]
        runs = {t.tid: self._runs(t) for t in blocked}   # (right after the census)
        for t in blocked:
            user_stack = self.user_stack(t) if user else NOT_REQUESTED
            # it ran since the census (so its stack was walked from registers
            # older than its memory), or it is awake now and waits for a CPU:
            # its block is over. Not put in then, and looked at again once in
            # (it may wake meanwhile): taken back before it can switch in and
            # be charged for it from the start (the second look below comes
            # after every walk: too late then). Its stacks are registered
            # only for a block that goes in (and kept after a take-back: the
            # switch-in may have charged the block with them already)
            if self._woke(t, runs[t.tid]):
                continue
            u = self._register(programs, user_stack)
            k = self._register(programs, t.kernel if kernel else NOT_REQUESTED)
            start = abi.Start(ts=start_ns, pid=t.pid, user_stack_id=u, kernel_stack_id=k,
                              stack_epoch=epoch, state=t.state | abi.STATE_BEFORE_START,
                              unwinder=abi.UNWINDER_DWARF, comm=t.comm.encode()[:15])
            if not all([p.put_block(t.tid, start) for p in programs]) \
                    or self._woke(t, runs[t.tid]):
                self._take_back(programs, t.tid, start_ns)
            else:
                put[t.tid] = t
        # a thread that ran between the census and now was not blocked since
        # before the start after all: its block comes out again
        for t in self.take():
            was = put.get(t.tid)
            if was is not None and (not self._wanted(t, state_mask)
                                    or t.exec_start != was.exec_start):
                self._take_back(programs, t.tid, start_ns)
                del put[t.tid]
        return len(put)

    @staticmethod
    def _take_back(programs: Sequence[Program], tid: int, start_ns: int) -> None:
        for p in programs:
            p.take_back_block(tid, start_ns)

    def _woke(self, t: ThreadNow, runs: int | None) -> bool:
        """Whether the thread has left the block the census saw: it has had
        a CPU since (schedstat's timeslices moved on from ``runs``) or is
        running or runnable now. On a busy machine a woken thread can wait
        hundreds of milliseconds for a CPU; its switch-in would then charge
        all of it from the start (as the BPF side sees no wakeup of a block
        put in after it)."""
        if runs is not None and self._runs(t) != runs:
            return True
        return self._state(t) == "R"

    def _state(self, t: ThreadNow) -> str | None:
        """The thread's state letter now (/proc's stat), None if not known."""
        text = self._task_file(t, "stat")
        try:
            return None if text is None else stat_fields(text)[0]
        except (ValueError, IndexError):
            return None

    def _runs(self, t: ThreadNow) -> int | None:
        """How many times the thread has been given a CPU (schedstat's
        timeslices), None if not known."""
        text = self._task_file(t, "schedstat")
        try:
            return None if text is None else int(text.split()[2])
        except (ValueError, IndexError):
            return None

    def _task_file(self, t: ThreadNow, name: str) -> str | None:
        """The text of one of the thread's /proc files, None if it is gone."""
        try:
            return (self.procfs.root / str(t.pid) / "task" / str(t.tid) / name).read_text()
        except OSError:
            return None

    def _register(self, programs: Sequence[Program], stack: Stack) -> int:
        if stack.problem == STACK_NOT_REQUESTED:
            return abi.STACK_NONE
        sid = abi.CENSUS_STACK_BIT | (self._next_id & (abi.CENSUS_STACK_BIT - 1))
        self._next_id += 1
        for p in programs:
            p.census_stacks[sid] = stack
        return sid

    @staticmethod
    def _wanted(t: ThreadNow, state_mask: int) -> bool:
        if t.on_cpu or not t.blocked or t.kernel_thread or not t.state & BLOCKED_STATES:
            return False  # running, runnable, exiting, or a state not known
        return not state_mask or bool(t.state & state_mask)


# --- what every thread is doing now (ember dump, the agent's /threads) ---

#: Kernel functions every blocked thread passes through on its way to sleep:
#: the one it blocked *in* is the first frame past them.
SCHEDULER = frozenset({
    "__schedule", "schedule", "schedule_timeout", "schedule_hrtimeout_range",
    "schedule_hrtimeout_range_clock", "schedule_preempt_disabled", "io_schedule",
    "io_schedule_timeout", "__switch_to", "__switch_to_asm", "preempt_schedule_common",
    "preempt_schedule_irq", "do_nanosleep", "futex_do_wait"})


@dataclass(frozen=True)
class ThreadReport:
    pid: int
    tid: int
    comm: str
    state: str                  # running, runnable, or the blocked state's name
    off_cpu_s: float | None     # how long off the CPU (None: running, or unknown)
    since_ns: int | None        # monotonic: since when
    blocked_in: str             # the kernel function it blocked in ("" if none)
    user: tuple[Frame, ...]     # root first
    kernel: tuple[Frame, ...]   # root (the system call entry) first

    def as_json(self) -> dict[str, object]:
        return {"pid": self.pid, "tid": self.tid, "comm": self.comm, "state": self.state,
                "off_cpu_seconds": self.off_cpu_s, "since_monotonic_ns": self.since_ns,
                "blocked_in": self.blocked_in,
                "user": [f.name for f in self.user], "kernel": [f.name for f in self.kernel]}


def _state(t: ThreadNow) -> str:
    if t.on_cpu:
        return "running"
    if t.state == abi.STATE_RUNNABLE:
        return "runnable"
    return abi.state_name(t.state)


def _blocked_in(t: ThreadNow, kernel: Sequence[Frame]) -> str:
    if t.on_cpu or t.state == abi.STATE_RUNNABLE:
        return ""
    for f in kernel:  # leaf first
        if f.name not in SCHEDULER:
            return f.name
    return ""


class Dumper:
    """A census and the symbols to name what it finds; reusable (--watch)."""

    def __init__(self, census: Census, symbolizer: Symbolizer,
                 python: PythonNames | None = None):
        self.census = census
        self.symbolizer = symbolizer
        # names frames as samples do (Python frames in place of the loop's)
        self.frames = SampleBuilder(symbolizer, profile_kind("offcpu"), python=python)

    @classmethod
    def standalone(cls, include_self: bool = False) -> Dumper:
        """With a census and symbols of its own (ember dump)."""
        procfs = ProcFS()
        try:
            kernel: KernelSymbols | None = KernelSymbols()
        except SymbolizationError as exc:  # kernel frames stay addresses
            log.warning("%s", exc)
            kernel = None
        python = PythonNames(Interpreters(procfs))
        unwinder = RemoteUnwinder(procfs, python=python.interpreters.bpf_value)
        return cls(Census(procfs, include_self, unwinder),
                   Symbolizer(ProcessTable(procfs), kernel), python)

    def close(self) -> None:
        self.census.close()

    def take(self, pids: Iterable[int] | None) -> list[ThreadReport]:
        """Every user thread of pids (None: of every process), now, the
        longest-blocked first."""
        self.census.set_pids(pids)
        found = [t for t in self.census.take() if not t.kernel_thread]
        self.symbolizer.processes.refresh({t.pid for t in found})
        out = []
        for t in found:
            user = (self.census.user_stack(t) if not t.on_cpu
                    else Stack(problem=STACK_NOT_REQUESTED))
            kframes = self.frames.frames("kernel", t.kernel, t.pid, False)
            uframes = self.frames.frames("user", user, t.pid, False)
            out.append(ThreadReport(
                pid=t.pid, tid=t.tid, comm=t.comm, state=_state(t),
                off_cpu_s=None if t.off_cpu_ns is None else t.off_cpu_ns / 1e9,
                since_ns=None if t.on_cpu else t.since_ns,
                blocked_in=_blocked_in(t, kframes[::-1]),
                user=tuple(uframes), kernel=tuple(kframes)))
        out.sort(key=lambda r: (-(r.off_cpu_s or 0.0), r.pid, r.tid))
        return out


def render(reports: Sequence[ThreadReport]) -> str:
    """Text: a header line per thread, then its stack root first, indented."""
    lines = []
    for r in reports:
        when = "" if r.off_cpu_s is None else f" for {r.off_cpu_s:.3f}s"
        where = f" in {r.blocked_in}" if r.blocked_in else ""
        lines.append(f"Thread {r.tid} ({r.comm}) of {r.pid}: {r.state}{where}{when}")
        for f in (*r.user, *r.kernel):
            lines.append(f"    {f.name}" + (" [k]" if f in r.kernel else ""))
        lines.append("")
    return "\n".join(lines)
