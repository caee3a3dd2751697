#!/usr/bin/env python3
"""Off-CPU profiling cost per context switch.

`taskset -c 0 perf bench sched pipe`: two processes on one CPU ping-pong over
a pipe, two context switches per round trip. Runs alternate between "none"
and "ember record --mode offcpu" (whole host, default settings), so drift in
the machine hits both alike. Reports the throughput ratio and the time added
per context switch.

    .venv/bin/python bench/offcpu_overhead.py [--rounds 5] [--loops 200000]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
from pathlib import Path

from common import need_root, start_ember, stop, summary


def pipe_bench(loops: int) -> float:
    """Microseconds per round trip."""
    out = subprocess.run(["taskset", "-c", "0", "perf", "bench", "sched", "pipe", "-l",
                          str(loops)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"([\d.]+)\s+usecs/op", out)
    if not m:
        raise RuntimeError(out)
    return float(m.group(1))


def prog_stats(pid: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the BPF programs process pid holds
    (needs kernel.bpf_stats_enabled=1)."""
    t = n = 0
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            text = info.read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        if "run_cnt" in fields and "prog_type" in fields:
            t += int(fields["run_time_ns"])
            n += int(fields["run_cnt"])
    return t, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loops", type=int, default=200_000)
    ap.add_argument("--ember-args", default="",
                    help="extra `ember record` arguments, e.g. '--no-kernel-stacks'")
    args = ap.parse_args()
    need_root()
    base: list[float] = []
    prof: list[float] = []
    per_run: list[float] = []
    stats_path = Path("/proc/sys/kernel/bpf_stats_enabled")
    stats_before = stats_path.read_text().strip()
    for i in range(args.rounds):
        order = ("none", "ember") if i % 2 == 0 else ("ember", "none")
        for which in order:
            if which == "none":
                base.append(pipe_bench(args.loops))
            else:
                ember = start_ember("--mode", "offcpu", "-o", "/dev/null",
                                        *args.ember_args.split())
                try:
                    stats_path.write_text("1")
                    t0, n0 = prog_stats(ember.pid)
                    prof.append(pipe_bench(args.loops))
                    t1, n1 = prog_stats(ember.pid)
                    stats_path.write_text(stats_before)
                    per_run.append((t1 - t0) / max(1, n1 - n0))
                finally:
                    stats_path.write_text(stats_before)
                    stop(ember)
        print(f"round {i + 1}: none {base[-1]:.3f} us/op, ember {prof[-1]:.3f} us/op", flush=True)
    ratios = [b / p for b, p in zip(base, prof, strict=True)]  # throughput ratio
    added_ns = [(p - b) * 1000 / 2 for b, p in zip(base, prof, strict=True)]
    print(f"round trip, none:   {summary(base)} us")
    print(f"round trip, ember:  {summary(prof)} us")
    print(f"throughput ember/none: {summary(ratios)}")
    print(f"added per context switch: {summary(added_ns)} ns")
    print(f"BPF program time per run (kernel bpf_stats): {summary(per_run)} ns")
    print(f"=> {statistics.median(ratios):.1%} of unprofiled throughput, "
          f"+{statistics.median(added_ns):.0f} ns per switch")


if __name__ == "__main__":
    main()
