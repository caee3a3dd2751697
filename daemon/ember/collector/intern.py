"""Stored profiles as interned rows: every frame, stack, thread and series
under a 64-bit content hash.

The id of a thing is the first 8 bytes of BLAKE2b over a canonical encoding
of its content, never a counter, so the same frame or stack has the same id
in every store and partial sums from several stores add up. A pprof profile
becomes one sample row per (thread, stack): (time, series, type, thread,
stack, values); the frames, stacks, threads and series a row names are new
rows only the first time any profile names them.

What the frames keep is what ``encode.pprof.from_proto`` reads from pprof
(mapping, address, function and system names, file, line, inlined), so a
stored range read back as pprof carries what the agents sent.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import numpy.typing as npt

from ..encode.folded import clean
from ..encode.pprof import location_frames, sample_context
from ..model import Frame, Mapping
from ..proto import profile_pb2 as pb

#: Values kept per sample (a profile with more sample types is refused).
MAX_VALUES = 4
#: Thread labels: (pid, tid, thread name, other sample labels sorted).
ThreadKey = tuple[int, int, str, tuple[tuple[str, str], ...]]


def content_id(*parts: object) -> int:
    """A 64-bit id of JSON-encodable content, the same in every store."""
    text = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def stack_id(frame_ids: Sequence[int]) -> int:
    """The id of a stack: its frame ids, root first."""
    digest = hashlib.blake2b(array("Q", frame_ids).tobytes(), digest_size=8,
                             person=b"ember-stack").digest()
    return int.from_bytes(digest, "little")


def mapping_fields(m: Mapping | None) -> tuple[object, ...] | None:
    if m is None:
        return None
    return (m.start, m.limit, m.offset, m.path, m.build_id, m.has_functions)


def frame_id(f: Frame) -> int:
    return content_id("frame", f.name, str(f.kind), mapping_fields(f.mapping), f.address,
                      f.system_name, f.file, f.line, f.inlined)


def series_id(labels_json: str) -> int:
    return content_id("series", labels_json)


def thread_id(key: ThreadKey) -> int:
    return content_id("thread", key[0], key[1], key[2], key[3])


def thread_name_id(name: str) -> int:
    """The id of a thread name as the flame graph's first level shows it."""
    return content_id("thread-name", clean(name))


def type_id(type_: str) -> int:
    return content_id("type", type_)


def labels_json(labels: Iterable[tuple[str, str]]) -> str:
    return json.dumps(sorted(labels), separators=(",", ":"))


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
    new_locations: dict[tuple[object, ...], tuple[int, ...]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.stack)

    def columns(self) -> dict[str, npt.NDArray[np.generic]]:
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

    def __init__(self) -> None:
        self.frames: dict[int, Frame] = {}
        self.stacks: set[int] = set()
        self.threads: dict[int, ThreadKey] = {}
        self.series: dict[str, int] = {}
        self._locations: dict[tuple[object, ...], tuple[int, ...]] = {}
        self._thread_keys: dict[tuple[object, ...], tuple[int, ThreadKey, int]] = {}

    def add(self, rows: Rows, p: pb.Profile, series_labels: Sequence[tuple[str, str]],
            type_: str, time_ns: int, end_ns: int) -> None:
        """Append the samples of one (validated) profile to ``rows``."""
        key = labels_json(series_labels)
        sid = self.series.get(key)
        if sid is None:
            sid = series_id(key)
            rows.new_series[sid] = key
        tid_type = type_id(type_)
        # (an id no location has: no frames, as a query reads it)
        frames_at = defaultdict(tuple, self._locations_of(p, rows)).__getitem__
        st = p.string_table
        nvalues = len(p.sample_type)
        merged: dict[tuple[int, int], list[int]] = {}
        tnames: dict[int, int] = {}
        for x in p.sample:
            # root first; (map, chain: a loop in C, not here, per frame)
            ids = list(chain.from_iterable(map(frames_at, reversed(x.location_id))))
            stk = stack_id(ids)
            if stk not in self.stacks and stk not in rows.new_stacks:
                rows.new_stacks[stk] = tuple(ids)
            label_key = tuple((lb.key, lb.str, lb.num) for lb in x.label)
            known = self._thread_keys.get(label_key)
            if known is None:
                pid, tid, name, labels = sample_context(st, x)
                tkey: ThreadKey = (pid, tid, name, labels)
                known = self._thread_keys[label_key] = (thread_id(tkey), tkey,
                                                        thread_name_id(name))
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

    def commit(self, rows: Rows) -> None:
        """What ``rows`` added is in the store now (called after its commit:
        a write that failed leaves the interner as it was)."""
        self.frames.update(rows.new_frames)
        self.stacks.update(rows.new_stacks)
        self.threads.update(rows.new_threads)
        self.series.update((k, sid) for sid, k in rows.new_series.items())
        self._locations.update(rows.new_locations)

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
                frames = location_frames(st, loc, mkey, lines)
                ids = tuple(frame_id(f) for f in frames)
                for fid, frame in zip(ids, frames, strict=True):
                    if fid not in self.frames:
                        rows.new_frames[fid] = frame
                rows.new_locations[key] = ids
            out[loc.id] = ids
        return out
