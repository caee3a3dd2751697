"""The agent's memory ceiling: one setting bounds what the agent keeps.

``memory_limit`` is the RSS the agent must stay under. What it holds beyond
the interpreter and its libraries is caches: ELF symbol tables, symbolized
frames, process maps, perf maps, labels. Each is a ``cache.BoundedCache``,
which registers itself: the governor sees every one without being told.
The symbol table cache gets its budget up front (a share of what the limit
leaves above the agent's footprint at start); the governor checks RSS after
every drain, and when RSS passes the high-water
mark (85% of the limit) shrinks the caches, largest first, until it is back
under the low-water mark (70%). Freed heap goes back to the kernel with
glibc's malloc_trim. Every shrink is counted per cache, with the bytes given
up, so a ceiling set too low shows as a steady shrink rate and cache misses,
never as an OOM kill.

BPF maps are kernel memory, outside RSS: their sizes come from one setting
of their own (``bpf_map_memory``, see kernel/programs.py ``map_entries``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from .. import cache

log = logging.getLogger(__name__)

HIGH_WATER = 0.85
LOW_WATER = 0.70
#: Share of the headroom (high-water mark less the RSS at start) the ELF
#: symbol table cache may use; the rest is for the memos and each drain's
#: own working set.
SYMBOL_CACHE_SHARE = 0.6
MIN_SYMBOL_CACHE = 4 << 20


def symbol_budget(limit: int, rss: int) -> int:
    """Bytes for the symbol table cache: a share of what the limit leaves
    above the agent's own footprint (the interpreter and its libraries, about
    60 MB), not of the limit itself, which a small limit would overcommit."""
    return max(MIN_SYMBOL_CACHE, int((HIGH_WATER * limit - rss) * SYMBOL_CACHE_SHARE))


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
    def __init__(self, limit: int, caches: Callable[[], Iterable[Shrinkable]] = cache.live,
                 on_shrink: Callable[[ShrinkReport], None] | None = None,
                 rss: Callable[[], int] = rss_bytes):
        self.limit = limit
        self.caches = caches
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
            for c in sorted(self.caches(), key=lambda c: -c.size_bytes()):
                if c.size_bytes() == 0:
                    continue
                report = ShrinkReport(c.name, c.shrink(0.5))
                reports.append(report)
                self.on_shrink(report)
            _malloc_trim()
            if self.rss() < target:
                break
        self.shrinks += 1
        released: dict[str, int] = {}
        for r in reports:
            released[r.cache] = released.get(r.cache, 0) + r.released
        log.warning("memory: RSS reached %.0f%% of memory_limit (%d MiB); caches shrunk "
                    "(%s), RSS now %d MiB", 100 * HIGH_WATER, self.limit >> 20,
                    ", ".join(f"{name} -{n >> 10} KiB" for name, n in released.items()),
                    self.rss() >> 20)
        return reports
