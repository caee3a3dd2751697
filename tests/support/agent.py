"""Agents running in the test process, on the real kernel."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ember import config
from ember.agent.controller import Agent
from ember.agent.memory import rss_bytes
from ember.config import AgentConfig, Targets


@contextmanager
def running_agent(cfg: AgentConfig) -> Iterator[Agent]:
    agent = Agent(cfg)
    agent.start()
    stop, reload = threading.Event(), threading.Event()
    t = threading.Thread(target=agent.run, args=(stop, reload))
    t.start()
    try:
        yield agent
    finally:
        stop.set()
        t.join(timeout=60)


def agent_cfg(tmp_path: Path, port: int, pid: int, **kw: object) -> AgentConfig:
    # In this process the governor measures the test run's RSS too (over
    # 200 MiB late in the suite): the default limit on top of that, or it
    # would empty every cache after every drain.
    settings: dict[str, object] = {
        "collector": f"127.0.0.1:{port}", "interval": 1.0, "frequency": 499,
        "metrics_listen": "127.0.0.1:0", "spool_dir": str(tmp_path / "spool"),
        "targets": Targets(pids=(pid,)), "max_backoff": 1.0,
        "memory_limit": rss_bytes() + AgentConfig().memory_limit}
    return config.override(AgentConfig(), **{**settings, **kw})
