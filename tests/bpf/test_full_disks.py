"""Full disks on both sides, for a minute, with the real agent and collector:
the agent keeps profiling and holds in memory what its spool cannot write
(dropping the oldest past spool_memory_max, counted); the collector refuses
writes with a retryable status and keeps answering queries; when space
returns both recover by themselves, and every profile the agent built is
stored or counted as dropped."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ember.collector.server import Collector
from ember.config import CollectorConfig
from tests.support.agent import agent_cfg, running_agent
from tests.support.disks import fill, tiny_filesystem
from tests.support.net import free_port
from tests.support.waits import wait_for

pytestmark = pytest.mark.bpf

FULL_SECONDS = 60


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_full_disks_on_both_sides(start_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("cpu_shares", FULL_SECONDS + 90)
    port = free_port()
    # 16 MiB for the collector: SQLite's write-ahead log grows to 4 MB before
    # it is checkpointed, so a smaller disk fills again by the log alone when
    # the backlog arrives after space returns
    with tiny_filesystem(tmp_path / "collector", "16m") as cfs, \
            tiny_filesystem(tmp_path / "agent", "1m") as afs:
        c = Collector(CollectorConfig(grpc_listen=f"127.0.0.1:{port}",
                                      http_listen="127.0.0.1:0", storage=str(cfs / "db.sqlite")))
        c.start()
        try:
            cfg = agent_cfg(tmp_path, port, w.pid, spool_dir=str(afs / "spool"),
                            spool_memory_max=40_000, offcpu=False)
            with running_agent(cfg) as agent:
                assert wait_for(lambda: c.store.count() > 0, 30)  # stored while there is room
                collector_filler, agent_filler = fill(cfs), fill(afs)
                time.sleep(FULL_SECONDS)
                shipping = agent.metrics.shipping["writeraw"]
                # the agent: alive, profiling, holding, dropping the oldest past the ceiling
                assert agent.liveness() == []
                assert shipping.write_errors._value.get() > 0
                assert agent.exporters["writeraw"].spool.held_bytes() > 0
                assert agent.metrics.spool_dropped._value.get() > 0
                health = "\n".join(agent.health())
                assert "the spool cannot write (ENOSPC)" in health, health
                # the collector: refuses writes retryably, answers queries
                assert c.metrics.rejected.labels("storage_full")._value.get() > 0
                assert c.metrics.requests.labels("invalid_argument")._value.get() == 0
                code, body = get(f"http://127.0.0.1:{c.http_port}/healthz")
                assert code == 503 and "storage refuses writes" in body
                code, body = get(f"http://127.0.0.1:{c.http_port}/api/v1/profile?since=10m")
                assert code == 200 and "work_a" in body
                # space returns: everything waiting goes out
                collector_filler.unlink()
                agent_filler.unlink()
                spool = agent.exporters["writeraw"].spool
                assert wait_for(lambda: spool.stats()[0] == 0, 90), spool.stats()
                assert spool.last_write_error == ""
            built = sum(s.get() for s in _children(agent.metrics.profiles_built))
            sent = agent.metrics.profiles_sent._value.get()
            dropped = agent.metrics.spool_dropped._value.get()
            left = agent.exporters["writeraw"].spool.stats()[0]
            assert left == 0 and sent + dropped == built, (sent, dropped, built)
            assert c.metrics.profiles._value.get() == sent
            assert c.metrics.duplicates._value.get() == 0
            print(f"built {built:.0f}, stored {sent:.0f}, dropped {dropped:.0f} (counted)")
        finally:
            c.close()


def _children(counter: object) -> list[object]:
    """The values of a labelled counter's children."""
    return [child._value for child in counter._metrics.values()]  # type: ignore[attr-defined]
