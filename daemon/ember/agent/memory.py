"""The agent's memory ceiling: one setting bounds what the agent keeps.

``memory_limit`` is the RSS the agent must stay under. What it holds beyond
the interpreter and its libraries is caches: ELF symbol tables, symbolized
frames, process maps, perf maps. Each cache is a ``Shrinkable``; the
governor gives the symbol table cache its budget up front (a share of the
limit), checks RSS after every drain, and when RSS passes the high-water
mark (85% of the limit) shrinks the caches, largest first, until it is back
under the low-water mark (70%). Freed heap goes back to the kernel with
glibc's malloc_trim. Every shrink is counted per cache, with the bytes given
up, so a ceiling set too low shows as a steady shrink rate and cache misses,
never as an OOM kill.

BPF maps are kernel memory, outside RSS: their sizes come from one setting
of their own (``bpf_map_memory``, see ``map_entries``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

HIGH_WATER = 0.85
LOW_WATER = 0.70
#: Share of memory_limit the ELF symbol table cache may use.
SYMBOL_CACHE_SHARE = 0.35


class Shrinkable(Protocol):
    name: str

    def size_bytes(self) -> int: ...
    def shrink(self, fraction: float) -> int:
        """Give up about ``fraction`` of the cache; returns bytes released."""
        ...


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _malloc_trim() -> None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@dataclass
class ShrinkReport:
    cache: str
    released: int


class MemoryGovernor:
    def __init__(self, limit: int, caches: Sequence[Shrinkable],
                 on_shrink: Callable[[ShrinkReport], None] | None = None,
                 rss: Callable[[], int] = rss_bytes):
        self.limit = limit
        self.caches = list(caches)
        self.on_shrink = on_shrink or (lambda report: None)
        self.rss = rss
        self.shrinks = 0

    def check(self) -> list[ShrinkReport]:
        """Shrink caches if RSS is past the high-water mark."""
        if not self.limit or self.rss() < HIGH_WATER * self.limit:
            return []
        reports = []
        target = LOW_WATER * self.limit
        for _ in range(4):  # each round halves what is left
            for cache in sorted(self.caches, key=lambda c: -c.size_bytes()):
                if cache.size_bytes() == 0:
                    continue
                report = ShrinkReport(cache.name, cache.shrink(0.5))
                reports.append(report)
                self.on_shrink(report)
            _malloc_trim()
            if self.rss() < target:
                break
        self.shrinks += 1
        rss = self.rss()
        log.warning("memory: RSS reached %.0f%% of memory_limit (%d MiB); caches shrunk "
                    "(%s), RSS now %d MiB", 100 * HIGH_WATER, self.limit >> 20,
                    ", ".join(f"{r.cache} -{r.released >> 10} KiB" for r in reports),
                    rss >> 20)
        return reports


# --- BPF map sizes from one budget ------------------------------------------------

#: Approximate kernel bytes per entry (value + element and bucket overhead).
STACK_ENTRY_BYTES = 1100      # 127 addresses
COUNT_ENTRY_BYTES = 200       # ember_key + ember_value in a preallocated hash
#: Relative weight of each program in the budget.
PROGRAM_WEIGHT = {"cpu": 2.0, "offcpu": 1.5, "sched": 1.5}


def _pow2_floor(n: int, least: int) -> int:
    n = max(n, least)
    return 1 << (n.bit_length() - 1)


def map_entries(budget: int, programs: Sequence[str]) -> dict[str, tuple[int, int]]:
    """(stack_entries, count_entries) per program kind, from the kernel memory
    budget for all of ember's maps. Stack storage, per generation (2 on-CPU,
    3 off-CPU; the sampled program keeps two kinds of stack maps), takes 85%
    of a program's share, counts the rest. Powers of two, at least 1024 stacks
    and 2048 counts each."""
    total = sum(PROGRAM_WEIGHT[p] for p in programs) or 1.0
    out = {}
    for p in programs:
        share = budget * PROGRAM_WEIGHT[p] / total
        stack_maps = {"cpu": 2, "offcpu": 6, "sched": 3}[p]
        stacks = _pow2_floor(int(share * 0.85 / (stack_maps * STACK_ENTRY_BYTES)), 1024)
        counts = _pow2_floor(int(share * 0.15 / COUNT_ENTRY_BYTES), 2048)
        out[p] = (stacks, counts)
    return out
