"""Queries over stored profiles: merge the pprof profiles of a time range and
label set, and render them as folded stacks, pprof or a JSON tree."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..encode.folded import encode_folded, fold
from ..encode.pprof import decode_pprof, encode_pprof, from_proto
from ..model import CPU, PROFILE_KINDS, Profile, ProfileType, Sample, merge_samples
from .store import Row

#: Friendly names for ember's own profile types (type=cpu, ...): one per
#: profile kind, so a new kind is queryable by name without touching this.
TYPE_ALIASES = {k.name: k.stored_type for k in PROFILE_KINDS}
FORMATS = ("folded", "pprof", "json")
#: The main value of on-CPU profiles: time, but sampled, so folded shows it as is.
_ONCPU_VALUE = CPU.sample_types[-1]


@dataclass(frozen=True)
class Merged:
    profile: Profile
    profiles: int                       # how many stored profiles were merged
    timeline: list[tuple[int, int]]     # (time_ns, first sample value) per profile


def merge(rows: Iterable[Row], start_ns: int, end_ns: int) -> Merged | None:
    ptype: ProfileType | None = None
    samples: list[Sample] = []
    timeline = []
    n = 0
    for row in rows:
        t, ss = from_proto(decode_pprof(row.data))
        if ptype is None:
            ptype = t
        elif t.sample_types != ptype.sample_types:
            continue  # a different shape under the same type name: not mergeable
        samples.extend(ss)
        timeline.append((row.time_ns, row.samples))
        n += 1
    if ptype is None:
        return None
    # folded: time profiles other than on-CPU in microseconds (as ember record writes them)
    last = ptype.sample_types[-1]
    scale = 1000 if last[1] == "nanoseconds" and last != _ONCPU_VALUE else 1
    ptype = ProfileType(ptype.name, ptype.sample_types, ptype.period_type, ptype.period,
                        folded_index=0 if scale == 1 else len(ptype.sample_types) - 1,
                        folded_scale=scale)
    return Merged(Profile(ptype, merge_samples(samples), start_ns, end_ns - start_ns), n,
                  timeline)


def tree(profile: Profile) -> dict[str, Any]:
    """Folded stacks as a nested {name, value, children} tree (root: "all")."""
    root: dict[str, Any] = {"name": "all", "value": 0, "children": {}}
    for stack, value in fold(profile).items():
        node = root
        node["value"] += value
        for name in stack.split(";"):
            child = node["children"].get(name)
            if child is None:
                child = node["children"][name] = {"name": name, "value": 0, "children": {}}
            child["value"] += value
            node = child

    def finish(node: dict[str, Any]) -> dict[str, Any]:
        kids = sorted(node["children"].values(), key=lambda c: (-c["value"], c["name"]))
        return {"name": node["name"], "value": node["value"],
                "children": [finish(c) for c in kids]}

    return finish(root)


def render(merged: Merged, fmt: str) -> tuple[bytes, str]:
    """(body, content type)."""
    if fmt == "folded":
        return encode_folded(merged.profile).encode(), "text/plain; charset=utf-8"
    if fmt == "pprof":
        return encode_pprof(merged.profile), "application/octet-stream"
    t = merged.profile.type
    body = {"sample_types": [list(x) for x in t.sample_types],
            "unit": "microseconds" if t.folded_scale == 1000 else t.sample_types[0][1],
            "profiles": merged.profiles, "timeline": merged.timeline,
            "tree": tree(merged.profile)}
    return json.dumps(body).encode(), "application/json"
