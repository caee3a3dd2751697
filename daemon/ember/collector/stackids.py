"""The ids of a profile's stacks, a profile at a time.

A stack's id is BLAKE2b over its frame ids (``ids.stack_id``), the same
in every store. Hashing each stack of a 1,000-stack profile took 1.9 ms,
and nearly all of them were hashed before. Here a profile's stacks are
first given 128-bit keys in bulk, and only stacks whose key has not been
seen are hashed with BLAKE2b.

A stack's key is two sums, over its frames, of a keyed 64-bit mix of
(frame id, position in the stack), with the keys drawn at random in each
process; a stack is found only if both sums and its depth are equal. Were
the mix a random function, two different stacks would share a sum with a
chance of 2^-64, and both with 2^-128: far less than the chance of two
stacks sharing an id (2^-64), which the store accepts. No sender sees the
keys, so none can choose stacks that meet.

Keys learned since the last merge wait (memo.py, where it is not in C)
until there are ``MERGE_AT`` of them. Before it would pass ``MAX_STACKS``
the memo forgets what it holds (all but those waiting), and what it
forgets is hashed again.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import numpy.typing as npt

from .memo import row_bytes, rows_memo

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]


def _mix(x: U64, k: U64) -> U64:
    """A 64-bit mix of each value, keyed by three odd words ``k``."""
    x = x * k[0]
    x ^= x >> np.uint64(32)
    x *= k[1]
    x ^= x >> np.uint64(29)
    x *= k[2]
    x ^= x >> np.uint64(32)
    return x


def stack_digest(frame_ids: bytes | memoryview) -> int:
    """A stack's id from its frame ids as little-endian 64-bit words, root
    first: the one definition (``ids.stack_id`` and ``blake2b_ids``)."""
    return int.from_bytes(hashlib.blake2b(frame_ids, digest_size=8,
                                          person=b"ember-stack").digest(), "little")


def blake2b_ids(flat: U64, bounds: I64, which: list[int]) -> list[int]:
    """``stack_digest`` of stacks ``which``: stack ``i`` is
    ``flat[bounds[i]:bounds[i + 1]]``."""
    view = memoryview(np.ascontiguousarray(flat, np.uint64).tobytes())
    b = bounds.tolist()
    return [stack_digest(view[b[i] * 8:b[i + 1] * 8]) for i in which]


def _first(rows: U64) -> U64:
    return np.ascontiguousarray(rows[:, 0])


class StackIds:
    """Stacks (frame ids, root first) -> their ids, remembered by key: a
    memo of rows (first sum, second sum, depth), sorted by the first sum
    where it is not in C."""

    MERGE_AT = 1 << 12
    MAX_STACKS = 1 << 20   # (32 bytes each)

    def __init__(self) -> None:
        self._k = np.frombuffer(os.urandom(8 * 7), np.uint64) | np.uint64(1)
        self._memo = rows_memo(3, 1, _first)

    def __len__(self) -> int:
        return len(self._memo)

    def keys(self, flat: U64, bounds: I64) -> tuple[U64, U64]:
        """Each stack's two sums (stack ``i``: ``flat[bounds[i]:bounds[i + 1]]``)."""
        depth = np.diff(bounds)
        # (a frame's position from 1: no frame id is known to mix to 0)
        pos = np.arange(1, len(flat) + 1, dtype=np.uint64) - np.repeat(
            bounds[:-1], depth).astype(np.uint64)
        x = flat.astype(np.uint64) ^ (pos * self._k[0])
        out = []
        for k in (self._k[1:4], self._k[4:7]):
            total = np.zeros(len(flat) + 1, np.uint64)
            np.cumsum(_mix(x, k), out=total[1:])
            out.append(total[bounds[1:]] - total[bounds[:-1]])   # (wrapping, as the sums)
        return out[0], out[1]

    def ids(self, flat: U64, bounds: I64) -> U64:
        """The id of each stack ``flat[bounds[i]:bounds[i + 1]]``."""
        first, second = self.keys(flat, bounds)
        rows = np.stack([first, second, np.diff(bounds).astype(np.uint64)], axis=1)
        got, found = self._memo.find(rows)
        out = got.reshape(-1)
        rest = np.flatnonzero(~found).tolist()
        if not rest:
            return out
        if len(self._memo) + len(rest) > self.MAX_STACKS:   # (before these are learned)
            self._memo.forget()
        new: dict[bytes, int] = {}   # (a stack twice in the profile: hashed once)
        keys = row_bytes(rows[rest])
        for i, key in zip(rest, keys, strict=True):
            new.setdefault(key, i)
        ids = dict(zip(new, blake2b_ids(flat, bounds, list(new.values())), strict=True))
        for key, sid in ids.items():
            self._memo.learn(key, (sid,))
        out[rest] = np.array([ids[key] for key in keys], np.uint64)
        if self._memo.waiting >= self.MERGE_AT:
            self._memo.merge()
        return out
