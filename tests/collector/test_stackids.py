"""Stack ids found by key (collector/stackids.py): whatever stacks come,
in whatever batches, across merges and past the memo's ceiling, each id is
``ids.stack_id`` of the stack's frames, as if each were hashed alone."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ember.collector import stackids
from ember.collector.ids import stack_id
from ember.collector.stackids import StackIds

#: every test with the memos in C, then as sorted arrays
pytestmark = pytest.mark.usefixtures("memo_kind")


def batch(stacks: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    flat = np.array([f for s in stacks for f in s], np.uint64)
    bounds = np.concatenate(([0], np.cumsum([len(s) for s in stacks]))).astype(np.int64)
    return flat, bounds


def stacks_of(rng: random.Random, frames: list[int], n: int) -> list[tuple[int, ...]]:
    """Random stacks, some empty, some of one frame, some repeated, some the
    same frames in another order or one frame longer."""
    out: list[tuple[int, ...]] = []
    for _ in range(n):
        kind = rng.random()
        if out and kind < 0.15:
            out.append(rng.choice(out))
        elif out and kind < 0.25:
            s = list(rng.choice(out))
            rng.shuffle(s)
            out.append(tuple(s))
        elif out and kind < 0.3:
            out.append((*rng.choice(out), rng.choice(frames)))
        else:
            out.append(tuple(rng.choice(frames) for _ in range(rng.choice([0, 1, 2, 5, 30]))))
    return out


@pytest.mark.parametrize(("merge_at", "ceiling"), [(1 << 12, 1 << 20), (7, 1 << 20), (7, 40)])
def test_ids_are_each_stacks_own_hash(monkeypatch: pytest.MonkeyPatch, merge_at: int,
                                      ceiling: int) -> None:
    monkeypatch.setattr(StackIds, "MERGE_AT", merge_at)
    monkeypatch.setattr(StackIds, "MAX_STACKS", ceiling)
    rng = random.Random(3)
    frames = [rng.getrandbits(64) for _ in range(50)] + [0, (1 << 64) - 1]
    memo, seen = StackIds(), []
    for _ in range(30):
        stacks = stacks_of(rng, frames, rng.randint(0, 40))
        stacks += rng.sample(seen, min(len(seen), 10))   # known before
        seen += stacks
        assert memo.ids(*batch(stacks)).tolist() == [stack_id(s) for s in stacks]
    assert len(memo) <= max(ceiling, merge_at) + 40 + 10


def test_stacks_whose_first_sums_meet_still_get_their_own_ids(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stack given the same first sum: found by the second sum and the
    depth, or hashed again; never another stack's id."""
    monkeypatch.setattr(StackIds, "MERGE_AT", 5)
    real = StackIds.keys

    def meeting(self: StackIds, flat: np.ndarray, bounds: np.ndarray) -> tuple[
            np.ndarray, np.ndarray]:
        first, second = real(self, flat, bounds)
        return np.zeros_like(first), second

    monkeypatch.setattr(StackIds, "keys", meeting)
    rng = random.Random(5)
    frames = [rng.getrandbits(64) for _ in range(20)]
    memo = StackIds()
    stacks = stacks_of(rng, frames, 60)
    for start in range(0, 60, 6):
        part = stacks[start:start + 6] + stacks[:3]
        assert memo.ids(*batch(part)).tolist() == [stack_id(s) for s in part]


def test_the_key_tells_apart_stacks_that_differ_only_in_order_or_depth() -> None:
    stacks = [(1, 2, 3), (3, 2, 1), (1, 2, 3, 0), (0, 1, 2, 3), (), (0,), (0, 0), (2, 2)]
    first, second = StackIds().keys(*batch(stacks))
    assert len(set(first.tolist())) == len(set(second.tolist())) == len(stacks)
    assert first[4] == second[4] == 0   # the empty stack sums nothing; (0,) something
    assert stackids.blake2b_ids(*batch(stacks), [0, 4]) == [stack_id((1, 2, 3)), stack_id(())]
