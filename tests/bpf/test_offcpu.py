"""Off-CPU time on the real kernel: blocked time split, totals, states."""

from __future__ import annotations

import subprocess
import time

import pytest

from ember.record import RecordOptions

from .helpers import inclusive, record, where

pytestmark = pytest.mark.bpf


def test_epoll_and_sleep_split(start_workload) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("offcpu_waits")
    duration = 5.0
    profile, rec = record(RecordOptions(mode="offcpu", pids=(w.pid,), duration=duration))
    waiter = where(profile, lambda s: s.thread_name == "waiter")
    shares = inclusive(waiter, ["wait_epoll", "wait_sleep"], 1)
    assert abs(shares["wait_epoll"] - 40) <= 3, shares
    assert abs(shares["wait_sleep"] - 60) <= 3, shares
    blocked_s = sum(s.values[1] for s in waiter) / 1e9
    assert abs(blocked_s - duration) <= 0.1 * duration, blocked_s
    # the kernel part names the blocking paths
    frames = {f.name for s in waiter for f in s.frames}
    assert {"do_epoll_wait", "do_nanosleep", "schedule"} <= frames, frames
    assert {dict(s.labels)["thread_state"] for s in waiter} == {"sleeping"}
    assert rec.stats.kernel["counted_ns"] == sum(
        s.values[1] for s in profile.samples if ("in_flight", "true") not in s.labels)


def test_state_filter_and_thresholds(start_workload) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("offcpu_waits")
    # only uninterruptible sleep: the waiter never blocks that way
    profile, rec = record(RecordOptions(mode="offcpu", pids=(w.pid,), duration=1.5, state=2))
    assert not where(profile, lambda s: s.thread_name == "waiter")
    assert rec.stats.kernel["state_filtered"] > 0
    # blocks of 25 ms or more: only the 30 ms sleeps remain
    profile, rec = record(RecordOptions(mode="offcpu", pids=(w.pid,), duration=1.5,
                                        min_block_us=25_000))
    shares = inclusive(where(profile, lambda s: s.thread_name == "waiter"),
                       ["wait_epoll", "wait_sleep"], 1)
    assert shares["wait_epoll"] == 0 and shares["wait_sleep"] == 100
    assert rec.stats.kernel["below_min"] > 0


def test_runnable_time_kept_apart(fixture_bin) -> None:  # type: ignore[no-untyped-def]
    """Three CPU-bound processes on one CPU: they are off-CPU only because
    they wait for the CPU. That is run-queue time, reported by runqlat and
    never as blocked time."""
    procs = [subprocess.Popen(["taskset", "-c", "0", str(fixture_bin / "cpu_shares"), "10"],
                              stdout=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        pids = []
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().startswith("ready")
            pids.append(p.pid)
        time.sleep(0.2)
        profile, _ = record(RecordOptions(mode="runqlat", pids=tuple(pids), duration=2))
        total = sum(s.values[1] for s in profile.samples)
        assert all(s.frames[-1].name == "[runqueue]" for s in profile.samples)
        assert all(("thread_state", "runnable") in s.labels for s in profile.samples)
        # each of 3 threads sharing one CPU waits about 2/3 of the time
        assert 0.5 * 2 * 3 * 2 / 3 <= total / 1e9 <= 1.2 * 2 * 3 * 2 / 3
        blocked, _ = record(RecordOptions(mode="offcpu", pids=tuple(pids), duration=1))
        assert sum(s.values[1] for s in blocked.samples) < 0.05 * 1e9
    finally:
        for p in procs:
            p.kill()
            p.wait()
