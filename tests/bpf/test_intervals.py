"""Off-CPU time charged in the interval it passes: the agent with 10 s
intervals, a thread blocked for the whole run, and busy mixed threads."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from ember.encode.pprof import decode_pprof, from_proto
from tests.support.agent import agent_cfg, running_agent
from tests.support.collector import collector_at
from tests.support.net import free_port

pytestmark = pytest.mark.bpf

INTERVAL_S = 10.0


def thread_names(pid: int) -> dict[int, str]:
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        out[int(task.name)] = (task / "comm").read_text().strip()
    return out


def noted_at(ns: str) -> float:
    return int(ns) / 1e9


@pytest.mark.parametrize("offcpu_sample", [0.0, 0.001])  # the exact and the sampled program
def test_each_interval_holds_the_time_that_passed_in_it(start_workload, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                        offcpu_sample: float) -> None:
    w = start_workload("long_block", 300)   # (killed at the end; the agent's compile + 62 s)
    names = thread_names(w.pid)
    sleeper = next(t for t, n in names.items() if n == "sleeper")
    port = free_port()
    c = collector_at(tmp_path, port)
    try:
        metrics_port = free_port()
        cfg = agent_cfg(tmp_path, port, w.pid, interval=INTERVAL_S, offcpu_sample=offcpu_sample,
                        frequency=999, metrics_listen=f"127.0.0.1:{metrics_port}")
        with running_agent(cfg):
            time.sleep(1)
            os.kill(w.pid, signal.SIGUSR1)  # the sleeper blocks from now on
            blocked_at = time.monotonic()
            time.sleep(6 * INTERVAL_S + 2)
            # the census on request: the sleeper, blocked for as long as it has been
            url = f"http://127.0.0.1:{metrics_port}/threads?min_blocked=30"
            before = time.monotonic()
            with urllib.request.urlopen(url, timeout=30) as r:
                census = json.loads(r.read())["threads"]
            asked = time.monotonic()
        [longest] = [t for t in census if t["tid"] == sleeper]
        assert longest["blocked_in"] == "hrtimer_nanosleep" and "block_long" in longest["user"]
        # since when: what the sleeper noted a moment before it blocked (later
        # by any preemption in between). On the scheduler's task clock, which
        # loses the CPU's stolen and interrupt time, a loaded VM put it 1.8 s
        # late after the minute
        assert w.proc.stdout is not None
        tag, noted = w.proc.stdout.readline().split()
        assert tag == "blocked" and noted_at(noted) >= blocked_at - 0.01
        since = longest["since_monotonic_ns"] / 1e9
        assert -0.01 <= since - noted_at(noted) <= 0.25, (since, noted_at(noted), longest)
        # for how long: up to the census, taken while the request was served
        assert before - since - 0.01 <= longest["off_cpu_seconds"] <= asked - since + 0.01, \
            (before, asked, longest)
        assert all(t["off_cpu_seconds"] >= 30 for t in census)
        rows = c.store.query(0, time.time_ns() + 10**9, {}, None)
    finally:
        c.close()
    # per interval (the profile's time) and thread: on-CPU and off-CPU ns
    cpu: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    off: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    duration: dict[int, int] = {}
    for row in rows:
        name = row.labels["__name__"]
        _, samples = from_proto(decode_pprof(row.data))
        duration[row.time_ns] = row.duration_ns
        for s in samples:
            if name == "ember_cpu":
                cpu[row.time_ns][s.tid] += s.values[1]
            elif name == "ember_offcpu":
                off[row.time_ns][s.tid] += s.values[1]
    windows = sorted(off)
    assert len(windows) >= 6, windows
    # the first window starts with the agent, the last ends with it: whole ones
    for t in windows[1:-1]:
        length = duration[t]
        assert abs(length - INTERVAL_S * 1e9) < 0.1 * INTERVAL_S * 1e9, length
        # blocked for the whole run: each interval carries its own share, not
        # everything at the end (the thread never wakes while the agent runs)
        assert abs(off[t][sleeper] - length) <= 0.05 * length, (t, off[t][sleeper], length)
        # no thread has more on- plus off-CPU time than the interval had
        for tid in set(cpu[t]) | set(off[t]):
            total = cpu[t][tid] + off[t][tid]
            assert total <= 1.02 * length, (names.get(tid), tid, total, length)
        mixed = [tid for tid, n in names.items() if n == "mixed"]
        assert len(mixed) == 2
        for tid in mixed:
            assert cpu[t][tid] > 0.2 * length and off[t][tid] > 0.1 * length, (tid, t)
    # the last window, cut short by the agent's stop, charges the block up to it
    last = windows[-1]
    assert off[last][sleeper] >= 0.9 * duration[last], (off[last][sleeper], duration[last])
