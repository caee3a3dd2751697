"""Merging stored rows and rendering them: a row that cannot be read is left
out and counted, and no stack depth breaks the JSON tree."""

from __future__ import annotations

import gzip
import json
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ember.collector.query import merge, render, tree, tree_json
from ember.collector.store import Row, Store, StoredProfile
from ember.encode.pprof import encode_pprof, to_proto
from ember.model import MAX_STACK_DEPTH, TRUNCATED, Frame, FrameKind, Sample
from ember.proto import profile_pb2 as pb
from tests.support.profiles import cpu_profile, offcpu_profile

NOW = time.time_ns()


def row(data: bytes) -> Row:
    return Row({"__name__": "ember_cpu"}, "cpu", NOW - 10**9, 10**9, 1, data)


def depth(node: dict[str, Any]) -> int:
    todo, deepest = [(node, 1)], 0
    while todo:
        n, d = todo.pop()
        deepest = max(deepest, d)
        todo.extend((c, d + 1) for c in n["children"])
    return deepest


def damaged(change: Callable[[pb.Profile], object]) -> bytes:
    p = to_proto(cpu_profile())
    change(p)
    return gzip.compress(p.SerializeToString())


def test_rows_that_cannot_be_read_are_skipped_and_counted() -> None:
    """Rows an older collector stored without today's checks: garbage, a cut
    gzip, a cut profile, a multi-member bomb, a string index out of range, a
    pid label that is no number, a sample with a value too many. The query
    answers from the good row and says how many it left out."""
    good = encode_pprof(cpu_profile())
    bomb = good + gzip.compress(b"\0" * (8 << 20)) * 16
    cut = gzip.compress(gzip.decompress(good)[:-3])
    pid = list(to_proto(cpu_profile()).string_table).index("pid")
    bad = [b"garbage", good[:40], bomb, cut,
           damaged(lambda p: setattr(p.function[0], "name", 10_000)),
           damaged(lambda p: p.sample[0].label.add(key=pid, str=1)),
           damaged(lambda p: p.sample[0].value.append(1))]
    store = Store(":memory:")
    store.write([StoredProfile(f"p{i}", (("__name__", "ember_cpu"),), "cpu", NOW - 10**9, 10**9,
                               1, data) for i, data in enumerate([*bad, good])])
    heard: list[tuple[str, int]] = []
    tracemalloc.start()
    try:
        merged = merge(store.query(0, NOW, {}), 0, NOW,
                       on_skip=lambda reason, n: heard.append((reason, n)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert merged is not None
    assert (merged.profiles, merged.skipped, heard) == (1, {"corrupt": 7}, [("corrupt", 7)])
    assert peak < 100 << 20
    assert b"main" in render(merged, "folded")[0]


def test_only_bad_rows_answer_nothing_but_are_counted() -> None:
    heard: list[tuple[str, int]] = []
    assert merge([row(b"x"), row(b"\x1f\x8b")], 0, NOW,
                 on_skip=lambda reason, n: heard.append((reason, n))) is None
    assert heard == [("corrupt", 2)]


def test_sums_past_int64_saturate() -> None:
    def extreme(sign: int) -> bytes:
        return damaged(lambda p: [s.value.__setitem__(1, sign * ((1 << 63) - 1)) for s in p.sample])
    merged = merge([row(extreme(1))] * 3 + [row(extreme(-1))] * 9, 0, NOW)
    assert merged is not None
    values = {s.values[1] for s in merged.profile.samples}
    assert values == {-(1 << 63)} and render(merged, "pprof")[0]


def test_rows_of_another_shape_are_counted() -> None:
    cpu, off = encode_pprof(cpu_profile()), encode_pprof(offcpu_profile())
    merged = merge([row(cpu), row(off), row(cpu)], 0, NOW)
    assert merged is not None and merged.profiles == 2 and merged.skipped == {"shape": 1}


def test_tree_json_is_json_dumps() -> None:
    merged = merge([row(encode_pprof(cpu_profile()))], 0, NOW)
    assert merged is not None
    t = tree(merged.profile)
    assert tree_json(t) == json.dumps(t)
    body = json.loads(render(merged, "json")[0])
    assert body["tree"] == t and sorted(body) == ["profiles", "sample_types", "timeline",
                                                  "tree", "unit"]
    assert [c["name"] for c in t["children"][0]["children"]] == ["main"]


def test_a_5000_frame_stack_makes_a_capped_tree() -> None:
    """A stored row from before stacks were capped: the tree keeps
    MAX_STACK_DEPTH levels (root, thread, [truncated], leafmost frames) and
    the JSON answer is written at that depth, where json.dumps gives up."""
    frames = tuple(Frame(f"f{i}", FrameKind.USER) for i in range(5000))
    prof = replace(cpu_profile(), samples=(Sample(frames, (1, 10), 1, 1, "t"),
                                           *cpu_profile().samples))
    merged = merge([row(encode_pprof(prof))], 0, NOW)
    assert merged is not None
    t = tree(merged.profile)
    assert depth(t) == MAX_STACK_DEPTH
    node = next(c for c in t["children"] if c["name"] == "t")
    assert node["children"][0]["name"] == TRUNCATED
    body = render(merged, "json")[0]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(3 * MAX_STACK_DEPTH)
    try:
        assert json.loads(body)["tree"] == t
    finally:
        sys.setrecursionlimit(limit)
    leaf = node
    while leaf["children"]:
        leaf = leaf["children"][0]
    assert leaf["name"] == "f4999"
    assert b"f4999 " in render(merged, "folded")[0] and render(merged, "pprof")[0]
