"""Stored profiles as interned rows: every frame, stack, thread and series
under a 64-bit content hash (ids.py), the same in every store. A pprof profile
becomes one sample row per (thread, stack): (time, series, type, thread,
stack, values); the frames, stacks, threads and series a row names are new
rows only the first time any profile names them.

What the frames keep is what ``encode.pprof.from_proto`` reads from pprof
(mapping, address, function and system names, file, line, inlined), so a
stored range read back as pprof carries what the agents sent.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from ..encode.pprof import (
    FunctionKey,
    LineKey,
    MappingKey,
    ProfileMessage,
    location_frames,
    sample_context,
)
from ..model import Frame, FrameKind, Mapping
from ..proto import profile_pb2 as pb
from . import decode
from .ids import (
    ThreadKey,
    frame_head,
    frame_id,
    frame_text,
    labels_json,
    series_id,
    stack_id,
    text_id,
    thread_id,
    thread_name_id,
    type_id,
)
from .locations import LocationMemo, RowKey, mix
from .memo import IdSet, row_bytes
from .scatter import ranges
from .stackids import StackIds

#: Values kept per sample (a profile with more sample types is refused).
MAX_VALUES = 4


@dataclass
class Rows:
    """What one write adds: sample rows as columns, and the new frames,
    stacks, threads and series they name."""

    time_ns: list[int] = field(default_factory=list)
    end_ns: list[int] = field(default_factory=list)
    series: list[int] = field(default_factory=list)
    type: list[int] = field(default_factory=list)
    thread: list[int] = field(default_factory=list)
    tname: list[int] = field(default_factory=list)
    stack: list[int] = field(default_factory=list)
    values: list[list[int]] = field(default_factory=lambda: [[] for _ in range(MAX_VALUES)])
    new_frames: dict[int, Frame] = field(default_factory=dict)
    new_stacks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    new_threads: dict[int, ThreadKey] = field(default_factory=dict)
    new_series: dict[int, str] = field(default_factory=dict)
    new_locations: dict[object, tuple[int, ...]] = field(default_factory=dict)
    new_location_rows: dict[RowKey, tuple[int, ...]] = field(default_factory=dict)
    #: rows made as arrays (``Interner.add`` of tables), after the lists'
    chunks: list[dict[str, npt.NDArray[np.generic]]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.stack) + sum(len(c["stack"]) for c in self.chunks)

    def columns(self) -> dict[str, npt.NDArray[np.generic]]:
        parts = [self._listed(), *self.chunks] if self.stack or not self.chunks else self.chunks
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([c[k] for c in parts]) for k in parts[0]}

    def _listed(self) -> dict[str, npt.NDArray[np.generic]]:
        cols: dict[str, npt.NDArray[np.generic]] = {
            "time_ns": np.array(self.time_ns, dtype=np.int64),
            "end_ns": np.array(self.end_ns, dtype=np.int64),
            "series": np.array(self.series, dtype=np.uint64),
            "type": np.array(self.type, dtype=np.uint64),
            "thread": np.array(self.thread, dtype=np.uint64),
            "tname": np.array(self.tname, dtype=np.uint64),
            "stack": np.array(self.stack, dtype=np.uint64)}
        for i, vs in enumerate(self.values):
            cols[f"v{i}"] = np.array(vs, dtype=np.int64)
        return cols


class Interner:
    """The ids a store already holds, and caches that turn a pprof's
    locations and label sets into them without hashing them again."""

    #: Threads whose ids (and their names' ids) are kept, a memo only: a
    #: thread's two ids are JSON and BLAKE2b, 0.3 ms a profile of 16 threads.
    MAX_THREAD_IDS = 1 << 16

    def __init__(self) -> None:
        self.frames: dict[int, Frame] = {}
        self.stacks = IdSet()
        self.threads: dict[int, ThreadKey] = {}
        self.series: dict[str, int] = {}
        # memos only (nothing here says the store holds it): locations by
        # content, read in bulk (locations.py) or message by message, stack
        # ids by key (stackids.py), and mappings' small ids
        self.locations = LocationMemo()
        self.stack_ids = StackIds()
        self._locations: dict[object, tuple[int, ...]] = {}
        self._mappings: dict[tuple[object, ...], int] = {}
        self._frame_heads: dict[MappingKey | None, tuple[Mapping | None, FrameKind, str]] = {}
        self._thread_ids: dict[ThreadKey, tuple[int, int]] = {}

    def add(self, rows: Rows, p: ProfileMessage, series_labels: Sequence[tuple[str, str]],
            type_: str, time_ns: int, end_ns: int, tables: decode.Tables | None = None
            ) -> None:
        """Append the samples of one (validated) profile to ``rows``, from
        its ``tables`` (read here if not given) or, if they cannot be read
        in bulk, message by message."""
        key = labels_json(series_labels)
        sid = self.series.get(key)
        if sid is None:
            sid = series_id(key)
            rows.new_series[sid] = key
        tid_type = type_id(type_)
        if tables is None or tables.source is not p:
            tables = decode.read(p)
        if tables is not None:
            self._add_tables(rows, p, tables, (time_ns, end_ns, sid, tid_type))
            return
        if not isinstance(p, pb.Profile):   # (a head is read in bulk: this is not reached)
            p = pb.Profile.FromString(p.SerializeToString())
        # (an id no location has: no frames, as a query reads it)
        frames_at = defaultdict(tuple, self._locations_of(p, rows)).__getitem__
        st = p.string_table
        nvalues = len(p.sample_type)
        merged: dict[tuple[int, int], list[int]] = {}
        tnames: dict[int, int] = {}
        # (label string indices are this profile's: known for it alone)
        thread_keys: dict[tuple[object, ...], tuple[int, ThreadKey, int]] = {}
        for x in p.sample:
            # root first; (map, chain: a loop in C, not here, per frame)
            ids = list(chain.from_iterable(map(frames_at, reversed(x.location_id))))
            stk = stack_id(ids)
            if stk not in self.stacks and stk not in rows.new_stacks:
                rows.new_stacks[stk] = tuple(ids)
            label_key = tuple((lb.key, lb.str, lb.num) for lb in x.label)
            known = thread_keys.get(label_key)
            if known is None:
                tkey: ThreadKey = sample_context(st, x)
                known = thread_keys[label_key] = (thread_id(tkey), tkey,
                                                  thread_name_id(tkey[2]))
            th, tkey, tnames[th] = known
            if th not in self.threads:
                rows.new_threads[th] = tkey
            vals = merged.get((th, stk))
            if vals is None:
                merged[(th, stk)] = list(x.value[:nvalues])
            else:  # the same stack twice in one profile (other sample labels)
                for i, v in enumerate(x.value[:nvalues]):
                    vals[i] += v
        for (th, stk), vals in merged.items():
            rows.time_ns.append(time_ns)
            rows.end_ns.append(end_ns)
            rows.series.append(sid)
            rows.type.append(tid_type)
            rows.thread.append(th)
            rows.tname.append(tnames[th])
            rows.stack.append(stk)
            for i in range(MAX_VALUES):
                rows.values[i].append(vals[i] if i < len(vals) else 0)

    def _add_tables(self, rows: Rows, p: ProfileMessage, t: decode.Tables,
                    fixed: tuple[int, int, int, int]) -> None:
        """``add`` from arrays: each location is looked up by its content
        (mapping, address, functions and lines, as small ids) in one pass,
        and each stack's id found by its key (stackids.py) from one array of
        frame ids."""
        # (the C reader hashed the strings: only labels and mappings are read)
        st: Sequence[str] = p.string_table if t.string_hash is not None \
            else list(p.string_table)
        smp = t.samples
        frames, counts = self._location_frames(p, st, t, rows)
        # root first: reversed, the samples run last to first, each root first
        at = smp.locations[::-1].astype(np.int64) - 1
        n = counts[at]
        offsets = np.cumsum(counts) - counts
        flat = frames[ranges(offsets[at], n)]
        bound = np.concatenate(([0], np.cumsum(n)))
        # each sample's frames, in the samples' reversed order: flat[b[i]:b[i + 1]]
        b = bound[np.concatenate(([0], np.cumsum(smp.depth[::-1])))]
        ids = self.stack_ids.ids(flat, b)
        lo, hi = b[:-1].tolist(), b[1:].tolist()
        stacks = ids.tolist()
        for j in np.flatnonzero(~self.stacks.known(ids)).tolist():
            if stacks[j] not in rows.new_stacks:
                rows.new_stacks[stacks[j]] = tuple(flat[lo[j]:hi[j]].tolist())
        stacks.reverse()
        threads, tnames = [], []
        named = self._thread_ids
        for labels in smp.label_sets:
            tkey: ThreadKey = sample_context(st, labels)
            got = named.get(tkey)
            if got is None:
                if len(named) >= self.MAX_THREAD_IDS:
                    named.clear()
                got = named[tkey] = (thread_id(tkey), thread_name_id(tkey[2]))
            th = got[0]
            if th not in self.threads:
                rows.new_threads[th] = tkey
            threads.append(th)
            tnames.append(got[1])
        n_samples, width = len(smp.depth), len(p.sample_type)
        stack = np.array(stacks, np.uint64)
        thread = np.array(threads, np.uint64)[smp.label_set]
        tname = np.array(tnames, np.uint64)[smp.label_set]
        values = smp.values.reshape(n_samples, width)
        if _repeats(thread, stack):
            # the same stack twice in one profile (other sample labels): summed
            pairs = np.stack([thread, stack], axis=1)
            merged: dict[tuple[int, int], list[int]] = {}
            first: dict[tuple[int, int], int] = {}
            for i, (key, vs) in enumerate(zip(map(tuple, pairs.tolist()), values.tolist(),
                                              strict=True)):
                if key in merged:
                    merged[key] = [a + b for a, b in zip(merged[key], vs, strict=True)]
                else:
                    merged[key], first[key] = vs, i
            keep = np.array(list(first.values()), np.int64)
            stack, thread, tname = stack[keep], thread[keep], tname[keep]
            values = np.array(list(merged.values()), np.int64).reshape(len(keep), width)
        time_ns, end_ns, sid, tid_type = fixed
        m = len(stack)
        chunk: dict[str, npt.NDArray[np.generic]] = {
            "time_ns": np.full(m, time_ns, np.int64), "end_ns": np.full(m, end_ns, np.int64),
            "series": np.full(m, sid, np.uint64), "type": np.full(m, tid_type, np.uint64),
            "thread": thread, "tname": tname, "stack": stack}
        for i in range(MAX_VALUES):
            chunk[f"v{i}"] = (np.ascontiguousarray(values[:, i]) if i < width
                              else np.zeros(m, np.int64))
        rows.chunks.append(chunk)

    def _location_frames(self, p: ProfileMessage, st: Sequence[str], t: decode.Tables,
                         rows: Rows) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
        """Every location's frame ids (root first), one after another, and
        how many each has: found by content (locations.py), a width at a
        time, and made from the profile where not found."""
        loc, fn = t.locations, t.functions
        mkeys = [None, *((m.memory_start, m.memory_limit, m.file_offset, st[m.filename],
                          st[m.build_id], m.has_functions) for m in p.mapping)]
        mids = np.array([0, *_small(self._mappings, mkeys[1:])], np.uint64)

        @functools.cache
        def fkeys() -> list[FunctionKey]:
            """By function id (ids are positions, checked): its strings."""
            get = list(st).__getitem__
            return [("", "", ""), *zip(map(get, fn.name.tolist()),
                                       map(get, fn.system_name.tolist()),
                                       map(get, fn.filename.tolist()), strict=True)]

        fhash = np.zeros(len(fn.id) + 1, np.uint64)
        if t.string_hash is not None:   # keyed hashes of the strings' bytes, mixed
            h = t.string_hash
            fhash[1:] = mix(np.stack([h[fn.name], h[fn.system_name], h[fn.filename]], axis=1))
        else:
            fhash[1:] = np.fromiter(map(hash, fkeys()[1:]), np.int64, len(fn.id)).view(np.uint64)
        n_loc = len(loc.id)
        counts = np.maximum(loc.lines, 1)
        first = np.cumsum(counts) - counts
        flat = np.zeros(int(counts.sum()), np.uint64)
        # each line's position in its location, and its location's width
        line_start = np.cumsum(loc.lines) - loc.lines
        pos = np.arange(len(loc.line_location)) - np.repeat(line_start, loc.lines)
        line_width = loc.lines[loc.line_location]
        for width in np.unique(loc.lines).tolist():
            which = np.flatnonzero(loc.lines == width)
            rec = np.zeros((len(which), 3 + 2 * width), np.uint64)
            rec[:, 0], rec[:, 1], rec[:, 2] = mids[loc.mapping[which]], loc.address[which], width
            if width:
                row_of = np.empty(n_loc, np.intp)
                row_of[which] = np.arange(len(which))
                sel = line_width == width
                r, col = row_of[loc.line_location[sel]], 3 + 2 * pos[sel]
                rec[r, col] = fhash[loc.line_function[sel]]
                rec[r, col + 1] = loc.line_line[sel].view(np.uint64)
            got, found = self.locations.find(width, rec)
            missing = np.flatnonzero(~found)
            if len(missing):
                made = self._new_locations(width, which[missing], loc, line_start, fkeys(),
                                           mkeys, rec[missing], rows)
                got[missing] = np.array(made, np.uint64).reshape(len(missing), -1)
            span = max(width, 1)
            flat[(first[which][:, None] + np.arange(span)).ravel()] = got.ravel()
        return flat, counts

    def _new_locations(self, width: int, at: npt.NDArray[np.intp], loc: decode.Locations,
                       line_start: npt.NDArray[np.int64], fkeys: list[FunctionKey],
                       mkeys: list[MappingKey | None], rec: npt.NDArray[np.uint64],
                       rows: Rows) -> list[tuple[int, ...]]:
        """The frame ids of locations ``at`` (all of ``width`` lines, not
        found: their rows ``rec``), made from the profile's tables, each
        row once per write."""
        n = len(at)
        if width:   # their lines, location by location: (line, function strings)
            j = (line_start[at][:, None] + np.arange(width)).ravel()
            flat = list(zip(loc.line_line[j].tolist(), map(fkeys.__getitem__,
                                                             loc.line_function[j].tolist()),
                            strict=True))
            lines = [tuple(flat[k * width:(k + 1) * width]) for k in range(n)]
        else:
            lines = [()] * n
        learned = rows.new_location_rows
        made = self._made_one if width == 1 else self._made
        out = []
        for key, mapping, address, ls in zip(row_bytes(rec), loc.mapping[at].tolist(),
                                             loc.address[at].tolist(), lines, strict=True):
            ids = learned.get((width, key))
            if ids is None:
                ids = learned[(width, key)] = made(address, mkeys[mapping], ls, rows)
            out.append(ids)
        return out

    def _made(self, address: int, mapping: MappingKey | None, lines: Sequence[LineKey],
              rows: Rows) -> tuple[int, ...]:
        """A new location's frame ids (root first); the frames not stored
        yet go into ``rows``."""
        frames = location_frames(address, mapping, lines)
        ids = tuple(frame_id(f) for f in frames)
        for fid, frame in zip(ids, frames, strict=True):
            if fid not in self.frames:
                rows.new_frames[fid] = frame
        return ids

    def _made_one(self, address: int, mapping: MappingKey | None, lines: Sequence[LineKey],
                  rows: Rows) -> tuple[int, ...]:
        """``_made`` of a location of one line (nearly all of them): its
        frame as ``location_frames`` makes it and its id as ``frame_id``
        takes it, in one step, what they share taken once per mapping. A
        program's first profile makes 4,800 of them, which took a decode
        worker 60 of its 75 ms."""
        ((line, fn),) = lines
        got = self._frame_heads.get(mapping)
        if got is None:   # (the mapping, kind and their JSON, as for a frame of it)
            f = location_frames(0, mapping, ())[0]
            got = self._frame_heads[mapping] = (f.mapping, f.kind, frame_head(f.kind, f.mapping))
        m, kind, head = got
        name, system, file = fn or ("", "", "")
        shown, system = name or f"{address:#x}", (system if system != name else "")
        fid = text_id(frame_text(shown, head, address, system, file, line, False))
        if fid not in self.frames:
            rows.new_frames[fid] = Frame(shown, kind, m, address, system, file, line)
        return (fid,)

    def adopt(self, rows: Rows, made: Rows) -> bool:
        """Add rows another interner made (a worker's) to ``rows``, keeping
        of what it calls new only what is new here. False, adding nothing,
        if they name a stack or frame neither stored nor sent along (that
        interner sent it before, for a write that failed)."""
        stacks = np.unique(made.columns()["stack"])
        if any(s not in made.new_stacks and s not in rows.new_stacks
               for s in stacks[~self.stacks.known(stacks)].tolist()):
            return False
        # the frames of the stacks new here, each once (a new program's
        # profile: 600 stacks of 20 frames, most of them the same few hundred)
        sent = np.fromiter(made.new_stacks, np.uint64, len(made.new_stacks))
        new_here = sent[~self.stacks.known(sent)].tolist()   # (one lookup, in bulk)
        needed = set(chain.from_iterable(made.new_stacks[s] for s in new_here))
        needed.difference_update(made.new_frames, rows.new_frames)
        if not needed <= self.frames.keys():
            return False
        rows.new_frames.update((k, v) for k, v in made.new_frames.items()
                               if k not in self.frames)
        rows.new_stacks.update((s, made.new_stacks[s]) for s in new_here)
        rows.new_threads.update((k, v) for k, v in made.new_threads.items()
                                if k not in self.threads)
        rows.new_series.update((sid, key) for sid, key in made.new_series.items()
                               if key not in self.series)
        rows.chunks.append(made.columns())
        return True

    def remember_locations(self, rows: Rows) -> None:
        self._locations.update(rows.new_locations)
        self.locations.update(rows.new_location_rows.items())

    def commit(self, rows: Rows) -> None:
        """What ``rows`` added is in the store now (called after its commit:
        a write that failed leaves the interner as it was)."""
        self.frames.update(rows.new_frames)
        self.stacks.update(rows.new_stacks)
        self.threads.update(rows.new_threads)
        self.series.update((k, sid) for sid, k in rows.new_series.items())
        self.remember_locations(rows)

    def _locations_of(self, p: pb.Profile, rows: Rows) -> dict[int, tuple[int, ...]]:
        """location id -> its frame ids, root first (a pprof location lists
        its inlined functions innermost first)."""
        st = list(p.string_table)  # a list indexes far faster than the message
        mkeys = {m.id: (m.memory_start, m.memory_limit, m.file_offset, st[m.filename],
                        st[m.build_id], m.has_functions) for m in p.mapping}
        fkeys = {f.id: (st[f.name], st[f.system_name], st[f.filename]) for f in p.function}
        out: dict[int, tuple[int, ...]] = {}
        for loc in p.location:
            mkey = mkeys.get(loc.mapping_id)
            lines = tuple((ln.line, fkeys.get(ln.function_id)) for ln in loc.line)
            key = (mkey, loc.address, lines)
            ids = self._locations.get(key) or rows.new_locations.get(key)
            if ids is None:
                ids = rows.new_locations[key] = self._made(loc.address, mkey, lines, rows)
            out[loc.id] = ids
        return out


#: An odd multiplier: a thread id times it, xor a stack id, is one word per pair.
_ODD = np.uint64(0x9E3779B97F4A7C15)


def _repeats(thread: npt.NDArray[np.uint64], stack: npt.NDArray[np.uint64]) -> bool:
    """Whether two samples have the same (thread, stack). Equal pairs give
    equal words, so words all different answer no (nearly always) with one
    sort; only equal words send the pairs themselves to be compared
    (``np.unique`` of the pairs as rows took 0.7 ms a profile)."""
    words = np.sort(thread * _ODD ^ stack)
    if not (words[1:] == words[:-1]).any():
        return False
    return len(np.unique(np.stack([thread, stack], axis=1), axis=0)) < len(stack)


def _small(table: dict[Any, int], keys: list[Any]) -> list[int]:
    """The small ids of ``keys`` in ``table``, new ones given out."""
    got = list(map(table.get, keys))
    if None in got:
        for i, key in enumerate(keys):
            if got[i] is None:
                got[i] = table.setdefault(key, len(table) + 1)
    return cast(list[int], got)
