"""Draining while the programs run: what the kernel counted is what ember
read, exactly, with drains every 20 ms under heavy event rates."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable

import pytest

from ember import abi
from ember.kernel.drain import Drainer
from ember.kernel.program import Program, self_tgid
from ember.kernel.programs import program_kind

pytestmark = pytest.mark.bpf


def drain_loop(program: Program, seconds: float) -> tuple[int, int, int]:
    d = Drainer(program)
    events = ns = missing = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.02)
        r = d.drain()
        events += r.stats.events
        ns += r.stats.total_ns
        missing += r.stats.stacks_missing
    program.detach()
    r = d.drain(final=True)
    return events + r.stats.events, ns + r.stats.total_ns, missing + r.stats.stacks_missing


def config() -> abi.Config:
    # every off-CPU kind at once: blocked, run queue, wakeup and off-wake keys
    return abi.Config(stack_flags=abi.STACK_USER | abi.STACK_KERNEL, self_tgid=self_tgid(),
                      modes=abi.MODE_BLOCKED | abi.MODE_RUNQ | abi.MODE_WAKEUP
                      | abi.MODE_OFFWAKE)


def test_oncpu_exact(start_workload) -> None:  # type: ignore[no-untyped-def]
    w1, w2 = start_workload("cpu_shares"), start_workload("pie_main")
    p = Program(program_kind("cpu"))
    try:
        p.configure(config())
        p.attach(frequency=4999)
        events, _, missing = drain_loop(p, 3)
        stats = p.stats()
    finally:
        p.close()
    assert events == stats[abi.Stat.COUNTED] > 10_000
    assert stats[abi.Stat.COUNTS_FULL] == 0 and missing == 0
    del w1, w2


def storm_drain(p: Program, cfg: abi.Config, attach: Callable[[], None]
                ) -> tuple[int, int, int, dict[abi.Stat, int]]:
    """Drain p every 20 ms for 3 s while two processes ping-pong over a pipe
    (a context-switch storm); what was drained, and the kernel's counters."""
    storm = subprocess.Popen(["perf", "bench", "sched", "pipe", "-l", "2000000"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)  # perf forks: kill the whole group
    try:
        p.configure(cfg)
        attach()
        events, ns, missing = drain_loop(p, 3)
        stats = p.stats()
    finally:
        os.killpg(storm.pid, signal.SIGKILL)
        storm.wait()
        p.close()
    assert events == stats[abi.Stat.COUNTED] > 10_000
    assert ns == stats[abi.Stat.COUNTED_NS]
    assert stats[abi.Stat.COUNTS_FULL] == 0 and missing == 0
    return events, ns, missing, stats


def test_offcpu_exact() -> None:
    p = Program(program_kind("sched"))
    storm_drain(p, config(), p.attach)


@pytest.mark.parametrize("sample_ns", [0, 1_000_000])
def test_offcpu_sampled_exact(sample_ns: int) -> None:
    """The sampled program under a switch storm: every block taken (0) or
    one in hundreds (1 ms). Weighted counts drained equal what the kernel
    counted, and no kernel stack is lost across the drains, though a chosen
    block is counted on its thread's way back to user space, often an epoch
    after its kernel stack was stored."""
    p = Program(program_kind("offcpu"))
    _, _, _, stats = storm_drain(p, abi.Config(stack_flags=abi.STACK_USER | abi.STACK_KERNEL,
                                               self_tgid=self_tgid(), sample_ns=sample_ns),
                                 p.attach)
    assert stats[abi.Stat.KERNEL_STACK_STALE] == 0
    assert stats[abi.Stat.KERNEL_STACK_COLLISION] == 0
    if sample_ns:
        assert stats[abi.Stat.SAMPLED] < 0.05 * stats[abi.Stat.EVENTS]
    else:
        assert stats[abi.Stat.SAMPLED] == stats[abi.Stat.EVENTS]
