"""The frames of the locations an interner has seen, found by content, a
whole profile's locations at once.

A 1,000-stack profile names about 5,000 locations, nearly all seen before.
Each was looked up in a dict by a key of small ids, its functions' strings
turned into those ids by two more dicts first: about 9 ms a profile, most
of it waiting on memory (three random reads into tables of 50,000 entries
per location). Here a location is a row of numbers, and a profile's rows
are looked up together:

- A function is the hash of its (name, system name, file) strings:
  Python's string hash, keyed at random in each process, so no one can
  choose strings that meet. Two functions share frames only if these hashes
  are equal; that is the same kind of chance as two frames sharing a 64-bit
  content id (intern.py), and with a key no sender knows.
- A location of ``w`` lines is the row (mapping, address, w, then function
  and line for each line), its mapping a small id of its content.
- The rows of each width are kept sorted by a 64-bit mix of their values
  (with multipliers drawn at random per process). A profile's rows are
  found with one ``searchsorted`` of their mixes, and a row counts as found
  only if every one of its values is equal, so a mix that two rows share
  costs a lookup, never a wrong frame.

Rows learned since the last merge wait in a dict until there are
``MERGE_AT`` of them. The memo only remembers: past ``MAX_ROWS`` rows it
forgets all but those, and what it forgets is made again from the profile.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import cast

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
#: A row (mapping, address, lines, then (function hash, line) per line) as
#: bytes, with its width (lines): how rows learned travel in ``Rows``.
RowKey = tuple[int, bytes]

_MULT = np.frombuffer(os.urandom(8 * 2), np.uint64) | np.uint64(1)


def mix(rows: U64) -> U64:
    """A 64-bit mix of each row's values (keyed per process)."""
    h = np.zeros(len(rows), np.uint64)
    for j in range(rows.shape[1]):
        h ^= rows[:, j]
        h *= _MULT[0]
        h ^= h >> np.uint64(31)
    h *= _MULT[1]
    h ^= h >> np.uint64(29)
    return h


def row_bytes(rows: U64) -> list[bytes]:
    """Each row of a 2-D array as bytes (a dict key)."""
    a = np.ascontiguousarray(rows, np.uint64)
    return cast(list[bytes], a.view(np.dtype((np.void, a.shape[1] * 8))).ravel().tolist())


class _Width:
    """The rows of one width: sorted arrays, and the rows learned since."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.cols = 3 + 2 * width
        self.keys = np.zeros(0, np.uint64)
        self.rows = np.zeros((0, self.cols), np.uint64)
        self.frames = np.zeros((0, max(width, 1)), np.uint64)
        self.recent: dict[bytes, tuple[int, ...]] = {}

    def find(self, rows: U64) -> tuple[U64, npt.NDArray[np.bool_]]:
        out = np.zeros((len(rows), max(self.width, 1)), np.uint64)
        found = np.zeros(len(rows), bool)
        if len(self.keys) and len(rows):
            q = mix(rows)
            order = np.argsort(q)   # (sorted, the search walks the table once)
            at = np.empty(len(q), np.intp)
            at[order] = np.searchsorted(self.keys, q[order])
            at = at.clip(0, len(self.keys) - 1)
            found = (self.keys[at] == q) & (self.rows[at] == rows).all(axis=1)
            out[found] = self.frames[at[found]]
        if self.recent:
            rest = np.flatnonzero(~found)
            recent = self.recent
            for i, key in zip(rest.tolist(), row_bytes(rows[rest]), strict=True):
                got = recent.get(key)
                if got is not None:
                    out[i] = got
                    found[i] = True
        return out, found

    def forget(self) -> None:
        self.keys, self.rows, self.frames = self.keys[:0], self.rows[:0], self.frames[:0]

    def merge(self) -> None:
        if not self.recent:
            return
        rows = np.frombuffer(b"".join(self.recent), np.uint64).reshape(-1, self.cols)
        frames = np.array(list(self.recent.values()), np.uint64).reshape(len(rows), -1)
        keys = mix(rows)
        order = np.argsort(keys, kind="stable")
        keys, rows, frames = keys[order], rows[order], frames[order]
        at = np.searchsorted(self.keys, keys)
        self.keys = np.insert(self.keys, at, keys)
        self.rows = np.insert(self.rows, at, rows, axis=0)
        self.frames = np.insert(self.frames, at, frames, axis=0)
        self.recent = {}


class LocationMemo:
    """Location rows -> their frame ids (root first), by width."""

    MERGE_AT = 1 << 12
    MAX_ROWS = 1 << 21   # (about 110 MB of one-line rows)

    def __init__(self) -> None:
        self._widths: dict[int, _Width] = {}

    def __len__(self) -> int:
        return sum(len(w.keys) + len(w.recent) for w in self._widths.values())

    def find(self, width: int, rows: U64) -> tuple[U64, npt.NDArray[np.bool_]]:
        """For rows of ``width`` lines: their frames (one row each, padded to
        at least one column) and which were found."""
        w = self._widths.get(width)
        if w is None:
            return (np.zeros((len(rows), max(width, 1)), np.uint64),
                    np.zeros(len(rows), bool))
        return w.find(rows)

    def update(self, learned: Iterable[tuple[RowKey, tuple[int, ...]]]) -> None:
        for (width, key), frames in learned:
            w = self._widths.get(width)
            if w is None:
                w = self._widths[width] = _Width(width)
            w.recent.setdefault(key, frames)
        if sum(len(w.recent) for w in self._widths.values()) >= self.MERGE_AT:
            if len(self) > self.MAX_ROWS:   # (keeping what was just learned)
                for w in self._widths.values():
                    w.forget()
            for w in self._widths.values():
                w.merge()
