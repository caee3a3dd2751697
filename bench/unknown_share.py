#!/usr/bin/env python3
"""Share of unnamed frames on the whole host, before and after issue 4's
symbolization work, under one demo workload, with the two versions
interleaved in the same run.

"Before" is ember at BEFORE_REV (the commit before the first issue-4
change: symbols from each object's own .symtab/.dynsym only), checked out
into a temporary worktree and run with this venv; "after" is this tree.
Each records the whole host (no PID filter) for --seconds at 499 Hz into
folded stacks with the user/kernel delimiter.

The demo workload, started once and kept running across all rounds:
- a stripped copy of cpu_shares whose symbols are in a separate debug file
  found by .gnu_debuglink (objcopy --only-keep-debug);
- pie_main (PIE + shared library), cpp_names (C++);
- a copy of inline_lines deleted after it started;
- node --perf-basic-prof running a hot JavaScript loop (JIT frames);
- a storm of short_lived processes (30 ms each, a few at a time);
- python3 hashing (libpython, libcrypto, libc with libc6-dbg installed).

A frame is unnamed when it is [unknown], an object+offset (``x.so+0x1a2b``),
an anonymous mapping name ([anon], //anon, memfd:...) or [kernel.kallsyms].
Reported per version: unnamed share of all frames and of user frames
(sample weighted), and the share of samples with at least one unnamed
user frame.

    .venv/bin/python bench/unknown_share.py [--seconds 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from common import ROOT, need_root

BEFORE_REV = "c4c28bd^"
BIN = ROOT / "tests" / "fixtures" / "bin"
_UNNAMED = re.compile(r"^(\[unknown\]|\[anon.*\]|//anon|memfd:.*|\[kernel\.kallsyms\]|"
                      r".*\+0x[0-9a-f]+|\[perf-map\])$")

NODE_LOOP = """
function hot(n) { let x = 0; for (let i = 0; i < n; i++) x = (x * 31 + i) % 1000003; return x; }
const end = Date.now() + END_MS; let s = 0;
while (Date.now() < end) s += hot(100000);
console.log(s);
"""
PY_HASH = """
import hashlib, time
end = time.time() + %d
b = b"x" * 65536
while time.time() < end:
    hashlib.sha256(b).digest(); sorted(range(2000), key=lambda v: -v)
"""


def start_workload(tmp: Path, seconds: int) -> tuple[list[subprocess.Popen[bytes]], Path]:
    procs: list[subprocess.Popen[bytes]] = []
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    # stripped, symbols in a debug file next to it (found by .gnu_debuglink)
    stripped = tmp / "shares_stripped"
    debug = tmp / "shares_stripped.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(BIN / "cpu_shares"), str(debug)],
                   check=True)
    subprocess.run(["objcopy", "--strip-all", f"--add-gnu-debuglink={debug}",
                    str(BIN / "cpu_shares"), str(stripped)], check=True, cwd=tmp)
    for argv in ([str(stripped), str(seconds)], [str(BIN / "pie_main"), str(seconds)],
                 [str(BIN / "cpp_names"), str(seconds)]):
        procs.append(subprocess.Popen(argv, **quiet))  # type: ignore[call-overload]
    deleted = tmp / "inline_deleted"
    shutil.copy(BIN / "inline_lines", deleted)
    procs.append(subprocess.Popen([str(deleted), str(seconds)], **quiet))  # type: ignore[call-overload]
    time.sleep(0.2)
    deleted.unlink()
    if shutil.which("node"):
        procs.append(subprocess.Popen(["node", "--perf-basic-prof", "-e",
                                       NODE_LOOP.replace("END_MS", str(seconds * 1000))], **quiet))  # type: ignore[call-overload]
    procs.append(subprocess.Popen([sys.executable, "-c", PY_HASH % seconds], **quiet))  # type: ignore[call-overload]
    storm = (f"end=$(( $(date +%s) + {seconds} )); while [ $(date +%s) -lt $end ]; do "
             f"for i in 1 2 3; do {BIN / 'short_lived'} 30 & done; wait; done")
    procs.append(subprocess.Popen(["sh", "-c", storm], **quiet))  # type: ignore[call-overload]
    return procs, stripped


def record(cmd: list[str], env: dict[str, str], seconds: float, out: Path) -> None:
    r = subprocess.run([*cmd, "record", "--duration", str(seconds), "--frequency", "499",
                        "--delimiter", "-o", str(out)], env=env, capture_output=True,
                       text=True, timeout=seconds + 180)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} record failed: {r.stderr[-2000:]}")


def unnamed_by_object(folded: Path) -> Counter[str]:
    """Sample-weighted unnamed frames by what names them (the object)."""
    by: Counter[str] = Counter()
    for line in folded.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        for f in stack.split(";")[1:]:
            if _UNNAMED.match(f):
                by[f.rsplit("+0x", 1)[0]] += int(count_s)
    return by


def shares(folded: Path) -> tuple[float, float, float, int]:
    frames = unnamed = user = user_unnamed = samples = bad_samples = 0
    for line in folded.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        count = int(count_s)
        parts = stack.split(";")
        if "-" in parts:
            cut = parts.index("-")
            u, k = parts[:cut], parts[cut + 1:]
        else:
            u, k = parts, []
        u = u[1:] if u else u  # the first frame is the process name
        nu = sum(bool(_UNNAMED.match(f)) for f in u)
        nk = sum(bool(_UNNAMED.match(f)) for f in k)
        frames += count * (len(u) + len(k))
        unnamed += count * (nu + nk)
        user += count * len(u)
        user_unnamed += count * nu
        samples += count
        bad_samples += count * (nu > 0)
    return (unnamed / max(frames, 1), user_unnamed / max(user, 1),
            bad_samples / max(samples, 1), samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    need_root()
    work = Path(tempfile.mkdtemp(prefix="ember-unknown-"))
    before_tree = work / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                    str(before_tree), BEFORE_REV], check=True)
    python = str(ROOT / ".venv" / "bin" / "python")
    versions = {
        "before": ([python, "-c", "import sys; from ember.cli import main; sys.exit(main())"],
                   {**os.environ, "PYTHONPATH": str(before_tree / "daemon")}),
        "after": ([str(ROOT / ".venv" / "bin" / "ember")], dict(os.environ)),
    }
    total = int(args.rounds * 2 * (args.seconds + 25) + 30)
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, list[tuple[float, float, float, int]]] = {v: [] for v in versions}
    left: dict[str, Counter[str]] = {v: Counter() for v in versions}
    try:
        procs, _ = start_workload(work, total)
        time.sleep(1)
        for rnd in range(args.rounds):
            order = list(versions) if rnd % 2 == 0 else list(reversed(versions))
            for name in order:
                out = work / f"{name}-{rnd}.folded"
                cmd, env = versions[name]
                record(cmd, env, args.seconds, out)
                results[name].append(shares(out))
                left[name] += unnamed_by_object(out)
                print(f"round {rnd} {name:6s}: unnamed {results[name][-1][0]:6.1%} of frames, "
                      f"{results[name][-1][1]:6.1%} of user frames, samples with one: "
                      f"{results[name][-1][2]:6.1%} ({results[name][-1][3]} samples)",
                      flush=True)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                        str(before_tree)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    for name, rs in results.items():
        n = len(rs)
        print(f"{name:6s} mean: unnamed {sum(r[0] for r in rs) / n:6.1%} of frames, "
              f"{sum(r[1] for r in rs) / n:6.1%} of user frames, "
              f"{sum(r[2] for r in rs) / n:6.1%} of samples have one")
        print("        unnamed frames by object: " + ", ".join(
            f"{obj} {count}" for obj, count in left[name].most_common(6)))


if __name__ == "__main__":
    main()
