"""Queries over stored profiles: the samples of a time range and label set,
summed by the store (store.aggregate), rendered as folded stacks, pprof or
a JSON tree (engine.py draws the tree views from the same aggregate).

A range read back as pprof or folded is exact: every (thread, stack) with
its summed values, its frames as the agents sent them (mappings, addresses,
lines, inlined functions)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..encode.folded import encode_folded
from ..encode.pprof import encode_pprof
from ..httpserve import check_cancelled
from ..model import CPU, PROFILE_KINDS, Profile, ProfileType, Sample
from .store import Aggregate, Store

#: Friendly names for ember's own profile types (type=cpu, ...): one per
#: profile kind, so a new kind is queryable by name without touching this.
TYPE_ALIASES = {k.name: k.stored_type for k in PROFILE_KINDS}
FORMATS = ("folded", "pprof", "json")
#: The main value of on-CPU profiles: time, but sampled, so folded shows it as is.
_ONCPU_VALUE = CPU.sample_types[-1]
#: Why stored profiles were left out of a merge: other sample types than
#: the first under the same type name.
SHAPE = "shape"


def profile_of(store: Store, agg: Aggregate, start_ns: int, end_ns: int) -> Profile:
    """The aggregate (per thread, not by name) as one profile: a sample per
    (thread, stack)."""
    if agg.thread is None or agg.stack is None:
        raise ValueError("a profile is made of sums per thread, not by thread name")
    frames_of = store.stacks(np.unique(agg.stack))
    frames = store.interner.frames
    threads = store.interner.threads
    values = [agg.sums(i).tolist() for i in range(len(agg.values))]
    samples = []
    for i, (t, s) in enumerate(zip(agg.thread.tolist(), agg.stack.tolist(), strict=True)):
        if not i % 4096:
            check_cancelled()  # its HTTP client left: stop
        pid, tid, name, labels = threads.get(t, (0, 0, "", ()))
        samples.append(Sample(tuple(frames[f] for f in frames_of.get(s, ())),
                              tuple(v[i] for v in values), pid, tid, name, labels))
    return Profile(scaled(agg.shape), tuple(samples), start_ns, end_ns - start_ns)


def scaled(ptype: ProfileType) -> ProfileType:
    """Folded shows time profiles other than on-CPU in microseconds (as
    ember record writes them), the main value otherwise."""
    last = ptype.sample_types[-1]
    scale = 1000 if last[1] == "nanoseconds" and last != _ONCPU_VALUE else 1
    return ProfileType(ptype.name, ptype.sample_types, ptype.period_type, ptype.period,
                       folded_index=0 if scale == 1 else len(ptype.sample_types) - 1,
                       folded_scale=scale)


def tree_json(root: dict[str, Any]) -> str:
    """``json.dumps(root)`` of a nested tree, written without recursion:
    CPython's encoder recurses for every object and list, and its recursion
    limit (1000) stops it at about 500 tree levels."""
    out: list[str] = []
    todo: list[dict[str, Any] | str] = [root]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        own = f'"self": {item["self"]}, ' if "self" in item else ""
        out.append(f'{{"name": {json.dumps(item["name"])}, "value": {item["value"]}, {own}'
                   '"children": [')
        todo.append("]}")
        kids = item["children"]
        for i in range(len(kids) - 1, -1, -1):  # pushed last first: popped in order
            todo.append(kids[i])
            if i:
                todo.append(", ")
    return "".join(out)


def render(profile: Profile, fmt: str) -> tuple[bytes, str]:
    """(body, content type) of folded or pprof."""
    if fmt == "folded":
        return encode_folded(profile).encode(), "text/plain; charset=utf-8"
    return encode_pprof(profile), "application/octet-stream"
