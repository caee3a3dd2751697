"""The location memo (collector/locations.py): a row found is always the
row learned, across widths and merges, and a mix that rows share costs a
lookup, never a wrong frame."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ember.collector import locations
from ember.collector.locations import LocationMemo
from ember.collector.memo import row_bytes

#: every test with the memos in C, then as sorted arrays
pytestmark = pytest.mark.usefixtures("memo_kind")


def _rows(rng: random.Random, width: int, n: int) -> np.ndarray:
    # few distinct values per column, so rows differ in one value only
    return np.array([[rng.choice([0, 1, 2, (1 << 64) - 1]) for _ in range(3 + 2 * width)]
                     for _ in range(n)], np.uint64)


@pytest.mark.parametrize("shared_mix", [False, True])
def test_the_memo_answers_as_a_dict_of_the_rows_learned(
        monkeypatch: pytest.MonkeyPatch, shared_mix: bool) -> None:
    monkeypatch.setattr(LocationMemo, "MERGE_AT", 40)   # merge often
    if shared_mix:   # every row the same mix: only the values tell them apart
        monkeypatch.setattr(locations, "mix", lambda r: np.full(len(r), 7, np.uint64))
    rng = random.Random(3)
    memo, ref = LocationMemo(), {}
    for _ in range(30):
        width = rng.randint(0, 3)
        asked = _rows(rng, width, 30)
        got, found = memo.find(width, asked)
        for key, frames, hit in zip(row_bytes(asked), got, found, strict=True):
            want = ref.get((width, key))
            if hit:
                assert want is not None and tuple(frames.tolist()) == want
            elif not shared_mix:   # (a shared mix may leave merged rows unfound)
                assert want is None
        learned = {}
        for key, hit in zip(row_bytes(asked), found, strict=True):
            if not hit and (width, key) not in ref:
                learned[(width, key)] = tuple(rng.getrandbits(64)
                                              for _ in range(max(width, 1)))
        memo.update(learned.items())
        ref.update(learned)
    assert len(memo) == len(ref)
    got, found = memo.find(5, _rows(rng, 5, 3))   # a width never learned
    assert not found.any() and got.shape == (3, 5)


def test_the_memo_starts_again_past_its_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LocationMemo, "MERGE_AT", 10)
    monkeypatch.setattr(LocationMemo, "MAX_ROWS", 25)
    memo = LocationMemo()
    for i in range(6):
        rows = np.arange(i * 10, i * 10 + 10, dtype=np.uint64)[:, None] * np.ones(5, np.uint64)
        memo.update([((1, k), (j,)) for j, k in enumerate(row_bytes(rows))])
        assert len(memo) <= 30
        got, found = memo.find(1, rows)
        assert found.all() and got[:, 0].tolist() == list(range(10))  # kept: the latest
