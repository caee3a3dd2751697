"""Writes that wait for one another are stored in one transaction, each
with its own answer, and a failed transaction fails each of its writes
(none is half stored)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ember.collector import store as store_module
from ember.collector.rows import Queue
from ember.collector.store import Store, StoredProfile
from ember.collector.validate import DEFAULT_LIMITS, check_request
from ember.errors import StorageError
from ember.proto import profilestore_pb2 as ps
from tests.support.collector import series
from tests.support.waits import wait_for


def profiles(n: int, tag: str) -> list[StoredProfile]:
    (sp,) = check_request(ps.WriteRawRequest(series=[series(10)]), DEFAULT_LIMITS,
                          time.time_ns())
    return [replace(sp, profile_id=f"{tag}-{i}", time_ns=sp.time_ns + i) for i in range(n)]


def queued_writes(store: Store, writes: list[list[StoredProfile]]
                  ) -> tuple[list[object], list[BaseException | None]]:
    """Each write from its own thread, all queued while the store is busy
    (its lock held here), then let go: (answers, errors) by write."""
    answers: list[object] = [None] * len(writes)
    errors: list[BaseException | None] = [None] * len(writes)

    def run(i: int) -> None:
        try:
            answers[i] = store.write(writes[i])
        except BaseException as exc:
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(writes))]
    with store._lock:
        for t in threads:
            t.start()
        assert wait_for(lambda: len(store._queue) == len(writes))
    for t in threads:
        t.join(30)
    return answers, errors


def test_queued_writes_go_in_one_transaction_each_with_its_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(":memory:")
    commits = []
    real = store._commit
    monkeypatch.setattr(store, "_commit", lambda *a: (commits.append(1), real(*a))[1])
    shared = profiles(1, "shared")
    writes = [profiles(3, f"w{i}") + shared for i in range(8)]
    answers, errors = queued_writes(store, writes)
    assert errors == [None] * 8
    assert len(commits) == 1
    assert store.count() == 8 * 3 + 1
    assert sorted(answers) == [(3, 1)] * 7 + [(4, 0)]  # the shared one stored once


def counted_commits(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of writes in each transaction, as it commits."""
    sizes: list[int] = []
    real = store._write
    monkeypatch.setattr(store, "_write", lambda batch: (sizes.append(len(batch)), real(batch))[1])
    return sizes


def test_under_load_the_writer_waits_for_more_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a transaction of several writes (writes are overlapping), the
    next writer waits up to LINGER_S for BATCH writes: three writes sent
    0.2 s apart go in one transaction."""
    monkeypatch.setattr(Queue, "LINGER_S", 60.0)
    monkeypatch.setattr(Queue, "BATCH", 3)
    store = Store(":memory:")
    sizes = counted_commits(store, monkeypatch)
    queued_writes(store, [profiles(1, f"first{i}") for i in range(2)])
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            store.write(profiles(1, f"late{i}"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
        time.sleep(0.2)
    for t in threads:
        t.join(60)
    assert not errors
    assert sizes == [2, 3]
    assert store.count() == 5


def test_a_lone_writer_never_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes one after another are each their own transaction, at once:
    with a linger of a minute, ten of them take well under one."""
    monkeypatch.setattr(Queue, "LINGER_S", 60.0)
    store = Store(":memory:")
    sizes = counted_commits(store, monkeypatch)
    began = time.monotonic()
    for i in range(10):
        assert store.write(profiles(1, f"w{i}")) == (1, 0)
    assert time.monotonic() - began < 60
    assert sizes == [1] * 10


def test_a_failed_transaction_fails_each_write_and_stores_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(":memory:")
    real = store._commit

    def fail_once(*a: object) -> None:
        monkeypatch.setattr(store, "_commit", real)
        raise StorageError("disk said no")

    monkeypatch.setattr(store, "_commit", fail_once)
    writes = [profiles(2, f"w{i}") for i in range(5)]
    _, errors = queued_writes(store, writes)
    assert all(isinstance(e, StorageError) for e in errors), errors
    assert store.count() == 0
    assert store.write(writes[0]) == (2, 0)  # the retry


def test_a_batch_with_profiles_stored_before_stores_the_others_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids already stored are found by the insert (then looked up and the
    batch written again without them): each write says what it stored,
    and every sample row is there once."""
    store = Store(":memory:")
    old = profiles(3, "old")
    assert store.write(old) == (3, 0)
    rows_before = store._db.execute("SELECT COUNT(*) FROM samples").fetchone()
    commits = []
    real = store._commit
    monkeypatch.setattr(store, "_commit", lambda *a: (commits.append(1), real(*a))[1])
    writes = [profiles(2, "new-a") + old[:1], old[1:], profiles(1, "new-b")]
    answers, errors = queued_writes(store, writes)
    assert errors == [None] * 3
    assert answers == [(2, 1), (0, 2), (1, 0)]
    assert len(commits) == 2   # the first found the stored ids, the second wrote
    assert store.count() == 6
    per_profile = rows_before[0] // 3 if rows_before else 0
    assert store._db.execute("SELECT COUNT(*) FROM samples").fetchone() == (6 * per_profile,)
    assert store.write(profiles(2, "new-a")) == (0, 2)


def test_the_size_between_measures_is_never_below_the_store_s(tmp_path: Path) -> None:
    """size_bytes measures at most once a second (every write asks); in
    between it adds the most each write can have added, so a write over
    the size limit is still seen as one."""
    store = Store(tmp_path / "s.duckdb")
    for i in range(30):
        store.write(profiles(5, f"w{i}"))
        estimate = store.size_bytes()
        with store._lock:
            assert estimate >= store._size(), i
    assert store._grown > 0   # (the estimate was used, not a measure each time)


def test_asking_the_size_does_not_wait_for_the_lock(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each write asks the size before it queues: one that waited for the
    lock to measure it waited for a transaction more. Asked while a write
    holds the lock, the size is the estimate, at once and not below the
    store's; asked when it is free, it is measured."""
    store = Store(tmp_path / "s.duckdb")
    store.write(profiles(5, "a"))
    monkeypatch.setattr(store_module, "SIZE_FRESH_S", 0.0)   # (every ask would measure)
    with store._lock:
        before = store._size()
        got: list[int] = []
        t = threading.Thread(target=lambda: got.append(store.size_bytes()))
        t.start()
        t.join(5)
        assert got and got[0] >= before, "the size was not answered while the lock was held"
    grown = store._grown
    store.size_bytes()
    assert store._grown == 0 <= grown, "asked with the lock free, the size was not measured"
