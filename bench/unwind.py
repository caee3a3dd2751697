#!/usr/bin/env python3
"""What walking user stacks from CFI tables costs, and what it buys.

    .venv/bin/python bench/unwind.py [--only cost,pipe,tables,roots,memory] [--rounds 5]

Sections (run as root; baselines measured in the same run, configurations
alternating round by round):

cost    the kernel's own run time per on-CPU sample (kernel.bpf_stats_enabled)
        of a program spinning 10 and 30 frames deep: built with frame
        pointers and walked by them (--unwinder fp), and built without and
        walked from tables (--unwinder dwarf); `ember record` at 999 Hz,
        pinned to CPU 1, the workload on CPU 0.
pipe    `taskset -c 0 perf bench sched pipe` (Debian's perf: no frame
        pointers, so every switch walks its tables) with no profiler, with
        ember's default off-CPU profile, and with it on frame pointers only:
        throughput kept.
tables  table build time (cold, from the ELF file) and size per object, for
        Debian's own libraries and programs.
roots   the host-wide share of on-CPU samples whose user stack reaches its
        root (_start or libc's start-up frames, clone3 / start_thread) while Debian binaries
        run (python3.11, perf bench, gzip, sha256sum): frame pointers vs tables.
memory  `ember agent` at its defaults on the whole host for a while, with
        the tables of every process it saw: peak RSS and the loader's counts.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import (
    EMBER,
    ROOT,
    need_root,
    ns_per_sample,
    pipe_us,
    render,
    spread,
    start_ember,
    status_kb,
    stop,
)

#: A user stack that reaches one of these reached its root: the start-up code
#: of the main thread (a stripped program's own _start has no name, libc's
#: frames above it do) or of a thread.
ROOTS = {"_start", "__libc_start_main_impl", "__libc_start_call_main", "clone3", "clone",
         "__clone", "__clone3", "start_thread"}

DEPTH_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static volatile unsigned long sink;
__attribute__((noinline)) static void spin(void) {
    unsigned long x = sink;
    for (int i = 0; i < 1000000; i++) x = x * 6364136223846793005UL + 1;
    sink = x;
}
__attribute__((noinline)) static void down(int n) {
    if (n > 0) down(n - 1); else spin();
    sink++;
}
int main(int argc, char **argv) {
    int depth = atoi(argv[1]);
    time_t end = time(0) + atoi(argv[2]);
    while (time(0) < end) down(depth);
    return 0;
}
"""


def depth_programs(tmp: Path) -> dict[str, Path]:
    src = tmp / "depth.c"
    src.write_text(DEPTH_C)
    out = {}
    for name, flags in (("fp", ["-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer"]),
                        ("nofp", ["-fomit-frame-pointer"])):
        out[name] = tmp / f"depth_{name}"
        subprocess.run(["gcc", "-O2", *flags, "-o", str(out[name]), str(src)], check=True)
    return out


def sample_cost(binary: Path, frames: int, unwinder: str, seconds: float) -> float:
    """BPF ns per on-CPU sample of a program `frames` deep (main, the
    recursion, the leaf and libc's start-up frames below main)."""
    # main + libc's 3 start-up frames + spin: the recursion makes the rest
    work = subprocess.Popen(["taskset", "-c", "0", str(binary), str(max(0, frames - 5)),
                             str(int(seconds) + 30)])
    return ns_per_sample(work, seconds, "--unwinder", unwinder)


def cost(rounds: int, seconds: float) -> list[list[str]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        bins = depth_programs(Path(tmp))
        for frames in (10, 30):
            runs: dict[str, list[float]] = {"fp": [], "dwarf": []}
            for r in range(rounds):
                order = ["fp", "dwarf"] if r % 2 == 0 else ["dwarf", "fp"]
                for u in order:
                    runs[u].append(sample_cost(bins["fp" if u == "fp" else "nofp"], frames, u,
                                               seconds))
            ratio = [d / f for d, f in zip(runs["dwarf"], runs["fp"], strict=True)]
            rows.append([str(frames), spread(runs["fp"], ".0f"), spread(runs["dwarf"], ".0f"),
                         spread(ratio, ".2f")])
            print(f"  {frames} frames: fp {runs['fp']} dwarf {runs['dwarf']}", flush=True)
    return rows


def pipe(rounds: int, loops: int) -> list[list[str]]:
    variants = {"none": None, "ember offcpu (default: tables)": "auto",
                "ember offcpu, frame pointers only": "fp"}
    us: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % 3:] + names[:r % 3]:
            unwinder = variants[name]
            if unwinder is None:
                us[name].append(pipe_us(loops))
                continue
            rec = start_ember("--mode", "offcpu", "--unwinder", unwinder, "-o", "/dev/null",
                              cpu=1)
            try:
                us[name].append(pipe_us(loops))
            finally:
                stop(rec)
        print(f"  pipe round {r + 1}: " + ", ".join(f"{us[n][-1]:.2f}" for n in names),
              flush=True)
    return [[n, spread(us[n]), spread([b / u for b, u in zip(us["none"], us[n], strict=True)],
                                      ".2f")] for n in names]


def tables() -> list[list[str]]:
    from ember.unwind.tables import build_table

    rows = []
    for path in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/python3.11",
                 "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
                 "/usr/lib/x86_64-linux-gnu/libcrypto.so.3", "/usr/bin/perf",
                 "/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1"):
        real = os.path.realpath(path)
        if not os.path.exists(real):
            continue
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            t = build_table(real)
            times.append(time.perf_counter() - t0)
        rows.append([path, f"{t.row_count}", f"{len(t.rows) / 1024:.0f}",
                     f"{min(times) * 1000:.0f}", f"{100 * t.coverage:.2f}"])
    return rows


def roots(seconds: float) -> list[list[str]]:
    loop = "import time\nend = time.time() + 600\nwhile time.time() < end: sum(range(10000))\n"
    work = [subprocess.Popen(["/usr/bin/python3.11", "-c", loop]),
            subprocess.Popen(["sh", "-c", "while :; do head -c 20000000 /dev/urandom | "
                              "gzip -1 > /dev/null; done"]),
            subprocess.Popen(["sh", "-c", "while :; do head -c 50000000 /dev/zero | "
                              "sha256sum > /dev/null; done"])]
    rows = []
    try:
        for unwinder in ("fp", "auto"):
            out = subprocess.run([*EMBER, "record", "--duration", str(seconds),
                                  "--no-kernel-stacks", "--unwinder", unwinder],
                                 capture_output=True, text=True, check=True).stdout
            total = whole = 0
            per: dict[str, list[int]] = {}
            for line in out.splitlines():
                stack, _, n = line.rpartition(" ")
                frames = stack.split(";")
                if len(frames) < 2:
                    continue
                count = int(n)
                total += count
                hit = any(f in ROOTS for f in frames[1:4])
                whole += count * hit
                c = per.setdefault(frames[0], [0, 0])
                c[0] += count
                c[1] += count * hit
            top = sorted(per.items(), key=lambda kv: -kv[1][0])[:4]
            rows.append([unwinder, f"{total}", f"{100 * whole / max(1, total):.1f}",
                         ", ".join(f"{k} {100 * v[1] / max(1, v[0]):.0f}%" for k, v in top)])
    finally:
        for w in work:
            w.kill()
            w.wait()
    return rows


def memory(seconds: float) -> list[list[str]]:
    port = 19000 + os.getpid() % 1000
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "ember.yaml"
        cfg.write_text(f"agent:\n  collector: 127.0.0.1:1\n  metrics_listen: 127.0.0.1:{port}\n"
                       f"  spool_dir: {tmp}/spool\n  unwind_cache_dir: {tmp}/unwind\n")
        agent = subprocess.Popen([*EMBER, "agent", "--config", str(cfg)],
                                 stderr=subprocess.DEVNULL)
        peak = 0.0
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end and agent.poll() is None:
                time.sleep(0.5)
                peak = max(peak, status_kb(agent.pid, "VmRSS") / 1024)
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        finally:
            agent.terminate()
            agent.wait(timeout=60)

    def value(pattern: str) -> str:
        m = re.search(pattern + r" ([\d.e+]+)", metrics)
        return f"{float(m.group(1)):.0f}" if m else "-"

    return [[f"{peak:.0f}", value(r"ember_unwind_processes"),
             value(r'ember_unwind_tables_total\{outcome="loaded"\}'),
             value(r'ember_unwind_rows\{state="used"\}'),
             value(r'ember_unwind_tables_total\{outcome="full"\}')]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="cost,pipe,tables,roots,memory")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    need_root()
    sys.path.insert(0, str(ROOT / "daemon"))
    sections = {
        "cost": ("BPF time per on-CPU sample", ["frames", "frame pointers (ns)",
                                                "tables (ns)", "tables / fp"],
                 lambda: cost(args.rounds, 4)),
        "pipe": ("Off-CPU: perf bench sched pipe (CPU 0)", ["configuration", "us/round trip",
                                                            "throughput vs none"],
                 lambda: pipe(args.rounds, 200_000)),
        "tables": ("Unwind tables per object", ["object", "rows", "KiB", "build ms (best of 3)",
                                                "rows the walker follows %"], tables),
        "roots": ("Host-wide on-CPU samples reaching their root (10 s)",
                  ["unwinder", "samples", "% reaching root", "top processes"],
                  lambda: roots(10)),
        "memory": ("The agent with tables for every process it saw (60 s, defaults)",
                   ["peak RSS MB", "processes with tables", "tables loaded", "rows",
                    "tables not loaded (full)"], lambda: memory(60)),
    }
    out = [f"## unwinding ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, "
           f"kernel {os.uname().release})", ""]
    for key in args.only.split(","):
        title, head, fn = sections[key]
        print(f"{title} ...", flush=True)
        out.append(render(title, head, fn()))
        print(out[-1], flush=True)
    print("\n".join(out))


if __name__ == "__main__":
    main()
