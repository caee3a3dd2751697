"""What the store takes and gives: a profile to store, the writes waiting
for the store's lock, a stored profile as it was sent, and the samples of
a range summed (the one merge every view starts from)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ..encode.pprof import ProfileMessage, encode_pprof, profile_shape
from ..model import Profile, ProfileType, Sample
from .intern import MAX_VALUES, Interner, Rows
from .matchers import Matchers
from .results import columns

if TYPE_CHECKING:
    from .decode import Tables
    from .store import Store


def shape_json(t: ProfileType) -> str:
    """A profile type's shape (its sample types and period) as stored."""
    return json.dumps([list(map(list, t.sample_types)), list(t.period_type), t.period])


def shape_of(text: str) -> ProfileType:
    types, period_type, period = json.loads(text)
    sample_types = tuple((a, b) for a, b in types)
    return ProfileType("", sample_types, (period_type[0], period_type[1]), int(period),
                       folded_index=len(sample_types) - 1)


@dataclass(frozen=True)
class StoredProfile:
    profile_id: str
    series_labels: tuple[tuple[str, str], ...]   # sorted, includes __name__
    type: str
    time_ns: int
    duration_ns: int
    samples: int          # sum of the first sample value (for timelines)
    data: bytes           # gzip pprof, as received (its size counts)
    proto: ProfileMessage | None = field(default=None, compare=False, repr=False)
    tables: Tables | None = field(default=None, compare=False, repr=False)  # proto's, read


class Write:
    """A request's profiles waiting to be written (``made``: each one's
    shape and rows, made by a worker), and then its outcome."""

    def __init__(self, profiles: Sequence[StoredProfile], made: Sequence[tuple[str, Rows]]):
        self.profiles, self.made = profiles, made
        self.done = self.held = False
        self.result = (0, 0)
        self.error: BaseException | None = None


class Queue:
    """Writes waiting for the store's lock: the writer that gets it takes
    them all, for one transaction (a group commit).

    A transaction's cost is mostly its own, not its rows': one 1,000-stack
    profile costs 8.5 ms to commit alone, and 1.7 ms each in a batch of ten.
    So under load (the last batch held more than one write: writes are
    overlapping) the writer waits up to ``LINGER_S`` for ``BATCH`` writes
    before it takes them. A lone writer never waits: its last batch was one."""

    BATCH = 8
    LINGER_S = 0.03

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._writes: list[Write] = []
        self._last = 0

    def __len__(self) -> int:
        with self._changed:
            return len(self._writes)

    def add(self, *writes: Write) -> None:
        with self._changed:
            self._writes.extend(writes)
            self._changed.notify()

    def take(self) -> list[Write]:
        """Every write queued (called with the store's lock held)."""
        with self._changed:
            # (a write held back waits as long for one more: rows_of)
            held = sum(w.held for w in self._writes)
            if self._last > 1 or held:
                want = max(self.BATCH if self._last > 1 else 0, held + 1 if held else 0)
                deadline = time.monotonic() + self.LINGER_S
                while len(self._writes) < want:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
            batch, self._writes = self._writes, []
            self._last = len(batch)
            return batch


def rows_of(interner: Interner, batch: list[Write], have: set[str], hold: bool = False
            ) -> tuple[Rows, list[tuple[StoredProfile, str]], list[Write]]:
    """The rows of the batch's profiles not in ``have``, each profile once,
    and their metadata; each write's ``result`` says how many of its own
    were (stored, already there).

    A worker sends a frame or stack with the first profile it names it in,
    and requests are answered in whatever order their threads run: the
    profile that sent it may come later in the batch than one naming it.
    So rows a worker made that name what is neither stored nor sent yet
    wait for the rest of the batch, and with ``hold``, a write of such rows
    not held before is left out and returned (for the next batch: its
    sender was answered but not queued yet). Only what still waits is made
    here from the profile, which took the collector's own process 50-100 ms
    a profile of a program new to it, under the store's lock, in a fleet's
    first seconds (Interner.adopt)."""
    from .validate import DEFAULT_LIMITS, decompress, parse  # rows without their proto
    rows = Rows()
    meta: list[tuple[StoredProfile, str]] = []
    stored: dict[int, int] = {}
    seen: set[str] = set()
    waiting: list[tuple[Write, int]] = []
    for w in batch:
        stored[id(w)] = 0
        for i, sp in enumerate(w.profiles):
            if sp.profile_id in have or sp.profile_id in seen:
                continue
            seen.add(sp.profile_id)
            if w.made and interner.adopt(rows, w.made[i][1]):
                meta.append((sp, w.made[i][0]))
                stored[id(w)] += 1
            else:
                waiting.append((w, i))
    while waiting:
        adopted = [(w, i) for w, i in waiting if w.made and interner.adopt(rows, w.made[i][1])]
        for w, i in adopted:
            meta.append((w.profiles[i], w.made[i][0]))
            stored[id(w)] += 1
        if not adopted:
            break
        waiting = [x for x in waiting if x not in adopted]
    held = list({id(w): w for w, _ in waiting if w.made and not w.held}.values()) if hold else []
    if held:
        for w in held:
            w.held = True
        rows, meta, _ = rows_of(interner, [w for w in batch if w not in held], have)
        return rows, meta, held
    for w, i in waiting:
        sp = w.profiles[i]
        p = sp.proto
        if p is None:
            p, _ = parse(decompress(sp.data, DEFAULT_LIMITS.max_profile_size)[0],
                         DEFAULT_LIMITS)
        interner.add(rows, p, sp.series_labels, sp.type, sp.time_ns,
                     sp.time_ns + sp.duration_ns, sp.tables)
        meta.append((sp, shape_json(profile_shape(p))))
        stored[id(w)] += 1
    for w in batch:
        w.result = (stored[id(w)], len(w.profiles) - stored[id(w)])
    return rows, meta, []


@dataclass(frozen=True)
class Row:
    """One stored profile as it was sent."""

    labels: dict[str, str]
    type: str
    time_ns: int
    duration_ns: int
    samples: int          # sum of the first sample value
    data: bytes           # gzip pprof


Part = tuple[npt.NDArray[np.uint32], tuple[npt.NDArray[np.int64], ...]]


@dataclass(frozen=True)
class Unsummed:
    """A merge's rows as read, not summed per leaf: in parts (DuckDB's
    batches), each the rows' leaf ids and their values of the sample types
    ``columns`` names, in that order."""
    parts: tuple[Part, ...]
    columns: tuple[int, ...]

    def of(self, value: int) -> list[tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]]:
        """Each part's leaf ids and values of sample type ``value``."""
        if value not in self.columns:
            raise LookupError(f"sample type {value} was not read")
        at = self.columns.index(value)
        return [(leaf, values[at]) for leaf, values in self.parts]


@dataclass(frozen=True)
class Aggregate:
    """Samples of a range summed per (thread, stack): the one merge every
    view starts from."""

    shape: ProfileType
    # per (thread, stack) summed: their ids; None when summed by name (the
    # leaf ids then name each (thread name, stack): Store.leaves.pairs),
    # which a fleet's hour holds 800,000 of: 12.8 MB more per merge
    thread: npt.NDArray[np.uint64] | None
    stack: npt.NDArray[np.uint64] | None
    values: tuple[npt.NDArray[np.int64] | None, ...]   # per sample type; None: not summed
    profiles: int
    skipped: dict[str, int]
    leaf: npt.NDArray[np.uint32] | None = None   # by_name: the store's leaf ids
    # by name, not yet summed: the rows themselves (leaf and values None),
    # for a tree to sum into its nodes at once (engine.Tree.build); summed()
    # sums them per leaf
    rows: Unsummed | None = None

    @property
    def nbytes(self) -> int:
        """What the aggregate holds (what caches weigh it by)."""
        held = [a for a in (self.thread, self.stack, self.leaf, *self.values) if a is not None]
        for leaf, values in self.rows.parts if self.rows is not None else ():
            held += [leaf, *values]
        return sum(a.nbytes for a in held)

    def sums(self, i: int) -> npt.NDArray[np.int64]:
        """The sums of sample type ``i`` (a LookupError if not summed)."""
        got = self.values[i]
        if got is None:
            raise LookupError(f"sample type {i} was not summed"
                              + (" (the rows are: summed() sums them)" if self.rows else ""))
        return got

    def summed(self) -> Aggregate:
        """This aggregate with its rows summed per leaf (itself if they were)."""
        if self.rows is None:
            return self
        # (here: leaves imports DuckDB, and a decode worker imports this module)
        from .leaves import sum_by_leaf
        leaf, sums = sum_by_leaf(self.rows.parts, len(self.rows.columns))
        values: list[npt.NDArray[np.int64] | None] = [None] * len(self.values)
        for c, column in zip(self.rows.columns, sums, strict=True):
            values[c] = column
        return replace(self, values=tuple(values), leaf=leaf, rows=None)


def as_sent(store: Store, start_ns: int, end_ns: int, matchers: Matchers,
            type_: str | None = None) -> list[Row]:
    """Each stored profile overlapping the range whose labels match, as it
    was sent (rebuilt from its rows: the samples with their frames, threads
    and values; two profiles of one series, type and start time come back
    as one), oldest first."""
    from .merge import where as where_of
    series = store.series_matching(matchers)
    where = where_of(store, start_ns, end_ns, series, type_)
    if where is None:
        return []
    args, extra = where.args, where.series
    kind = " AND type_id = ?" if type_ is not None else ""
    with store.reading() as cur:
        profiles = cur.execute(
            "SELECT series, type, type_id, shape, time_ns, duration_ns, samples FROM "
            f"profiles WHERE time_ns < ? AND time_ns + duration_ns >= ?{kind}{extra} "
            "ORDER BY time_ns", args).fetchall()
        got = columns(
            cur, "SELECT time_ns, series, type, thread, leaf, "
            + ", ".join(f"v{i}" for i in range(MAX_VALUES))
            + " FROM samples WHERE time_ns < ? AND end_ns >= ?"
            + kind.replace("type_id", "type") + extra, args)
    # rows name threads and (thread name, stack) pairs by number: their ids
    thread_ids = store.thread_nums.ids[np.asarray(got["thread"], np.intp)]
    stack_ids = store.leaves.pairs(np.asarray(got["leaf"], np.uint32))[1]
    stacks = store.stacks(np.unique(stack_ids))
    frames, threads = store.interner.frames, store.interner.threads
    by_profile: dict[tuple[int, int, int], list[Sample]] = {}
    for t, sid, tid, th, stk, *values in zip(
            got["time_ns"].tolist(), got["series"].tolist(), got["type"].tolist(),
            thread_ids.tolist(), stack_ids.tolist(),
            *(got[f"v{i}"].tolist() for i in range(MAX_VALUES)), strict=True):
        pid, tid_, name, labels = threads.get(th, (0, 0, "", ()))
        by_profile.setdefault((t, sid, tid), []).append(Sample(
            tuple(frames[f] for f in stacks.get(stk, ())), tuple(values), pid, tid_, name,
            labels))
    out = []
    for sid, type_name, tid, shape, t, d, n in profiles:
        ptype = shape_of(shape)
        samples = tuple(Sample(x.frames, x.values[:len(ptype.sample_types)], x.pid, x.tid,
                               x.thread_name, x.labels)
                        for x in by_profile.get((t, sid, tid), []))
        data = encode_pprof(Profile(ptype, samples, t, d))
        out.append(Row(store.series_labels(sid), type_name, t, d, n, data))
    return out

