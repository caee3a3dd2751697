"""What an interner has seen, looked up a batch at a time, for things that
come by the thousand per profile and nearly all come again: rows of 64-bit
words mapped to values (``SortedMemo``: locations.py, stackids.py), and a
set of 64-bit ids (``IdSet``: the stacks a store holds).

The rows are kept in arrays sorted by a 64-bit key of each row (whatever
the user's ``key`` function gives: a keyed mix of the row, or one of its
words). A batch of rows is found with one ``searchsorted`` of its keys, and
a row counts as found only if every one of its words is equal, so a key
that two rows share costs a lookup, never a wrong value.

Rows learned since the last merge wait in a dict (by their bytes) until
the owner merges them in; ``forget`` drops the sorted arrays, for an owner
that keeps its memory under a ceiling (what is forgotten is made again).

Where the install built it, ``rows_memo`` gives a ``HashMemo`` instead: the
same rows in a keyed hash table in C (_memo.c), each row found with one
probe and one compare, and learned at once (nothing waits to be merged).
On a fleet's worker it found a profile's 5,000 locations in about a third
of the sorted arrays' time, whose gather of candidate rows from a table of
a million waited on memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt

_memo: ModuleType | None
try:   # the hash table in C (_memo.c), built by the install where it can be
    from . import _memo
except ImportError:   # pragma: no cover  (an install without a compiler)
    _memo = None

U64 = npt.NDArray[np.uint64]
Found = npt.NDArray[np.bool_]


def row_bytes(rows: U64) -> list[bytes]:
    """Each row of a 2-D array as bytes (a dict key)."""
    a = np.ascontiguousarray(rows, np.uint64)
    return cast(list[bytes], a.view(np.dtype((np.void, a.shape[1] * 8))).ravel().tolist())


class RowsMemo(Protocol):
    """Rows of words -> values of words (``SortedMemo``, ``HashMemo``)."""

    def __len__(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    def find(self, rows: U64) -> tuple[U64, Found]: ...
    def learn(self, row: bytes, values: tuple[int, ...]) -> None: ...
    def forget(self) -> None: ...
    def merge(self) -> None: ...


def rows_memo(cols: int, values: int, key: Callable[[U64], U64]) -> RowsMemo:
    """A memo of rows of ``cols`` words -> ``values`` words: in C where it
    was built, else sorted arrays by ``key`` of each row."""
    if _memo is not None:
        return HashMemo(cols, values)
    return SortedMemo(cols, values, key)


class HashMemo:
    """Rows of ``cols`` words -> values of ``values`` words, in C (_memo.c),
    hashed with keys drawn at random per memo."""

    def __init__(self, cols: int, values: int) -> None:
        assert _memo is not None
        self.cols, self.width = cols, values
        self._table = _memo.Table(cols, values, os.urandom(16))

    def __len__(self) -> int:
        return len(self._table)

    @property
    def waiting(self) -> int:
        return 0

    @property
    def nbytes(self) -> int:
        return int(self._table.nbytes)

    def find(self, rows: U64) -> tuple[U64, Found]:
        out = np.zeros((len(rows), self.width), np.uint64)
        found = np.zeros(len(rows), bool)
        if len(rows):
            self._table.find(np.ascontiguousarray(rows, np.uint64), out, found)
        return out, found

    def learn(self, row: bytes, values: tuple[int, ...]) -> None:
        self._table.add(row, np.array(values, np.uint64))

    def learn_all(self, rows: U64, values: U64) -> None:
        """Many rows at once (a row held keeps its values)."""
        self._table.add(np.ascontiguousarray(rows, np.uint64),
                        np.ascontiguousarray(values, np.uint64))

    def forget(self) -> None:
        self._table.clear()

    def merge(self) -> None:
        pass


class SortedMemo:
    """Rows of ``cols`` words -> values of ``values`` words."""

    def __init__(self, cols: int, values: int, key: Callable[[U64], U64]) -> None:
        self.cols, self.width, self.key = cols, values, key
        self.keys = np.zeros(0, np.uint64)            # sorted
        self.rows = np.zeros((0, cols), np.uint64)
        self.values = np.zeros((0, values), np.uint64)
        self.recent: dict[bytes, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self.keys) + len(self.recent)

    @property
    def waiting(self) -> int:
        """Rows learned, not merged yet."""
        return len(self.recent)

    def find(self, rows: U64) -> tuple[U64, Found]:
        """Each row's values (zeros if not found), and which were found."""
        out = np.zeros((len(rows), self.width), np.uint64)
        found = np.zeros(len(rows), bool)
        if len(self.keys) and len(rows):
            q = self.key(rows)
            order = np.argsort(q)   # (sorted, the search walks the table once)
            at = np.empty(len(q), np.intp)
            at[order] = np.searchsorted(self.keys, q[order])
            at = at.clip(0, len(self.keys) - 1)
            found = (self.keys[at] == q) & (self.rows[at] == rows).all(axis=1)
            out[found] = self.values[at[found]]
        if self.recent:
            rest = np.flatnonzero(~found)
            recent = self.recent
            for i, b in zip(rest.tolist(), row_bytes(rows[rest]), strict=True):
                got = recent.get(b)
                if got is not None:
                    out[i] = got
                    found[i] = True
        return out, found

    def learn(self, row: bytes, values: tuple[int, ...]) -> None:
        """A row (as bytes) and its values, until the next merge (a row
        already waiting keeps its values)."""
        self.recent.setdefault(row, values)

    def forget(self) -> None:
        """Drop the merged rows (those waiting stay)."""
        self.keys, self.rows, self.values = self.keys[:0], self.rows[:0], self.values[:0]

    def merge(self) -> None:
        """The rows waiting, into the sorted arrays."""
        if not self.recent:
            return
        rows = np.frombuffer(b"".join(self.recent), np.uint64).reshape(-1, self.cols)
        values = np.array(list(self.recent.values()), np.uint64).reshape(len(rows), -1)
        keys = self.key(rows)
        order = np.argsort(keys, kind="stable")
        keys, rows, values = keys[order], rows[order], values[order]
        at = np.searchsorted(self.keys, keys)
        self.keys = np.insert(self.keys, at, keys)
        self.rows = np.insert(self.rows, at, rows, axis=0)
        self.values = np.insert(self.values, at, values, axis=0)
        self.recent = {}


class IdSet:
    """64-bit ids as one sorted array (8 bytes each; a Python set of them
    takes about 70, and a store's stacks only grow: a fleet hour's 200,000
    held 15 MB), with the latest ones in a small set until there are
    ``MERGE_AT`` of them. ``known`` asks for many at once (the latest ones
    also in a C table where it was built: asking the set one id at a time
    took a worker 0.4 ms a profile)."""

    MERGE_AT = 1 << 14

    def __init__(self) -> None:
        self._sorted = np.zeros(0, np.uint64)
        self._recent: set[int] = set()
        self._table = HashMemo(1, 1) if _memo is not None else None

    def __len__(self) -> int:
        recent = np.fromiter(self._recent, np.uint64, len(self._recent))
        s = self._sorted
        if not len(s):
            return len(recent)
        return len(s) + int((s[np.searchsorted(s, recent).clip(0, len(s) - 1)] != recent).sum())

    def __contains__(self, i: object) -> bool:
        if i in self._recent:
            return True
        if not isinstance(i, int | np.integer) or not 0 <= int(i) < 1 << 64 \
                or not len(self._sorted):
            return False
        k = int(np.searchsorted(self._sorted, np.uint64(i)))
        return k < len(self._sorted) and int(self._sorted[k]) == int(i)

    def known(self, ids: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        """Which of ``ids`` are in the set."""
        s = self._sorted
        out = (s[np.searchsorted(s, ids).clip(0, len(s) - 1)] == ids) if len(s) \
            else np.zeros(len(ids), bool)
        if self._recent:
            rest = np.flatnonzero(~out)
            if self._table is not None:
                out[rest] = self._table.find(ids[rest].reshape(-1, 1))[1]
            else:
                recent = self._recent
                out[rest] = np.fromiter((i in recent for i in ids[rest].tolist()), bool,
                                        len(rest))
        return out

    def update(self, ids: Iterable[int]) -> None:
        new = [i for i in ids if i not in self._recent]
        self._recent.update(new)
        if len(self._recent) >= self.MERGE_AT:
            self.add_array(np.fromiter(self._recent, np.uint64, len(self._recent)))
            self._recent = set()
            if self._table is not None:
                self._table.forget()
        elif new and self._table is not None:
            a = np.array(new, np.uint64).reshape(-1, 1)
            self._table.learn_all(a, a)

    def add_array(self, ids: npt.NDArray[np.uint64]) -> None:
        self._sorted = np.union1d(self._sorted, ids.astype(np.uint64))
