"""What an interner remembers (collector/memo.py). The sorted memo under
locations and stack ids: what was learned is found, before and after a
merge, whatever the keys share; what was not learned is never found. Its
twin in C: the same, as it grows and after it is cleared, and a buffer of
the wrong size is an error, not a read past its end. The
set of stored ids: whatever order and size ids come in, it answers as a
Python set of them would, one at a time and many at once, across the
merges of its recent ids."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ember.collector import memo as memo_module
from ember.collector.locations import mix
from ember.collector.memo import HashMemo, IdSet, SortedMemo, row_bytes, rows_memo


def rows_of(rng: random.Random, n: int, cols: int) -> np.ndarray:
    # few distinct words: rows that differ in one word only are common
    words = [0, 1, (1 << 64) - 1, rng.getrandbits(64), rng.getrandbits(64)]
    return np.array([[rng.choice(words) for _ in range(cols)] for _ in range(n)], np.uint64)


@pytest.mark.parametrize("key", ["mixed", "one word", "constant"])
def test_found_is_what_was_learned(key: str) -> None:
    """With keys that tell the rows apart, every row learned is found; with
    keys that rows share, a row may be missed (and learned again), but a
    row found always has its own values."""
    def key_of(rows: np.ndarray) -> np.ndarray:
        if key == "constant":   # every row's key meets every other's
            return np.zeros(len(rows), np.uint64)
        if key == "one word":   # (of five values: most rows share it)
            return np.ascontiguousarray(rows[:, 1])
        return mix(rows)

    rng = random.Random(7)
    memo = SortedMemo(3, 2, key_of)
    truth: dict[bytes, tuple[int, int]] = {}
    hits = 0
    for round_ in range(12):
        asked = rows_of(rng, 40, 3)
        values, found = memo.find(asked)
        for b, v, hit in zip(row_bytes(asked), values.tolist(), found.tolist(), strict=True):
            if hit:
                assert tuple(v) == truth[b]
                hits += 1
            else:
                assert v == [0, 0] and (key != "mixed" or b not in truth)
        for i in np.flatnonzero(~found)[:10].tolist():
            b = row_bytes(asked[i:i + 1])[0]
            value = truth.get(b, (rng.getrandbits(64), round_))
            memo.learn(b, value)
            truth[b] = value
        if round_ % 3 == 2:
            memo.merge()
    # (the rows come again: the checks above ran)
    assert hits > (20 if key == "mixed" else 0), hits
    if key == "mixed":
        assert len(memo) == len(truth)


def test_the_c_memo_was_built() -> None:
    """The set-up installs a compiler and Python's headers (the build is
    optional: a failure would be silent)."""
    import ember.collector._memo  # noqa: F401


@pytest.mark.parametrize("cols", [1, 3, 9])
def test_the_c_memo_answers_as_a_dict_of_the_rows_learned(cols: int) -> None:
    """Rows that differ in one word, learned in batches until the table has
    grown many times over: every row learned is found with its first
    values, no other row is found, and after ``forget`` none is."""
    rng = random.Random(cols)
    memo, truth = HashMemo(cols, 2), {}
    for _ in range(25):
        asked = rows_of(rng, 400, cols) if cols > 1 else \
            np.array([[rng.getrandbits(64)] for _ in range(400)], np.uint64)
        values, found = memo.find(asked)
        for b, v, hit in zip(row_bytes(asked), values.tolist(), found.tolist(), strict=True):
            assert hit == (b in truth) and (v == list(truth[b]) if hit else v == [0, 0])
        for b in row_bytes(asked[~found]):
            value = (rng.getrandbits(64), rng.getrandbits(64))
            memo.learn(b, value)
            truth.setdefault(b, value)
        assert len(memo) == len(truth) and memo.waiting == 0
    assert len(truth) > 2048 or cols == 3   # (past the first table: it grew)
    assert memo.nbytes >= len(truth) * (cols + 2) * 8
    memo.forget()
    assert len(memo) == 0 and not memo.find(asked)[1].any()


def test_the_c_memo_refuses_buffers_of_the_wrong_size() -> None:
    from ember.collector._memo import Table
    t = Table(3, 1, bytes(16))
    with pytest.raises(ValueError, match="rows"):
        t.add(np.zeros(4, np.uint64), np.zeros(1, np.uint64))
    with pytest.raises(ValueError, match="values"):
        t.add(np.zeros(6, np.uint64), np.zeros(1, np.uint64))
    with pytest.raises(ValueError, match="found"):
        t.find(np.zeros(6, np.uint64), np.zeros(2, np.uint64), np.zeros(3, bool))
    with pytest.raises(ValueError, match="out"):
        t.find(np.zeros(6, np.uint64), np.zeros(3, np.uint64), np.zeros(2, bool))
    with pytest.raises(ValueError, match="16-byte key"):
        Table(3, 1, b"short")
    with pytest.raises(BufferError):   # (a read-only buffer to write into)
        t.find(np.zeros(3, np.uint64), bytes(8), np.zeros(1, bool))
    assert t.add(np.arange(6, dtype=np.uint64), np.array([7, 8], np.uint64)) == 2
    assert t.add(np.arange(6, dtype=np.uint64), np.array([9, 9], np.uint64)) == 0
    out, found = np.zeros(2, np.uint64), np.zeros(2, bool)
    assert t.find(np.arange(6, dtype=np.uint64), out, found) == 2
    assert out.tolist() == [7, 8] and found.all()


def test_a_memo_is_in_c_where_it_was_built(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(rows_memo(3, 1, mix), HashMemo)
    monkeypatch.setattr(memo_module, "_memo", None)
    assert isinstance(rows_memo(3, 1, mix), SortedMemo)


def test_forget_keeps_what_waits() -> None:
    memo = SortedMemo(1, 1, lambda r: np.ascontiguousarray(r[:, 0]))
    a, b = np.array([[5]], np.uint64), np.array([[9]], np.uint64)
    memo.learn(row_bytes(a)[0], (50,))
    memo.merge()
    memo.learn(row_bytes(b)[0], (90,))
    memo.forget()
    assert memo.find(a)[1].tolist() == [False]
    assert memo.find(b)[0].tolist() == [[90]]
    memo.merge()
    assert len(memo) == 1 and memo.find(b)[0].tolist() == [[90]]


@pytest.mark.usefixtures("memo_kind")
def test_an_id_set_answers_as_a_set_of_the_same_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(IdSet, "MERGE_AT", 50)   # merge often
    rng = random.Random(9)
    ids, ref = IdSet(), set()
    first = [rng.getrandbits(64) for _ in range(300)]
    ids.add_array(np.array(first, np.uint64))
    ref.update(first)
    for _ in range(40):
        batch = [rng.getrandbits(64) for _ in range(rng.randint(0, 30))]
        batch += rng.sample(sorted(ref), 3)        # some known already
        ids.update(batch)
        ref.update(batch)
        asked = [*rng.sample(sorted(ref), 20), *(rng.getrandbits(64) for _ in range(20)),
                 0, (1 << 64) - 1]
        assert [a in ids for a in asked] == [a in ref for a in asked]
        assert ids.known(np.array(asked, np.uint64)).tolist() == [a in ref for a in asked]
        assert len(ids) == len(ref)
    assert np.uint64(first[0]) in ids and -1 not in ids and "x" not in ids and (1 << 64) not in ids
    assert ids.known(np.zeros(0, np.uint64)).tolist() == []
    assert IdSet().known(np.array([1, 2], np.uint64)).tolist() == [False, False]
