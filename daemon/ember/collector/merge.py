"""The one merge every view starts from: the samples of a type, range and
set of series summed per (thread, stack), or per (thread name, stack).

Three ways to the same sums, chosen by what is asked:

- a few of the series (a quarter or less, one host say), or the edges a
  window slides by (window.py): the rows are read and summed here
  (leaves.raw_sums), faster than DuckDB groups them; or, for a tree,
  handed over as read, for it to sum into its nodes (``raw``);
- every series of a type: the sealed blocks inside the range (the longest
  that fit) are read from their roll-ups, the rest from the rows
  (rollup.py); a merge of one generation keeps the blocks' sums in
  memory for the next of the same blocks (blocksums.py);
- otherwise DuckDB groups the rows.

Each runs in one read transaction, so what it reads (the profiles counted,
the seals, the rows) is one state of the store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import numpy.typing as npt

from ..errors import StorageError
from ..httpserve import check_cancelled, on_cancel
from ..model import ProfileType
from .blocksums import Part, add_up
from .leaves import grouped, raw_rows, raw_sums
from .matchers import Matchers
from .results import columns
from .rollup import Block, capped_sum, runs
from .rows import Aggregate, Unsummed, shape_json
from .rows import Part as RowPart

if TYPE_CHECKING:
    from .store import Store

_PROFILES = "SELECT {} FROM profiles WHERE time_ns < ? AND time_ns + duration_ns >= ? " \
    "AND type_id = ?"


@dataclass(frozen=True)
class Where:
    """Which sample rows a merge reads: ``clause`` with its ``args``, and
    ``series``, the part of the clause that names the series ('' when they
    are all of them; its arguments are the last of ``args``), for the
    queries of ``profiles`` to say the same."""
    clause: str
    args: list[Any]
    series: str


#: Series named as constants at most this many. DuckDB filters a list of
#: constants in its scan, and its per-row-group minimum and maximum skip
#: the row groups of other series (cluster.py): one host's hour read in 29
#: ms, not 57 as a list parameter, which it joins. But it parses a long
#: list slowly (10,000: 260 ms); past this, the list is a parameter, with
#: the range of its numbers as constants for the skipping.
INLINE_SERIES = 256


def in_series(series: Sequence[int]) -> tuple[str, list[Any]]:
    """SQL naming the series (`` AND series IN (3, 4, ...)``), and its arguments."""
    if len(series) <= INLINE_SERIES:
        return f" AND series IN ({', '.join(str(int(s)) for s in series)})", []
    return (f" AND series BETWEEN {int(min(series))} AND {int(max(series))} "
            "AND series IN (SELECT unnest(?::UINTEGER[]))", [list(series)])


def where(store: Store, start_ns: int, end_ns: int, series: Sequence[int],
          type_: str | None) -> Where | None:
    """The rows of samples in a range, of some series (numbers) and a type
    (None: no row can match). The series are named only when they are not
    all of them."""
    if not series:
        return None
    clause = "time_ns < ? AND end_ns >= ?"
    args: list[Any] = [end_ns, start_ns]
    if type_ is not None:
        tid = store.type_id(type_)
        if tid is None:
            return None
        clause += " AND type = ?"
        args.append(tid)
    named, named_args = in_series(series) if len(series) < store.series_count() else ("", [])
    return Where(clause + named, args + named_args, named)


def aggregate(store: Store, start_ns: int, end_ns: int, matchers: Matchers, type_: str,
              by_name: bool = False, value: int | None = None, upto: int | None = None,
              gained: tuple[int, int] | None = None,
              ended_before: int | None = None, raw: bool = False) -> Aggregate | None:
    """Store.aggregate (its docstring says what each argument narrows)."""
    shapes = store.shapes(type_)
    matched = store.series_matching(matchers)
    found = where(store, start_ns, end_ns, matched, type_)
    if found is None or not shapes:
        return None
    with store.reading() as cur:
        return _aggregate(cur, store, (start_ns, end_ns), found, matched, shapes,
                          by_name, value, upto, gained, ended_before, raw)


def _aggregate(cur: duckdb.DuckDBPyConnection, store: Store, span: tuple[int, int],
               found: Where, matched: list[int], shapes: list[ProfileType],
               by_name: bool, value: int | None, upto: int | None,
               gained: tuple[int, int] | None, ended_before: int | None,
               raw: bool) -> Aggregate | None:
    start_ns, end_ns = span
    clause, args = found.clause, found.args
    every_series = not found.series
    shape = shapes[0]
    n = len(shape.sample_types)
    skipped: dict[str, int] = {}
    summed = [f"v{i}" for i in range(n) if value in (None, i)]
    committed = False
    try:
        cur.execute("BEGIN TRANSACTION")
        # (fetchall: a result left unfinished would refuse ``columns`` below)
        counted = cur.execute(_PROFILES.format("COUNT(*)") + found.series, args).fetchall()[0]
        if not counted or not counted[0]:
            return None
        if len(shapes) > 1:
            # other sample types under the same type name: not mergeable with the first
            other = cur.execute(_PROFILES.format("COUNT(*)") + found.series + " AND shape <> ?",
                                [*args, shape_json(shape)]).fetchall()[0]
            if other and other[0]:
                skipped["shape"] = int(other[0])
            clause += (" AND (time_ns, series) IN (SELECT (time_ns, series) FROM profiles "
                       "WHERE type_id = ? AND shape = ?)")
            args = [*args, args[2], shape_json(shape)]
        if upto is not None:
            clause += " AND written <= ?"
            args = [*args, upto]
        if gained is not None:
            clause += " AND (time_ns >= ? OR written > ?)"
            args = [*args, *gained]
        if ended_before is not None:
            clause += " AND end_ns < ?"
            args = [*args, ended_before]
        with on_cancel(cur.interrupt):   # the client left: stop the merge
            # a few series, or a window's edges (window.py: a slide's rows are
            # a write or two; DuckDB's grouping into 2^20 leaf ids costs 40-70
            # ms however few they are, summing them here 12-20)
            edges = gained is not None or ended_before is not None
            got: dict[str, Any] | None = None
            rows: list[RowPart] | None = None
            if by_name and (edges or len(matched) * 4 <= store.series_count()):
                rows = raw_rows(cur, clause, args, summed)
                got = None if rows is None or raw else grouped(rows, summed)
            if rows is None:
                rolled = (by_name and every_series and len(shapes) == 1 and gained is None
                          and ended_before is None)
                got = _grouped(cur, store, clause, args, summed, by_name, rolled,
                               (start_ns, end_ns, upto))
        cur.execute("COMMIT")
        committed = True
    except duckdb.Error as exc:
        check_cancelled()
        raise StorageError(f"query failed: {exc}") from None
    finally:
        if not committed:   # (a ROLLBACK with none open fails: 0.3-0.5 ms an answer)
            with contextlib.suppress(duckdb.Error):
                cur.execute("ROLLBACK")
    profiles = int(counted[0]) - skipped.get("shape", 0)
    if got is None:   # (raw: the rows as read)
        return Aggregate(shape, None, None, (None,) * n, profiles, skipped,
                         rows=Unsummed(tuple(rows or ()),
                                       tuple(i for i in range(n) if value in (None, i))))
    cols = list(got.values())
    thread = stack = leaf = None
    if by_name:   # (the leaf ids name the pairs: store.leaves.pairs)
        leaf = np.asarray(cols.pop(0), np.uint32)
    else:   # (a thread has one name: its (thread, leaf) is its (thread, stack))
        thread = store.thread_nums.ids[np.asarray(cols.pop(0), np.intp)]
        stack = store.leaves.pairs(np.asarray(cols.pop(0), np.uint32))[1]
    got_values = iter(np.asarray(c, np.int64) for c in cols)
    return Aggregate(shape, thread, stack,
                     tuple(next(got_values) if value in (None, i) else None for i in range(n)),
                     profiles, skipped, leaf)


def _grouped(cur: duckdb.DuckDBPyConnection, store: Store, clause: str, args: list[Any],
             summed: list[str], by_name: bool, rolled: bool,
             span: tuple[int, int, int | None]) -> dict[str, Any]:
    """DuckDB's GROUP BY of the rows, with ``rolled`` the sealed blocks'
    roll-up rows in place of theirs (in the caller's transaction)."""
    sums = ", ".join(capped_sum(c) for c in summed)
    who = "leaf" if by_name else "thread, leaf"
    blocks: list[tuple[int, int, int]] = []
    sealed: dict[Block, int] = {}
    if rolled:
        start_ns, end_ns, upto = span
        type_id = args[2]
        sealed = {(int(s), int(b)): int(w) for b, w, s in cur.execute(
            "SELECT block, written, span FROM seals WHERE type = ? AND block >= ? "
            "AND block < ?", (type_id, start_ns, end_ns)).fetchall()}
        blocks = runs(sealed, start_ns, end_ns, upto)
    if not blocks:
        return columns(cur, f"SELECT {who}, {sums} FROM samples WHERE {clause} GROUP BY {who}",
                       args)
    return _from_parts(cur, store, clause, args, summed, sums, sealed, blocks, span[2])


def _from_parts(cur: duckdb.DuckDBPyConnection, store: Store, clause: str, args: list[Any],
                summed: list[str], sums: str, sealed: dict[Block, int],
                blocks: list[tuple[int, int, int]], upto: int | None) -> dict[str, Any]:
    """``_grouped`` of sealed blocks: the sums of their roll-up rows (kept
    in memory, for a merge of one generation, for the next merge of the
    same blocks: blocksums.py) added to the sums of the rows outside them."""
    type_id = args[2]
    every = tuple((span, start, sealed[(span, start)]) for span, lo, hi in blocks
                  for start in range(lo, hi, span))
    whole = store.block_sums.get(type_id, every, summed, upto)
    if whole is None:
        whole = _blocks_part(cur, type_id, blocks, sums, upto)
        store.block_sums.put(type_id, every, summed, whole)
    outside = " AND ".join("NOT (time_ns >= ? AND time_ns < ?)" for _ in blocks)
    rest_args = [*args, *(x for r in blocks for x in r[1:])]
    # (few rows, as a range's edges are: read and summed here, as DuckDB's
    # grouping costs 30 ms however few they are)
    rest = raw_sums(cur, f"{clause} AND {outside}", rest_args, summed)
    if rest is None:
        rest = columns(cur, f"SELECT leaf, {sums} FROM samples WHERE {clause} AND {outside} "
                       "GROUP BY leaf", rest_args)
    rest_leaf = np.asarray(rest.pop("leaf"), np.uint32)
    if not len(rest_leaf):
        return {"leaf": whole.leaf, **dict(zip(summed, whole.sums, strict=True))}
    check_cancelled()
    leaf, totals = add_up([whole, Part(rest_leaf, tuple(np.asarray(c, np.int64)
                                                        for c in rest.values()), upto)],
                          len(summed))
    return {"leaf": leaf, **dict(zip(summed, totals, strict=True))}


def _blocks_part(cur: duckdb.DuckDBPyConnection, type_id: int,
                 blocks: list[tuple[int, int, int]], sums: str, upto: int | None) -> Part:
    """The roll-up rows (of generation ``upto``, when given) of runs of
    sealed blocks, grouped per leaf by DuckDB in one pass (read block by
    block and summed in numpy, the fleet hour's first flame graph took
    614 ms, not 352)."""
    inside = " OR ".join("(span = ? AND block >= ? AND block < ?)" for _ in blocks)
    written = "" if upto is None else " AND written <= ?"
    got = columns(
        cur, f"SELECT leaf, {sums} FROM rollups WHERE type = ? AND ({inside}){written} "
        "GROUP BY leaf",
        [type_id, *(x for r in blocks for x in r), *([] if upto is None else [upto])])
    cols = [np.asarray(c, np.int64) for c in got.values()]
    return Part(np.asarray(cols.pop(0), np.uint32), tuple(cols), upto)


def timeline(store: Store, start_ns: int, end_ns: int, matchers: Matchers,
             type_: str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                                  npt.NDArray[np.int64]]:
    """Store.timeline."""
    found = where(store, start_ns, end_ns, store.series_matching(matchers), type_)
    if found is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    with contextlib.closing(store.cursor()) as cur:
        got = columns(cur, _PROFILES.format("time_ns, series, samples") + found.series,
                      found.args)
    return (np.asarray(got["time_ns"], np.int64), np.asarray(got["series"], np.int64),
            np.asarray(got["samples"], np.int64))


def stored_leaves(store: Store) -> npt.NDArray[np.uint32]:
    """Store.stored_leaves."""
    try:
        with store.reading() as cur:
            # (grouped by the leaf id, DuckDB keeps an array per id: DISTINCT
            # hashed them and needed more than 64 MB for a fleet hour)
            got = columns(cur, "SELECT leaf FROM samples GROUP BY leaf")
    except duckdb.Error as exc:
        raise StorageError(f"query failed: {exc}") from None
    return np.asarray(got["leaf"], np.uint32)
