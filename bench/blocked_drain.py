#!/usr/bin/env python3
"""What charging blocks in flight costs a drain: the exact off-CPU program
with N threads of a target blocked the whole time (they block after attach,
so each has a block in flight at every drain), drained every 50 ms.

Same run, same program, drains alternating between the Drainer as it is
(charging each block in flight up to the drain) and the same Drainer told
the program does not charge in flight (the drains before it did), so the
ratio is the cost of the in-flight charges alone.

    .venv/bin/python bench/blocked_drain.py [--threads 10000] [--drains 40]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from common import need_root, render
from ember import abi
from ember.kernel.drain import Drainer
from ember.kernel.program import Program, self_tgid
from ember.kernel.programs import program_kind

CHILD = r"""
import sys, threading
n = int(sys.argv[1])
sys.stdin.readline()                        # attached: block from now on
ev = threading.Event()
threading.stack_size(64 * 1024)
for _ in range(n):
    threading.Thread(target=ev.wait, daemon=True).start()
print("blocked", flush=True)
sys.stdin.readline()
"""


class NotInFlight:
    """The program's maps, as seen by a drain that charges nothing in flight."""

    def __init__(self, program: Program):
        self._p = program

    charges_in_flight = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._p, name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=10_000)
    ap.add_argument("--drains", type=int, default=40)
    a = ap.parse_args()
    need_root()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(a.threads)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    p = Program(program_kind("sched"), count_entries=65536)
    try:
        p.configure(abi.Config(stack_flags=abi.STACK_USER | abi.STACK_KERNEL,
                               self_tgid=self_tgid(), modes=abi.MODE_BLOCKED,
                               filter=abi.FILTER_PIDS))
        p.set_targets([child.pid])
        with_charges = Drainer(p)
        with_charges.begin(time.monotonic_ns())
        p.attach()
        assert child.stdin and child.stdout
        child.stdin.write("go\n")
        child.stdin.flush()
        child.stdout.readline()
        time.sleep(1)
        without = Drainer(NotInFlight(p))  # type: ignore[arg-type]
        times: dict[str, list[float]] = {"in flight charged": [], "not charged": []}
        records: dict[str, list[int]] = {"in flight charged": [], "not charged": []}
        for i in range(a.drains):
            name, d = (("in flight charged", with_charges) if i % 2 == 0
                       else ("not charged", without))
            d.epoch = max(with_charges.epoch, without.epoch)
            time.sleep(0.05)
            t0 = time.perf_counter()
            r = d.drain()
            times[name].append(time.perf_counter() - t0)
            records[name].append(len(r.records))
        base = statistics.median(times["not charged"])
        rows = [[name, f"{statistics.median(ts) * 1000:.1f}",
                 f"{min(ts) * 1000:.1f}-{max(ts) * 1000:.1f}",
                 f"{statistics.median(records[name]):.0f}",
                 f"{statistics.median(ts) / base:.2f}"]
                for name, ts in times.items()]
        print(render(f"drain with {a.threads} threads blocked ({a.drains} drains, alternating)",
                     ["drain", "median ms", "range ms", "records", "ratio"], rows))
    finally:
        p.close()
        child.kill()


if __name__ == "__main__":
    main()
