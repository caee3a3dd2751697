"""Profiles as OTLP (opentelemetry-proto, profiles v1development), for an
OpenTelemetry Collector, Grafana Pyroscope or Parca.

One ExportProfilesServiceRequest carries the profiles of one drain: a
ResourceProfiles per process (its labels as resource attributes, named by
the OpenTelemetry semantic conventions where one exists), one Profile per
value type (OTLP profiles have a single sample type each: CPU samples and
CPU time become two profiles over the same stacks), and one dictionary
shared by all of them. Index 0 of every table is the zero value, as the
format requires. Stacks are root first in ember and leaf first in OTLP, and
capped at ``MAX_STACK_DEPTH`` frames (``encode.depth``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as svc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb
from opentelemetry.proto.resource.v1 import resource_pb2

from ..model import Frame, Mapping, Profile, location_groups
from .depth import cap_frames

#: ember label -> OpenTelemetry resource attribute (semantic conventions).
RESOURCE_KEYS = {
    "host": "host.name",
    "pid": "process.pid",
    "comm": "process.executable.name",
    "executable": "process.executable.path",
    "build_id": "process.executable.build_id.gnu",
    "container_id": "container.id",
    "namespace": "k8s.namespace.name",
    "pod": "k8s.pod.name",
    "container": "k8s.container.name",
}
SCOPE = common_pb2.InstrumentationScope(name="ember", version="0.1.0")


class _Tables:
    def __init__(self) -> None:
        self.d = pb.ProfilesDictionary()
        self.strings: dict[str, int] = {}
        self.functions: dict[tuple[str, str, str], int] = {}
        self.mappings: dict[tuple[int, int, int, str], int] = {}
        self.locations: dict[tuple[int, int, tuple[tuple[int, int], ...]], int] = {}
        self.stacks: dict[tuple[int, ...], int] = {}
        self.attributes: dict[tuple[str, str], int] = {}
        self.string("")
        self.d.mapping_table.add()
        self.d.location_table.add()
        self.d.function_table.add()
        self.d.link_table.add()
        self.d.attribute_table.add()
        self.d.stack_table.add()

    def string(self, s: str) -> int:
        i = self.strings.get(s)
        if i is None:
            i = self.strings[s] = len(self.d.string_table)
            self.d.string_table.append(s)
        return i

    def mapping(self, m: Mapping) -> int:
        key = (m.start, m.limit, m.offset, m.path)
        i = self.mappings.get(key)
        if i is None:
            i = self.mappings[key] = len(self.d.mapping_table)
            entry = self.d.mapping_table.add(memory_start=m.start, memory_limit=m.limit,
                                             file_offset=m.offset,
                                             filename_strindex=self.string(m.path))
            if m.build_id:
                entry.attribute_indices.append(self.attribute("process.executable.build_id.gnu",
                                                              m.build_id))
        return i

    def function(self, f: Frame) -> int:
        filename = f.file or (f.mapping.path if f.mapping else "")
        key = (f.name, f.system_name or f.name, filename)
        i = self.functions.get(key)
        if i is None:
            i = self.functions[key] = len(self.d.function_table)
            self.d.function_table.add(name_strindex=self.string(f.name),
                                      system_name_strindex=self.string(key[1]),
                                      filename_strindex=self.string(filename))
        return i

    def location(self, group: Sequence[Frame]) -> int:
        """A frame and the frames inlined into it, innermost first."""
        f = group[-1]
        mi = self.mapping(f.mapping) if f.mapping else 0
        lines = tuple((self.function(g), g.line) for g in group)
        key = (mi, f.address, lines)
        i = self.locations.get(key)
        if i is None:
            i = self.locations[key] = len(self.d.location_table)
            loc = self.d.location_table.add(mapping_index=mi, address=f.address)
            for fi, line in lines:
                loc.lines.add(function_index=fi, line=line)
        return i

    def stack(self, frames: Sequence[Frame]) -> int:
        key = tuple(self.location(group) for group in location_groups(frames))
        i = self.stacks.get(key)
        if i is None:
            i = self.stacks[key] = len(self.d.stack_table)
            self.d.stack_table.add(location_indices=key)
        return i

    def attribute(self, key: str, value: str) -> int:
        k = (key, value)
        i = self.attributes.get(k)
        if i is None:
            i = self.attributes[k] = len(self.d.attribute_table)
            self.d.attribute_table.add(key_strindex=self.string(key),
                                       value=common_pb2.AnyValue(string_value=value))
        return i


def _resource(labels: dict[str, str]) -> resource_pb2.Resource:
    attrs = []
    for k, v in sorted(labels.items()):
        if k == "__name__":
            continue
        key = RESOURCE_KEYS.get(k, f"ember.{k}")
        value = (common_pb2.AnyValue(int_value=int(v)) if k == "pid" and v.isdigit()
                 else common_pb2.AnyValue(string_value=v))
        attrs.append(common_pb2.KeyValue(key=key, value=value))
    return resource_pb2.Resource(attributes=attrs)


def to_otlp(profiles: Sequence[Profile]) -> svc.ExportProfilesServiceRequest:
    """One request: a ResourceProfiles per profile (its labels as the
    resource), one OTLP profile per sample type."""
    t = _Tables()
    req = svc.ExportProfilesServiceRequest()
    for p in profiles:
        rp = req.resource_profiles.add(resource=_resource(dict(p.labels)))
        sp = rp.scope_profiles.add(scope=SCOPE)
        stacks = [t.stack(cap_frames(s.frames)) for s in p.samples]
        sample_attrs = [[t.attribute("thread.id", str(s.tid)),
                         t.attribute("thread.name", s.thread_name),
                         *(t.attribute(k, v) for k, v in s.labels)] for s in p.samples]
        for vi, (vtype, unit) in enumerate(p.type.sample_types):
            prof = sp.profiles.add(time_unix_nano=p.start_ns, duration_nano=p.duration_ns,
                                   period=p.type.period,
                                   profile_id=uuid.uuid4().bytes)
            prof.sample_type.type_strindex = t.string(vtype)
            prof.sample_type.unit_strindex = t.string(unit)
            prof.period_type.type_strindex = t.string(p.type.period_type[0])
            prof.period_type.unit_strindex = t.string(p.type.period_type[1])
            prof.attribute_indices.append(t.attribute("profile.frame.type", "native"))
            for s, si, attrs in zip(p.samples, stacks, sample_attrs, strict=True):
                if s.values[vi]:
                    prof.samples.add(stack_index=si, values=[s.values[vi]],
                                     attribute_indices=attrs)
    req.dictionary.CopyFrom(t.d)
    return req


def encode_requests(profiles: Sequence[Profile], max_bytes: int) -> list[bytes]:
    """Serialized export requests holding every profile: one per drain, split
    in halves while larger than max_bytes."""
    out = []
    pending = [list(profiles)] if profiles else []
    while pending:
        part = pending.pop()
        data = to_otlp(part).SerializeToString()
        if len(data) > max_bytes and len(part) > 1:
            pending += [part[len(part) // 2:], part[:len(part) // 2]]
            continue
        out.append(data)
    return out


def profiles_in(data: bytes) -> int:
    """How many OTLP profiles (one per sample type) a serialized request
    holds, as the endpoint counts what it rejects (0 if unreadable)."""
    try:
        req = svc.ExportProfilesServiceRequest.FromString(data)
    except Exception:
        return 0
    return sum(len(sp.profiles) for rp in req.resource_profiles for sp in rp.scope_profiles)
