"""Shipping through the spool to a real collector: nothing lost while it is
down, nothing stored twice when an acknowledgement is lost."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry

from ember.collector.server import Collector, _Servicer
from ember.config import CollectorConfig
from ember.export.shipper import Endpoint, Shipper
from ember.export.spool import Spool
from ember.metrics import AgentMetrics
from ember.proto import profilestore_pb2 as ps
from tests.support.collector import series
from tests.support.net import free_port


def wait_for(cond: object, timeout: float = 20) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


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
        c = Collector(CollectorConfig(grpc_listen=f"127.0.0.1:{port}", http_listen="127.0.0.1:0",
                                      storage=str(tmp_path / "db.sqlite")))
        c.start()
        try:
            assert wait_for(lambda: spool.stats()[0] == 0)
            assert c.store.count() == 5 and shipper.sent == 5
        finally:
            c.close()
    finally:
        shipper.stop()


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
