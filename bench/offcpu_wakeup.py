#!/usr/bin/env python3
"""What ending off-CPU blocks at the wakeup costs the default (sampled)
off-CPU program: the kernel's own run time of its BPF programs per context
switch (kernel.bpf_stats_enabled), with and without its sched_waking hook,
under `taskset -c 0 perf bench sched pipe` (a wakeup at every switch: the
worst case), alternating the two round by round; and the round trip time.

    .venv/bin/python bench/offcpu_wakeup.py [--rounds 7] [--loops 200000]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import need_root, pipe_us, spread
from ember import abi
from ember.kernel.program import Program, self_tgid
from ember.kernel.programs import program_kind

STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--loops", type=int, default=200_000)
    args = ap.parse_args()
    need_root()
    kind = program_kind("offcpu")
    p = Program(kind)
    p.configure(abi.Config(stack_flags=abi.STACK_USER | abi.STACK_KERNEL,
                           self_tgid=self_tgid(), sample_ns=1_000_000))
    before = STATS.read_text().strip()
    STATS.write_text("1")
    ns: dict[str, list[float]] = {"with sched_waking": [], "without": []}
    us: dict[str, list[float]] = {"none": [], "with sched_waking": [], "without": []}
    try:
        for r in range(args.rounds):
            order = ["none", "with sched_waking", "without"]
            for mode in order[r % 3:] + order[:r % 3]:
                if mode != "none":
                    for hook in kind.all_hooks():
                        if not hook.optional and (mode != "without"
                                                  or hook.point != "tp_btf/sched_waking"):
                            p.attach_hook(hook)
                t0, _ = p.run_stats()
                us[mode].append(pipe_us(args.loops))
                t1, _ = p.run_stats()
                p.detach()
                if mode != "none":
                    ns[mode].append((t1 - t0) / (2 * args.loops))
    finally:
        STATS.write_text(before)
        p.close()
    print(f"perf bench sched pipe, {args.loops} round trips on CPU 0, {args.rounds} rounds; "
          "median (min-max)")
    for mode, xs in ns.items():
        print(f"  BPF ns per switch, {mode:18} {spread(xs, '.0f')}")
    for mode, xs in us.items():
        print(f"  us per round trip, {mode:18} {spread(xs)}")


if __name__ == "__main__":
    main()
