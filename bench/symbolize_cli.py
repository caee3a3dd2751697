#!/usr/bin/env python3
"""``ember symbolize`` against bcc's BPF.sym on many distinct addresses, both
timed as whole processes (start-up, reading the addresses, printing
included), and the warm ratio (addresses seen before) in one process.

The process named is tests/fixtures/bin/cpp_names (stopped while timed, so
it does not compete for the CPUs); the addresses are random points inside
random functions of its executable mappings (bench/symbolize.py's), one hex
address a line on stdin for both commands. bcc's side is a Python script
that prints ``ADDR NAME+OFFSET [MODULE]`` from BPF.sym for each address, as
ember prints ``ADDR NAME+OFFSET OBJECT``. The two commands alternate, the
first of each round in turn, and the ratio is taken round by round: the
machine's speed drifts, a pair's ratio much less.

    sudo .venv/bin/python bench/symbolize_cli.py [--addresses 300000] [--rounds 7]
        [--ember-path DIR]   # the daemon/ directory of another checkout (before/after)

(--ember-path changes the ember symbolize timed; the warm figure is of the
ember this script imports.)
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from symbolize import addresses, rate

from common import ROOT, need_root, spread, symbolize_passes

BCC_SCRIPT = """\
import sys
from bcc import BPF
pid = int(sys.argv[1])
out = []
for word in sys.stdin.read().split():
    addr = int(word, 16)
    name = BPF.sym(addr, pid, show_module=True, show_offset=True).decode()
    out.append(f"{addr:#x} {name}\\n")
sys.stdout.write("".join(out))
"""


def timed(cmd: list[str], stdin: Path, env: dict[str, str], out: int | None
          ) -> tuple[float, float]:
    """(wall, user + system CPU seconds) of one whole run of cmd."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(stdin, "rb") as f:
        t0 = time.perf_counter()
        subprocess.run(cmd, stdin=f, stdout=out, env=env, check=True)
        wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def same_offsets(ember_out: str, bcc_out: str) -> tuple[int, int]:
    """(lines whose offset into the function is the same, lines compared):
    the two may name one function by different aliases (libc's __GI_*)."""
    same = total = 0
    for ours, theirs in zip(ember_out.splitlines(), bcc_out.splitlines(), strict=True):
        total += 1
        a, b = ours.split(" ")[1], theirs.split(" ")[1]
        same += "+0x" in a and "+0x" in b and a.rsplit("+", 1)[1] == b.rsplit("+", 1)[1]
    return same, total


def whole_processes(pid: int, addrs: list[int], rounds: int, daemon: Path) -> None:
    path = [str(daemon), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    with tempfile.TemporaryDirectory() as d:
        stdin = Path(d) / "addresses"
        stdin.write_text("".join(f"{a:#x}\n" for a in addrs))
        script = Path(d) / "bcc_sym.py"
        script.write_text(BCC_SCRIPT)
        commands = {"ember": [sys.executable, "-m", "ember.cli", "symbolize", "--pid", str(pid)],
                    "bcc": [sys.executable, str(script), str(pid)]}
        outputs = {}
        for name, cmd in commands.items():  # warm-up: page cache, bytecode; and a check
            with open(stdin, "rb") as f:
                outputs[name] = subprocess.run(cmd, stdin=f, capture_output=True, env=env,
                                               text=True, check=True).stdout
        same, total = same_offsets(outputs["ember"], outputs["bcc"])
        times: dict[str, list[tuple[float, float]]] = {"ember": [], "bcc": []}
        for r in range(rounds):
            for name in (("ember", "bcc") if r % 2 == 0 else ("bcc", "ember")):
                times[name].append(timed(commands[name], stdin, env, subprocess.DEVNULL))
    print(f"{len(addrs)} distinct addresses of {pid}, {rounds} rounds, seconds: median (min-max)")
    for name in commands:
        print(f"  {name:5} wall {spread([w for w, _ in times[name]])}"
              f"   cpu {spread([c for _, c in times[name]])}")
    ratio = [b[0] / e[0] for e, b in zip(times["ember"], times["bcc"], strict=True)]
    cpu_ratio = [b[1] / e[1] for e, b in zip(times["ember"], times["bcc"], strict=True)]
    print(f"  bcc/ember wall {spread(ratio)}   cpu {spread(cpu_ratio)}   (x faster, per round)")
    print(f"  same offset into the function as bcc on {same} of {total} lines")


def warm(pid: int, addrs: list[int], rounds: int) -> None:
    """Addresses seen before, in this process: what the agent meets at every
    drain (ember's frames memo against bcc's own cache)."""
    passes = symbolize_passes(pid)
    for fn in passes.values():
        fn(addrs)  # the cold pass
    ratios = []
    for _ in range(rounds):
        ratios.append(rate(passes["ember"], addrs) / rate(passes["bcc"], addrs))
    print(f"warm, {len(addrs)} addresses seen before, in one process: "
          f"ember/bcc addresses per second {spread(ratios)} (median (min-max))")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--addresses", type=int, default=300_000)
    ap.add_argument("--warm-addresses", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ember-path", type=Path, default=ROOT / "daemon",
                    help="the daemon/ directory whose ember symbolize is timed")
    args = ap.parse_args()
    need_root()
    proc = subprocess.Popen([str(ROOT / "tests/fixtures/bin/cpp_names"), "3600"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        proc.send_signal(signal.SIGSTOP)  # its maps stay; its CPU is the benchmark's
        rng = random.Random(7)
        whole_processes(proc.pid, addresses(proc.pid, args.addresses, rng), args.rounds,
                        args.ember_path.resolve())
        warm(proc.pid, addresses(proc.pid, args.warm_addresses, rng), args.rounds)
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
