#!/usr/bin/env python3
"""What Python frames cost.

    .venv/bin/python bench/python.py [--only cost,agent] [--rounds 5]

Sections (run as root; the baseline measured in the same run, the two
configurations alternating round by round):

cost    the kernel's own run time per on-CPU sample (kernel.bpf_stats_enabled)
        of Debian's python3.11 recursing 10 and 40 Python frames deep:
        walked from tables with Python frames (the default) and without
        (--no-python-frames: the same native walk). `ember record` at 999 Hz
        pinned to CPU 1, the workload on CPU 0.
agent   `ember record` on the whole host for 20 s (what the agent does every
        interval) while 20 busy Python processes run (Debian's 3.11 and
        pyenv's 3.12 and 3.13 when present): ember's whole CPU time per
        second recorded (start-up and table loading included), with and
        without Python frames, and its peak RSS.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (
    EMBER,
    ROOT,
    need_root,
    ns_per_sample,
    render,
    spread,
)

DEEP = """
import sys, time
def spin():
    x = 0
    for i in range(20000):
        x += i
    return x
def down(n):
    return down(n - 1) if n > 0 else spin()
depth, end = int(sys.argv[1]), time.time() + float(sys.argv[2])
while time.time() < end:
    down(depth)
"""

BUSY = """
import sys, time
class Handler:
    def parse(self, n):
        return sum(i * i for i in range(n))
    def handle(self):
        return self.parse(3000) + self.parse(1000)
end = time.time() + float(sys.argv[1])
h = Handler()
while time.time() < end:
    h.handle()
    time.sleep(0.0005)
"""


def sample_cost(script: Path, depth: int, python_frames: bool, seconds: float) -> float:
    work = subprocess.Popen(["taskset", "-c", "0", "/usr/bin/python3.11", str(script),
                             str(depth), str(seconds + 60)])
    return ns_per_sample(work, seconds,
                         "--python-frames" if python_frames else "--no-python-frames")


def cost(rounds: int, seconds: float) -> list[list[str]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "deep.py"
        script.write_text(DEEP)
        for depth in (10, 40):
            runs: dict[bool, list[float]] = {False: [], True: []}
            for r in range(rounds):
                for on in ((False, True) if r % 2 == 0 else (True, False)):
                    runs[on].append(sample_cost(script, depth, on, seconds))
            ratio = [a / b for a, b in zip(runs[True], runs[False], strict=True)]
            rows.append([str(depth), spread(runs[False], ".0f"), spread(runs[True], ".0f"),
                         spread(ratio, ".2f")])
            print(f"  depth {depth}: off {runs[False]} on {runs[True]}", flush=True)
    return rows


def pythons() -> list[str]:
    out = ["/usr/bin/python3.11"]
    root = Path.home() / ".pyenv" / "versions"
    for short in ("3.12", "3.13"):
        found = sorted(root.glob(f"{short}.*/bin/python{short}"))
        if found:
            out.append(str(found[-1]))
    return out


def agent(rounds: int, seconds: float) -> list[list[str]]:
    """ember's whole CPU time (user + system, start-up, table loading and
    every drain) over `seconds` of host-wide recording, per second."""
    exes = pythons()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "busy.py"
        script.write_text(BUSY)
        work = [subprocess.Popen([exes[i % len(exes)], str(script), "3600"])
                for i in range(20)]
        cpu: dict[bool, list[float]] = {False: [], True: []}
        rss: dict[bool, list[float]] = {False: [], True: []}
        try:
            time.sleep(1)
            for r in range(rounds):
                for on in ((False, True) if r % 2 == 0 else (True, False)):
                    flag = "--python-frames" if on else "--no-python-frames"
                    out = subprocess.run(
                        ["/usr/bin/time", "-f", "TIME %U %S %M", *EMBER, "record",
                         "--duration", str(seconds), "--no-kernel-stacks", flag, "-o",
                         "/dev/null"], capture_output=True, text=True, check=True).stderr
                    user, sys_, max_kb = out.split("TIME ")[1].split()[:3]
                    cpu[on].append((float(user) + float(sys_)) / seconds)
                    rss[on].append(int(max_kb) / 1024)
                print(f"  round {r + 1}: off {cpu[False][-1]:.3f} on {cpu[True][-1]:.3f}",
                      flush=True)
        finally:
            for w in work:
                w.kill()
                w.wait()
    ratio = [a / b for a, b in zip(cpu[True], cpu[False], strict=True)]
    return [["without Python frames", spread(cpu[False]), spread(rss[False], ".0f"), "1.00"],
            ["with Python frames", spread(cpu[True]), spread(rss[True], ".0f"),
             spread(ratio, ".2f")]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="cost,agent")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    need_root()
    sys.path.insert(0, str(ROOT / "daemon"))
    sections = {
        "cost": ("BPF time per on-CPU sample, python3.11", [
            "Python frames deep", "native walk (ns)", "with Python frames (ns)", "ratio"],
            lambda: cost(args.rounds, 4)),
        "agent": ("ember on the whole host, 20 busy Python processes", [
            "configuration", "CPU s/s", "peak RSS MiB", "CPU vs without"],
            lambda: agent(args.rounds, 20)),
    }
    for name in args.only.split(","):
        title, head, fn = sections[name]
        print(render(title, head, fn()), flush=True)


if __name__ == "__main__":
    main()
