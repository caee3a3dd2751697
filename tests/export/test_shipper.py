"""Shipping through the spool to a real collector: nothing lost while it is
down, nothing stored twice when an acknowledgement is lost."""

from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from ember.collector.server import STORAGE_RETRY_AFTER, Collector, _Servicer
from ember.config import CollectorConfig
from ember.errors import StorageFull
from ember.export.exporter import flush_jitter
from ember.export.shipper import Endpoint, Shipper, Verdict, verdict
from ember.export.spool import Spool
from ember.metrics import AgentMetrics
from ember.proto import profile_pb2 as pb
from ember.proto import profilestore_pb2 as ps
from tests.support.collector import collector_at, series
from tests.support.net import free_port
from tests.support.waits import wait_for


def test_collector_down_then_up(tmp_path: Path) -> None:
    port = free_port()
    spool = Spool(tmp_path / "spool", 1 << 20)
    metrics = AgentMetrics(CollectorRegistry())
    shipper = Shipper(spool, Endpoint(f"127.0.0.1:{port}", timeout=1), metrics,
                      max_backoff=0.3, base_backoff=0.05)
    shipper.start()
    try:
        for i in range(5):
            spool.put(ps.WriteRawRequest(series=[series(100 + i)]).SerializeToString())
        time.sleep(1)
        assert spool.stats()[0] == 5  # nobody to send to: all kept
        assert metrics.send_failures.labels("unavailable")._value.get() > 0
        c = collector_at(tmp_path, port)
        try:
            assert wait_for(lambda: spool.stats()[0] == 0)
            assert c.store.count() == 5 and shipper.sent == 5
        finally:
            c.close()
    finally:
        shipper.stop()


def test_a_long_outage_ends_within_the_shippers_backoff(tmp_path: Path) -> None:
    """After 20 s of refused connections gRPC's own reconnect backoff, left
    at its default, would not try again for several more seconds (up to two
    minutes after longer outages): the shipper's ceiling bounds it."""
    port = free_port()
    spool = Spool(tmp_path / "spool", 1 << 20)
    shipper = Shipper(spool, Endpoint(f"127.0.0.1:{port}", timeout=1),
                      AgentMetrics(CollectorRegistry()), max_backoff=0.3, base_backoff=0.05)
    shipper.start()
    try:
        spool.put(ps.WriteRawRequest(series=[series(100)]).SerializeToString())
        time.sleep(20)
        assert spool.stats()[0] == 1
        c = collector_at(tmp_path, port)
        try:
            up = time.monotonic()
            assert wait_for(lambda: spool.stats()[0] == 0, timeout=10)
            # one backoff (0.3 s) and one connection; a default channel waits 3-8 s more
            assert time.monotonic() - up < 2.5
        finally:
            c.close()
    finally:
        shipper.stop()


def test_a_new_ceiling_opens_a_new_channel(tmp_path: Path) -> None:
    """A reload's max_backoff reaches gRPC's reconnect backoff, which a
    channel fixes when it opens: the next send opens another."""
    ep = Endpoint(f"127.0.0.1:{free_port()}", timeout=1)
    shipper = Shipper(Spool(tmp_path / "spool", 1 << 20), ep, AgentMetrics(CollectorRegistry()),
                      max_backoff=60)
    first = shipper._stub_for()[0]
    shipper.set_endpoint(ep, 60)
    assert shipper._stub_for()[0] is first
    shipper.set_endpoint(ep, 5)
    assert shipper.max_backoff == 5 and shipper._stub_for()[0] is not first
    shipper._close_channel()


def test_lost_acknowledgement_stored_once(tmp_path: Path, monkeypatch: object) -> None:
    """The collector stores the request but the agent sees a failure: the
    re-send carries the same profile ids and is stored once."""
    calls = {"n": 0}
    original = _Servicer.WriteRaw

    def flaky(self: _Servicer, request: ps.WriteRawRequest, context: object) -> object:
        calls["n"] += 1
        response = original(self, request, context)
        if calls["n"] == 1:
            context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")  # type: ignore[attr-defined]
        return response

    monkeypatch.setattr(_Servicer, "WriteRaw", flaky)  # type: ignore[attr-defined]
    c = Collector(CollectorConfig(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0",
                                  storage=str(tmp_path / "db.sqlite")))
    c.start()
    spool = Spool(tmp_path / "spool", 1 << 20)
    shipper = Shipper(spool, Endpoint(f"127.0.0.1:{c.grpc_port}", timeout=5),
                      AgentMetrics(CollectorRegistry()), max_backoff=0.2, base_backoff=0.05)
    try:
        spool.put(ps.WriteRawRequest(series=[series(1), series(2)]).SerializeToString())
        shipper.start()
        assert wait_for(lambda: spool.stats()[0] == 0)
        assert calls["n"] == 2
        assert c.store.count() == 2
        assert c.metrics.duplicates._value.get() == 2
    finally:
        shipper.stop()
        c.close()


def test_permanent_rejection_is_dropped_and_counted(tmp_path: Path) -> None:
    c = Collector(CollectorConfig(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0",
                                  storage=str(tmp_path / "db.sqlite")))
    c.start()
    spool = Spool(tmp_path / "spool", 1 << 20)
    metrics = AgentMetrics(CollectorRegistry())
    shipper = Shipper(spool, Endpoint(f"127.0.0.1:{c.grpc_port}"), metrics)
    try:
        bad = series()
        bad.samples[0].raw_profile = b"not a profile"
        spool.put(ps.WriteRawRequest(series=[bad]).SerializeToString())
        spool.put(ps.WriteRawRequest(series=[series()]).SerializeToString())
        shipper.start()
        assert wait_for(lambda: spool.stats()[0] == 0)
        assert metrics.spool_dropped._value.get() == 1
        assert c.store.count() == 1  # the good one behind it was not blocked
    finally:
        shipper.stop()
        c.close()


@pytest.mark.parametrize(("code", "details", "expected"), [
    (grpc.StatusCode.INVALID_ARGUMENT, "series 0: bad", Verdict.DROP),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded", Verdict.RETRY),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (9 vs. 8)",
     Verdict.SPLIT),
    (grpc.StatusCode.UNAVAILABLE, "collector cannot store now", Verdict.RETRY),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "", Verdict.RETRY),
    (grpc.StatusCode.INTERNAL, "store failed", Verdict.RETRY),
    (grpc.StatusCode.UNAUTHENTICATED, "wrong token", Verdict.RETRY),
])
def test_retry_by_meaning(code: grpc.StatusCode, details: str, expected: Verdict) -> None:
    assert verdict(code, details) is expected


def _collector(tmp_path: Path, **kw: object) -> Collector:
    c = Collector(CollectorConfig(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0",
                                  storage=str(tmp_path / "db.sqlite"), **kw))  # type: ignore[arg-type]
    c.start()
    return c


def test_overload_is_retried_until_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """A collector serving one write at a time, slowly, and 12 agents at
    once: most calls are refused for load, and every profile is stored."""
    c = _collector(tmp_path, max_concurrent_writes=1)
    write = c.store.write

    def slow(profiles: object, made: object = ()) -> tuple[int, int]:
        time.sleep(0.05)
        return write(profiles, made)  # type: ignore[arg-type]

    monkeypatch.setattr(c.store, "write", slow)
    agents = []
    try:
        for a in range(12):
            spool = Spool(tmp_path / f"spool{a}", 1 << 20)
            for i in range(3):
                spool.put(ps.WriteRawRequest(series=[series(1000 * a + i)]).SerializeToString())
            metrics = AgentMetrics(CollectorRegistry())
            shipper = Shipper(spool, Endpoint(f"127.0.0.1:{c.grpc_port}"), metrics,
                              max_backoff=0.5, base_backoff=0.05)
            agents.append((spool, metrics, shipper))
        for _, _, shipper in agents:
            shipper.start()
        assert wait_for(lambda: all(s.stats()[0] == 0 for s, _, _ in agents), 60)
        assert c.store.count() == 36
        refused = sum(m.send_failures.labels("resource_exhausted")._value.get()
                      for _, m, _ in agents)
        assert refused > 0  # the limit was hit, and nothing was dropped for it
        # the collector counted each refusal gRPC made for it
        assert c.metrics.requests.labels("resource_exhausted")._value.get() == refused
        assert sum(m.spool_dropped._value.get() for _, m, _ in agents) == 0
    finally:
        for _, _, shipper in agents:
            shipper.stop()
        c.close()


def _padded(pid: int, pad: int) -> ps.RawProfileSeries:
    """A series whose profile carries ``pad`` bytes of incompressible comment."""
    s = series(pid)
    prof = pb.Profile.FromString(gzip.decompress(s.samples[0].raw_profile))
    prof.comment.append(len(prof.string_table))
    prof.string_table.append(os.urandom(pad // 2).hex())
    s.samples[0].raw_profile = gzip.compress(prof.SerializeToString())
    return s


def test_too_large_is_split_by_profile_and_a_single_one_dropped(tmp_path: Path) -> None:
    c = _collector(tmp_path, max_request_size=1 << 16)
    spool = Spool(tmp_path / "spool", 1 << 22)
    metrics = AgentMetrics(CollectorRegistry())
    shipper = Shipper(spool, Endpoint(f"127.0.0.1:{c.grpc_port}"), metrics,
                      max_backoff=0.2, base_backoff=0.05)
    try:
        # two profiles of about 40 kB gzipped: too large together, fine apart
        spool.put(ps.WriteRawRequest(series=[_padded(1, 80_000), _padded(2, 80_000)])
                  .SerializeToString())
        spool.put(ps.WriteRawRequest(series=[_padded(3, 200_000)]).SerializeToString())
        spool.put(ps.WriteRawRequest(series=[series(4)]).SerializeToString())
        shipper.start()
        assert wait_for(lambda: spool.stats()[0] == 0)
        assert sorted(c.store.label_values("pid")) == ["1", "2", "4"]
        assert metrics.spool_dropped._value.get() == 1  # the single 100 kB one
    finally:
        shipper.stop()
        c.close()


def test_a_corrupt_entry_is_quarantined_and_the_thread_lives_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = _collector(tmp_path)
    spool = Spool(tmp_path / "spool", 1 << 20)
    metrics = AgentMetrics(CollectorRegistry())
    shipper = Shipper(spool, Endpoint(f"127.0.0.1:{c.grpc_port}"), metrics,
                      max_backoff=0.2, base_backoff=0.05)
    calls = {"n": 0}
    real = spool.oldest

    def failing_once(timeout: float | None = None) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a bug")
        return real(timeout)

    monkeypatch.setattr(spool, "oldest", failing_once)
    try:
        spool.put(b"\xff\xff\xff not a request")
        spool.put(ps.WriteRawRequest(series=[series(5)]).SerializeToString())
        shipper.start()
        assert wait_for(lambda: spool.stats()[0] == 0)
        assert shipper.alive() and c.store.count() == 1
        assert spool.quarantined == 1 and len(list((spool.dir / "quarantine").iterdir())) == 1
        assert metrics.send_failures.labels("exception")._value.get() == 1
        assert metrics.send_failures.labels("corrupt")._value.get() == 1
    finally:
        shipper.stop()
        c.close()


def test_a_full_store_refuses_with_a_retry_hint(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    c = _collector(tmp_path)

    def full(profiles: object, made: object = ()) -> tuple[int, int]:
        raise StorageFull("cannot store: the disk is full (database or disk is full)")

    monkeypatch.setattr(c.store, "write", full)
    spool = Spool(tmp_path / "spool", 1 << 20)
    metrics = AgentMetrics(CollectorRegistry())
    shipper = Shipper(spool, Endpoint(f"127.0.0.1:{c.grpc_port}"), metrics, max_backoff=1)
    try:
        spool.put(ps.WriteRawRequest(series=[series(6)]).SerializeToString())
        entry = spool.oldest()
        assert entry is not None and not shipper.send_one(entry)
        assert spool.stats()[0] == 1 and shipper.last_error == "UNAVAILABLE"
        assert all(shipper.backoff() >= STORAGE_RETRY_AFTER for _ in range(20))
        assert c.health().startswith("storage refuses writes")
        assert c.metrics.rejected.labels("storage_full")._value.get() == 1
        monkeypatch.undo()
        assert shipper.send_one(entry) and c.store.count() == 1
    finally:
        c.close()


def test_a_fresh_request_waits_its_jitter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """After idling, the shipper waits a random part of its jitter before
    sending, so agents whose drains line up reach the collector spread out;
    a backlog is sent without waiting again."""
    assert flush_jitter(10) == 1.0 and flush_jitter(3600) == 5.0
    c = _collector(tmp_path)
    spool = Spool(tmp_path / "spool", 1 << 20)
    shipper = Shipper(spool, Endpoint(f"127.0.0.1:{c.grpc_port}"),
                      AgentMetrics(CollectorRegistry()), jitter=0.4)
    waits: list[tuple[float, float]] = []
    monkeypatch.setattr("ember.export.shipper.random.uniform",
                        lambda a, b: waits.append((a, b)) or b)
    try:
        for i in range(3):
            spool.put(ps.WriteRawRequest(series=[series(20 + i)]).SerializeToString())
        start = time.monotonic()
        for _ in range(3):
            shipper.step()
        assert waits == [(0, 0.4)] and time.monotonic() - start >= 0.4
        assert c.store.count() == 3
    finally:
        c.close()
