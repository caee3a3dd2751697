"""Sums scattered by index: rows into their leaves, leaves into their
nodes, and each node into its parent, exact in int64.

One host's hour is 1.25 million rows into 527,000 leaves of a tree of
800,000 nodes. In numpy these sums took about half of that answer: rows
per leaf by ``bincount`` (in float64, exact only below 2^53, so a column
went through it in 32-bit halves), leaves into nodes by ``add.at``, and
the totals by one ``add.at`` a level. Where the install built it, the C
module (_scatter.c) does each in one loop, without holding the GIL; the
numpy forms below give the same answers where it is not built.

Every sum saturates at the int64 limits, as the store's own sums are
capped at 2^63 - 1.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

_scatter: ModuleType | None
try:   # the loops in C (_scatter.c), built by the install where it can be
    from . import _scatter
except ImportError:   # pragma: no cover  (an install without a compiler)
    _scatter = None
#: Whether the loops run in C (numpy's own sums are faster than the
#: fallbacks here where a caller has an exact one, as leaves.sum_by_leaf does).
IN_C = _scatter is not None

I64 = npt.NDArray[np.int64]
Nodes = npt.NDArray[np.int32]
_MAX, _MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def add_at(out: I64, index: npt.NDArray[Any], values: I64,
           seen: npt.NDArray[np.bool_] | None = None) -> float:
    """``out[index[i]] += values[i]`` for every i, saturating (``seen``, if
    given, marks each index too); an IndexError, with nothing written,
    for an index outside ``out``. Returns the sum of the values' magnitudes
    as a float, capped at 2^64 (whether any sum could have saturated)."""
    if _scatter is not None:
        return float(_scatter.add_at(out, _ints(index), np.ascontiguousarray(values, np.int64),
                                     None if seen is None else seen.view(np.uint8)))
    idx = np.asarray(index, np.int64)
    v = np.asarray(values, np.int64)
    if len(v) != len(idx):
        raise ValueError(f"{len(v)} values for {len(idx)} indices")
    if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= len(out)):
        raise IndexError(f"an index is outside the {len(out)} sums")
    if seen is not None:
        seen[idx] = True
    size = min(float(np.abs(v.astype(np.float64)).sum()), 2.0**64)
    if float(np.abs(out.astype(np.float64)).max(initial=0)) + size < 2.0**62:
        np.add.at(out, idx, v)   # (no sum can leave int64)
    else:   # (rare) each addition saturating in turn, as the C loop does
        for at, value in zip(idx.tolist(), v.tolist(), strict=True):
            out[at] = min(max(int(out[at]) + value, _MIN), _MAX)
    return size


def zeroed(n: int, dtype: type[np.generic]) -> npt.NDArray[Any]:
    """``np.zeros``, its memory written now: calloc leaves fresh pages
    unwritten, and the scattered sums then read each one (the zero page
    mapped) and write it (a copy mapped): two page faults a page, at about
    3 us each on this machine, where a fill takes one in order. One host's
    sums in a warm-up answer faulted 1,498 times a thread: 15-21 ms of CPU
    for 5-7 ms of sums. The sums per leaf too: their first call on one
    host's rows faulted 2,051-2,246 times, 1,499 this way."""
    out = np.empty(n, dtype)
    out.fill(0)
    return out


def sum_per_index(parts: Sequence[tuple[npt.NDArray[np.uint32], Sequence[I64]]], columns: int
                  ) -> tuple[npt.NDArray[np.uint32], list[I64]]:
    """Several (indices, a values array per column) summed per index: the
    indices any part names (ascending), and each column's sums at them
    (``add_at``'s: exact, saturating)."""
    live = [(ix, sums) for ix, sums in parts if len(ix)]
    if not live:
        return np.zeros(0, np.uint32), [np.zeros(0, np.int64) for _ in range(columns)]
    top = max(int(ix.max()) for ix, _ in live) + 1
    if _scatter is not None:
        return _sum_per_index_c(_scatter, live, columns, top)
    accs = [np.zeros(top, np.int64) for _ in range(columns)]
    seen = np.zeros(top, bool)
    for ix, sums in live:
        if not columns:
            seen[ix] = True
        for c, acc in enumerate(accs):   # (the first column's loop marks the indices)
            add_at(acc, ix, sums[c], seen if c == 0 else None)
    present = np.flatnonzero(seen)
    return present.astype(np.uint32), [acc[present] for acc in accs]


def _sum_per_index_c(c_loops: ModuleType,
                     live: list[tuple[npt.NDArray[np.uint32], Sequence[I64]]], columns: int,
                     top: int) -> tuple[npt.NDArray[np.uint32], list[I64]]:
    """sum_per_index in C: each column summed in 32 bits while its values
    and sums fit (one host's hour: the sums in half the memory took half
    the time), then in int64 from the row where they no longer do. Values
    are summed in units of the first values' greatest common divisor
    (``unit``): on-CPU time is a count of sampling periods in nanoseconds,
    and one host's hour of it passes 2^32 ns in its first 4% of rows, but
    not 2^32 periods. An index is marked only where a value is not
    positive; elsewhere its nonzero first sum names it (a mark for every
    row, a second scattered write, took as long as the sum)."""
    marks = np.zeros(top, np.uint8)
    accs: list[npt.NDArray[Any]] = []
    units: list[int] = []
    for c in range(columns):
        acc: npt.NDArray[Any] = zeroed(top, np.uint32)
        g = unit(live[0][1][c])
        for ix, sums in live:
            index, values = _ints(ix), np.ascontiguousarray(sums[c], np.int64)
            if acc.dtype == np.uint32:
                done = c_loops.sum_narrow(acc, index, values, marks, g)
                if done == len(index):
                    continue
                acc = acc.astype(np.int64)
                acc *= g   # (below 2^63: g < 2^31)
                g = 1
                index, values = index[done:], values[done:]
            c_loops.sum_rows(acc, index, values, marks)
        accs.append(acc)
        units.append(g)
    if not columns:
        for ix, _ in live:
            c_loops.sum_rows(None, _ints(ix), None, marks)
    first = accs[0] if columns else None
    k = c_loops.present(first, marks)
    present = np.empty(k, np.uint32)
    out = [np.empty(k, np.int64)] if columns else []
    # (the first column's sums, times its unit, written as the indices are)
    c_loops.present(first, marks, present, *[*out, *units[:1]])
    for acc, g in zip(accs[1:], units[1:], strict=True):
        col = np.asarray(acc[present], np.int64)
        out.append(col * g if g != 1 else col)
    return present, out


#: The values a unit is found from, and the largest unit (32-bit sums of
#: units stay below 2^63 as int64).
UNIT_FROM, UNIT_MAX = 64, (1 << 31) - 1


def unit(values: npt.NDArray[Any]) -> int:
    """The greatest common divisor of the first ``UNIT_FROM`` nonzero
    values, or 1 (none, a negative one, or one past ``UNIT_MAX``): a guess,
    which sum_narrow checks of every row."""
    head = np.asarray(values[:UNIT_FROM], np.int64)
    head = head[head != 0]
    if not len(head) or int(head.min()) < 0:
        return 1
    g = int(np.gcd.reduce(head))
    return g if g <= UNIT_MAX else 1


def unit_totals(leaves: Nodes, values: I64, parent: npt.NDArray[Any]) -> I64 | None:
    """A tree's totals, as ``add_at`` of the leaves' values at their nodes
    and ``roll_up`` give them (one per node of ``parent``), summed in C in
    32 bits, in units of the values' common divisor (``unit``); None where
    the loops are not built, the arrays are not the index's int32, or a
    value or sum does not fit (the caller sums in int64). Half the memory
    of int64 sums, for writes that land at random: one host's hour, 527,000
    leaves into 800,000 nodes, and their roll-up."""
    if _scatter is None or leaves.dtype != np.int32 or parent.dtype != np.int32:
        return None
    g = unit(values)
    # (the root's total, where values are not negative: every other sum is
    # at most that; off-CPU nanoseconds pass 2^32 in 4.3 s, found here and
    # not at the end of the roll-up. The loops check each sum all the same.)
    if float(values.sum(dtype=np.float64)) >= g * 2.0**32:
        return None
    total = np.empty(len(parent), np.int64)
    scratch = np.empty(len(parent), np.uint32)
    done = _scatter.unit_totals(total, scratch, np.ascontiguousarray(leaves),
                                np.ascontiguousarray(values, np.int64),
                                np.ascontiguousarray(parent), g)
    return total if done else None


#: The node of each leaf id (-1: none yet), and the parent of each node.
Slots = tuple[Nodes, Nodes]


class SlotTotals(NamedTuple):
    """A tree's totals, and each node's own value where every one was
    summed in 32 bits: ``own`` in units of ``unit`` (else None)."""
    total: I64
    own: npt.NDArray[np.uint32] | None
    unit: int


def slot_totals(parts: Sequence[tuple[npt.NDArray[np.uint32], I64]], slots: Slots,
                learn: Callable[[npt.NDArray[np.uint32]], Slots]) -> SlotTotals | None:
    """A tree's totals (one per node of ``slots``' parents) from a query's
    rows as read, in parts (leaf ids, values): each row's value added at
    its leaf's node (``slots``), then each node's total into its parent's.
    No sums per leaf between: one host's hour is 1.25 million rows into
    527,000 leaves, and summing them per leaf (in 32 bits), listing the
    leaves, gathering their nodes and adding the leaves into them took
    14-21 ms at the median where this takes 10-15. In 32 bits and units
    of the values' common divisor (``unit``) while the values and sums fit,
    from there on in int64. Leaves with no node yet are given theirs by
    ``learn`` (their ids; it returns the slots and parents then), and the
    pass goes on. None where the loops are not built, the arrays are not
    the index's int32, a total could saturate (the caller keeps the own
    values then: Tree.build), or ``learn`` left a leaf without a node."""
    if _scatter is None or any(a.dtype != np.int32 for a in slots):
        return None
    live = [(np.ascontiguousarray(ix, np.uint32), np.ascontiguousarray(v, np.int64))
            for ix, v in parts if len(ix)]
    g = unit(live[0][1]) if live else 1
    acc: npt.NDArray[Any] = zeroed(len(slots[1]), np.uint32)
    # (the helper's sums, then the roll-up's)
    scratch = np.empty(len(acc), np.uint32)
    # of the values' magnitudes (in units while the sums are 32-bit)
    size = _in_two(live, slots[0], g, acc, scratch)
    if size is not None:   # (every row summed)
        live = []
    size = size or 0
    for k, (ix, values) in enumerate(live):
        while True:
            done, got = _scatter.slot_sums(acc, ix, values, slots[0], g)
            size += got
            if done == len(ix):
                break
            ix, values = ix[done:], values[done:]
            if not _has_slot(slots, int(ix[0]), len(acc)):   # learned, and on from there
                rest = np.concatenate([ix, *(later for later, _ in live[k + 1:])])
                slots = learn(np.unique(rest[~_have_slots(slots, rest, len(acc))]))
                if not _has_slot(slots, int(ix[0]), len(slots[1])):
                    return None
                acc = np.concatenate([acc, np.zeros(len(slots[1]) - len(acc), acc.dtype)])
                scratch = np.empty(len(acc), np.uint32)
            elif acc.dtype == np.uint32:   # a value or sum past 32 bits
                acc = acc.astype(np.int64) * g
                size, g = size * g, 1
    if size * g >= 2**62:
        return None
    # (each node's own sum stays where it is in units: a view's own values
    # are then a lookup)
    own = acc if acc.dtype == np.uint32 else None
    if own is not None and size < 1 << 32:
        total = np.empty(len(acc), np.int64)
        if _scatter.unit_roll_up(total, own, scratch, slots[1], g):
            return SlotTotals(total, own, g)
    total = acc.astype(np.int64) * g if own is not None else acc
    _scatter.roll_up(total, slots[1])
    return SlotTotals(total, own, g if own is not None else 1)


#: Rows from which ``slot_totals`` sums in two threads (DuckDB's read,
#: before it, used both cores; the sums, alone, one).
SPLIT_ROWS = 1 << 18
_helper: list[ThreadPoolExecutor] = []   # (made by the first merge that asks)
_helper_free = threading.Lock()   # held by the merge whose rows the helper sums


def _in_two(live: list[tuple[npt.NDArray[np.uint32], I64]], by_leaf: Nodes, g: int,
            acc: npt.NDArray[np.uint32], other: npt.NDArray[np.uint32]) -> int | None:
    """``live``'s rows summed into ``acc`` (zeroed, uint32, in units of
    ``g``) by two threads, the later parts into ``other`` (as long; zeroed
    here) added in after. One host's hour, its tree built in turns in one
    process: 10.9 ms at the median against 16.1 in one thread; its answer,
    2-3 ms sooner.
    Returns the size (as slot_sums counts it), or None where it did not
    sum every row (too few to be worth it, another merge has the helper
    thread (8 clients: none queues behind one), a leaf with no node, a
    value or sum past 32 bits: the caller sums them in one thread, as they
    come; ``acc`` is then zero)."""
    loops, rows = _scatter, sum(len(ix) for ix, _ in live)
    if loops is None or rows < SPLIT_ROWS or len(live) < 2:
        return None

    def run(parts: list[tuple[npt.NDArray[np.uint32], I64]],
            into: npt.NDArray[np.uint32]) -> int | None:
        size = 0
        for ix, values in parts:
            done, got = loops.slot_sums(into, ix, values, by_leaf, g)
            if done < len(ix):
                return None
            size += got
        return size

    if not _helper_free.acquire(blocking=False):
        return None
    try:
        if not _helper:
            _helper.append(ThreadPoolExecutor(1, thread_name_prefix="ember-sums"))
        half = int(np.searchsorted(np.cumsum([len(ix) for ix, _ in live]), rows // 2)) + 1
        other.fill(0)
        theirs = _helper[0].submit(run, live[half:], other)
        mine = run(live[:half], acc)
        size = theirs.result()
    finally:
        _helper_free.release()
    if mine is None or size is None or mine + size >= 1 << 32:
        acc[:] = 0
        return None
    np.add(acc, other, out=acc)   # (no sum passes 2^32 - 1: their sizes' sum does not)
    return mine + size


def _have_slots(slots: Slots, leaf: npt.NDArray[np.uint32], nodes: int) -> npt.NDArray[np.bool_]:
    """Whether each leaf id has a node below ``nodes``."""
    by_leaf = slots[0]
    inside = leaf < len(by_leaf)
    node = by_leaf[leaf[inside]]
    inside[inside] = (node >= 0) & (node < nodes)
    return inside


def _has_slot(slots: Slots, leaf: int, nodes: int) -> bool:
    return bool(_have_slots(slots, np.array([leaf], np.uint32), nodes)[0])


def roll_up(total: I64, parent: npt.NDArray[Any], levels: Callable[[], Sequence[Nodes]]
            ) -> None:
    """Each node's total added into its parent's, from the last node up,
    where every node's parent is an earlier node (as the index numbers
    them; index_file checks it of a stored index): each total becomes its
    own value and its descendants'. ``parent`` may be longer than
    ``total`` (the index grew since the tree was made). The numpy form
    goes a level at a time (``levels``: node indices by depth)."""
    if _scatter is not None:
        _scatter.roll_up(total, _ints(parent))
        return
    n = len(total)
    for level in reversed(levels()[1:]):
        level = level[level < n]
        add_at(total, np.asarray(parent)[level], total[level])


def ranges(first: npt.NDArray[Any], count: npt.NDArray[Any]) -> I64:
    """The indices first[i], ..., first[i] + count[i] - 1, for each i in turn."""
    total = int(count.sum())
    return np.repeat(first - (np.cumsum(count) - count), count) + np.arange(total)


def _ints(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    if a.dtype in (np.uint32, np.int32, np.int64):
        return np.ascontiguousarray(a)
    return np.ascontiguousarray(a, np.int64)
