"""A fleet-shaped hour of profiles, written straight into a collector store.

The shape the store is sized for: 200,000 distinct stacks grown as prefix
trees (a new stack is an older one plus a frame, as call trees grow) over
20,000 function names, 20 hosts x 10 processes (200 series), 360 ten-second
intervals, each series drawing its stacks from a Zipf-like popularity, about
25 million sample rows. Frames, stacks, threads and series go through the
store's own interning (the same ids a real write makes); only the pprof
decoding is skipped, which bench/store_engine.py measures on its own.

    from fleet_hour import generate; generate(store, stacks=200_000, ...)
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ember.collector.api import Api
from ember.collector.ids import (
    frame_id,
    labels_json,
    series_id,
    stack_id,
    thread_id,
    thread_name_id,
    type_id,
)
from ember.collector.index import Index
from ember.collector.intern import MAX_VALUES, Rows
from ember.collector.store import Store, StoredProfile
from ember.model import CPU, Frame, FrameKind, Mapping

TYPE = "ember_cpu:cpu:nanoseconds:cpu:nanoseconds"
SHAPE = json.dumps([[list(t) for t in CPU.sample_types], ["cpu", "nanoseconds"], 10101010])
PERIOD_NS = 10_101_010   # 99 Hz


@dataclass(frozen=True)
class Shape:
    stacks: int = 200_000
    functions: int = 20_000
    hosts: int = 20
    processes: int = 10
    intervals: int = 360
    interval_s: int = 10
    rows: int = 25_000_000
    threads_per_process: int = 4
    seed: int = 1


def generate(store: Store, shape: Shape = Shape(), end_ns: int | None = None,
             log: bool = True) -> dict[str, float]:
    """Fill ``store`` with one hour ending at ``end_ns`` (now); returns
    {"rows", "seconds", "rows_per_s"} of the appends."""
    rng = np.random.default_rng(shape.seed)
    end_ns = end_ns or time.time_ns()
    exe = Mapping(0x400000, 0x4000000, 0, "/usr/bin/service", "c0ffee")
    frames = [Frame(f"svc::module{i % 97}::function_{i}", FrameKind.USER, exe,
                    0x400000 + 64 * i, file=f"src/module{i % 97}.cc", line=1 + i % 500)
              for i in range(shape.functions)]
    fids = [frame_id(f) for f in frames]
    # stacks as prefix trees: 64 roots, then each new stack extends an older one
    stacks: list[tuple[int, ...]] = []
    picks = rng.integers(0, shape.functions, size=shape.stacks)
    parents = rng.random(shape.stacks)
    for i in range(shape.stacks):
        if i < 64:
            base: tuple[int, ...] = tuple(fids[j] for j in rng.integers(0, shape.functions, 8))
        else:  # prefer recent stacks as parents: call trees grow deep
            base = stacks[int(i - 1 - (parents[i] ** 3) * (i - 1))]
        stacks.append((*base[-60:], fids[int(picks[i])]))
    sids = np.array([stack_id(s) for s in stacks], np.uint64)
    rows = Rows()
    rows.new_frames.update(zip(fids, frames, strict=True))
    rows.new_stacks.update(zip(sids.tolist(), stacks, strict=True))
    series, threads, series_labels, tnames = [], [], [], []
    for h in range(shape.hosts):
        for p in range(shape.processes):
            labels = (("__name__", "ember_cpu"), ("host", f"host-{h:02d}"),
                      ("comm", f"service-{p}"), ("pid", str(1000 + p)))
            key = labels_json(labels)
            sid = series_id(key)
            rows.new_series[sid] = key
            series.append(sid)
            series_labels.append(labels)
            ts, tn = [], []
            for t in range(shape.threads_per_process):
                tkey = (1000 + p, 1000 + p + t, f"worker-{t}", ())
                tid = thread_id(tkey)
                rows.new_threads[tid] = tkey
                ts.append(tid)
                tn.append(thread_name_id(tkey[2]))
            threads.append(ts)
            tnames.append(tn)
    store.append(rows, [])
    # samples: each (series, interval) draws its stacks by popularity
    per = max(1, shape.rows // (shape.intervals * len(series)))
    weights = 1.0 / np.arange(1, shape.stacks + 1) ** 0.6
    weights /= weights.sum()
    order = rng.permutation(shape.stacks)
    start_ns = end_ns - shape.intervals * shape.interval_s * 10**9
    appended, spent = 0, 0.0
    t_id = type_id(TYPE)
    for k in range(shape.intervals):
        t0 = start_ns + k * shape.interval_s * 10**9
        batch = Rows()
        meta = []
        n = per * len(series)
        chosen = sids[order[rng.choice(shape.stacks, size=n, p=weights)]]
        counts = rng.integers(1, 20, size=n)
        ser = np.repeat(np.array(series, np.uint64), per)
        which = rng.integers(0, shape.threads_per_process, size=n).tolist()
        thr = [threads[i // per][x] for i, x in enumerate(which)]
        batch.tname = [tnames[i // per][x] for i, x in enumerate(which)]
        batch.time_ns = np.full(n, t0, np.int64).tolist()
        batch.end_ns = np.full(n, t0 + shape.interval_s * 10**9, np.int64).tolist()
        batch.series = ser.tolist()
        batch.type = [t_id] * n
        batch.thread = thr
        batch.stack = chosen.tolist()
        batch.values = [counts.tolist(), (counts * PERIOD_NS).tolist()] + \
            [[0] * n for _ in range(MAX_VALUES - 2)]
        for i in range(len(series)):
            total = int(counts[i * per:(i + 1) * per].sum())
            meta.append((StoredProfile(f"gen-{k}-{i}", series_labels[i], TYPE, t0,
                                       shape.interval_s * 10**9, total, b""), SHAPE))
        began = time.perf_counter()
        store.append(batch, meta)
        spent += time.perf_counter() - began
        appended += n
        if log and k % 60 == 59:
            print(f"  {k + 1}/{shape.intervals} intervals, {appended:,} rows", flush=True)
    return {"rows": appended, "seconds": spent, "rows_per_s": appended / spent}


def scaled(scale: float) -> Shape:
    """The fleet hour's shape at ``scale`` (1: 200,000 stacks, 25M rows)."""
    return Shape(stacks=int(200_000 * scale), functions=max(1000, int(20_000 * scale)),
                 rows=int(25_000_000 * scale), intervals=max(6, int(360 * scale)))


def hour_at(path: Path, scale: float, copy_of: str | None = None) -> None:
    """A fleet hour in a new store at ``path``: a copy of ``copy_of`` (a
    store this module generated earlier; the collector's store writes, so
    never the original) or generated at ``scale``."""
    if copy_of:
        shutil.copy(copy_of, path)
        return
    store = Store(path)
    try:
        generate(store, scaled(scale))
    finally:
        store.close()


def extent(store: Store) -> tuple[str, int, int]:
    """(the stored type, first start, last end) of a store's samples."""
    with store.cursor() as cur:
        row = cur.execute("SELECT min(time_ns), max(end_ns) FROM samples").fetchone()
    assert row is not None
    return store.types()[0], int(row[0]), int(row[1])


@contextmanager
def sealed_hours(hours: int, rows: int, stacks: int
                 ) -> Iterator[tuple[Store, Index, dict[str, float], int, int]]:
    """A temporary store of ``hours`` fleet-shaped hours (``rows`` sample
    rows over ``stacks`` stacks in all), every closed block sealed, and its
    query index built ahead, as a collector does at start: (the store, the
    index, generate's figures and "sealed", "seal_s", first start, last end)."""
    shape = Shape(stacks=stacks, functions=max(1000, stacks // 10), intervals=360 * hours,
                  rows=rows)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store.duckdb")
        try:
            print(f"generating {shape}", file=sys.stderr)
            gen = generate(store, shape)
            _, lo, hi = extent(store)
            began, sealed = time.monotonic(), 0
            while store.seal(hi + 4 * 3600 * 10**9):   # every block closed
                sealed += 1
            gen.update(sealed=sealed, seal_s=time.monotonic() - began)
            index = Api(store).index
            index.warm()
            yield store, index, gen, lo, hi
        finally:
            store.close()


def tree_ms(store: Store, index: Index, start: int, end: int) -> float:
    """A pruned tree of [start, end) from a new API (nothing cached but the
    shared index), in ms."""
    api = Api(store)
    api.index = index
    began = time.perf_counter()
    code, _, _ = api.handle("/api/v1/tree", {"from": [str(start)], "to": [str(end)]})
    assert code == 200, code
    return (time.perf_counter() - began) * 1000
