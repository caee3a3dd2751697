"""SIGHUP on a real agent (its own process, real signals): a config file that
does not load is reported as FILE:LINE and the agent keeps running on what it
had; a good one is applied by the next SIGHUP."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.collector import collector_at
from tests.support.net import free_port

pytestmark = pytest.mark.bpf

EMBER = ROOT / ".venv/bin/ember"


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def wait_for(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_sighup_with_a_bad_config_keeps_the_running_one(tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    collector = collector_at(tmp_path, port)
    cfg, log = tmp_path / "ember.yaml", tmp_path / "agent.log"
    base = (f"agent:\n  collector: 127.0.0.1:{port}\n  interval: 1s\n"
            f"  metrics_listen: 127.0.0.1:{metrics_port}\n"
            f"  spool_dir: {tmp_path / 'spool'}\n"
            f"  targets:\n    pids: [{os.getpid()}]\n")
    cfg.write_text(base)
    with log.open("w") as err:
        agent = subprocess.Popen([str(EMBER), "agent", "--config", str(cfg)], stderr=err,
                                 stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{metrics_port}"
    try:
        wait_for(lambda: status(f"{url}/readyz") == 200, 120, "the agent to attach")

        cfg.write_text(base + "  include_self: !foo true\n")  # line 8
        agent.send_signal(signal.SIGHUP)
        wait_for(lambda: "keeping the running configuration" in log.read_text(), 10,
                 "the reload to be refused")
        time.sleep(3)
        assert agent.poll() is None, log.read_text()
        assert status(f"{url}/healthz") == 200
        refused = [line for line in log.read_text().splitlines() if "keeping the running" in line]
        assert refused == [f"SIGHUP: keeping the running configuration: {cfg}:8: "
                           "agent.include_self: unsupported YAML tag !foo"], log.read_text()
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert re.search(r'^ember_errors_total\{reason="config"\} 1\.0$', metrics, re.M)

        cfg.write_text(base + "  labels: {reloaded: 'yes'}\n")
        agent.send_signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP: configuration reloaded" in log.read_text(), 10,
                 "the good config to be applied")
        assert agent.poll() is None and status(f"{url}/healthz") == 200
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=60)
        finally:
            if agent.poll() is None:
                agent.kill()
            collector.close()
    assert agent.returncode == 0, log.read_text()
