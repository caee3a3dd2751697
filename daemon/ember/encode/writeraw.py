"""Profiles -> Parca WriteRaw series: one gzip pprof per process and profile
type, with its labels, packed into requests of bounded size.

Every profile carries a unique id (a pprof comment ``ember-profile-id=...``)
so a re-send after an ambiguous failure is stored once by the collector.
"""

from __future__ import annotations

import gzip
import re
import uuid
from collections.abc import Sequence
from dataclasses import replace

from ..model import Profile, merge_samples
from ..proto import profilestore_pb2 as ps
from .pprof import to_proto_with_mappings

PROFILE_ID_PREFIX = "ember-profile-id="
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def make_series(profile: Profile) -> tuple[ps.RawProfileSeries, str]:
    """One RawProfileSeries: the profile's labels and its gzip pprof, with a
    new profile id (returned too)."""
    profile_id = uuid.uuid4().hex
    proto, mappings = to_proto_with_mappings(replace(
        profile, samples=merge_samples(profile.samples),
        comments=(*profile.comments, f"{PROFILE_ID_PREFIX}{profile_id}")))
    raw = gzip.compress(proto.SerializeToString(), compresslevel=6, mtime=0)
    series = ps.RawProfileSeries(labels=ps.LabelSet(labels=[
        ps.Label(name=k, value=v) for k, v in sorted(profile.labels.items())]))
    sample = series.samples.add(raw_profile=raw)
    for m in mappings:
        info = sample.executable_info.add(elf_type=m.elf_type)
        if m.load_offset or m.load_vaddr:
            info.load_segment.offset = m.load_offset
            info.load_segment.vaddr = m.load_vaddr
    return series, profile_id


def batch_requests(series: Sequence[ps.RawProfileSeries], max_bytes: int
                   ) -> list[ps.WriteRawRequest]:
    """Pack series into WriteRaw requests of at most max_bytes each (a single
    larger series gets a request of its own)."""
    requests: list[ps.WriteRawRequest] = []
    current = ps.WriteRawRequest()
    size = 0
    for s in series:
        n = s.ByteSize() + 8
        if current.series and size + n > max_bytes:
            requests.append(current)
            current, size = ps.WriteRawRequest(), 0
        current.series.append(s)
        size += n
    if current.series:
        requests.append(current)
    return requests


def encode_requests(profiles: Sequence[Profile], max_bytes: int) -> list[bytes]:
    """Serialized WriteRaw requests holding every profile, each at most
    max_bytes (a single larger profile gets a request of its own)."""
    series = [make_series(p)[0] for p in profiles]
    return [r.SerializeToString() for r in batch_requests(series, max_bytes)]


def profiles_in(data: bytes) -> int:
    """How many profiles a serialized request holds (0 if unreadable)."""
    try:
        req = ps.WriteRawRequest.FromString(data)
    except Exception:
        return 0
    return sum(len(s.samples) for s in req.series)
