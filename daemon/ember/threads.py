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
like its own. The sampled program walks the stacks itself when the thread
wakes; for a block still in flight at the end (a sampled program counts a
block only when it ends), ``Census.in_flight`` charges what passed of it,
from the census again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from . import abi
from .errors import BpfError
from .kernel.census import SchedClock, ThreadNow, threads
from .kernel.drain import STACK_NOT_REQUESTED, Record, Stack
from .kernel.program import Program, self_tgid
from .kernel.programs import program_kind
from .symbols.procmaps import ProcFS
from .unwind.remote import RemoteUnwinder

log = logging.getLogger(__name__)

NOT_REQUESTED = Stack(problem=STACK_NOT_REQUESTED)


class Census:
    """The census program, loaded, and what it is read for."""

    def __init__(self, procfs: ProcFS | None = None, include_self: bool = False):
        self.program = Program(program_kind("census"))
        self.include_self = include_self
        self.clock = SchedClock()
        self.unwinder = RemoteUnwinder(procfs)
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
        """Every thread of the processes looked at, now (clocks measured first)."""
        self.clock.calibrate()
        return threads(self.program.census(), self.clock)

    def user_stack(self, t: ThreadNow) -> Stack:
        if t.kernel_thread:
            return Stack(problem="unavailable")
        return self.unwinder.walk(t.pid, t.ip, t.sp, t.bp)

    # --- at the start ---
    def put_blocked(self, programs: Sequence[Program], start_ns: int, state_mask: int,
                    user: bool, kernel: bool, epoch: int = 0) -> int:
        """Put the blocks of the threads blocked now into the off-CPU
        programs, timed from start_ns; how many threads."""
        self.start_ns = start_ns
        found = 0
        for t in self.take():
            if not self._wanted(t, state_mask):
                continue
            if t.since_ns is not None and t.since_ns >= start_ns:
                continue  # blocked after the programs attached: theirs
            u = self._register(programs, self.user_stack(t) if user else NOT_REQUESTED)
            k = self._register(programs, t.kernel if kernel else NOT_REQUESTED)
            start = abi.Start(ts=start_ns, pid=t.pid, user_stack_id=u, kernel_stack_id=k,
                              stack_epoch=epoch, state=t.state | abi.STATE_BEFORE_START,
                              unwinder=abi.UNWINDER_DWARF, comm=t.comm.encode()[:15])
            if all([p.put_block(t.tid, start) for p in programs]):
                found += 1
        return found

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
        if t.on_cpu or not t.blocked or t.kernel_thread:
            return False
        return not state_mask or bool(t.state & state_mask)

    # --- at the end ---
    def in_flight(self, end_ns: int, start_ns: int, state_mask: int, user: bool,
                  kernel: bool, min_ns: int = 0, max_ns: int = 0) -> list[Record]:
        """Blocks still in flight now, charged from when they began (not
        before start_ns, the session's start) up to end_ns, one block each."""
        out = []
        for t in self.take():
            if not self._wanted(t, state_mask) or t.since_ns is None:
                continue
            began = t.since_ns
            state = t.state
            if began <= start_ns:
                state |= abi.STATE_BEFORE_START
            frm = max(began, start_ns)
            if end_ns <= frm or end_ns - began < min_ns or (max_ns and end_ns - began > max_ns):
                continue
            out.append(Record(
                pid=t.pid, tid=t.tid, comm=t.comm, state=state,
                user=self.user_stack(t) if user else NOT_REQUESTED,
                kernel=t.kernel if kernel else NOT_REQUESTED,
                count=1, total_ns=end_ns - frm, in_flight=True, kind=abi.KIND_BLOCKED))
        return out
