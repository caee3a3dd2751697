"""Queries over stored profiles: merge the pprof profiles of a time range and
label set, and render them as folded stacks, pprof or a JSON tree.

A stored row that cannot be read (one stored before the write checks it
would now fail existed) is left out and counted, never the reason a query
fails."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..encode.folded import encode_folded, fold
from ..encode.pprof import encode_pprof, from_proto
from ..httpserve import check_cancelled
from ..model import (
    CPU,
    MAX_STACK_DEPTH,
    PROFILE_KINDS,
    TRUNCATED,
    Profile,
    ProfileType,
    Sample,
    cap_depth,
    merge_samples,
)
from .store import Row
from .validate import DEFAULT_LIMITS, INT64_MAX, InvalidRequest, Limits, decompress, parse

#: Friendly names for ember's own profile types (type=cpu, ...): one per
#: profile kind, so a new kind is queryable by name without touching this.
TYPE_ALIASES = {k.name: k.stored_type for k in PROFILE_KINDS}
FORMATS = ("folded", "pprof", "json")
#: The main value of on-CPU profiles: time, but sampled, so folded shows it as is.
_ONCPU_VALUE = CPU.sample_types[-1]
#: Why a stored row was left out of a merge.
CORRUPT = "corrupt"    # does not decode, or not into a profile
SHAPE = "shape"        # other sample types than the first row under the same type name


@dataclass(frozen=True)
class Merged:
    profile: Profile
    profiles: int                       # how many stored profiles were merged
    timeline: list[tuple[int, int]]     # (time_ns, first sample value) per profile
    skipped: dict[str, int] = field(default_factory=dict)   # rows left out, by reason


def merge(rows: Iterable[Row], start_ns: int, end_ns: int, limits: Limits = DEFAULT_LIMITS,
          on_skip: Callable[[str, int], None] | None = None) -> Merged | None:
    """The rows merged into one profile (None if no row could be read).
    ``on_skip(reason, rows)`` hears of rows left out, even when none was
    merged; ``limits`` should be the ones the rows were written under."""
    ptype: ProfileType | None = None
    samples: list[Sample] = []
    timeline = []
    skipped: Counter[str] = Counter()
    for row in rows:
        check_cancelled()  # its HTTP client left: stop merging
        try:
            t, ss = load(row.data, limits)
        except InvalidRequest:
            skipped[CORRUPT] += 1
            continue
        if ptype is None:
            ptype = t
        elif t.sample_types != ptype.sample_types:
            skipped[SHAPE] += 1  # not mergeable
            continue
        samples.extend(ss)
        timeline.append((row.time_ns, row.samples))
    if on_skip is not None:
        for reason, n in skipped.items():
            on_skip(reason, n)
    if ptype is None:
        return None
    # folded: time profiles other than on-CPU in microseconds (as ember record writes them)
    last = ptype.sample_types[-1]
    scale = 1000 if last[1] == "nanoseconds" and last != _ONCPU_VALUE else 1
    ptype = ProfileType(ptype.name, ptype.sample_types, ptype.period_type, ptype.period,
                        folded_index=0 if scale == 1 else len(ptype.sample_types) - 1,
                        folded_scale=scale)
    return Merged(Profile(ptype, _saturate(merge_samples(samples)), start_ns, end_ns - start_ns),
                  len(timeline), timeline, dict(skipped))


def load(data: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[ProfileType, list[Sample]]:
    """A stored row as the model; InvalidRequest if it cannot be read. Rows
    were checked when written, so this does not check them all again (that
    would add half to a query's time): it bounds decompression, as rows
    written before that bound may need, and turns what ``from_proto`` cannot
    read, or values that do not match the sample types, into InvalidRequest."""
    p, _ = parse(decompress(data, limits.max_profile_size, limits.max_gzip_members)[0], limits)
    try:
        t, samples = from_proto(p)
    except (IndexError, ValueError) as exc:  # a string index out of range, a pid not a number
        raise InvalidRequest(f"unreadable profile: {exc}") from None
    n = len(t.sample_types)
    if not n or any(len(s.values) != n for s in samples):
        raise InvalidRequest("sample values do not match the sample types")
    return t, samples


def _saturate(samples: tuple[Sample, ...]) -> tuple[Sample, ...]:
    """Sums kept within int64: each stored value is an int64, but the sum of
    many need not be, and pprof values are int64."""
    if not samples or (max(max(s.values) for s in samples) <= INT64_MAX
                       and min(min(s.values) for s in samples) >= -INT64_MAX - 1):
        return samples
    return tuple(Sample(s.frames, tuple(max(-INT64_MAX - 1, min(v, INT64_MAX)) for v in s.values),
                        s.pid, s.tid, s.thread_name, s.labels) for s in samples)


def tree(profile: Profile) -> dict[str, Any]:
    """Folded stacks as a nested {name, value, children} tree (root: "all",
    then the thread, then the frames), children by value, then name. At most
    ``MAX_STACK_DEPTH`` levels: a deeper stack keeps its leafmost frames under
    ``[truncated]``. Built without recursion, so no depth can overflow it."""
    root: dict[str, Any] = {"name": "all", "value": 0, "children": {}}
    for stack, value in fold(profile).items():
        thread, *frames = stack.split(";")
        node = root
        node["value"] += value
        for name in (thread, *cap_depth(frames, TRUNCATED, MAX_STACK_DEPTH - 2)):
            child = node["children"].get(name)
            if child is None:
                child = node["children"][name] = {"name": name, "value": 0, "children": {}}
            child["value"] += value
            node = child
    todo = [root]
    while todo:
        node = todo.pop()
        node["children"] = sorted(node["children"].values(),
                                  key=lambda c: (-c["value"], c["name"]))
        todo.extend(node["children"])
    return root


def tree_json(root: dict[str, Any]) -> str:
    """``json.dumps(root)`` of a ``tree``, written without recursion:
    CPython's encoder recurses for every object and list, and its recursion
    limit (1000) stops it at about 500 tree levels."""
    out: list[str] = []
    todo: list[dict[str, Any] | str] = [root]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        out.append(f'{{"name": {json.dumps(item["name"])}, "value": {item["value"]}, '
                   '"children": [')
        todo.append("]}")
        kids = item["children"]
        for i in range(len(kids) - 1, -1, -1):  # pushed last first: popped in order
            todo.append(kids[i])
            if i:
                todo.append(", ")
    return "".join(out)


def render(merged: Merged, fmt: str) -> tuple[bytes, str]:
    """(body, content type)."""
    if fmt == "folded":
        return encode_folded(merged.profile).encode(), "text/plain; charset=utf-8"
    if fmt == "pprof":
        return encode_pprof(merged.profile), "application/octet-stream"
    t = merged.profile.type
    head = json.dumps({"sample_types": [list(x) for x in t.sample_types],
                       "unit": "microseconds" if t.folded_scale == 1000 else t.sample_types[0][1],
                       "profiles": merged.profiles, "timeline": merged.timeline})
    return f'{head[:-1]}, "tree": {tree_json(tree(merged.profile))}}}'.encode(), "application/json"
