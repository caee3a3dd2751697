"""A fleet against one real collector: 100 agents' shipping paths, flushing
together every second for 60 s, lose nothing to the collector's concurrency
limit (calls past it are answered RESOURCE_EXHAUSTED, which the shipper
used to take as final and delete the request). The limit is set to 4 so
that four sender processes sharing a 2-core machine with the collector
reach it for sure, as 100 hosts reach the default 64."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
SENDERS, PROCESSES, SECONDS = 100, 4, 60


@pytest.mark.slow
def test_a_hundred_senders_for_a_minute_lose_nothing(tmp_path: Path) -> None:
    grpc_port, http_port = free_port(), free_port()
    (tmp_path / "ember.yaml").write_text("collector:\n  max_concurrent_writes: 4\n")
    collector = subprocess.Popen(
        [sys.executable, "-m", "ember.cli", "collector", "--config",
         str(tmp_path / "ember.yaml"), "--grpc-listen",
         f"127.0.0.1:{grpc_port}", "--http-listen", f"127.0.0.1:{http_port}",
         "--storage", str(tmp_path / "db.sqlite")],
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        per = SENDERS // PROCESSES
        fleets = [subprocess.Popen(
            [sys.executable, "-m", "tests.support.fleet", f"127.0.0.1:{grpc_port}",
             str(tmp_path / f"fleet{p}"), str(per), str(SECONDS), str(1 + p * 10_000_000)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True) for p in range(PROCESSES)]
        results = []
        for f in fleets:
            out, _ = f.communicate(timeout=SECONDS + 240)
            assert f.returncode == 0
            results.append(json.loads(out.strip().splitlines()[-1]))
        put = sum(r["put"] for r in results)
        sent = sum(r["sent"] for r in results)
        assert put >= SENDERS * (SECONDS - 2)
        assert sum(r["dropped"] for r in results) == 0
        assert sum(r["left"] for r in results) == 0
        assert sent == put
        refused = sum(r["refused_for_load"] for r in results)
        assert refused > 0, "the collector's limit was never reached: the test shows nothing"
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics",
                                         timeout=10).read().decode()
        stored = next(float(line.split()[-1]) for line in metrics.splitlines()
                      if line.startswith("ember_collector_profiles_stored_total "))
        assert stored == put
        print(f"{put} profiles from {SENDERS} senders in {SECONDS}s; refused for load "
              f"{refused:.0f} times, all retried")
    finally:
        collector.terminate()
        collector.wait(timeout=30)
