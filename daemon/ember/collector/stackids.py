"""The ids of a profile's stacks, a profile at a time.

A stack's id is BLAKE2b over its frame ids (``intern.stack_id``), the same
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

Keys learned since the last merge wait in a dict until there are
``MERGE_AT`` of them. Past ``MAX_STACKS`` the memo forgets all but those,
and what it forgets is hashed again.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Key = tuple[int, int, int]   # (first sum, second sum, depth)


def _mix(x: U64, k: U64) -> U64:
    """A 64-bit mix of each value, keyed by three odd words ``k``."""
    x = x * k[0]
    x ^= x >> np.uint64(32)
    x *= k[1]
    x ^= x >> np.uint64(29)
    x *= k[2]
    x ^= x >> np.uint64(32)
    return x


def blake2b_ids(flat: U64, bounds: I64, which: list[int]) -> list[int]:
    """``intern.stack_id`` of stacks ``which``: stack ``i`` is
    ``flat[bounds[i]:bounds[i + 1]]``."""
    view = memoryview(np.ascontiguousarray(flat, np.uint64).tobytes())
    b = bounds.tolist()
    return [int.from_bytes(hashlib.blake2b(view[b[i] * 8:b[i + 1] * 8], digest_size=8,
                                           person=b"ember-stack").digest(), "little")
            for i in which]


class StackIds:
    """Stacks (frame ids, root first) -> their ids, remembered by key."""

    MERGE_AT = 1 << 12
    MAX_STACKS = 1 << 20   # (32 bytes each)

    def __init__(self) -> None:
        self._k = np.frombuffer(os.urandom(8 * 7), np.uint64) | np.uint64(1)
        self._first = np.zeros(0, np.uint64)    # sorted
        self._second = np.zeros(0, np.uint64)
        self._depth = np.zeros(0, np.int64)
        self._ids = np.zeros(0, np.uint64)
        self._recent: dict[Key, int] = {}

    def __len__(self) -> int:
        return len(self._first) + len(self._recent)

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
        depth = np.diff(bounds)
        n = len(depth)
        out = np.zeros(n, np.uint64)
        found = np.zeros(n, bool)
        if len(self._first) and n:
            at = np.searchsorted(self._first, first).clip(0, len(self._first) - 1)
            found = ((self._first[at] == first) & (self._second[at] == second)
                     & (self._depth[at] == depth))
            out[found] = self._ids[at[found]]
        rest = np.flatnonzero(~found).tolist()
        if not rest:
            return out
        keys = list(zip(first[rest].tolist(), second[rest].tolist(), depth[rest].tolist(),
                        strict=True))
        recent = self._recent
        new: dict[Key, int] = {}   # (a stack twice in the profile: hashed once)
        for i, key in zip(rest, keys, strict=True):
            if key not in recent and key not in new:
                new[key] = i
        for key, sid in zip(new, blake2b_ids(flat, bounds, list(new.values())), strict=True):
            recent[key] = sid
        out[rest] = np.array([recent[key] for key in keys], np.uint64)
        if len(recent) >= self.MERGE_AT:
            self._merge()
        return out

    def _merge(self) -> None:
        if len(self) > self.MAX_STACKS:   # (keeping what was just learned)
            self._first, self._second = self._first[:0], self._second[:0]
            self._depth, self._ids = self._depth[:0], self._ids[:0]
        m = len(self._recent)
        keys = np.array(list(self._recent), np.uint64).reshape(m, 3)
        ids = np.fromiter(self._recent.values(), np.uint64, m)
        order = np.argsort(keys[:, 0], kind="stable")
        keys, ids = keys[order], ids[order]
        at = np.searchsorted(self._first, keys[:, 0])
        self._first = np.insert(self._first, at, keys[:, 0])
        self._second = np.insert(self._second, at, keys[:, 1])
        self._depth = np.insert(self._depth, at, keys[:, 2].astype(np.int64))
        self._ids = np.insert(self._ids, at, ids)
        self._recent = {}
