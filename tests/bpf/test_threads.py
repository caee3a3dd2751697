"""Threads that were blocked before ember looked: found by the census,
charged from the start (`ember record`), and shown by `ember dump`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.pythons import DEBIAN_311

pytestmark = pytest.mark.bpf

EMBER = [sys.executable, "-m", "ember.cli"]
RECORD_S = 4.0
#: long_block.c's mixed threads nap 2 ms at a time (and the timer's 50 us slack)
NAP_US = 2100


def thread_names(pid: int) -> dict[int, str]:
    return {int(t.name): (t / "comm").read_text().strip()
            for t in Path(f"/proc/{pid}/task").iterdir()}


def run_time_ns(pid: int, tid: int) -> int:
    return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])


def run_delay_ns(pid: int, tid: int) -> int:
    """How long the thread has waited for a CPU, in all (schedstat)."""
    return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])


@pytest.mark.parametrize("sample_us", [1000, 0])  # the sampled and the exact program
def test_blocked_since_before_the_start(start_workload, tmp_path: Path, sample_us: int) -> None:  # type: ignore[no-untyped-def]
    """A thread asleep in block_long since 10 s before a 4 s off-CPU record:
    nearly all of its time in the record is off-CPU, under block_long, with
    the marker frame; the threads that spin and nap are charged as before."""
    w = start_workload("long_block", 60, "now")
    sleeper = next(t for t, n in thread_names(w.pid).items() if n == "sleeper")
    time.sleep(10)
    ran = run_time_ns(w.pid, sleeper)
    mixers = [t for t, n in thread_names(w.pid).items() if n == "mixed"]
    waited = {t: run_delay_ns(w.pid, t) for t in mixers}
    out = tmp_path / "off.folded"
    t0 = time.monotonic()
    r = subprocess.run([*EMBER, "record", "--mode", "offcpu", "--pid", str(w.pid),
                        "--duration", str(RECORD_S), "--sample-us", str(sample_us),
                        "-o", str(out)], capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert run_time_ns(w.pid, sleeper) - ran < 1_000_000  # truth: it never ran
    waited = {t: run_delay_ns(w.pid, t) - ns for t, ns in waited.items()}
    lines = [line.rsplit(" ", 1) for line in out.read_text().splitlines()]
    slept = [(stack, int(v)) for stack, v in lines if stack.startswith("sleeper;")]
    assert slept, out.read_text()
    assert all("block_long" in s and s.endswith("[blocked since before the start]")
               for s, _ in slept), slept
    us = sum(v for _, v in slept)
    # the record's window is its duration (the command's wall time bounds it)
    assert 0.95 * RECORD_S * 1e6 <= us <= wall * 1e6, (us, wall)
    # threads that block and wake during the record are not marked, except
    # for the one nap a mixed thread may have been in when the record began
    # (blocked since before the start, in its nanosleep): at most the nap and
    # the thread's wait for a CPU, which /proc says (the waits of the whole
    # record: a bound, on a machine as busy as it was)
    mixed = [(s, int(v)) for s, v in lines if s.startswith("mixed;")]
    marked = [(s, v) for s, v in mixed if "before the start" in s]
    assert sum(v for s, v in mixed if "before the start" not in s) > 0.1 * RECORD_S * 1e6, mixed
    assert all("hrtimer_nanosleep" in s for s, _ in marked), marked
    bound_us = sum(NAP_US + ns / 1000 for ns in waited.values())
    assert sum(v for _, v in marked) <= bound_us, (marked, waited)


def test_census_times_blocks_on_the_runqueue_clock(start_workload) -> None:  # type: ignore[no-untyped-def]
    """On this kernel the census reads each thread's switch-out and the
    reader's runqueue clock (no fallback to the task clock, which loses
    stolen time): the sleeper's block is as long as the kernel says."""
    from ember.kernel.census import needs_task_clock
    from ember.threads import Census

    w = start_workload("long_block", 60, "now")
    sleeper = next(t for t, n in thread_names(w.pid).items() if n == "sleeper")
    time.sleep(2)
    census = Census()
    try:
        census.set_pids([w.pid])
        raw = census.program.census()
    finally:
        census.close()
    [t] = [t for t in raw if t.tid == sleeper]
    assert t.switched and t.rq_now and not needs_task_clock([t]), (t.switched, t.rq_now)
    # blocked since about its start (it blocks at once), 2 s and more ago
    blocked_ns = t.rq_now - t.switched
    assert 1.9e9 < blocked_ns < 60e9, blocked_ns


def test_dump_states_blocking_functions_and_since(start_workload) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.Popen([str(Path(__file__).parents[1] / "fixtures/bin/dump_threads"), "30"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        _, pid_s, cond_at, read_at, rt_at = proc.stdout.readline().split()
        assert int(rt_at) > 0, "SCHED_FIFO refused"   # (as root it is not)
        pid = int(pid_s)
        time.sleep(1.5)
        r = subprocess.run([*EMBER, "dump", "-p", str(pid), "--json"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        threads = {t["comm"]: t for t in map(json.loads, r.stdout.splitlines())}
        assert {"condwait", "piperead", "spinner", "rtwait"} <= set(threads), threads.keys()
        cond, pipe, spin = threads["condwait"], threads["piperead"], threads["spinner"]
        assert cond["state"] == "sleeping" and "wait_cond" in cond["user"]
        assert any("pthread_cond_wait" in f for f in cond["user"]), cond["user"]
        assert "futex" in cond["blocked_in"], cond
        assert pipe["state"] == "sleeping" and "wait_read" in pipe["user"]
        assert pipe["blocked_in"].endswith("pipe_read"), pipe  # anon_pipe_read in 6.18
        assert spin["state"] in ("running", "runnable") and not spin["blocked_in"]
        # since when, within 100 ms of what the threads noted just before blocking
        assert abs(cond["since_monotonic_ns"] - int(cond_at)) < 100_000_000, cond
        assert abs(pipe["since_monotonic_ns"] - int(read_at)) < 100_000_000, pipe
        # a real-time thread too (the fair class's bookkeeping would put it
        # at least 0.4 s late)
        rt = threads["rtwait"]
        assert "wait_rt" in rt["user"], rt
        assert abs(rt["since_monotonic_ns"] - int(rt_at)) < 100_000_000, rt
        # the longest-blocked first
        order = [t["comm"] for t in map(json.loads, r.stdout.splitlines())]
        assert order.index("spinner") > max(order.index("condwait"), order.index("piperead"))
    finally:
        proc.kill()
        proc.wait()


NAPPER = """\
import time


def nap_long():
    time.sleep(120)


print("ready", flush=True)
nap_long()
"""


@pytest.mark.parametrize("sample_us", [1000, 0])  # the sampled and the exact program
def test_python_thread_blocked_since_before_the_start(tmp_path: Path, sample_us: int) -> None:
    """Debian's python3.11 asleep in nap_long since 10 s before the record:
    its time is off-CPU under the Python function, walked from its registers
    with its Python frames."""
    script = tmp_path / "napper.py"
    script.write_text(NAPPER)
    proc = subprocess.Popen([DEBIAN_311, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(10)
        out = tmp_path / "off.folded"
        r = subprocess.run([*EMBER, "record", "--mode", "offcpu", "--pid", str(proc.pid),
                            "--duration", str(RECORD_S), "--sample-us", str(sample_us),
                            "-o", str(out)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    finally:
        proc.kill()
        proc.wait()
    lines = [line.rsplit(" ", 1) for line in out.read_text().splitlines()]
    napping = [(s, int(v)) for s, v in lines if "nap_long" in s]
    assert napping, out.read_text()
    assert all(s.endswith("[blocked since before the start]") for s, _ in napping), napping
    assert sum(v for _, v in napping) >= 0.95 * RECORD_S * 1e6, napping


#: ``ember record`` with the census seeing the thread ``EMBER_SPINNER`` (which
#: runs) as blocked since long before, at both its looks: the race of a
#: thread the census found asleep that wakes before its block goes in and
#: runs on past the second look. ``EMBER_NO_SCHEDSTAT`` turns off the
#: daemon's checks of schedstat and of the state around each put (the
#: test's own check that it fails without them).
RACED = """
import dataclasses, os, sys
from ember import abi, threads
from ember.cli import main

spinner, seen = int(os.environ["EMBER_SPINNER"]), {}
real = threads.Census.take

def take(self):
    out = []
    for t in real(self):
        if t.tid == spinner:
            t = seen.setdefault(t.tid, dataclasses.replace(
                t, on_cpu=False, state=abi.STATE_INTERRUPTIBLE, since_ns=None))
        out.append(t)
    return out

threads.Census.take = take
if os.environ.get("EMBER_NO_SCHEDSTAT"):
    threads.Census._woke = lambda self, t, runs: False
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("sample_us", [1000, 0])  # the sampled and the exact program
def test_a_thread_that_ran_after_the_census_is_not_blocked_since_the_start(
        tmp_path: Path, sample_us: int) -> None:
    """Two spinning processes on one CPU, so each is preempted every few
    milliseconds; the census is made to see one of them blocked. None of its
    time is charged as blocked since before the start: schedstat says it got
    a CPU after the census, or (a busy machine: it has not had one since)
    its state is runnable, so its block is taken back as soon as it is put
    in. Before, its first switch-in after a preemption charged the time from
    the start under the stack walked from stale registers (CI's red run of
    400bfb3: 103 ms of a spinning thread, in its nap's kernel stack)."""
    cpu = min(os.sched_getaffinity(0))
    spin = [subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c",
                              "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.5)
        out = tmp_path / "off.folded"
        r = subprocess.run([sys.executable, "-c", RACED, "record", "--mode", "offcpu",
                            "--pid", str(spin[0].pid), "--duration", "2",
                            "--sample-us", str(sample_us), "-o", str(out)],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "EMBER_SPINNER": str(spin[0].pid)})
        assert r.returncode == 0, r.stderr
        # truth: it was preempted all along (schedstat's timeslices)
        assert int(Path(f"/proc/{spin[0].pid}/schedstat").read_text().split()[2]) > 10
    finally:
        for p in spin:
            p.kill()
            p.wait()
    marked = [line for line in out.read_text().splitlines() if "before the start" in line]
    assert marked == [], marked
