"""The scattered sums (collector/scatter.py): the C loops and their numpy
forms give the same answers, exact to the last unit, as Python's integers
summed one addition at a time, each saturating at the int64 limits."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ember.collector import leaves, scatter

MAX, MIN = (1 << 63) - 1, -(1 << 63)


@pytest.fixture
def backend(scatter_kind: str) -> str:
    return scatter_kind


def test_the_c_loops_were_built() -> None:
    """The set-up installs a compiler and Python's headers (the build is
    optional: a failure would be silent)."""
    import ember.collector._scatter  # noqa: F401


def reference_add_at(out: list[int], index: list[int], values: list[int]) -> None:
    for i, v in zip(index, values, strict=True):
        out[i] = min(max(out[i] + v, MIN), MAX)


@pytest.mark.parametrize("dtype", [np.uint32, np.int32, np.int64])
@pytest.mark.parametrize("scale", ["small", "extreme", "mixed"])
def test_add_at_sums_as_python_does_one_addition_at_a_time(backend: str, dtype: type,
                                                           scale: str) -> None:
    rng = np.random.default_rng(hash((str(dtype), scale)) & 0xFFFF)
    n, m = 20_000, 300
    index = rng.integers(0, m - 1, n).astype(dtype)   # (the last sum: never indexed)
    if scale == "small":
        values = rng.integers(0, 1000, n)
    elif scale == "extreme":
        values = rng.integers(1 << 60, MAX, n, dtype=np.int64)
    else:   # both signs, some past either limit, in an order the sums depend on
        values = rng.integers(MIN, MAX, n, dtype=np.int64)
    values = values.astype(np.int64)
    out = rng.integers(-50, 50, m).astype(np.int64)
    want = out.tolist()
    reference_add_at(want, index.tolist(), values.tolist())
    seen = np.zeros(m, bool)
    size = scatter.add_at(out, index, values, seen)
    assert out.tolist() == want
    assert seen.tolist() == [i in set(index.tolist()) for i in range(m)]
    # (the magnitudes' sum, capped at 2^64 - 1)
    assert size == pytest.approx(min(float(np.abs(values.astype(np.float64)).sum()), 2.0**64),
                                 rel=1e-9)
    assert (size >= 2.0**62) == (scale != "small")


def test_add_at_refuses_an_index_outside_and_writes_nothing(backend: str) -> None:
    out = np.arange(10, dtype=np.int64)
    for bad in ([3, 10], [3, -1]):
        with pytest.raises(IndexError):
            scatter.add_at(out, np.array(bad, np.int64), np.array([5, 5], np.int64))
        assert out.tolist() == list(range(10))
    with pytest.raises(ValueError, match="2 values for 3 indices"):
        scatter.add_at(out, np.array([1, 2, 3], np.int64), np.array([5, 5], np.int64))
    assert out.tolist() == list(range(10))


def test_the_c_loop_checks_its_buffers() -> None:
    from ember.collector import _scatter
    out = np.zeros(4, np.int64)
    with pytest.raises(TypeError, match="index: int32, uint32 or int64"):
        _scatter.add_at(out, np.array([1.0]), np.array([1], np.int64))
    with pytest.raises(TypeError, match="values: int64"):
        _scatter.add_at(out, np.array([1], np.int64), np.array([1], np.int32))
    with pytest.raises(TypeError, match="out: int64"):
        _scatter.add_at(np.zeros(4), np.array([1], np.int64), np.array([1], np.int64))
    with pytest.raises(ValueError):   # (read-only)
        out.flags.writeable = False
        _scatter.add_at(out, np.array([1], np.int64), np.array([1], np.int64))
    with pytest.raises(ValueError, match="seen holds 3 bytes for 4 sums"):
        _scatter.add_at(np.zeros(4, np.int64), np.array([1], np.int64), np.array([1], np.int64),
                        np.zeros(3, np.uint8))


def random_tree(rng: np.random.Generator, n: int) -> np.ndarray:
    """Parents as the index numbers them: each node's an earlier node."""
    parent = np.full(n, -1, np.int32)
    parent[1:] = [int(rng.integers(max(0, i - 40), i)) for i in range(1, n)]
    return parent


@pytest.mark.parametrize("grown", [0, 25])
def test_roll_up_gives_each_node_its_subtree_s_sum(backend: str, grown: int) -> None:
    rng = np.random.default_rng(7)
    parent = random_tree(rng, 2_000 + grown)
    own = rng.integers(0, 1 << 40, 2_000).astype(np.int64)
    own[::7] = 0
    total = own.copy()
    # (a parent array longer than the totals: the index grew since)
    scatter.roll_up(total, parent, lambda: levels_of(parent))
    want = own.tolist()
    for i in range(len(own) - 1, 0, -1):
        want[int(parent[i])] += want[i]
    assert total.tolist() == want


def test_roll_up_saturates(backend: str) -> None:
    parent = np.array([-1, 0, 1, 1, 0], np.int64)
    total = np.array([0, 5, MAX - 3, 9, MAX], np.int64)
    scatter.roll_up(total, parent, lambda: levels_of(parent))
    assert total.tolist() == [MAX, MAX, MAX - 3, 9, MAX]


@pytest.mark.parametrize("values", ["small", "periods", "periods, one not",
                                    "a leaf past 2^32 units", "a total past 2^32 units"])
def test_a_tree_s_totals_in_units_are_its_int64_totals(backend: str, values: str) -> None:
    """unit_totals gives add_at and roll_up's totals where every value is a
    multiple of the unit and every sum fits 32 bits of units, and None (the
    caller sums in int64) where not, or where the loops are not built."""
    rng = np.random.default_rng(11)
    parent = random_tree(rng, 3_000)
    period = 1 if values == "small" else 10_101_010
    leaves = rng.choice(3_000, 1_500, replace=False).astype(np.int32)
    sums = rng.integers(1, 1_000, 1_500).astype(np.int64) * period
    sums[::9] = 0
    if values == "periods, one not":
        sums[700] += 1
    elif values == "a leaf past 2^32 units":
        sums[700] = period << 32
    elif values == "a total past 2^32 units":   # (each fits; the root's sum does not)
        sums[:3] = period * ((1 << 32) - 1)
    want = np.zeros(len(parent), np.int64)
    scatter.add_at(want, leaves, sums)
    scatter.roll_up(want, parent, lambda: levels_of(parent))
    got = scatter.unit_totals(leaves, sums, parent)
    if backend == "numpy" or values not in ("small", "periods"):
        assert got is None
        return
    assert got is not None and got.dtype == np.int64
    assert got.tolist() == want.tolist()
    if values == "periods":   # (the root: past 32 bits of ns, not of periods)
        assert int(want[0]) > 1 << 32


def test_the_c_totals_in_units_check_their_buffers() -> None:
    from ember.collector import _scatter
    parent = np.array([-1, 0, 1, 1], np.int32)
    leaves, v = np.array([2, 3], np.int32), np.array([6, 9], np.int64)
    total, scratch = np.full(4, 7, np.int64), np.full(4, 5, np.uint32)
    for bad in (0, 1 << 31):
        with pytest.raises(ValueError, match=f"unit {bad}: from 1 to 2"):
            _scatter.unit_totals(total, scratch, leaves, v, parent, bad)
    with pytest.raises(ValueError, match="scratch: 4 writable uint32 items expected"):
        _scatter.unit_totals(total, scratch[:3], leaves, v, parent, 3)
    with pytest.raises(TypeError, match="leaves and parent: int32"):
        _scatter.unit_totals(total, scratch, leaves.astype(np.int64), v, parent, 3)
    with pytest.raises(ValueError, match="2 values for 1 leaves"):
        _scatter.unit_totals(total, scratch, leaves[:1], v, parent, 3)
    with pytest.raises(ValueError, match="3 parents for 4 totals"):
        _scatter.unit_totals(total, scratch, leaves, v, parent[:3], 3)
    with pytest.raises(IndexError, match=r"leaf 4 \(item 1\) is outside the 4 nodes"):
        _scatter.unit_totals(total, scratch, np.array([2, 4], np.int32), v, parent, 3)
    with pytest.raises(ValueError, match="node 2's parent \\(3\\) is not an earlier node"):
        _scatter.unit_totals(total, scratch, leaves, v, np.array([-1, 0, 3, 1], np.int32), 3)
    assert total.tolist() == [7] * 4   # (nothing written)
    # the scratch is zeroed here, whatever it held
    assert _scatter.unit_totals(total, scratch, leaves, v, parent, 3)
    assert total.tolist() == [15, 15, 6, 9]
    # not done: a value not a multiple, one past 2^32 units, a sum past 2^32 - 1
    for bad in ([6, 10], [6, 3 << 32], [3 * ((1 << 32) - 1), 3]):
        assert not _scatter.unit_totals(total, scratch, leaves, np.array(bad, np.int64),
                                        parent, 3)


def test_roll_up_refuses_a_parent_that_is_not_an_earlier_node() -> None:
    from ember.collector import _scatter
    total = np.arange(4, dtype=np.int64)
    for parent in ([-1, 0, 3, 1], [-1, 0, -1, 2], [-1, 0, 2, 2]):
        with pytest.raises(ValueError, match="is not an earlier node"):
            _scatter.roll_up(total, np.array(parent, np.int32))
        assert total.tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="3 parents for 4 totals"):
        _scatter.roll_up(total, np.array([-1, 0, 1], np.int32))


def levels_of(parent: np.ndarray) -> list[np.ndarray]:
    depth = np.zeros(len(parent), np.int64)
    for i in range(1, len(parent)):
        depth[i] = depth[parent[i]] + 1
    return [np.flatnonzero(depth == d).astype(np.int32) for d in range(int(depth.max()) + 1)]


def test_sums_by_leaf_are_the_same_in_c_and_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    leaf = rng.integers(0, 5_000, 100_000).astype(np.uint32)
    values = [rng.integers(0, 1 << 20, len(leaf)).astype(np.int64),
              rng.integers(0, 1 << 62, len(leaf)).astype(np.int64)]
    # (in parts, as a query's batches come: cut at uneven places)
    cuts = [0, 1, 40_000, 40_000, 99_999, len(leaf)]
    parts = [(leaf[a:b], [v[a:b] for v in values]) for a, b in itertools.pairwise(cuts)]
    in_c = leaves.sum_by_leaf(parts, 2)
    assert [x.tolist() for x in in_c[1]] == [x.tolist() for x in
                                             leaves.sum_by_leaf([(leaf, values)], 2)[1]]
    monkeypatch.setattr(scatter, "IN_C", False)
    in_numpy = leaves.sum_by_leaf(parts, 2)
    assert in_c[0].dtype == in_numpy[0].dtype == np.uint32
    assert in_c[0].tolist() == in_numpy[0].tolist()
    for a, b in zip(in_c[1], in_numpy[1], strict=True):
        assert a.dtype == b.dtype == np.int64
        assert a.tolist() == b.tolist()
    # no columns at all: the leaves the rows name
    assert leaves.sum_by_leaf([(leaf, [])], 0)[0].tolist() == sorted(set(leaf.tolist()))
    assert leaves.sum_by_leaf([], 2)[0].tolist() == []


@pytest.mark.parametrize("columns", [0, 1, 3])
@pytest.mark.parametrize("values", ["small", "signed", "past 32 bits", "periods",
                                    "periods, one not", "periods past 32 bits"])
def test_sums_per_index_name_every_index_a_row_names(backend: str, columns: int,
                                                     values: str) -> None:
    """Whatever the values: zeros, signs that cancel to a sum of 0, sums
    that leave 32 bits part way, multiples of a period (the C loops sum in
    32 bits while they fit, in units of the first values' common divisor
    while every value is a multiple of it, and list an index by its nonzero
    first sum, or by a mark where a value is not positive)."""
    rng = np.random.default_rng(columns)
    period = {"periods": 10_101_010, "periods, one not": 10_101_010,
              "periods past 32 bits": 1 << 30}.get(values, 1)
    lo, hi = {"small": (0, 4), "signed": (-3, 4), "past 32 bits": (0, 1 << 28)}.get(values,
                                                                                  (1, 20))
    parts = []
    for n in (3_000, 0, 500):
        ix = rng.integers(0, 2_000, n).astype(np.uint32)
        sums = [rng.integers(lo, hi, n).astype(np.int64) * period for _ in range(columns)]
        if columns and n == 3_000 and period > 1:   # (index 7: past 2^32 ns; the last, units)
            sums[0][2800:3000] = period * (1 << 25 if period == 1 << 30 else 19)
            ix[2800:3000] = 7
            if values == "periods, one not":   # (the rows from 1500 on: summed in int64)
                sums[0][1500] += 1
        if columns and n:
            sums[0][:50] = 0
            if values == "signed":   # (index 1999 cancels to 0 in the first column)
                sums[0][50:60] = [5, -5] * 5
                ix[50:60] = 1999
            if values == "past 32 bits":   # (index 7's sum passes 2^32 at row 2900)
                sums[0][2800:3000] = 1 << 25
                ix[2800:3000] = 7
        parts.append((ix, sums))
    got_ix, got = scatter.sum_per_index(parts, columns)
    want: dict[int, list[int]] = {}
    for ix, sums in parts:
        for row, at in enumerate(ix.tolist()):
            acc = want.setdefault(at, [0] * columns)
            for c in range(columns):
                acc[c] += int(sums[c][row])
    assert got_ix.dtype == np.uint32
    assert got_ix.tolist() == sorted(want)
    for c in range(columns):
        assert got[c].dtype == np.int64
        assert got[c].tolist() == [want[i][c] for i in sorted(want)]
    if values != "small" and values != "signed" and columns:
        assert want[7][0] > 1 << 32
    if values == "periods past 32 bits" and columns:
        assert want[7][0] // period > 1 << 32


def test_the_unit_is_the_first_values_common_divisor() -> None:
    assert scatter.unit(np.array([0, 20, 30, 0, 50], np.int64)) == 10
    assert scatter.unit(np.array([7] * 100 + [3], np.int64)) == 7   # (a guess: the first 64)
    assert scatter.unit(np.array([], np.int64)) == 1
    assert scatter.unit(np.array([0, 0], np.int64)) == 1
    assert scatter.unit(np.array([20, -10], np.int64)) == 1
    assert scatter.unit(np.array([1 << 31, 1 << 32], np.int64)) == 1   # (past UNIT_MAX)
    assert scatter.unit(np.array([(1 << 31) - 1], np.int64)) == (1 << 31) - 1


def test_the_c_sums_per_index_check_their_buffers() -> None:
    from ember.collector import _scatter
    acc, marks = np.zeros(4, np.int64), np.zeros(4, np.uint8)
    ix, v = np.array([1, 3], np.uint32), np.array([2, 2], np.int64)
    with pytest.raises(IndexError, match=r"index 4 \(item 1\) is outside the 4 sums"):
        _scatter.sum_rows(acc, np.array([1, 4], np.uint32), v, marks)
    with pytest.raises(ValueError, match="sums and values: both or neither"):
        _scatter.sum_rows(acc, ix, None, marks)
    with pytest.raises(ValueError, match="3 sums for 4 marks"):
        _scatter.sum_rows(np.zeros(3, np.int64), ix, v, marks)
    with pytest.raises(ValueError, match="1 values for 2 indices"):
        _scatter.sum_rows(acc, ix, v[:1], marks)
    with pytest.raises(TypeError, match="sums: int64 items expected"):
        _scatter.sum_rows(acc.astype(np.uint32), ix, v, marks)
    assert acc.tolist() == [0, 0, 0, 0] and not marks.any()   # (nothing written)
    _scatter.sum_rows(acc, ix, v, marks)
    assert acc.tolist() == [0, 2, 0, 2] and not marks.any()   # (marked only where <= 0)
    _scatter.sum_rows(None, np.array([2], np.uint32), None, marks)
    assert marks.tolist() == [0, 0, 1, 0]
    marks[:] = 0
    with pytest.raises(ValueError, match="out holds 1 items for 2 present"):
        _scatter.present(acc, marks, np.zeros(1, np.uint32))
    with pytest.raises(TypeError, match="out: writable uint32"):
        _scatter.present(acc, marks, np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="first holds 4 sums for 3 marks"):
        _scatter.present(acc, marks[:3])
    out = np.zeros(_scatter.present(acc, marks), np.uint32)
    _scatter.present(acc, marks, out)
    assert out.tolist() == [1, 3]
    # the first sums at the indices, times a unit (uint32 sums only)
    sums = np.zeros(2, np.int64)
    with pytest.raises(ValueError, match="sums: only with first and out"):
        _scatter.present(acc, marks, None, sums)
    with pytest.raises(ValueError, match="sums holds 1 items for 2 present"):
        _scatter.present(acc, marks, out, sums[:1])
    with pytest.raises(ValueError, match=r"unit 3: from 1 to 1 \(int64 sums\)"):
        _scatter.present(acc, marks, out, sums, 3)
    _scatter.present(acc, marks, out, sums)
    assert sums.tolist() == [2, 2]
    units = np.array([0, (1 << 32) - 1, 0, 5], np.uint32)
    _scatter.present(units, marks, out, sums, (1 << 31) - 1)
    assert out.tolist() == [1, 3]
    assert sums.tolist() == [((1 << 32) - 1) * ((1 << 31) - 1), 5 * ((1 << 31) - 1)]
    narrow = np.zeros(4, np.uint32)
    with pytest.raises(TypeError, match="sums: writable uint32"):
        _scatter.sum_narrow(acc, ix, v, marks)
    with pytest.raises(IndexError, match=r"index 4 \(item 1\) is outside the 4 sums"):
        _scatter.sum_narrow(narrow, np.array([1, 4], np.uint32), v, marks)
    with pytest.raises(ValueError, match="2 values for 3 indices"):
        _scatter.sum_narrow(narrow, np.array([1, 2, 3], np.uint32), v, marks)
    for bad in (0, -3, 1 << 31):
        with pytest.raises(ValueError, match=f"unit {bad}: from 1 to 2"):
            _scatter.sum_narrow(narrow, ix, v, marks, bad)
    # summed up to the first value outside [0, 2^32) or sum past 2^32 - 1
    big = np.array([5, 0, (1 << 32) - 6, 1, 7], np.int64)
    assert _scatter.sum_narrow(narrow, np.array([2, 0, 2, 2, 1], np.uint32), big, None) == 3
    assert narrow.tolist() == [0, 0, (1 << 32) - 1, 0]
    assert _scatter.sum_narrow(narrow, np.array([1, 1], np.uint32),
                               np.array([3, -1], np.int64), marks) == 1
    assert narrow.tolist() == [0, 3, (1 << 32) - 1, 0]
    # in units: up to the first value that is not a multiple of the unit
    narrow[:] = 0
    assert _scatter.sum_narrow(narrow, np.array([1, 1, 3, 2], np.uint32),
                               np.array([6, 9, 0, 4], np.int64), marks, 3) == 3
    assert narrow.tolist() == [0, 5, 0, 0] and marks[3] == 1


def reference_tree(n: int, parent: np.ndarray, node: list[int], values: list[int]
                   ) -> tuple[list[int], list[int]]:
    """(totals, own values) of rows at nodes, summed one addition at a time."""
    own = [0] * n
    for at, v in zip(node, values, strict=True):
        own[at] += v
    total = list(own)
    for i in range(n - 1, 0, -1):
        total[int(parent[i])] += total[i]
    return total, own


def random_parents(rng: np.random.Generator, n: int) -> np.ndarray:
    parent = np.zeros(n, np.int32)
    parent[0] = -1
    parent[1:] = (rng.random(n - 1) * np.arange(1, n)).astype(np.int32)
    return parent


@pytest.mark.parametrize("values", ["small", "periods", "periods, one not", "past 32 bits",
                                    "a total past 32 bits", "signed"])
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_summed_straight_into_a_tree_s_nodes(values: str, threads: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """slot_totals: each row at its leaf's node, then rolled up, is what
    adding the rows one at a time gives, in parts, whatever the values
    (in 32-bit units while they fit, in int64 from where they do not); its
    own values, kept where they were 32-bit, are each node's own. In one
    thread, or two (from SPLIT_ROWS rows: what two threads cannot sum in
    32 bits is summed again in one)."""
    monkeypatch.setattr(scatter, "SPLIT_ROWS", 1 if threads == 2 else 1 << 40)
    split = []
    real = scatter._in_two
    monkeypatch.setattr(scatter, "_in_two", lambda *a: split.append(real(*a)) or split[-1])
    rng = np.random.default_rng(len(values))
    n, leaves_n = 3_000, 2_000
    parent = random_parents(rng, n)
    by_leaf = rng.permutation(np.arange(n - leaves_n, n)).astype(np.int32)
    period = 10_000_000 if values.startswith("periods") else 1
    lo, hi = {"signed": (-3, 4), "past 32 bits": (1 << 30, 1 << 33),
              "a total past 32 bits": (1 << 20, 1 << 21)}.get(values, (0, 20))
    parts = []
    for rows in (4_000, 0, 1, 2_500):
        leaf = rng.integers(0, leaves_n, rows).astype(np.uint32)
        parts.append((leaf, rng.integers(lo, hi, rows).astype(np.int64) * period))
    if values == "periods, one not":
        parts[3][1][100] += 1
    got = scatter.slot_totals(parts, (by_leaf, parent), lambda ids: pytest.fail("learned"))
    assert got is not None
    node = [int(by_leaf[i]) for p, _ in parts for i in p.tolist()]
    total, own = reference_tree(n, parent, node, [int(v) for _, p in parts for v in p.tolist()])
    assert got.total.dtype == np.int64 and got.total.tolist() == total
    thirty_two = values in ("small", "periods", "a total past 32 bits")
    assert (got.own is not None) == thirty_two, "own values kept where they were in units"
    if got.own is not None:
        assert got.unit == period
        assert (got.own.astype(np.int64) * got.unit).tolist() == own
    # (two threads summed every row where the sums stayed 32-bit, the total too)
    assert (split[0] is not None) == (threads == 2 and values in ("small", "periods"))


def test_rows_are_summed_in_one_thread_while_another_merge_has_the_helper(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scatter, "SPLIT_ROWS", 1)
    rng = np.random.default_rng(9)
    parent = random_parents(rng, 100)
    slots = (np.arange(100, dtype=np.int32), parent)
    parts = [(rng.integers(0, 100, 50).astype(np.uint32), np.ones(50, np.int64))
             for _ in range(4)]
    alone = scatter.slot_totals(parts, slots, lambda ids: pytest.fail())
    acc = np.zeros(100, np.uint32)
    other = np.full(100, 7, np.uint32)   # (the helper's array is zeroed before it sums)
    assert scatter._in_two(parts, slots[0], 1, acc, other) == 200
    with scatter._helper_free:   # (another merge's)
        assert scatter._in_two(parts, slots[0], 1, np.zeros(100, np.uint32), other) is None
        busy = scatter.slot_totals(parts, slots, lambda ids: pytest.fail())
    assert alone is not None and busy is not None
    assert alone.total.tolist() == busy.total.tolist()
    assert (acc.astype(np.int64) == alone.own).all()


def test_rows_of_leaves_without_a_node_are_learned_and_summed() -> None:
    """Leaves the index has no node for yet (-1, or past the slots) are
    given theirs by ``learn``, once, with the ids of every such leaf left
    in the rows, and the sum goes on; a leaf ``learn`` leaves without one
    gives None, as does a total that could saturate, or no C loops."""
    rng = np.random.default_rng(5)
    parent = random_parents(rng, 50)
    full = np.arange(10, 50, dtype=np.int32)   # leaf i -> node 10 + i
    known = full[:30].copy()
    known[[3, 7]] = -1   # (leaves 3 and 7, and 30 on, not yet)
    leaf = rng.integers(0, 40, 5_000).astype(np.uint32)
    values = rng.integers(1, 9, 5_000).astype(np.int64)
    parts = [(leaf[:2_000], values[:2_000]), (leaf[2_000:], values[2_000:])]
    asked: list[list[int]] = []

    def learn(ids: np.ndarray) -> scatter.Slots:
        asked.append(ids.tolist())
        return full, np.concatenate([parent, random_parents(rng, 3)[1:] * 0])

    first = next(i for i, x in enumerate(leaf.tolist()) if x in (3, 7) or x >= 30)
    got = scatter.slot_totals(parts, (known, parent[:40]), learn)
    assert got is not None
    assert len(asked) == 1
    assert asked[0] == sorted({x for x in leaf[first:].tolist() if x in (3, 7) or x >= 30})
    total, own = reference_tree(52, np.concatenate([parent, [0, 0]]),
                                [10 + x for x in leaf.tolist()], values.tolist())
    assert got.total.tolist() == total   # (the slots' parents, grown by learn)
    assert got.own is not None and got.own.tolist() == own
    # learn leaves one without a node: None
    assert scatter.slot_totals(parts, (known, parent), lambda ids: (known, parent)) is None
    # sums that could pass 2^62: None (Tree.build keeps the own values then)
    huge = [(leaf[:3], np.full(3, 1 << 61, np.int64))]
    assert scatter.slot_totals(huge, (full, parent), learn) is None
    # not the index's int32 arrays: None
    assert scatter.slot_totals(parts, (full.astype(np.int64), parent), learn) is None


def test_rows_into_nodes_not_built_give_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scatter, "_scatter", None)
    parent = np.array([-1, 0], np.int32)
    assert scatter.slot_totals([(np.zeros(1, np.uint32), np.ones(1, np.int64))],
                               (np.array([1], np.int32), parent), lambda ids: pytest.fail()) \
        is None


def test_the_c_rows_into_nodes_check_their_buffers() -> None:
    from ember.collector import _scatter
    slots = np.array([1, 2, -1, 9], np.int32)
    leaf, v = np.array([0, 1, 0], np.uint32), np.array([3, 6, 9], np.int64)
    acc = np.zeros(3, np.uint32)
    with pytest.raises(TypeError, match="sums: writable uint32 or int64"):
        _scatter.slot_sums(acc.astype(np.int32), leaf, v, slots)
    with pytest.raises(ValueError, match="unit 3: int64 sums are in units of 1"):
        _scatter.slot_sums(np.zeros(3, np.int64), leaf, v, slots, 3)
    with pytest.raises(TypeError, match="leaves: uint32 and slots: int32"):
        _scatter.slot_sums(acc, leaf.astype(np.int64), v, slots)
    with pytest.raises(TypeError, match="leaves: uint32 and slots: int32"):
        _scatter.slot_sums(acc, leaf, v, slots.astype(np.uint32))
    with pytest.raises(ValueError, match="2 values for 3 leaves"):
        _scatter.slot_sums(acc, leaf, v[:2], slots)
    with pytest.raises(ValueError, match="unit 0: from 1 to 2"):
        _scatter.slot_sums(acc, leaf, v, slots, 0)
    assert _scatter.slot_sums(acc, leaf, v, slots, 3) == (3, 6)   # (in units of 3)
    assert acc.tolist() == [0, 4, 2]
    # it stops at a leaf with no node among the sums: -1, past them, past the slots
    for bad in (2, 3, 4):
        assert _scatter.slot_sums(acc, np.array([1, bad, 0], np.uint32), v, slots) == (1, 3)
    # in 32 bits: at a value not a multiple of the unit, or a sum past 2^32 - 1
    assert _scatter.slot_sums(acc, leaf, np.array([3, 7, 3], np.int64), slots, 3)[0] == 1
    full = np.array([0, (1 << 32) - 1, 0], np.uint32)
    assert _scatter.slot_sums(full, leaf, np.array([0, 1, 1], np.int64), slots)[0] == 2
    wide = np.zeros(3, np.int64)   # (int64: saturating; the magnitudes' sum too)
    rows = np.array([-5, 1 << 62, (1 << 63) - 1], np.int64)
    assert _scatter.slot_sums(wide, leaf, rows, slots) == (3, 5 + (1 << 62) + (1 << 63) - 1)
    assert wide.tolist() == [0, (1 << 63) - 6, 1 << 62]
    assert _scatter.slot_sums(wide, leaf[:1], np.array([9], np.int64), slots) == (1, 9)
    assert wide.tolist() == [0, (1 << 63) - 1, 1 << 62]   # (saturated)
    assert _scatter.slot_sums(wide, leaf, np.full(3, (1 << 63) - 1, np.int64), slots) == \
        (3, (1 << 64) - 1)
    # the roll-up of own sums in units, which stay as they are
    parent = np.array([-1, 0, 1], np.int32)
    own, scratch, total = np.array([1, 2, 3], np.uint32), np.full(3, 7, np.uint32), \
        np.zeros(3, np.int64)
    assert _scatter.unit_roll_up(total, own, scratch, parent, 5)
    assert total.tolist() == [30, 25, 15] and own.tolist() == [1, 2, 3]
    assert not _scatter.unit_roll_up(total, np.array([1, 2, (1 << 32) - 1], np.uint32),
                                     scratch, parent, 5)
    with pytest.raises(ValueError, match=r"node 2's parent \(2\) is not an earlier node"):
        _scatter.unit_roll_up(total, own, scratch, np.array([-1, 0, 2], np.int32), 1)
    with pytest.raises(ValueError, match="node 1's parent"):
        _scatter.unit_roll_up(total, own, scratch, np.array([-1, -1, 0], np.int32), 1)
    with pytest.raises(ValueError, match="own: 3 uint32 items expected"):
        _scatter.unit_roll_up(total, own[:2], scratch, parent, 1)
    with pytest.raises(ValueError, match="scratch: 3 writable uint32 items expected"):
        _scatter.unit_roll_up(total, own, scratch.astype(np.int64), parent, 1)
    with pytest.raises(TypeError, match="parent: int32 items expected"):
        _scatter.unit_roll_up(total, own, scratch, parent.astype(np.int64), 1)
    with pytest.raises(ValueError, match="2 parents for 3 totals"):
        _scatter.unit_roll_up(total, own, scratch, parent[:2], 1)
