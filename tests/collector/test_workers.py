"""Rows made by decode workers (collector/workers.py) store exactly what the
collector stores reading the requests itself, a worker that already sent a
frame or stack for a write that failed does not leave it out, and each
program's profiles go to one worker (a request split by program comes back
whole, in order, refused as one)."""

from __future__ import annotations

import gzip
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from ember.agent.labels import ProcessLabels, series_labels
from ember.collector import workers
from ember.collector.rows import Queue
from ember.collector.store import Store
from ember.collector.validate import DEFAULT_LIMITS, InvalidRequest, check_request
from ember.encode.writeraw import make_series
from ember.proto import profilestore_pb2 as ps
from tests.support.profiles import fleet_profile
from tests.support.waits import wait_for

TABLES = ("samples", "frames", "stacks", "threads", "series", "leaves", "profiles")


@pytest.fixture(autouse=True)
def fresh_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process plays the worker: its interner starts empty."""
    monkeypatch.setattr(workers, "_interner", None)
    yield


def requests(n: int, seed: int = 4, programs: int = 1) -> list[ps.WriteRawRequest]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prof = fleet_profile(rng, program=i % programs)
        labels = series_labels(prof.type, ProcessLabels(pid=10 + i % 3,
                                                        comm=f"svc{i % programs}"),
                               {"host": f"h{i % 2}"})
        now = time.time_ns() - 10**10 + i
        out.append(ps.WriteRawRequest(series=[make_series(replace(
            prof, start_ns=now, duration_ns=10**9, labels=labels))[0]]))
    return out


def contents(store: Store) -> dict[str, list[tuple[object, ...]]]:
    return {t: store._db.execute(
        f"SELECT {'* EXCLUDE (received_ns)' if t == 'profiles' else '*'} FROM {t} "
        "ORDER BY ALL").fetchall() for t in TABLES}


def by_the_collector(reqs: list[ps.WriteRawRequest]) -> Store:
    store = Store(":memory:")
    for r in reqs:
        store.write(check_request(r, DEFAULT_LIMITS, time.time_ns()))
    return store


def made_by_a_worker(reqs: list[ps.WriteRawRequest]) -> list[list[workers.Prepared]]:
    out = []
    for r in reqs:
        prepared, _ = workers.prepare(r.SerializeToString(), DEFAULT_LIMITS, time.time_ns())
        out.append(workers.with_data(prepared, r))
    return out


def by_a_worker(reqs: list[ps.WriteRawRequest], store: Store | None = None) -> Store:
    store = store or Store(":memory:")
    for prepared in made_by_a_worker(reqs):
        store.write([x.profile for x in prepared], [(x.shape, x.rows) for x in prepared])
    return store


def test_rows_a_worker_made_are_what_the_collector_stores() -> None:
    reqs = requests(6)
    mine, theirs = by_the_collector(reqs), by_a_worker(reqs)
    assert sum(len(rows) for rows in contents(mine).values()) > 100
    assert contents(mine) == contents(theirs)


def test_only_data_the_worker_changed_is_sent_back() -> None:
    """A profile stored as it was sent comes back without its bytes (the
    collector has them); one the worker compressed anew (sent as raw
    pprof) comes back with the gzip it made, which is what is stored."""
    reqs = requests(2)
    sample = reqs[1].series[0].samples[0]
    sample.raw_profile = gzip.decompress(sample.raw_profile)
    prepared = [workers.prepare(r.SerializeToString(), DEFAULT_LIMITS, time.time_ns())[0][0]
                for r in reqs]
    assert prepared[0].profile.data == workers.AS_SENT
    assert gzip.decompress(prepared[1].profile.data) == sample.raw_profile
    filled = [workers.with_data([x], r)[0] for x, r in zip(prepared, reqs, strict=True)]
    assert filled[0].profile.data == reqs[0].series[0].samples[0].raw_profile
    assert filled[1] == prepared[1]
    assert contents(by_the_collector(reqs)) == contents(by_a_worker(reqs))


def test_what_a_worker_sent_for_a_failed_write_is_made_again() -> None:
    reqs = requests(4)
    # the worker reads the first two; their write fails, nothing is stored
    for r in reqs[:2]:
        workers.prepare(r.SerializeToString(), DEFAULT_LIMITS, time.time_ns())
    # the same profiles again, and two more: the worker calls nothing of
    # the first two new now, so the collector must read them itself
    again = by_a_worker(reqs)
    prepared, _ = workers.prepare(reqs[0].SerializeToString(), DEFAULT_LIMITS, time.time_ns())
    assert not prepared[0].rows.new_stacks, "the worker no longer sends its stacks"
    assert contents(again) == contents(by_the_collector(reqs))


def stored_in_one_batch(made: list[list[workers.Prepared]], order: list[int],
                        together: bool = True) -> Store:
    """The writes of ``made`` queued in ``order``, all before the store's
    lock is let go if ``together``, else the first written alone and the
    rest queued once it is held back. The collector reading a profile
    itself fails the test."""
    store = Store(":memory:")

    def refuse(*_: object) -> None:
        raise AssertionError("the collector read a profile a worker had read")
    store.interner.add = refuse  # type: ignore[method-assign]
    answers: list[tuple[int, int]] = []
    threads = [threading.Thread(target=lambda i=i: answers.append(store.write(
        [x.profile for x in made[i]], [(x.shape, x.rows) for x in made[i]]))) for i in order]
    if together:
        with store._lock:
            for k, t in enumerate(threads, 1):
                t.start()
                assert wait_for(lambda k=k: len(store._queue) == k)  # (queued in this order)
    else:
        threads[0].start()
        assert wait_for(lambda: any(w.held for w in store._queue._writes))
        for t in threads[1:]:
            t.start()
    for t in threads:
        t.join(30)
    assert answers == [(1, 0)] * len(order)
    return store


@pytest.mark.parametrize("together", [True, False], ids=["one batch", "the next batch"])
def test_a_profile_answered_before_the_one_that_sent_its_stacks_is_stored_from_its_rows(
        together: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker sends a stack with the first profile naming it; the second
    profile's write may reach the store first, in the same batch or alone
    before it: it waits for the first (held back once), and is stored as
    the two in order are, not read by the collector."""
    monkeypatch.setattr(Queue, "LINGER_S", 60.0)
    reqs = requests(2)
    mine = stored_in_one_batch(made_by_a_worker(reqs), [1, 0], together)
    monkeypatch.setattr(workers, "_interner", None)
    assert contents(mine) == contents(stored_in_one_batch(made_by_a_worker(reqs), [0, 1]))


def test_a_worker_that_dies_is_replaced() -> None:
    pool = workers.Workers(1, DEFAULT_LIMITS)
    try:
        (req,) = requests(1)
        first, _ = pool.prepare(req, time.time_ns())
        (pid,) = list(pool._pools[0]._processes)  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGKILL)
        again, _ = pool.prepare(req, time.time_ns())
        assert [x.profile for x in again] == [x.profile for x in first]
        assert list(pool._pools[0]._processes) != [pid]  # type: ignore[attr-defined]
    finally:
        pool.close()


def test_the_pool_starts_its_processes_before_the_first_request() -> None:
    pool = workers.Workers(2, DEFAULT_LIMITS)
    try:
        processes = [p._processes for p in pool._pools]  # type: ignore[attr-defined]
        assert wait_for(lambda: all(len(ps) == 1 and all(p.is_alive() for p in ps.values())
                                    for ps in processes), timeout=60), processes
    finally:
        pool.close()


def series_of(reqs: list[ps.WriteRawRequest]) -> ps.WriteRawRequest:
    """One request of every series of ``reqs``, as an agent batches them."""
    return ps.WriteRawRequest(series=[s for r in reqs for s in r.series])


def test_program_is_the_executable_then_the_command_then_the_labels() -> None:
    def labels(**kv: str) -> ps.LabelSet:
        return ps.LabelSet(labels=[ps.Label(name=k, value=v) for k, v in kv.items()])

    assert workers.program_of(labels(comm="a", executable="/bin/x", pid="1")) == \
        workers.program_of(labels(comm="b", executable="/bin/x", pid="2"))
    assert workers.program_of(labels(comm="a", pid="1")) == \
        workers.program_of(labels(comm="a", pid="2"))
    assert workers.program_of(labels(comm="a")) != workers.program_of(labels(comm="b"))
    assert workers.program_of(labels(pid="1")) != workers.program_of(labels(pid="2"))


def test_programs_are_dealt_out_evenly_and_stay_with_their_worker() -> None:
    r = workers.Router(3)
    first = [r.pick(f"p{i}") for i in range(6)]
    assert sorted(first) == [0, 0, 1, 1, 2, 2]
    assert [r.pick(f"p{i}") for i in range(6)] == first


def test_a_busy_worker_hands_its_programs_on_and_the_other_learns_them() -> None:
    r = workers.Router(2)
    w = r.pick("p")
    r.taken(w, workers.SPILL - 1)
    assert r.pick("p") == w, "a little busier: still the worker that knows it"
    r.taken(w, 1)
    assert r.pick("p") == 1 - w, f"{workers.SPILL} more in hand: the other worker"
    r.done(w, workers.SPILL)
    r.taken(1 - w, 1)
    assert r.pick("p") == w, "both know it now: the less busy"
    r.done(1 - w, 1)
    r.taken(w, 1)
    assert r.pick("p") == 1 - w


def test_each_programs_frames_are_learned_and_sent_once() -> None:
    pool = workers.Workers(2, DEFAULT_LIMITS)
    try:
        reqs = requests(12, programs=3)
        sent: list[int] = []
        for req in reqs:   # one at a time: none busy, each to its program's worker
            prepared, _ = pool.prepare(req, time.time_ns())
            sent += [f for x in prepared for f in x.rows.new_frames]
        assert len(sent) > 100
        assert len(sent) == len(set(sent)), "a frame sent by two workers"
        assert sorted(pool.router._programs) == [1, 2]
    finally:
        pool.close()


def test_a_request_split_by_program_comes_back_whole_and_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reqs = requests(9, seed=5, programs=3)
    batch = series_of(reqs)
    # a series of two profiles, as an agent's spool holds them
    batch.series[4].samples.extend(requests(1, seed=9, programs=1)[0].series[0].samples)
    pool = workers.Workers(2, DEFAULT_LIMITS)
    parts: list[tuple[int, list[int] | None]] = []
    submit = pool._submit

    def seen(w: int, data: bytes, numbers: list[int] | None, *args: Any) -> Any:
        parts.append((w, numbers))
        return submit(w, data, numbers, *args)
    monkeypatch.setattr(pool, "_submit", seen)
    try:
        prepared, _ = pool.prepare(batch, time.time_ns())
        assert pool.router.busy == [0, 0]
    finally:
        pool.close()
    assert sorted(w for w, _ in parts) == [0, 1], "one part for each worker"
    assert sorted(i for _, numbers in parts for i in numbers or []) == list(range(9))
    mine = check_request(batch, DEFAULT_LIMITS, time.time_ns())
    assert len(mine) == 10
    assert [x.profile.profile_id for x in prepared] == [sp.profile_id for sp in mine]
    assert [x.profile.series_labels for x in prepared] == [sp.series_labels for sp in mine]
    store = Store(":memory:")
    store.write([x.profile for x in prepared], [(x.shape, x.rows) for x in prepared])
    assert contents(store) == contents(by_the_collector([batch]))


def test_a_split_request_with_a_bad_series_is_refused_whole_and_named() -> None:
    reqs = requests(6, seed=6, programs=3)
    for i in (4, 5):   # (in two workers' parts: the lower is named)
        reqs[i].series[0].samples[0].raw_profile = b"\x1f\x8b not gzip"
    batch = series_of(reqs)
    pool = workers.Workers(2, DEFAULT_LIMITS)
    try:
        with pytest.raises(InvalidRequest, match=r"^series 4 sample 0: "):
            pool.prepare(batch, time.time_ns())
        assert pool.router.busy == [0, 0]
    finally:
        pool.close()
    with pytest.raises(InvalidRequest, match=r"^series 4 sample 0: "):
        check_request(batch, DEFAULT_LIMITS, time.time_ns())


def test_ready_asks_every_worker_and_starts_a_dead_one_again() -> None:
    pool = workers.Workers(2, DEFAULT_LIMITS)
    try:
        assert pool.ready(60)
        (pid,) = list(pool._pools[1]._processes)  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGKILL)
        assert pool.ready(60)
        assert list(pool._pools[1]._processes) != [pid]  # type: ignore[attr-defined]
        assert pool.router.busy == [0, 0]
    finally:
        pool.close()


def test_a_worker_does_not_load_duckdb() -> None:
    """A decode worker imports what ``prepare`` needs, and DuckDB (22 MB of
    each worker's memory) is not among it: the store is the collector's."""
    out = subprocess.run([sys.executable, "-c", "import sys, ember.collector.workers; "
                          "print(sorted(m for m in sys.modules if m.split('.')[0] == 'duckdb' "
                          "or m in ('ember.collector.store', 'ember.collector.tables')))"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
