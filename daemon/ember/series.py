"""Samples of one drain -> Parca WriteRaw series: one pprof per process and
profile type, labelled with what identifies the process.

Every profile carries a unique id (a pprof comment ``ember-profile-id=...``)
so a re-send after an ambiguous failure is stored once by the collector.
"""

from __future__ import annotations

import gzip
import re
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .encode.pprof import to_proto_with_mappings
from .kube import container_of
from .model import Profile, ProfileType, Sample, merge_samples
from .proto import profilestore_pb2 as ps

PROFILE_ID_PREFIX = "ember-profile-id="
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

#: WriteRaw __name__ per profile type.
SERIES_NAMES = {"cpu": "ember_cpu", "offcpu": "ember_offcpu", "runqlat": "ember_runqlat",
                "wakeup": "ember_wakeup", "offwake": "ember_offwake"}


@dataclass(frozen=True)
class ProcessLabels:
    pid: int
    comm: str = ""
    executable: str = ""
    build_id: str = ""
    cgroup: str = ""
    container_id: str = ""
    pod_uid: str = ""  # not a label: finds the pod when the container is not listed yet

    def as_labels(self) -> dict[str, str]:
        out = {"pid": str(self.pid), "comm": self.comm, "executable": self.executable,
               "build_id": self.build_id, "cgroup": self.cgroup,
               "container_id": self.container_id}
        return {k: v for k, v in out.items() if v}


def cgroup_of(pid: int, proc: Path = Path("/proc")) -> str:
    """The process's cgroup v2 path ('' when unknown)."""
    try:
        for line in (proc / str(pid) / "cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    except OSError:
        pass
    return ""


def container_id(cgroup: str) -> str:
    """The 64-hex container id of a containerd/CRI-O/Docker cgroup path."""
    return container_of(f"0::{cgroup}").container_id


def read_comm(pid: int, proc: Path = Path("/proc")) -> str:
    try:
        return (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def split_by_process(samples: Iterable[Sample]) -> dict[int, list[Sample]]:
    out: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        out[s.pid].append(s)
    return out


def series_labels(ptype: ProfileType, meta: ProcessLabels, common: dict[str, str],
                  extra: dict[str, str] | None = None) -> dict[str, str]:
    """A process's profile labels before relabeling: __name__, the common
    labels (host, configured ones), the process's, then extra (pod metadata)."""
    return {"__name__": SERIES_NAMES[ptype.name], **common, **meta.as_labels(), **(extra or {})}


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
