"""A tree slid along time instead of merged again.

A page left on "the last hour" asks again as time passes, and a fleet
writes every few seconds; each write makes the cached tree stale, and the
whole hour merged again from its rows takes over a second. The new range
mostly overlaps the last one's, so the last tree of the same query and the
same length is moved on instead: the rows the range gained (newer than the
old end) are added and the rows it lost (ended before the new start) taken
away, two small sums over the edges rather than one over the hour.

That is exact whatever was written since, inside the old range or not
(agents ship profiles that end now, inside a range that ends now): each
row keeps the generation of the write that stored it, a tree sums only the
rows written by its generation, and the rows a slide adds are those of the
new range newer than the old end or written since the old tree. Nothing
may have been deleted since; otherwise, and when the range moved back or
changed its sample types, the tree is merged from the rows as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..cache import BoundedCache
from ..model import ProfileType
from .engine import Tree
from .matchers import Selector
from .store import Store


@dataclass(frozen=True)
class Made:
    """A tree and what it was made of."""
    start: int
    end: int
    generation: int
    shape: ProfileType
    value: int          # which of the sample types the tree sums
    tree: Tree


class Windows:
    """The latest tree per (type, matchers, value, range length), to slide:
    at most ``size`` of them and ``max_bytes`` of their values, the least
    recently slid given up first (the newest stays, however large)."""

    def __init__(self, size: int = 16, max_bytes: int = 32 << 20):
        self._latest: BoundedCache[tuple[object, ...], Made] = BoundedCache(
            "collector_windows", size, max_bytes=max_bytes, weigh=lambda m: m.tree.nbytes,
            lru=True, keep=1)
        self.slid = 0       # how many trees were slid rather than merged (tests, metrics)
        self.on_tree: Callable[[str], None] | None = None   # hears "slid" or "merged"

    def tree(self, store: Store, key: tuple[object, ...], stored: str, selector: Selector,
             start: int, end: int, build: Callable[[int], Made | None]) -> Tree | None:
        """The tree of ``stored`` over [start, end) for ``selector``: slid
        from the last one of ``key`` when that is exact, else ``build(generation)``."""
        generation = store.generation   # the tree sums the rows written by then
        key = (*key, end - start)
        last = self._latest.get(key)
        made = self._slide(store, last, stored, selector, start, end, generation) if last else None
        how = "slid"
        if made is None:
            made, how = build(generation), "merged"
        else:
            self.slid += 1
        if made is not None and self.on_tree is not None:
            self.on_tree(how)
        if made is not None:
            self._latest.put(key, made)
        return made.tree if made is not None else None

    @staticmethod
    def _slide(store: Store, last: Made, stored: str, selector: Selector, start: int,
               end: int, generation: int) -> Made | None:
        if not last.start <= start < last.end <= end:
            return None
        if store.deleted_since(last.generation) or store.shapes(stored) != [last.shape]:
            return None
        # the new range's rows the old tree lacks: newer than its end, or
        # written since it was made
        gained = store.aggregate(start, end, selector, stored, by_name=True, value=last.value,
                                 upto=generation, gained=(last.end, last.generation))
        if gained is None or gained.shape != last.shape:
            return None
        lost = None
        if start > last.start:   # the old tree's rows that ended before the new start
            lost = store.aggregate(last.start, last.end, selector, stored, by_name=True,
                                   value=last.value, upto=last.generation, ended_before=start)
        tree = last.tree.slid(gained, lost, last.value)
        if tree is None:
            return None
        return Made(start, end, generation, last.shape, last.value, tree)
