"""Sealed blocks' sums kept in memory (collector/blocksums.py): merges of
the same blocks read their roll-up rows once, and what is kept answers
exactly as the rows do after late rows reach a block, for a tree older or
newer than the kept sums, and once retention cuts the blocks."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ember.collector import leaves, merge
from ember.collector.blocksums import BlockSums, Part, add_up
from ember.collector.matchers import selector
from ember.collector.store import Store
from tests.support.profiles import write_fleet
from tests.support.store import FAR, T0, fill, seal_all

S = 10**9
INT64_MAX = (1 << 63) - 1


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db.duckdb")
    yield s
    s.close()


def sums(store: Store, upto: int | None, rolled: bool = True, lo: int = 0,
         hi: int = FAR) -> dict[int, int]:
    """A merge of every series, as {leaf: sum}: from the roll-ups (and what
    is kept of them) or from the sample rows alone."""
    real = merge.runs
    if not rolled:
        merge.runs = lambda *a: []  # type: ignore[assignment]
    try:
        agg = store.aggregate(lo, hi, selector([]), store.types()[0], by_name=True, value=1,
                              upto=upto)
    finally:
        merge.runs = real  # type: ignore[assignment]
    assert agg is not None and agg.leaf is not None
    return dict(zip(agg.leaf.tolist(), agg.sums(1).tolist(), strict=True))


def reads(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[int, int, int]]]:
    """Records the runs of blocks whose roll-up rows each merge reads."""
    seen: list[list[tuple[int, int, int]]] = []
    real = merge._blocks_part

    def counting(cur: Any, type_id: int, blocks: list[tuple[int, int, int]], *a: Any) -> Part:
        seen.append(blocks)
        return real(cur, type_id, blocks, *a)
    monkeypatch.setattr(merge, "_blocks_part", counting)
    return seen


def test_a_block_s_rollup_rows_are_read_once(store: Store,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(1)
    fill(store, rng, 40)
    seal_all(store)
    seen = reads(monkeypatch)
    first = sums(store, store.generation)
    assert len(seen) == 1 and sum((e - b) // s for s, b, e in seen[0]) >= 2
    # the same blocks again, in ranges that differ: nothing read again
    assert sums(store, store.generation, hi=FAR - 5 * S) == first
    assert sums(store, store.generation, lo=1) == first
    assert len(seen) == 1
    assert first == sums(store, store.generation, rolled=False)
    # other blocks (a range that leaves out the first): read for themselves
    sums(store, store.generation, lo=T0 + 600 * S)
    assert len(seen) == 2


def test_a_merge_of_no_one_generation_reads_the_blocks_and_keeps_nothing(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    fill(store, rng, 40)
    seal_all(store)
    write_fleet(store, rng, T0 + 400 * S, pids=(10,))    # late rows, of their own generation
    seen = reads(monkeypatch)
    assert sums(store, None) == sums(store, None, rolled=False)
    assert len(seen) == 1 and not store.block_sums._parts.items()
    assert sums(store, None) == sums(store, store.generation)   # (read again, each)
    assert len(seen) == 3 and len(store.block_sums._parts.items()) == 1


def test_late_rows_after_the_sums_were_kept_are_counted(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(2)
    fill(store, rng, 40)
    seal_all(store)
    kept_at = store.generation
    before = sums(store, kept_at)
    seen = reads(monkeypatch)
    write_fleet(store, rng, T0 + 400 * S, pids=(10, 20))   # a retry into a sealed block
    after = sums(store, store.generation)
    assert after != before
    assert after == sums(store, store.generation, rolled=False)
    assert seen, "the blocks the late rows reached are read again"
    # a tree of the generation before them still reads them as it did
    assert sums(store, kept_at) == before == sums(store, kept_at, rolled=False)


def test_a_tree_older_than_the_kept_sums_leaves_late_rows_out(store: Store) -> None:
    rng = random.Random(3)
    fill(store, rng, 40)
    seal_all(store)
    old = store.generation
    write_fleet(store, rng, T0 + 500 * S, pids=(10,))     # late, then kept with them
    new = sums(store, store.generation)
    assert new == sums(store, store.generation, rolled=False)
    assert sums(store, old) == sums(store, old, rolled=False) != new


def test_writes_outside_the_sealed_blocks_keep_them(store: Store,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(4)
    fill(store, rng, 40)
    seal_all(store)
    sums(store, store.generation)
    seen = reads(monkeypatch)
    for k in range(3):   # the live edge, not sealed: no block's sums change
        write_fleet(store, rng, FAR - (k + 1) * 10 * S)
        assert sums(store, store.generation) == sums(store, store.generation, rolled=False)
    assert seen == []


def test_retention_drops_the_kept_sums_of_what_it_deletes(store: Store) -> None:
    rng = random.Random(5)
    fill(store, rng, 40)
    seal_all(store)
    sums(store, store.generation)
    kept = [k for k, _ in store.block_sums._parts.items()]
    assert kept
    with store._writing("test"):
        store._delete_before(T0 + 900 * S)
    cut = T0 + 900 * S
    left = [k for k, _ in store.block_sums._parts.items()]
    assert all(start >= cut for k in left for _, start, _ in k[1])
    assert len(left) < len(kept)
    seal_all(store)
    assert sums(store, store.generation) == sums(store, store.generation, rolled=False)


def test_kept_sums_cannot_be_changed() -> None:
    part = Part(np.array([1, 2], np.uint32), (np.array([5, 6], np.int64),), 1)
    with pytest.raises(ValueError):
        part.sums[0][0] = 7


def test_parts_add_up_per_leaf_and_saturate() -> None:
    big = INT64_MAX - 10
    a = Part(np.array([3, 1, 7], np.uint32), (np.array([5, big, 0], np.int64),), 1)
    b = Part(np.array([1, 4], np.uint32), (np.array([big, 2], np.int64),), 1)
    leaf, (got,) = add_up([a, b, Part(np.zeros(0, np.uint32), (np.zeros(0, np.int64),), 1)], 1)
    assert leaf.tolist() == [1, 3, 4, 7]        # a leaf summed to 0 is still there
    assert got.tolist() == [INT64_MAX, 5, 2, 0]
    small = Part(np.array([2, 9], np.uint32), (np.array([4, 1], np.int64),), 1)
    leaf, (got,) = add_up([small, Part(np.array([9], np.uint32), (np.array([3], np.int64),), 1)],
                          1)
    assert dict(zip(leaf.tolist(), got.tolist(), strict=True)) == {2: 4, 9: 4}


def test_a_part_is_not_used_across_a_late_write_it_did_not_see() -> None:
    kept = BlockSums(1 << 20)
    blocks = ((300 * S, 0, 7),)
    part = Part(np.array([1], np.uint32), (np.array([1], np.int64),), 10)
    kept.put(5, blocks, ["v0"], part)
    assert kept.get(5, blocks, ["v0"], 12) is part
    kept.touched(np.array([5], np.uint64), np.array([300 * S]), np.array([0]), 12)
    assert kept.get(5, blocks, ["v0"], 11) is part       # before the late write
    assert kept.get(5, blocks, ["v0"], 12) is None
    assert kept.get(5, blocks, ["v1"], 11) is None       # other columns: not kept
    kept.put(5, blocks, ["v0"], Part(part.leaf, part.sums, 12))
    assert kept.get(5, blocks, ["v0"], 11) is None       # now it holds them: not for 11
    assert kept.get(5, blocks, ["v0"], 13) is not None


def test_rows_around_the_kept_sums_of_more_than_numpy_sums_are_grouped(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(6)
    fill(store, rng, 40)
    seal_all(store)
    sums(store, store.generation)
    for k in range(3):
        write_fleet(store, rng, FAR - (k + 1) * 10 * S)
    monkeypatch.setattr(leaves, "RAW_ROWS", 7)   # (the unsealed rows: more than that)
    assert sums(store, store.generation) == sums(store, store.generation, rolled=False)
