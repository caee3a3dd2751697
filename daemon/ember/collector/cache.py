"""Made answers kept by (query, store generation), made once however many
ask at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from ..cache import BoundedCache

T = TypeVar("T")


class Cache(Generic[T]):
    """Trees (or the sums they are built from, or answers) by (query, store
    generation): a write makes older entries unreachable, and the oldest go
    past ``size`` entries or ``max_bytes`` (``weigh``: an entry's bytes;
    the newest stays, however large).
    The entries are a ``BoundedCache`` named ``name``, so the collector's
    metrics show each cache's size. Requests for one being made wait for it
    rather than make it again (a page asks for the flame graph and the table
    at once, and 8 clients ask alike)."""

    def __init__(self, name: str, size: int = 8, max_bytes: int = 0,
                 weigh: Callable[[T], int] | None = None):
        self._lock = threading.Lock()
        self._items: BoundedCache[tuple[object, ...], T] = BoundedCache(
            name, size, max_bytes=max_bytes, weigh=weigh, keep=1)   # the newest stays
        self._making: dict[tuple[object, ...], threading.Lock] = {}

    def get(self, key: tuple[object, ...], make: Callable[[], T | None]) -> T | None:
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
                    self._items.put(key, tree)
            return tree
        finally:
            with self._lock:
                del self._making[key]
            making.release()
