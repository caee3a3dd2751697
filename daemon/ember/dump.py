"""``ember dump``: what every thread of some processes is doing now, and
since when, with its whole stack (kernel, then native user frames), the
longest-blocked first.

One census (threads.py, bpf/census.c) gives each thread's state, how long it
has been off the CPU and its kernel stack; its user stack is walked from the
registers it entered the kernel with (unwind/remote.py). A running thread's
user registers are those of its last kernel entry: its user stack is shown
as of then, and not at all for a thread that is running right now.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from . import abi
from .errors import SymbolizationError
from .kernel.census import ThreadNow
from .kernel.drain import Stack
from .model import Frame
from .symbols.kallsyms import KernelSymbols
from .symbols.procmaps import ProcessTable, ProcFS
from .symbols.symbolizer import Symbolizer
from .threads import Census

log = logging.getLogger(__name__)

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

    def __init__(self, include_self: bool = False):
        procfs = ProcFS()
        self.processes = ProcessTable(procfs)
        try:
            kernel: KernelSymbols | None = KernelSymbols()
        except SymbolizationError as exc:  # kernel frames stay addresses
            log.warning("%s", exc)
            kernel = None
        self.symbolizer = Symbolizer(self.processes, kernel)
        self.census = Census(procfs, include_self)

    def close(self) -> None:
        self.census.close()

    def take(self, pids: Iterable[int] | None) -> list[ThreadReport]:
        self.census.set_pids(pids)
        found = [t for t in self.census.take() if not t.kernel_thread]
        self.processes.refresh({t.pid for t in found})
        out = []
        for t in found:
            user = self.census.user_stack(t) if not t.on_cpu else Stack(problem="running")
            kframes = self.symbolizer.kernel_frames(t.kernel.ips) if t.kernel.ips else []
            uframes = (self.symbolizer.user_frames(t.pid, user.ips) if user.ips else [])
            out.append(ThreadReport(
                pid=t.pid, tid=t.tid, comm=t.comm, state=_state(t),
                off_cpu_s=None if t.off_cpu_ns is None else t.off_cpu_ns / 1e9,
                since_ns=None if t.on_cpu else t.since_ns,
                blocked_in=_blocked_in(t, kframes),
                user=tuple(reversed(uframes)), kernel=tuple(reversed(kframes))))
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
