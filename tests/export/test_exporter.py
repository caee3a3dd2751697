"""An exporter per wire: profiles encoded into its requests and spooled,
what a full spool drops counted on that wire's metrics."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from ember.config import AgentConfig
from ember.encode import otlp, writeraw
from ember.export.exporter import exporters
from ember.metrics import AgentMetrics
from tests.support.profiles import cpu_profile


def labelled(pid: int):  # type: ignore[no-untyped-def]
    return replace(cpu_profile(), labels={"__name__": "ember_cpu", "pid": str(pid)})


def test_each_wire_spools_its_own_requests(tmp_path: Path) -> None:
    cfg = AgentConfig(spool_dir=str(tmp_path / "spool"), exporters=("writeraw", "otlp"))
    out = exporters(cfg, AgentMetrics(CollectorRegistry()))
    assert list(out) == ["writeraw", "otlp"]
    assert out["otlp"].spool.dir == tmp_path / "spool" / "otlp"
    for e in out.values():
        e.export([labelled(1), labelled(2)])
    wr_entry, ot_entry = out["writeraw"].spool.oldest(), out["otlp"].spool.oldest()
    assert wr_entry is not None and ot_entry is not None
    wr, ot = wr_entry.data, ot_entry.data
    assert writeraw.profiles_in(wr) == 2
    assert otlp.profiles_in(ot) == 2 * len(cpu_profile().type.sample_types)


def test_a_full_spool_counts_what_it_drops(tmp_path: Path) -> None:
    metrics = AgentMetrics(CollectorRegistry())
    cfg = AgentConfig(spool_dir=str(tmp_path), spool_max_size=1 << 20)
    e = exporters(cfg, metrics)["writeraw"]
    e.spool.max_bytes = 1  # every new request pushes the older ones out
    for pid in range(3):
        e.export([labelled(pid)])
    assert e.spool.stats()[0] == 1
    assert metrics.spool_dropped._value.get() == 2  # profiles
    assert metrics.spool_dropped_bytes._value.get() > 0
