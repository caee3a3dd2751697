#!/usr/bin/env python3
"""What charging blocks in flight costs: N threads of a target blocked the
whole time, drained every 50 ms, with the exact off-CPU program and with the
sampled one (whose drains run its task iterator and walk the user stacks of
the blocks in flight in user space, each stack once while it stays put).
Same run, same program, drains alternating between the Drainer as it is
(charging each block in flight up to the drain) and the same Drainer told
the program does not charge in flight, so the ratio is the cost of the
in-flight charges alone. Then the walk at the start: a census of N threads
blocked before the programs attached, their stacks, and their blocks put in.

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
from ember.threads import Census
from ember.unwind.remote import RemoteUnwinder

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

    def in_flight(self) -> list[abi.InFlight]:
        return []

    def __getattr__(self, name: str) -> object:
        return getattr(self._p, name)


def drains(kind: str, threads: int, n: int) -> str:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(threads)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    p = Program(program_kind(kind), count_entries=65536)
    try:
        p.configure(abi.Config(stack_flags=abi.STACK_USER | abi.STACK_KERNEL,
                               self_tgid=self_tgid(), modes=abi.MODE_BLOCKED,
                               filter=abi.FILTER_PIDS, sample_ns=1_000_000))
        p.set_targets([child.pid])
        with_charges = Drainer(p, walk_user=RemoteUnwinder().walk)
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
        for i in range(n):
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
        return render(f"{kind}: a drain with {threads} threads blocked ({n} drains, "
                      "alternating)", ["drain", "median ms", "range ms", "records", "ratio"],
                      rows)
    finally:
        p.close()
        child.kill()


def at_start(threads: int) -> str:
    """Threads blocked before the programs attach: the census, their stacks
    walked, their blocks put into the sampled program."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(threads)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin and child.stdout
    child.stdin.write("go\n")
    child.stdin.flush()
    child.stdout.readline()
    p = Program(program_kind("offcpu"))
    census = Census()
    try:
        p.configure(abi.Config(stack_flags=abi.STACK_USER | abi.STACK_KERNEL,
                               self_tgid=self_tgid(), filter=abi.FILTER_PIDS))
        p.set_targets([child.pid])
        p.attach()
        census.set_pids([child.pid])
        rows = []
        for _ in range(3):
            t0 = time.perf_counter()
            found = census.take()
            t1 = time.perf_counter()
            n = census.put_blocked([p], time.monotonic_ns(), 0, True, True)
            t2 = time.perf_counter()
            rows.append([f"{len(found)}", f"{(t1 - t0) * 1000:.1f}", f"{(t2 - t1) * 1000:.1f}",
                         f"{n}"])
        return render(f"the start: {threads} threads blocked before it (3 runs)",
                      ["threads seen", "census ms", "walks + puts ms", "put in"], rows)
    finally:
        census.close()
        p.close()
        child.kill()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=10_000)
    ap.add_argument("--drains", type=int, default=40)
    a = ap.parse_args()
    need_root()
    print(drains("sched", a.threads, a.drains))
    print(drains("offcpu", a.threads, a.drains))
    print(at_start(a.threads))


if __name__ == "__main__":
    main()
