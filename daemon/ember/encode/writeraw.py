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

from ..model import Profile, ProfileType, Sample, merge_samples
from ..proto import profilestore_pb2 as ps
from .pprof import to_proto_with_mappings

PROFILE_ID_PREFIX = "ember-profile-id="
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def make_series(ptype: ProfileType, samples: Sequence[Sample], labels: dict[str, str],
                start_ns: int, duration_ns: int) -> tuple[ps.RawProfileSeries, str]:
    """One RawProfileSeries for one process; returns it with its profile id."""
    profile_id = uuid.uuid4().hex
    profile = Profile(ptype, merge_samples(samples), start_ns, duration_ns,
                      comments=(f"{PROFILE_ID_PREFIX}{profile_id}",))
    proto, mappings = to_proto_with_mappings(profile)
    raw = gzip.compress(proto.SerializeToString(), compresslevel=6, mtime=0)
    series = ps.RawProfileSeries(labels=ps.LabelSet(labels=[
        ps.Label(name=k, value=v) for k, v in sorted(labels.items())]))
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
