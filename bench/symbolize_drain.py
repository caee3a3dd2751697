#!/usr/bin/env python3
"""A drain's user stacks symbolized one stack at a time (SampleBuilder's
loop of Symbolizer.user_frames), with and without Symbolizer.prepare first
(the stacks of processes new to the symbolizer named in one batch per
process), on a first drain (cold: new processes) and the next (warm: the
same stacks again), as CPU seconds of this process.

The processes are fixtures (cpp_names, pie_main, many_stacks, cpu_shares,
several of each, stopped: their maps stay, their CPU is the benchmark's);
each has stacks of 5 to 40 frames drawn from random points in random
functions of its executable mappings (and with --junk, some end in an
address no mapping covers, as frame-pointer walks through code built
without them do). Objects are indexed beforehand, as
for new processes of binaries the agent knows; each round takes a new
Symbolizer. The two ways alternate, the first of each round in turn.

    sudo .venv/bin/python bench/symbolize_drain.py [--copies 5] [--stacks 300] [--rounds 7]
        [--junk 0.02]
"""

from __future__ import annotations

import argparse
import random
import signal
import statistics
import subprocess
import time
from collections.abc import Sequence

from symbolize import addresses

from common import ROOT, need_root
from ember.model import Frame
from ember.symbols.objects import ObjectCache
from ember.symbols.procmaps import ProcessTable
from ember.symbols.symbolizer import Symbolizer

FIXTURES = ("cpp_names", "pie_main", "many_stacks", "cpu_shares")
Stacks = list[tuple[int, Sequence[int]]]


def stacks_of(pids: list[int], per: int, junk: float, rng: random.Random) -> Stacks:
    """per stacks of each process; a junk fraction of them end in an
    address no mapping covers (a frame-pointer walk gone astray)."""
    out: Stacks = []
    for pid in pids:
        pool = addresses(pid, 3000, rng)
        for _ in range(per):
            ips = [rng.choice(pool) for _ in range(rng.randrange(5, 41))]
            out.append((pid, [*ips, rng.randrange(1, 1 << 20)] if rng.random() < junk else ips))
    rng.shuffle(out)
    return out


def drain(sym: Symbolizer, stacks: Stacks, prepare: bool) -> tuple[float, list[list[Frame]]]:
    """CPU seconds of one drain's user stacks, and their frames: as
    SampleBuilder.build, the processes touched first and a round ended last."""
    t0 = time.process_time()
    sym.processes.touch({pid for pid, _ in stacks})
    if prepare:
        sym.prepare(stacks)
    frames = [sym.user_frames(pid, ips) for pid, ips in stacks]
    sym.processes.expire()
    return time.process_time() - t0, frames


def spread(xs: list[float]) -> str:
    return f"{min(xs):7.3f} {statistics.median(xs):7.3f} {max(xs):7.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, default=5, help="processes of each fixture")
    ap.add_argument("--stacks", type=int, default=300, help="stacks per process")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--junk", type=float, default=0.0,
                    help="the fraction of stacks that end in an unmapped address")
    args = ap.parse_args()
    need_root()
    procs = [subprocess.Popen([str(ROOT / "tests/fixtures/bin" / name), "3600"],
                              stdout=subprocess.PIPE, text=True)
             for name in FIXTURES * args.copies]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().startswith("ready")
            p.send_signal(signal.SIGSTOP)
        stacks = stacks_of([p.pid for p in procs], args.stacks, args.junk, random.Random(3))
        objects = ObjectCache()
        Symbolizer(ProcessTable(), objects=objects).prepare(stacks)  # objects indexed
        times: dict[tuple[bool, str], list[float]] = {}
        for r in range(args.rounds):
            frames = []
            for prepare in ((False, True) if r % 2 == 0 else (True, False)):
                sym = Symbolizer(ProcessTable(), objects=objects)
                for state in ("cold", "warm"):
                    seconds, got = drain(sym, stacks, prepare)
                    times.setdefault((prepare, state), []).append(seconds)
                frames.append(got)
            assert frames[0] == frames[1], "prepare changed the frames"
    finally:
        for p in procs:
            p.kill()
            p.wait()
    n = sum(len(ips) for _, ips in stacks)
    print(f"{len(stacks)} stacks, {n} frames, of {len(procs)} processes; CPU seconds "
          f"min median max over {args.rounds} rounds")
    for state in ("cold", "warm"):
        plain, prepared = times[(False, state)], times[(True, state)]
        ratio = [a / b for a, b in zip(plain, prepared, strict=True)]
        print(f"  {state}: user_frames {spread(plain)}   prepare + user_frames "
              f"{spread(prepared)}   speed-up {spread(ratio)}")


if __name__ == "__main__":
    main()
