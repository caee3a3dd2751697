"""The Pyroscope push encoder: names, service_name, labels, pprof, batching
and splitting; and how the pyroscope wire authenticates."""

from __future__ import annotations

import base64
import gzip
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ember.config import AgentConfig
from ember.encode import pyroscope
from ember.export.exporter import endpoint, exporters
from ember.export.shipper import WIRES, Endpoint
from ember.metrics import AgentMetrics
from ember.model import PROFILE_KINDS, Profile
from ember.proto import profile_pb2 as pb
from ember.proto import pyroscope_push_pb2 as push
from tests.support.profiles import cpu_profile, offcpu_profile


def labelled(p: Profile, **labels: str) -> Profile:
    return replace(p, labels={"__name__": f"ember_{p.type.name}", "pid": "10", **labels})


@pytest.mark.parametrize(("labels", "expected"), [
    ({"service_name": "checkout", "comm": "app", "namespace": "a", "container": "b"},
     "checkout"),
    ({"comm": "app", "namespace": "shop", "container": "cart"}, "shop/cart"),
    ({"comm": "app", "namespace": "shop"}, "app"),
    ({}, "unspecified"),
])
def test_service_name(labels: dict[str, str], expected: str) -> None:
    assert pyroscope.service_name(labels) == expected


def test_profile_names() -> None:
    names = {k.name: pyroscope.profile_name(labelled(replace(cpu_profile(), type=replace(
        cpu_profile().type, name=k.name)))) for k in PROFILE_KINDS}
    assert names == {"cpu": "process_cpu", "offcpu": "off_cpu", "runqlat": "ember_runqlat",
                     "wakeup": "ember_wakeup", "offwake": "ember_offwake"}


def test_series_carries_sorted_labels_and_the_pprof() -> None:
    p = labelled(cpu_profile(), comm="app", host="node-1")
    series = pyroscope.make_series(p)
    labels = [(lb.name, lb.value) for lb in series.labels]
    assert labels == sorted(labels)
    assert dict(labels) == {"__name__": "process_cpu", "comm": "app", "host": "node-1",
                            "pid": "10", "service_name": "app"}
    (sample,) = series.samples
    assert uuid.UUID(sample.ID).version == 4
    prof = pb.Profile.FromString(gzip.decompress(sample.raw_profile))
    s = prof.string_table
    assert [(s[t.type], s[t.unit]) for t in prof.sample_type] == [("samples", "count"),
                                                                  ("cpu", "nanoseconds")]
    assert (s[prof.period_type.type], s[prof.period_type.unit]) == ("cpu", "nanoseconds")
    assert sum(x.value[1] for x in prof.sample) == p.total(1)
    assert "main" in s


def test_batching_and_splitting() -> None:
    profiles = [labelled(cpu_profile(), comm=f"app{i}") for i in range(4)]
    one = pyroscope.encode_requests(profiles, 1 << 20)
    assert len(one) == 1 and pyroscope.profiles_in(one[0]) == 4
    small = pyroscope.encode_requests(profiles, 10)
    assert len(small) == 4 and all(pyroscope.profiles_in(r) == 1 for r in small)
    halves = pyroscope.split(one[0])
    assert [pyroscope.profiles_in(h) for h in halves] == [2, 2]
    names = [lb.value for h in halves for s in push.PushRequest.FromString(h).series
             for lb in s.labels if lb.name == "service_name"]
    assert names == ["app0", "app1", "app2", "app3"]
    assert pyroscope.split(small[0]) == [small[0]]
    assert pyroscope.profiles_in(b"\xff not a request") == 0


def test_off_cpu_keeps_nanoseconds_of_blocked_time() -> None:
    p = labelled(offcpu_profile(), comm="app")
    (sample,) = pyroscope.make_series(p).samples
    prof = pb.Profile.FromString(gzip.decompress(sample.raw_profile))
    s = prof.string_table
    assert [(s[t.type], s[t.unit]) for t in prof.sample_type][-1] == ("off_cpu", "nanoseconds")
    assert sum(x.value[-1] for x in prof.sample) == 40_000_123 + 2_500


def test_credentials() -> None:
    assert Endpoint("x").metadata() is None
    assert Endpoint("x", token="t").metadata() == [("authorization", "Bearer t")]
    basic = Endpoint("x", token="glc_key", username="123456", tenant="t1").metadata()
    assert basic == [("authorization", "Basic " + base64.b64encode(b"123456:glc_key").decode()),
                     ("x-scope-orgid", "t1")]


def test_pyroscope_settings_and_spool(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("glc_key\n")
    cfg = AgentConfig(spool_dir=str(tmp_path / "spool"), exporters=("pyroscope",),
                      pyroscope_endpoint="pyro:4040", pyroscope_token_file=str(token),
                      pyroscope_basic_auth_user="123456", pyroscope_tenant_id="t1")
    ep = endpoint(cfg, "pyroscope")
    assert (ep.address, ep.token, ep.username, ep.tenant) == ("pyro:4040", "glc_key", "123456",
                                                              "t1")
    assert endpoint(cfg, "writeraw").address == cfg.collector
    out = exporters(cfg, AgentMetrics(CollectorRegistry()))
    assert out["pyroscope"].wire is WIRES["pyroscope"]
    assert out["pyroscope"].spool.dir == tmp_path / "spool" / "pyroscope"
    out["pyroscope"].export([labelled(cpu_profile()), labelled(offcpu_profile())])
    entry = out["pyroscope"].spool.oldest()
    assert entry is not None and pyroscope.profiles_in(entry.data) == 2
