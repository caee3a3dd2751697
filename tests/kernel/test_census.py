"""The census's records in monotonic time (no kernel needed)."""

from __future__ import annotations

import os

from ember import abi
from ember.kernel.census import SchedClock, _exec_start_ns, needs_task_clock, threads

SCHED = """python3 (1234, #threads: 1)
-------------------------------------------------------------------
se.exec_start                                :      33701263.016763
se.vruntime                                  :          1131.351728
"""


def test_exec_start_parsed_to_ns() -> None:
    assert _exec_start_ns(SCHED) == 33_701_263_016_763
    assert _exec_start_ns("se.exec_start : 5.5\n") == 5_500_000
    assert _exec_start_ns("nothing here\n") is None


def raw(**kw: int) -> abi.Thread:
    t = abi.Thread(pid=10, tid=11, state=abi.STATE_INTERRUPTIBLE, exec_start=1_000,
                   now=50_000, cpu=1, ip=0x401000, sp=0x7FFF0000, bp=0x7FFF0100,
                   comm=b"worker")
    for k, v in kw.items():
        setattr(t, k, v)
    return t


def test_threads_put_exec_start_on_the_monotonic_clock_of_its_cpu() -> None:
    clock = SchedClock()
    clock.offsets = {0: 100, 1: 20_000}
    t = raw(kernel_len=16)
    t.kernel[0], t.kernel[1] = 0xFFFFFFFF81000010, 0xFFFFFFFF81000020
    [now] = threads([t], clock)
    assert now.since_ns == 21_000 and now.off_cpu_ns == 29_000
    assert now.blocked and not now.on_cpu and now.comm == "worker"
    assert now.kernel.ips == (0xFFFFFFFF81000010, 0xFFFFFFFF81000020)
    # running: not off the CPU; an unmeasured CPU: since unknown
    [running] = threads([raw(flags=abi.THREAD_ON_CPU, state=abi.STATE_RUNNABLE)], clock)
    assert running.off_cpu_ns is None and not running.blocked
    [unknown] = threads([raw(cpu=7)], clock)
    assert unknown.since_ns is None and unknown.off_cpu_ns is None
    # no kernel stack: said why
    [failed] = threads([raw(kernel_len=-14)], clock)
    assert failed.kernel.problem == "error"


def test_threads_time_a_block_on_the_runqueue_clock_when_they_have_it() -> None:
    # the task clock (exec_start) lost 2 s to steal during the block; the
    # runqueue clock did not: the block is rq_now - switched long
    clock = SchedClock()
    clock.offsets = {1: 20_000}
    t = raw(switched=5_000_000_000, rq_now=65_000_000_000, now=70_000_000_000,
            exec_start=3_000_000_000)
    [now] = threads([t], clock)
    assert now.off_cpu_ns == 60_000_000_000 and now.since_ns == 10_000_000_000
    assert not needs_task_clock([t])
    # a switch-out stamped after the reader's (older) clock: blocked from now
    [late] = threads([raw(switched=9, rq_now=5, now=70)], clock)
    assert late.since_ns == 70 and late.off_cpu_ns == 0
    # without the runqueue clock: the task clock, so SchedClock is needed,
    # unless the thread is on a CPU (then since does not matter)
    assert needs_task_clock([raw(switched=0, rq_now=65)])
    assert needs_task_clock([raw(switched=5, rq_now=0)])
    assert not needs_task_clock([raw(flags=abi.THREAD_ON_CPU, state=abi.STATE_RUNNABLE)])


def test_calibration_measures_every_cpu_it_may_run_on() -> None:
    clock = SchedClock()
    clock.calibrate()
    assert set(clock.offsets) == set(os.sched_getaffinity(0)), clock.offsets
