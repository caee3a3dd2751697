"""Rows made by decode workers (collector/workers.py) store exactly what the
collector stores reading the requests itself, and a worker that already
sent a frame or stack for a write that failed does not leave it out."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from ember.agent.labels import ProcessLabels, series_labels
from ember.collector import workers
from ember.collector.store import Store
from ember.collector.validate import DEFAULT_LIMITS, check_request
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


def requests(n: int, seed: int = 4) -> list[ps.WriteRawRequest]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prof = fleet_profile(rng)
        labels = series_labels(prof.type, ProcessLabels(pid=10 + i % 3, comm="svc"),
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


def by_a_worker(reqs: list[ps.WriteRawRequest], store: Store | None = None) -> Store:
    store = store or Store(":memory:")
    for r in reqs:
        prepared, _ = workers.prepare(r.SerializeToString(), DEFAULT_LIMITS, time.time_ns())
        store.write([x.profile for x in prepared], [(x.shape, x.rows) for x in prepared])
    return store


def test_rows_a_worker_made_are_what_the_collector_stores() -> None:
    reqs = requests(6)
    mine, theirs = by_the_collector(reqs), by_a_worker(reqs)
    assert sum(len(rows) for rows in contents(mine).values()) > 100
    assert contents(mine) == contents(theirs)


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


def test_a_worker_that_dies_is_replaced() -> None:
    pool = workers.Workers(1, DEFAULT_LIMITS)
    try:
        (req,) = requests(1)
        first, _ = pool.prepare(req, time.time_ns())
        (pid,) = list(pool._pool._processes)  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGKILL)
        again, _ = pool.prepare(req, time.time_ns())
        assert [x.profile for x in again] == [x.profile for x in first]
        assert list(pool._pool._processes) != [pid]  # type: ignore[attr-defined]
    finally:
        pool.close()


def test_the_pool_starts_its_processes_before_the_first_request() -> None:
    pool = workers.Workers(2, DEFAULT_LIMITS)
    try:
        processes = pool._pool._processes  # type: ignore[attr-defined]
        assert wait_for(lambda: len(processes) == 2 and all(
            p.is_alive() for p in processes.values()), timeout=60), processes
    finally:
        pool.close()
