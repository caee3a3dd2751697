"""The real agent's shipping path when its spool holds an entry it cannot
read and its collector is away: the entry is quarantined and counted,
shipping goes on, and /healthz says profiles are not leaving the host
until they do."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ember.agent.controller import SHIP_STALL_MIN
from tests.support.agent import agent_cfg, running_agent
from tests.support.collector import collector_at
from tests.support.net import free_port

pytestmark = pytest.mark.bpf


def healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_unreadable_entry_quarantined_and_a_stall_reported(start_workload, tmp_path: Path  # type: ignore[no-untyped-def]
                                                           ) -> None:
    w = start_workload("cpu_shares", SHIP_STALL_MIN + 60)
    port = free_port()
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    bad = spool_dir / "00000000000000000001-1-000000.writeraw"
    bad.mkdir()  # a directory where a request should be: unreadable
    cfg = agent_cfg(tmp_path, port, w.pid, offcpu=False)
    with running_agent(cfg) as agent:
        http = agent._http.server_address[1]  # type: ignore[union-attr]
        spool = agent.exporters["writeraw"].spool
        deadline = time.monotonic() + 10
        while spool.quarantined == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (spool_dir / "quarantine" / bad.name).is_dir() and not bad.exists()
        assert agent.metrics.spool_quarantined.labels("writeraw")._value.get() == 1
        # nobody answers: after SHIP_STALL_MIN the agent says so, and stays alive
        time.sleep(SHIP_STALL_MIN + 3)
        code, body = healthz(http)
        assert code == 503 and "the oldest spooled request has waited" in body, body
        assert "UNAVAILABLE" in body
        assert agent.liveness() == [] and agent.exporters["writeraw"].shipper.alive()
        c = collector_at(tmp_path, port)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (spool.stats()[0] or healthz(http)[0] != 200):
                time.sleep(0.2)
            assert spool.stats()[0] == 0 and healthz(http) == (200, "ok\n")
            assert c.store.count() > SHIP_STALL_MIN / cfg.interval / 2
        finally:
            c.close()
