"""What every thread of the targets is doing now, and since when.

The census program (bpf/census.c, a task iterator) gives each thread's
state, kernel stack, the user registers it entered the kernel with, the CPU
it last ran on, and when it last went off a CPU, on two clocks:

- ``switched``, on the runqueue clock (sched_clock), with ``rq_now``, that
  clock on the reader's CPU when the census looked (and ``now``, the same
  moment on CLOCK_MONOTONIC). The runqueue clock runs at the monotonic
  clock's rate, so a block's length is ``rq_now - switched``.
- ``se.exec_start``: the scheduler's task clock of that CPU, which is
  sched_clock less the time the CPU was stolen by the hypervisor and spent
  in interrupts. It runs behind CLOCK_MONOTONIC by a different amount on
  each CPU, and the amount grows with that time: a loaded VM loses 1-3% of
  each CPU's time that way, so a thread blocked for a minute would seem
  blocked for up to 2 s less. It times a block only for threads outside
  the fair class (real-time, deadline, sched_ext: only the fair class marks
  a switch-in in ``prev_sum_exec_runtime``) and when the kernel lacks the
  runqueue clock's fields (no CONFIG_FAIR_GROUP_SCHED or
  CONFIG_SCHED_INFO); ``SchedClock`` then measures each CPU's offset as
  late as it can: a thread pinned to the CPU sleeps a moment, then reads its
  own exec_start (``/proc/thread-self/sched``), which is then its switch-in
  time. exec_start still tells whether a thread ran between two censuses.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .. import abi
from .drain import Stack

_SCHED = "/proc/thread-self/sched"
_TRIES = 3


def _exec_start_ns(text: str) -> int | None:
    for line in text.splitlines():
        if line.startswith("se.exec_start"):
            ms, _, frac = line.split(":", 1)[1].strip().partition(".")
            return int(ms) * 1_000_000 + int(frac.ljust(6, "0")[:6])
    return None


def _offset_here() -> int | None:
    """CLOCK_MONOTONIC less this CPU's task clock (the smallest of a few
    tries: exec_start is at most as late as the read)."""
    best = None
    for _ in range(_TRIES):
        time.sleep(0.0002)  # off the CPU and back: exec_start is now
        now = time.monotonic_ns()
        try:
            with open(_SCHED) as f:
                start = _exec_start_ns(f.read())
        except OSError:
            return None
        if start is None:
            return None
        best = now - start if best is None else min(best, now - start)
    return best


class SchedClock:
    """Per-CPU offsets from the scheduler's task clock to CLOCK_MONOTONIC."""

    def __init__(self) -> None:
        self.offsets: dict[int, int] = {}

    def calibrate(self, cpus: Sequence[int] | None = None) -> None:
        cpus = sorted(os.sched_getaffinity(0)) if cpus is None else cpus
        found: dict[int, int] = {}

        def measure(cpu: int) -> None:
            try:
                os.sched_setaffinity(0, {cpu})
            except OSError:
                return
            off = _offset_here()
            if off is not None:
                found[cpu] = off

        for cpu in cpus:  # a thread each: the caller's affinity stays as it is
            t = threading.Thread(target=measure, args=(cpu,), name="ember-clock")
            t.start()
            t.join()
        self.offsets = found

    def monotonic(self, cpu: int, exec_start: int) -> int | None:
        off = self.offsets.get(cpu)
        return None if off is None or not exec_start else exec_start + off


@dataclass(frozen=True)
class ThreadNow:
    """One thread as the census saw it."""

    pid: int
    tid: int
    comm: str
    state: int                 # abi.STATE_*; RUNNABLE: running or waiting for a CPU
    on_cpu: bool
    kernel_thread: bool
    since_ns: int | None       # monotonic: when it last went off (or on) a CPU
    now_ns: int                # monotonic: when the census looked
    ip: int                    # user registers at its kernel entry
    sp: int
    bp: int
    kernel: Stack
    exec_start: int = 0        # the raw task clock value: changes whenever it runs

    @property
    def blocked(self) -> bool:
        return self.state != abi.STATE_RUNNABLE

    @property
    def off_cpu_ns(self) -> int | None:
        """How long it has been off the CPU (None: running, or unknown)."""
        if self.on_cpu or self.since_ns is None:
            return None
        return max(0, self.now_ns - self.since_ns)


def _on_rq_clock(t: abi.Thread) -> bool:
    """Whether the census timed this thread's switch-out on the runqueue
    clock (a fair-class thread, on a kernel with the fields), so its block
    needs no SchedClock."""
    return bool(t.switched and t.rq_now)


def needs_task_clock(raw: Sequence[abi.Thread]) -> bool:
    """Whether some thread off the CPU has no switch-out on the runqueue
    clock (the kernel lacks its fields): SchedClock must then be measured."""
    return any(not _on_rq_clock(t) for t in raw if not t.flags & abi.THREAD_ON_CPU)


def _since(t: abi.Thread, clock: SchedClock) -> int | None:
    if _on_rq_clock(t):
        # a switch-out a moment after the reader's runqueue clock was last
        # updated reads as now, never as later
        return int(t.now) - max(0, int(t.rq_now) - int(t.switched))
    return clock.monotonic(t.cpu, t.exec_start)


def threads(raw: Sequence[abi.Thread], clock: SchedClock) -> list[ThreadNow]:
    out = []
    for t in raw:
        n = t.kernel_len // 8 if t.kernel_len > 0 else 0
        kernel = (Stack(tuple(t.kernel[:n])) if n
                  else Stack(problem="unavailable" if t.kernel_len >= 0 else "error"))
        out.append(ThreadNow(
            pid=t.pid, tid=t.tid, comm=t.comm.split(b"\0", 1)[0].decode("utf-8", "replace"),
            state=t.state, on_cpu=bool(t.flags & abi.THREAD_ON_CPU),
            kernel_thread=bool(t.flags & abi.THREAD_KERNEL),
            since_ns=_since(t, clock), now_ns=t.now,
            ip=t.ip, sp=t.sp, bp=t.bp, kernel=kernel, exec_start=t.exec_start))
    return out
