#!/usr/bin/env python3
"""Symbolization speed: ember's Symbolizer against bcc's BPF.sym on the same
addresses of the same live process, cold (fresh caches) and warm (second
pass), as addresses per second and ratios.

The process is tests/fixtures/bin/cpp_names (executable, libstdc++, libc,
libm, libgcc_s); the addresses are random points inside random functions of
its executable mappings, taken from the objects' own symbol tables.

Also: the time to index libc cold (its symbol table and, from libc6-dbg,
its separate debug file), and the memory of 200 distinct objects indexed
(RSS growth of this process, and the cache's own estimate).

    .venv/bin/python bench/symbolize.py [--addresses 20000] [--objects 200]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import tempfile
import time
from pathlib import Path

from common import ROOT, need_root, status_kb, symbolize_passes
from ember.symbols.diskcache import DiskSymbolCache
from ember.symbols.elf import ElfSymbols
from ember.symbols.objects import ObjectCache
from ember.symbols.procmaps import ProcessTable
from ember.symbols.symbolizer import Symbolizer

LIBC = Path("/usr/lib/x86_64-linux-gnu/libc.so.6")


def libc_cold_ms(runs: int = 7, disk: Path | None = None) -> float:
    """Median time to index libc from nothing (page cache warm); with disk,
    from ember's on-disk symbol cache (filled by the first run)."""
    times = []
    for _ in range(runs):
        cache = ObjectCache(disk=DiskSymbolCache(disk) if disk else None)
        t0 = time.perf_counter()
        _, obj = cache.open([LIBC])
        times.append((time.perf_counter() - t0) * 1000)
        assert obj is not None and len(obj) > 1000
    return sorted(times)[len(times) // 2]


def objects_memory(n: int) -> tuple[int, float, float]:
    """(objects indexed, RSS growth MB, cache estimate MB) for n distinct
    shared objects of the system."""
    import os

    cache = ObjectCache(max_bytes=1 << 40)
    paths = sorted(p for p in Path("/usr/lib/x86_64-linux-gnu").glob("*.so*")
                   if p.is_file() and not p.is_symlink())
    before = status_kb(os.getpid(), "VmRSS")
    done = 0
    for p in paths:
        if done == n:
            break
        _, obj = cache.open([p])
        done += obj is not None
    grown = (status_kb(os.getpid(), "VmRSS") - before) / 1024
    return done, grown, cache.tables.size_bytes() / (1 << 20)


def addresses(pid: int, n: int, rng: random.Random) -> list[int]:
    proc = ProcessTable().get(pid)
    assert proc is not None
    pool = []
    for m in proc.maps:
        if not (m.executable and m.file_backed):
            continue
        elf = ElfSymbols(m.path)
        for f in elf.functions():
            start, end = f.start, f.start + f.size
            off = None
            for seg in elf.segments:
                if seg.executable and seg.vaddr <= start < seg.vaddr + seg.filesz:
                    off = start - seg.vaddr + seg.offset
            if off is None or not m.offset <= off < m.offset + (m.end - m.start):
                continue
            pool.append((m.start + off - m.offset, max(1, end - start)))
    picks = [rng.choice(pool) for _ in range(n)]
    return [base + rng.randrange(size) for base, size in picks]


def rate(fn, addrs: list[int]) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn(addrs)
    return len(addrs) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--addresses", type=int, default=20_000)
    ap.add_argument("--objects", type=int, default=200)
    args = ap.parse_args()
    need_root()
    from bcc import BPF

    proc = subprocess.Popen([str(ROOT / "tests/fixtures/bin/cpp_names"), "120"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        pid = proc.pid
        addrs = addresses(pid, args.addresses, random.Random(7))
        passes = symbolize_passes(pid)
        ember_pass, bcc_pass = passes["ember"], passes["bcc"]

        ember_cold, ember_warm = rate(ember_pass, addrs), rate(ember_pass, addrs)
        with tempfile.TemporaryDirectory() as d:
            sym = Symbolizer(ProcessTable(), objects=ObjectCache(disk=DiskSymbolCache(d)))
            ember_pass(addrs[:50])  # fills the disk cache
            sym = Symbolizer(ProcessTable(), objects=ObjectCache(disk=DiskSymbolCache(d)))
            disk_cold = rate(ember_pass, addrs)
        bcc_cold, bcc_warm = rate(bcc_pass, addrs), rate(bcc_pass, addrs)
        # sanity: both name the same function (bcc may pick another alias,
        # e.g. libc's __GI_* names from libc6-dbg): compare offsets into it
        table = sym.processes.get(pid)
        assert table is not None
        same = 0
        for x in addrs[:2000]:
            entry = table.find(x)
            ours = sym.lookup(pid, entry, x) if entry else None
            theirs = BPF.sym(x, pid, show_offset=True, demangle=False).decode()
            if ours and "+0x" in theirs and int(theirs.rsplit("+", 1)[1], 16) == ours[2]:
                same += 1
    finally:
        proc.kill()
        proc.wait()
    print(f"{len(addrs)} addresses in {pid}'s executable mappings")
    print(f"ember cold {ember_cold:10.0f}/s   warm {ember_warm:10.0f}/s")
    print(f"bcc   cold {bcc_cold:10.0f}/s   warm {bcc_warm:10.0f}/s")
    print(f"ember cold with the disk cache filled {disk_cold:10.0f}/s")
    print(f"ratio ember/bcc: cold {ember_cold / bcc_cold:.2f}x "
          f"(disk cache {disk_cold / bcc_cold:.2f}x), warm {ember_warm / bcc_warm:.2f}x")
    print(f"same function (offset into it) as bcc for {same} of 2000 checked")
    print(f"libc indexed cold (with its debug file): {libc_cold_ms():.1f} ms")
    with tempfile.TemporaryDirectory() as d:
        print(f"libc from the disk cache: {libc_cold_ms(disk=Path(d)):.1f} ms")
    n, rss, est = objects_memory(args.objects)
    print(f"{n} distinct objects indexed: RSS +{rss:.0f} MB (cache estimate {est:.0f} MB)")


if __name__ == "__main__":
    main()
