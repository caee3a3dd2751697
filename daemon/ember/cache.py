"""One bounded cache type, and the registry through which the memory
governor sees every cache.

Every cache in ember (symbol and DWARF tables, symbolized frames, objects of
mappings, perf maps, process maps and labels, demangled names, compiled
relabel patterns) is a ``BoundedCache``: a named mapping bounded by entries
and/or approximate bytes that evicts its oldest entries first (least
recently used with ``lru=True``). Each registers itself, so the agent's
memory governor (agent/memory.py) finds every cache without being told of
it, shrinks the largest first, and the metrics report each by name.

Reads of a plain cache are the dict's own ``get`` (no Python frame on the
symbolizer's hot path; atomic under the GIL). Writes, eviction, shrinking
and an LRU read take the cache's lock, so a cache shared with a thread (the
process maps, read by the watcher thread) stays consistent.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_MISSING = object()
_LIVE: weakref.WeakSet[BoundedCache[object, object]] = weakref.WeakSet()


class BoundedCache(Generic[K, V]):
    """A named mapping with a bound.

    ``max_entries`` bounds the number of entries, ``max_bytes`` their
    approximate size: ``weigh(value)`` bytes each, or ``entry_bytes`` when
    no ``weigh`` is given. ``keep`` entries always stay (a symbol table the
    drain is using is not evicted for being large). ``floor`` is the
    smallest bound ``shrink`` may leave (default: 1024 entries, or 1 MiB).
    ``register=False`` only for a cache nested inside another cache's
    entries, whose weight counts it.
    """

    def __init__(self, name: str, max_entries: int = 0, *, max_bytes: int = 0,
                 weigh: Callable[[V], int] | None = None, entry_bytes: int = 200,
                 lru: bool = False, keep: int = 0, floor: int = 0, register: bool = True):
        if max_entries <= 0 and max_bytes <= 0:
            raise ValueError(f"cache {name}: needs max_entries or max_bytes")
        self.name = name
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.entry_bytes = entry_bytes
        self.lru = lru
        self.keep = keep
        self.floor = floor
        self.evictions = 0
        self._weigh = weigh
        self._bytes = 0   # weighed caches: the sum of weights, as of each entry's put
        self._data: dict[K, V] = {}
        self._lock = threading.RLock()
        #: the value of key, or None; an LRU read also makes it the newest
        self.get: Callable[[K], V | None] = self._get_lru if lru else self._data.get
        if register:
            _LIVE.add(self)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"<BoundedCache {self.name}: {len(self._data)} entries>"

    def _get_lru(self, key: K) -> V | None:
        with self._lock:
            value = self._data.pop(key, _MISSING)
            if value is _MISSING:
                return None
            self._data[key] = value  # type: ignore[assignment]
            return value  # type: ignore[return-value]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def put(self, key: K, value: V) -> V:
        """Store value (the newest entry), evict past the bounds; returns value."""
        with self._lock:
            self._remove(key)
            self._data[key] = value
            if self._weigh is not None:
                self._bytes += self._weigh(value)
            self._evict()
        return value

    def _remove(self, key: K) -> V | None:
        value = self._data.pop(key, _MISSING)
        if value is _MISSING:
            return None
        if self._weigh is not None:
            self._bytes -= self._weigh(value)  # type: ignore[arg-type]
        return value  # type: ignore[return-value]

    def pop(self, key: K) -> V | None:
        with self._lock:
            return self._remove(key)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0

    def values(self) -> list[V]:
        """A snapshot of the values, oldest first."""
        with self._lock:
            return list(self._data.values())

    def items(self) -> list[tuple[K, V]]:
        """A snapshot of the entries, oldest first."""
        with self._lock:
            return list(self._data.items())

    def size_bytes(self) -> int:
        """Approximate bytes held. Entries that grow after their put (DWARF
        tables parse units on demand, perf maps re-read their file) are
        weighed again here."""
        if self._weigh is None:
            return len(self._data) * self.entry_bytes
        with self._lock:
            self._bytes = sum(self._weigh(v) for v in self._data.values())
            return self._bytes

    def _evict(self) -> None:
        data = self._data
        while self.max_entries and len(data) > max(self.max_entries, self.keep):
            self._remove(next(iter(data)))
            self.evictions += 1
        while self.max_bytes and self._held() > self.max_bytes and len(data) > self.keep:
            self._remove(next(iter(data)))
            self.evictions += 1

    def _held(self) -> int:
        return self._bytes if self._weigh is not None else len(self._data) * self.entry_bytes

    def resize(self, *, max_entries: int | None = None, max_bytes: int | None = None) -> None:
        """New bounds (evicting what no longer fits)."""
        with self._lock:
            if max_entries is not None:
                self.max_entries = max_entries
            if max_bytes is not None:
                self.max_bytes = max_bytes
            self._evict()

    def shrink(self, fraction: float) -> int:
        """Give up about ``fraction`` of the cache, oldest first, and keep the
        bound there (not below ``floor``): a cache that refilled at once would
        only thrash. Returns the bytes released."""
        with self._lock:
            before = self.size_bytes()
            if self.max_bytes:
                floor = self.floor or 1 << 20
                self.max_bytes = max(floor, int(before * (1 - fraction)))
            else:
                floor = self.floor or 1024
                self.max_entries = max(floor, int(len(self._data) * (1 - fraction)))
            self._evict()
            return before - self.size_bytes()


def live() -> list[BoundedCache[object, object]]:
    """Every registered cache still alive, by name."""
    return sorted(_LIVE, key=lambda c: c.name)


def sizes() -> dict[str, tuple[int, int]]:
    """(approximate bytes, evictions so far) per cache name, caches of one
    name summed."""
    out: dict[str, tuple[int, int]] = {}
    for c in live():
        size, evicted = out.get(c.name, (0, 0))
        out[c.name] = (size + c.size_bytes(), evicted + c.evictions)
    return out
