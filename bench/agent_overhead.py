#!/usr/bin/env python3
"""The agent's own cost: CPU seconds and peak RSS per minute of profiling the
whole host at the default settings (19 Hz, 10 s interval, on-CPU and
off-CPU) with N busy processes, and how both grow with the number of
distinct stacks (many_stacks: 2^depth stacks per process).

    .venv/bin/python bench/agent_overhead.py [--seconds 60] [--procs 50]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from common import ROOT, need_root

EMBER = str(ROOT / ".venv/bin/ember")
BIN = ROOT / "tests/fixtures/bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(label: str, workload: list[list[str]], seconds: float, state: Path,
        frequency: int | None = None) -> None:
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL) for cmd in workload]
    gport, hport, mport = free_port(), free_port(), free_port()
    collector = subprocess.Popen([EMBER, "collector", "--grpc-listen", f"127.0.0.1:{gport}",
                                  "--http-listen", f"127.0.0.1:{hport}", "--storage",
                                  str(state / f"{label}.db")], stderr=subprocess.DEVNULL)
    extra = ["--frequency", str(frequency)] if frequency else []
    agent = subprocess.Popen([EMBER, "agent", "--collector", f"127.0.0.1:{gport}",
                              "--metrics-listen", f"127.0.0.1:{mport}",
                              "--spool-dir", str(state / f"{label}.spool"), *extra],
                             stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(8)  # compile and attach
        c0, t0 = cpu_seconds(agent.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = cpu_seconds(agent.pid), time.monotonic()
        rss = peak_rss_mb(agent.pid)
        minutes = (t1 - t0) / 60
        print(f"{label:32s} agent CPU {(c1 - c0) / minutes:6.2f} s/min "
              f"({(c1 - c0) / (t1 - t0):6.2%} of one core)   peak RSS {rss:6.1f} MB", flush=True)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
        collector.send_signal(signal.SIGTERM)
        collector.wait(timeout=30)
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--procs", type=int, default=50)
    args = ap.parse_args()
    need_root()
    life = str(args.seconds + 30)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        run("idle host (baseline)", [], args.seconds, state)
        run(f"{args.procs} busy processes", [[str(BIN / "cpu_shares"), life]] * args.procs,
            args.seconds, state)
        for depth in (4, 8, 12):
            run(f"{args.procs} x {2 ** depth} stacks @99Hz",
                [[str(BIN / "many_stacks"), life, str(depth)]] * args.procs, args.seconds,
                state, frequency=99)


if __name__ == "__main__":
    main()
