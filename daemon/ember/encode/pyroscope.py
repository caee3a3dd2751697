"""Profiles -> Grafana Pyroscope's push API (``push.v1.PusherService/Push``),
as Grafana Alloy's ``pyroscope.write`` sends them: a RawProfileSeries per
process and profile type, its labels sorted, one RawSample holding the
gzip pprof and a UUID.

Pyroscope names a profile type by ``__name__`` and the pprof's sample and
period types: ember's on-CPU profiles are ``process_cpu`` (what Alloy's eBPF
profiler sends, so Pyroscope's views of CPU apply), off-CPU ones
``off_cpu`` (Pyroscope's name for them); the kinds Pyroscope has no name for
keep ember's (``ember_runqlat``, ...).

Pyroscope refuses a series without ``service_name``. It is, in order: the
profile's own ``service_name`` label (``agent.labels`` or a relabel rule set
it), ``NAMESPACE/CONTAINER`` on Kubernetes, the command name (``comm``), or
``unspecified``, as Alloy says when it knows nothing better.
"""

from __future__ import annotations

import gzip
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..model import Profile, merge_samples
from ..proto import pyroscope_push_pb2 as push
from .pprof import to_proto

#: ember profile kind -> Pyroscope ``__name__`` (the others keep ember's series name).
PROFILE_NAMES = {"cpu": "process_cpu", "offcpu": "off_cpu"}
SERVICE_NAME = "service_name"
UNSPECIFIED = "unspecified"


def profile_name(profile: Profile) -> str:
    return PROFILE_NAMES.get(profile.type.name) or profile.labels.get(
        "__name__", f"ember_{profile.type.name}")


def service_name(labels: Mapping[str, str]) -> str:
    """What Pyroscope lists the profile under (see the module's docstring)."""
    if labels.get(SERVICE_NAME):
        return labels[SERVICE_NAME]
    if labels.get("namespace") and labels.get("container"):
        return f"{labels['namespace']}/{labels['container']}"
    return labels.get("comm") or UNSPECIFIED


def series_labels(profile: Profile) -> list[push.LabelPair]:
    """The series' labels, sorted by name: ember's, with Pyroscope's
    ``__name__`` and a ``service_name``."""
    labels = dict(profile.labels)
    labels["__name__"] = profile_name(profile)
    labels[SERVICE_NAME] = service_name(labels)
    return [push.LabelPair(name=k, value=v) for k, v in sorted(labels.items())]


def make_series(profile: Profile) -> push.RawProfileSeries:
    """One series: the labels and the gzip pprof under a new UUID."""
    proto = to_proto(replace(profile, samples=merge_samples(profile.samples)))
    raw = gzip.compress(proto.SerializeToString(), compresslevel=6, mtime=0)
    return push.RawProfileSeries(labels=series_labels(profile), samples=[
        push.RawSample(raw_profile=raw, ID=str(uuid.uuid4()))])


def _pack(series: Sequence[push.RawProfileSeries], max_bytes: int) -> list[bytes]:
    """Series packed into requests of at most max_bytes each (a single
    larger series gets a request of its own)."""
    out: list[bytes] = []
    current, size = push.PushRequest(), 0
    for s in series:
        n = s.ByteSize() + 8
        if current.series and size + n > max_bytes:
            out.append(current.SerializeToString())
            current, size = push.PushRequest(), 0
        current.series.append(s)
        size += n
    if current.series:
        out.append(current.SerializeToString())
    return out


def encode_requests(profiles: Sequence[Profile], max_bytes: int) -> list[bytes]:
    """Serialized push requests holding every profile, each at most max_bytes
    (a single larger profile gets a request of its own)."""
    return _pack([make_series(p) for p in profiles], max_bytes)


def split(data: bytes) -> list[bytes]:
    """A request as two holding its profiles between them (the request
    itself when it holds a single profile)."""
    flat = [push.RawProfileSeries(labels=s.labels, samples=[sample])
            for s in push.PushRequest.FromString(data).series for sample in s.samples]
    if len(flat) < 2:
        return [data]
    half = len(flat) // 2
    return [push.PushRequest(series=part).SerializeToString()
            for part in (flat[:half], flat[half:])]


def profiles_in(data: bytes) -> int:
    """How many profiles a serialized request holds (0 if unreadable)."""
    try:
        req = push.PushRequest.FromString(data)
    except Exception:
        return 0
    return sum(len(s.samples) for s in req.series)
