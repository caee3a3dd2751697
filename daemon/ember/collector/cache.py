"""Made answers kept by (query, store generation), made once however many
ask at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from ..cache import BoundedCache

T = TypeVar("T")


class Cache(Generic[T]):
    """Trees (or the sums they are built from, or answers) by (generation,
    query), where the generation is the newest that changed what the query
    reads (Store.generation_of): a write makes the query's older entry
    unreachable, so keeping a newer one drops it (a fleet writes every few
    seconds: kept, they were most of what the caches held), and the least
    recently used go past ``size`` entries or ``max_bytes`` (``weigh``: an
    entry's bytes; the newest stays, however large). An entry made for an
    older generation than the query's kept one is returned, not kept.
    The entries are a ``BoundedCache`` named ``name``, so the collector's
    metrics show each cache's size. Requests for one being made wait for it
    rather than make it again (a page asks for the flame graph and the table
    at once, and 8 clients ask alike)."""

    def __init__(self, name: str, size: int = 8, max_bytes: int = 0,
                 weigh: Callable[[T], int] | None = None):
        self._lock = threading.Lock()
        self._items: BoundedCache[tuple[object, ...], T] = BoundedCache(
            name, size, max_bytes=max_bytes, weigh=weigh, lru=True, keep=1)   # the newest stays
        self._making: dict[tuple[object, ...], threading.Lock] = {}
        self._kept: dict[tuple[object, ...], int] = {}   # query -> the generation kept for it

    def get(self, generation: int, query: tuple[object, ...],
            make: Callable[[], T | None]) -> T | None:
        key = (generation, *query)
        while True:
            with self._lock:
                hit = self._items.get(key)
                if hit is not None:
                    return hit
                making = self._making.get(key)
                if making is None:
                    making = self._making[key] = threading.Lock()
                    making.acquire()
                    break
            with making:  # another request makes it: wait, then look again
                pass
        try:
            tree = make()
            if tree is not None:
                with self._lock:
                    self._keep(generation, query, tree)
            return tree
        finally:
            with self._lock:
                del self._making[key]
            making.release()

    def _keep(self, generation: int, query: tuple[object, ...], value: T) -> None:
        kept = self._kept.get(query)
        if kept is not None and generation < kept:
            return
        if kept is not None and kept < generation:
            self._items.pop((kept, *query))
        self._kept[query] = generation
        self._items.put((generation, *query), value)
        if len(self._kept) > 4 * max(1, len(self._items)):   # (those the bounds pushed out)
            live = {k[1:] for k, _ in self._items.items()}
            self._kept = {q: g for q, g in self._kept.items() if q in live}
