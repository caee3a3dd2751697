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
  choose strings that meet. (With the C reader, each string's hash is
  ``hash`` of its bytes, taken as it reads them, and the three are
  ``mix``ed: no string is made for a function already seen.) Two
  functions share frames only if these hashes are equal; that is the same
  kind of chance as two frames sharing a 64-bit content id (intern.py),
  and with a key no sender knows.
- A location of ``w`` lines is the row (mapping, address, w, then function
  and line for each line), its mapping a small id of its content.
- The rows of each width are a memo (memo.py): a keyed hash table in C
  where the install built it, else arrays sorted by a 64-bit ``mix`` of
  the rows (multipliers drawn at random per process), searched with one
  ``searchsorted``, the rows learned since the last merge waiting in a dict
  until there are ``MERGE_AT`` of them. Either way a profile's rows are
  looked up together, and a row counts as found only if every one of its
  values is equal, so a hash two rows share costs a lookup, never a wrong
  frame.

The memo only remembers: before it would pass ``MAX_ROWS`` rows it forgets
what it holds (the sorted arrays: all but the rows waiting), and what it
forgets is made again from the profile.
"""

from __future__ import annotations

import os
from collections.abc import Collection

import numpy as np
import numpy.typing as npt

from .memo import RowsMemo, rows_memo

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


class LocationMemo:
    """Location rows -> their frame ids (root first), by width: a
    ``SortedMemo`` per width, its rows keyed by ``mix``."""

    MERGE_AT = 1 << 12
    MAX_ROWS = 1 << 21   # (about 110 MB of one-line rows)

    def __init__(self) -> None:
        self._widths: dict[int, RowsMemo] = {}

    def __len__(self) -> int:
        return sum(len(w) for w in self._widths.values())

    def find(self, width: int, rows: U64) -> tuple[U64, npt.NDArray[np.bool_]]:
        """For rows of ``width`` lines: their frames (one row each, padded to
        at least one column) and which were found."""
        w = self._widths.get(width)
        if w is None:
            return (np.zeros((len(rows), max(width, 1)), np.uint64),
                    np.zeros(len(rows), bool))
        return w.find(rows)

    def update(self, learned: Collection[tuple[RowKey, tuple[int, ...]]]) -> None:
        memos = self._widths
        if len(self) + len(learned) > self.MAX_ROWS:   # (before what is learned now)
            for m in memos.values():
                m.forget()
        for (width, key), frames in learned:
            if width not in memos:
                memos[width] = rows_memo(3 + 2 * width, max(width, 1), mix)
            memos[width].learn(key, frames)
        if sum(m.waiting for m in memos.values()) >= self.MERGE_AT:
            for m in memos.values():
                m.merge()
