#!/usr/bin/env python3
"""Which way of draining is right? Runs the real on-CPU program at 4999 Hz
on all CPUs with busy workloads and drains every 10 ms, two ways:

- naive: read all counts, then delete each key read (what bcc tools do with
  items() + clear()): an increment between the read and the delete is lost;
- epoch: ember's Drainer (flip, RCU grace period, read and delete the old
  epoch only).

Compares what was drained with the kernel's own COUNTED counter.

    .venv/bin/python bench/drain_race.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import subprocess
import time

from common import ROOT, need_root
from ember import abi
from ember.kernel.drain import Drainer
from ember.kernel.program import Program, self_tgid
from ember.kernel.programs import program_kind


def run(kind: str, seconds: float) -> tuple[int, int]:
    p = Program(program_kind("cpu"))
    try:
        p.configure(abi.Config(stack_flags=abi.STACK_USER | abi.STACK_KERNEL,
                               self_tgid=self_tgid()))
        p.attach(frequency=4999)
        drained = 0
        d = Drainer(p)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.01)
            if kind == "epoch":
                drained += d.drain().stats.events
            else:
                items = p.counts_map.lookup_batch()
                drained += sum(v.count for _, v in items)
                for k, _ in items:
                    p.counts_map.delete(abi.Key.from_buffer_copy(k))
        p.detach()
        if kind == "epoch":
            drained += d.drain(final=True).stats.events
        else:
            drained += sum(v.count for _, v in p.counts_map.lookup_batch())
        return drained, p.stats()[abi.Stat.COUNTED]
    finally:
        p.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    args = ap.parse_args()
    need_root()
    busy = [subprocess.Popen([str(ROOT / "tests/fixtures/bin" / name), "600"],
                             stdout=subprocess.DEVNULL)
            for name in ("cpu_shares", "pie_main", "cpp_names")]
    try:
        for kind in ("naive", "epoch", "naive", "epoch"):
            drained, counted = run(kind, args.seconds)
            print(f"{kind:6s} drained {drained:8d}  kernel counted {counted:8d}  "
                  f"lost {counted - drained:5d} ({(counted - drained) / counted:.4%})",
                  flush=True)
    finally:
        for b in busy:
            b.kill()
            b.wait()


if __name__ == "__main__":
    main()
