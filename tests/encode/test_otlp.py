"""OTLP export: what ember sends decodes, through opentelemetry-proto's own
messages and servicer, into the profiles it built."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from ember.encode.otlp import to_otlp
from ember.export.shipper import OTLP, Endpoint, Shipper
from ember.export.spool import Spool
from ember.metrics import AgentMetrics
from ember.model import OFFCPU_TYPE, Frame, FrameKind, Mapping, Profile, Sample, cpu_type
from tests.support.otlp import otlp_server, stacks

APP = Mapping(0x400000, 0x500000, 0, "/usr/bin/app", "ab" * 20)
LIBC = Mapping(0x7F0000000000, 0x7F0000200000, 0x28000, "/usr/lib/libc.so.6", "cd" * 20)


def frame(name: str, addr: int, m: Mapping = APP) -> Frame:
    return Frame(name, FrameKind.USER, m, addr)


def profiles() -> list[Profile]:
    cpu = cpu_type(99)
    p1 = [Sample((frame("main", 0x401000), frame("work_a", 0x401200)), (35, 35 * cpu.period),
                 42, 42, "app"),
          Sample((frame("main", 0x401000), frame("work_b", 0x401300),
                  frame("memcpy", 0x7F0000010000, LIBC)), (50, 50 * cpu.period), 42, 43,
                 "worker")]
    p2 = [Sample((frame("main", 0x401000), Frame("do_nanosleep", FrameKind.KERNEL),
                  Frame.marker("[sleeping]")), (3, 90_000_000), 7, 7, "sleeper",
                 (("thread_state", "sleeping"),))]
    return [Profile(cpu, tuple(p1), 10, 20, {"__name__": "ember_cpu", "host": "h1", "pid": "42",
                                             "comm": "app", "namespace": "shop", "pod": "app-1",
                                             "container": "app", "pod_label_tier": "web"}),
            Profile(OFFCPU_TYPE, tuple(p2), 10, 20, {"__name__": "ember_offcpu", "host": "h1",
                                                     "pid": "7", "comm": "sleeper"})]


def test_request_structure() -> None:
    req = to_otlp(profiles())
    d = req.dictionary
    # every table starts with its zero value
    assert d.string_table[0] == "" and d.stack_table[0].location_indices == []
    assert d.location_table[0].address == 0 and d.function_table[0].name_strindex == 0
    assert len(req.resource_profiles) == 2
    rp = req.resource_profiles[0]
    attrs = {a.key: (a.value.string_value or a.value.int_value) for a in rp.resource.attributes}
    assert attrs["host.name"] == "h1" and attrs["process.pid"] == 42
    assert attrs["k8s.namespace.name"] == "shop" and attrs["k8s.pod.name"] == "app-1"
    assert attrs["k8s.container.name"] == "app" and attrs["ember.pod_label_tier"] == "web"
    assert "__name__" not in attrs
    # one profile per value type, over the same stacks
    cpu_profiles = rp.scope_profiles[0].profiles
    types = [(d.string_table[p.sample_type.type_strindex],
              d.string_table[p.sample_type.unit_strindex]) for p in cpu_profiles]
    assert types == [("samples", "count"), ("cpu", "nanoseconds")]
    assert sorted(stacks(req, cpu_profiles[0])) == [
        (["main", "work_a"], 35), (["main", "work_b", "memcpy"], 50)]
    assert cpu_profiles[0].period == cpu_type(99).period
    off = req.resource_profiles[1].scope_profiles[0].profiles
    assert stacks(req, off[1]) == [(["main", "do_nanosleep", "[sleeping]"], 90_000_000)]
    # mappings keep build ids; sample attributes name threads and states
    [mapping] = [m for m in d.mapping_table
                 if d.string_table[m.filename_strindex] == "/usr/lib/libc.so.6"]
    assert mapping.memory_start == LIBC.start and mapping.file_offset == LIBC.offset
    attr = d.attribute_table
    keys = {d.string_table[attr[i].key_strindex]: attr[i].value.string_value
            for i in off[0].samples[0].attribute_indices}
    assert keys == {"thread.id": "7", "thread.name": "sleeper", "thread_state": "sleeping"}


def test_shipper_exports_to_an_otlp_servicer(tmp_path: Path) -> None:
    token = "s3cret"
    with otlp_server() as (address, received):
        spool = Spool(tmp_path / "otlp", 1 << 20)
        metrics = AgentMetrics(CollectorRegistry())
        shipper = Shipper(spool, Endpoint(address, token), metrics, wire=OTLP)
        spool.put(to_otlp(profiles()).SerializeToString())
        shipper.start()
        deadline = time.monotonic() + 10
        while not received.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        shipper.stop()
    assert len(received.requests) == 1
    assert received.metadata[0]["authorization"] == f"Bearer {token}"
    got = received.requests[0]
    assert sorted(stacks(got, got.resource_profiles[0].scope_profiles[0].profiles[0])) == [
        (["main", "work_a"], 35), (["main", "work_b", "memcpy"], 50)]
    assert spool.stats()[0] == 0
    assert metrics.otlp_sent._value.get() == 4  # 2 processes x 2 value types
