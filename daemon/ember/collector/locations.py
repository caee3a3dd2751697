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

import numpy as np
import numpy.typing as npt

from .memo import SortedMemo

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
        self._widths: dict[int, SortedMemo] = {}

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

    def update(self, learned: Iterable[tuple[RowKey, tuple[int, ...]]]) -> None:
        for (width, key), frames in learned:
            w = self._widths.get(width)
            if w is None:
                w = self._widths[width] = SortedMemo(3 + 2 * width, max(width, 1), mix)
            w.learn(key, frames)
        if sum(len(w.recent) for w in self._widths.values()) >= self.MERGE_AT:
            if len(self) > self.MAX_ROWS:   # (keeping what was just learned)
                for w in self._widths.values():
                    w.forget()
            for w in self._widths.values():
                w.merge()
