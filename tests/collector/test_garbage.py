"""Retention forgets the threads and series no stored row names
(collector/garbage.py): gone from their tables and from memory, while
every one a row still names stays, a reopened store reads the tables'
numbers with their gaps, and a thread or series that comes back (read by
the collector or by a worker that saw it before) is stored again and reads
back as sent."""

from __future__ import annotations

import json
import random
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ember.agent.labels import ProcessLabels, series_labels
from ember.collector import workers
from ember.collector.api import Api
from ember.collector.matchers import selector
from ember.collector.store import Store
from ember.collector.validate import DEFAULT_LIMITS, INT64_MAX, check_request
from ember.encode.pprof import decode_pprof, from_proto
from ember.encode.writeraw import make_series
from ember.model import Profile, Sample, merge_samples
from ember.proto import profilestore_pb2 as ps
from tests.support.profiles import fleet_profile

S = 10**9
T0 = 1_700_000_000 * S


def request(rng: random.Random, pid: int, at_ns: int) -> tuple[Profile, ps.WriteRawRequest]:
    """A profile whose samples are all of process ``pid`` (threads pid/11-13), at ``at_ns``."""
    prof = fleet_profile(rng, 30)
    prof = replace(prof, samples=tuple(replace(s, pid=pid) for s in prof.samples),
                   start_ns=at_ns, duration_ns=S,
                   labels=series_labels(prof.type, ProcessLabels(pid=pid, comm="app"),
                                        {"host": "h0"}))
    return prof, ps.WriteRawRequest(series=[make_series(prof)[0]])


def write(store: Store, rng: random.Random, pid: int, at_ns: int) -> Profile:
    prof, req = request(rng, pid, at_ns)
    store.write(check_request(req, DEFAULT_LIMITS, at_ns + S))
    return prof


def table_pids(store: Store) -> set[int]:
    """The pids of the threads table, and of the series table (the series'
    pid label): the same set, as every profile here is one process's."""
    threads = {r[0] for r in store._db.execute("SELECT DISTINCT pid FROM threads").fetchall()}
    series = {int(dict(json.loads(r[0]))["pid"])
              for r in store._db.execute("SELECT labels FROM series").fetchall()}
    assert threads == series, (threads, series)
    return threads


def memory_pids(store: Store) -> set[int]:
    """The same from memory: the interner's threads, and the series' labels."""
    threads = {key[0] for key in store.interner.threads.values()}
    series = {int(v) for v in store.label_values("pid")}
    assert threads == series and len(store.interner.series) == store.series_count(), (
        threads, series, len(store.interner.series))
    matched = {int(store.series_labels(n)["pid"])
               for n in store.series_matching(selector(["pid=~.+"]))}
    assert matched == series
    return threads


def key(s: Sample) -> tuple[object, ...]:
    return (s.frames, s.pid, s.tid, s.thread_name, s.labels)


def read_back(store: Store, start_ns: int = 0) -> dict[tuple[object, ...], tuple[int, ...]]:
    code, body, _ = Api(store).handle("/api/v1/profile", {
        "from": [str(start_ns)], "to": [str(INT64_MAX)], "format": ["pprof"]})
    assert code == 200, body
    return {key(s): s.values for s in from_proto(decode_pprof(body))[1]}


def sent(*profiles: Profile) -> dict[tuple[object, ...], tuple[int, ...]]:
    return {key(s): s.values for s in merge_samples([s for p in profiles for s in p.samples])}


def retain_from(store: Store, cutoff_ns: int) -> tuple[int, int]:
    """Retention as the collector runs it, with its cutoff at ``cutoff_ns``."""
    return store.enforce_retention((time.time_ns() - cutoff_ns) / 1e9, 1 << 40)


def test_retention_forgets_the_threads_no_row_names(tmp_path: Path) -> None:
    rng = random.Random(5)
    path = tmp_path / "store.duckdb"
    store = Store(path)
    write(store, rng, 100, T0)                   # only before the cutoff
    kept = [write(store, rng, 300, T0),          # before and after it
            write(store, rng, 300, T0 + 60 * S),
            write(store, rng, 200, T0 + 60 * S)]  # only after it
    assert table_pids(store) == memory_pids(store) == {100, 200, 300}
    gone = [i for i, k in store.interner.threads.items() if k[0] == 100]
    assert len(gone) == 3
    assert retain_from(store, T0 + 30 * S) == (2, 0)   # (pid 100's profile and pid 300's first)
    assert table_pids(store) == memory_pids(store) == {200, 300}
    assert all(store.thread_nums.num(i) is None for i in gone)
    assert read_back(store) == sent(*kept[1:])
    assert retain_from(store, T0 + 30 * S) == (0, 0)   # nothing more to forget
    assert table_pids(store) == {200, 300}

    # opened again: the numbers' gaps read, and pid 100 comes back as new threads
    store.close()
    store = Store(path)
    try:
        assert table_pids(store) == memory_pids(store) == {200, 300}
        back = write(store, rng, 100, T0 + 120 * S)
        assert table_pids(store) == memory_pids(store) == {100, 200, 300}
        assert read_back(store, T0 + 100 * S) == sent(back)
        assert read_back(store) == sent(*kept[1:], back)
        numbers = store._db.execute("SELECT num FROM threads").fetchall()
        assert len(numbers) == len(set(numbers)) == 9
        # a thread and a series the tables hold with no row (none is written
        # so): forgotten too
        store._db.execute("INSERT INTO threads VALUES (42, 999, 1, 'orphan', '[]', 1000)")
        store._db.execute("""INSERT INTO series VALUES (43, 'x', '[["pid","999"]]', 1000)""")
    finally:
        store.close()
    store = Store(path)   # (the newest rows read from the table, not kept by writes)
    try:
        assert memory_pids(store) == {100, 200, 300, 999}
        assert retain_from(store, T0 + 90 * S) == (2, 0)
        assert table_pids(store) == memory_pids(store) == {100}
        assert read_back(store) == sent(back)
    finally:
        store.close()


@pytest.fixture()
def fresh_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process plays the worker: its interner starts empty."""
    monkeypatch.setattr(workers, "_interner", None)


@pytest.mark.usefixtures("fresh_worker")
def test_a_worker_that_saw_a_forgotten_thread_still_stores_it() -> None:
    """A worker made rows for pid 100's threads before retention forgot
    them; its rows for them afterwards still carry them, and they read back."""
    rng = random.Random(9)
    store = Store(":memory:")
    try:
        for pid, at in ((100, T0), (200, T0 + 60 * S)):
            _, req = request(rng, pid, at)
            prepared, _ = workers.prepare(req.SerializeToString(), DEFAULT_LIMITS, at + S)
            store.write([x.profile for x in prepared], [(x.shape, x.rows) for x in prepared])
        assert retain_from(store, T0 + 30 * S) == (1, 0)
        assert memory_pids(store) == {200}
        again, req = request(rng, 100, T0 + 120 * S)
        prepared, _ = workers.prepare(req.SerializeToString(), DEFAULT_LIMITS, T0 + 121 * S)
        store.write([x.profile for x in prepared], [(x.shape, x.rows) for x in prepared])
        assert table_pids(store) == memory_pids(store) == {100, 200}
        assert read_back(store, T0 + 100 * S) == sent(again)
        # pid 100's old numbers are not forgotten again: its new ones stay
        assert retain_from(store, T0 + 90 * S) == (1, 0)
        assert table_pids(store) == memory_pids(store) == {100}
        assert read_back(store) == sent(again)
    finally:
        store.close()


def test_the_series_a_selector_matches_follow_writes_and_retention() -> None:
    """series_matching remembers a selector's series while none comes or
    goes: a new one, or one retention forgets, is seen at the next ask."""
    store = Store(":memory:")
    rng = random.Random(8)
    sel = selector(["pid=~1[0-3]"])

    def pids() -> list[int]:
        return sorted(int(store.series_labels(n)["pid"]) for n in store.series_matching(sel))
    write(store, rng, 10, T0)
    write(store, rng, 11, T0)
    assert pids() == [10, 11]
    store.series_matching(sel).clear()   # (a copy: the one remembered stays)
    assert pids() == [10, 11]
    write(store, rng, 12, T0 + 5 * S)
    write(store, rng, 14, T0 + 5 * S)
    assert pids() == [10, 11, 12]
    assert retain_from(store, T0 + 3 * S)[0] > 0
    assert pids() == [12]
