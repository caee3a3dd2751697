"""Collectors on loopback and what agents would send them."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from ember.agent.labels import ProcessLabels, series_labels
from ember.collector.server import Collector
from ember.config import CollectorConfig
from ember.encode.writeraw import make_series
from ember.proto import profilestore_pb2 as ps

from .profiles import cpu_profile, offcpu_profile


def series(pid: int = 10, kind: str = "cpu") -> ps.RawProfileSeries:
    prof = cpu_profile() if kind == "cpu" else offcpu_profile()
    now = time.time_ns()
    labels = series_labels(prof.type, ProcessLabels(pid=pid, comm="app"), {"host": "h"})
    return make_series(replace(prof, start_ns=now - 10**9, duration_ns=10**9, labels=labels))[0]


def collector_at(tmp_path: Path, port: int) -> Collector:
    c = Collector(CollectorConfig(grpc_listen=f"127.0.0.1:{port}", http_listen="127.0.0.1:0",
                                  storage=str(tmp_path / "db.sqlite")))
    c.start()
    return c
