"""The store and the query engine on ember's own profiles: a range read
back as pprof equals what was sent (frames with mappings, lines and inlined
functions, threads, labels, summed values); the tree views (pruned tree,
zoom, search, top) agree with numbers computed from the folded stacks; a
store of the older format is converted with nothing readable lost."""

from __future__ import annotations

import gzip
import json
import random
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ember.agent.labels import ProcessLabels, series_labels
from ember.collector.api import Api
from ember.collector.legacy import KEPT_SUFFIX
from ember.collector.store import Store, StoredProfile
from ember.collector.validate import DEFAULT_LIMITS, INT64_MAX, check_request
from ember.encode.folded import parse_folded
from ember.encode.pprof import decode_pprof, encode_pprof, from_proto, to_proto
from ember.encode.writeraw import make_series
from ember.flamegraph.graphs import top_functions
from ember.flamegraph.inputs import Stacks
from ember.model import (
    MAX_STACK_DEPTH,
    TRUNCATED,
    Frame,
    FrameKind,
    Mapping,
    Profile,
    Sample,
    merge_samples,
)
from ember.proto import profile_pb2 as pb
from ember.proto import profilestore_pb2 as ps
from tests.support.legacy import write_legacy
from tests.support.profiles import cpu_profile, fleet_profile, offcpu_profile

NOW = time.time_ns()
ALL = {"from": ["0"], "to": [str(INT64_MAX)]}
EXE = Mapping(0x400000, 0x500000, 0, "/usr/bin/app", "feedface")


def stored(prof: Profile, pid: int = 10, at: int = 0) -> list[StoredProfile]:
    """What the collector stores of a profile an agent sent."""
    labels = series_labels(prof.type, ProcessLabels(pid=pid, comm="app"), {"host": f"h{pid}"})
    sent = replace(prof, start_ns=NOW - (at + 1) * 10**9, duration_ns=10**9, labels=labels)
    return check_request(ps.WriteRawRequest(series=[make_series(sent)[0]]), DEFAULT_LIMITS, NOW)


def get(api: Api, path: str, **params: str) -> tuple[int, bytes]:
    code, body, _ = api.handle(path, {**ALL, **{k: [v] for k, v in params.items()}})
    return code, body


def key(s: Sample) -> tuple[object, ...]:
    return (s.frames, s.pid, s.tid, s.thread_name, s.labels)


def test_a_range_reads_back_as_pprof_equal_to_what_was_sent(api: Api) -> None:
    rng = random.Random(7)
    sent = [fleet_profile(rng) for _ in range(6)]
    for i, prof in enumerate(sent):
        api.store.write(stored(prof, pid=10 + i % 2, at=i))
    code, body = get(api, "/api/v1/profile", format="pprof")
    assert code == 200
    _, got = from_proto(decode_pprof(body))
    want = {key(s): s.values for s in merge_samples([s for p in sent for s in p.samples])}
    assert {key(s): s.values for s in got} == want
    frames = {f for s in got for f in s.frames}
    assert any(f.inlined and f.file == "inl.h" for f in frames)
    assert all(f.mapping == EXE and f.line for f in frames)


def test_folded_and_the_tree_agree_with_the_samples(api: Api) -> None:
    rng = random.Random(3)
    sent = fleet_profile(rng, 200)
    api.store.write(stored(sent))
    folded = parse_folded(get(api, "/api/v1/profile", format="folded")[1].decode())
    assert sum(folded.values()) == sum(s.values[0] for s in sent.samples)
    body = json.loads(get(api, "/api/v1/tree", max_nodes="20000")[1])
    assert body["total"] == sum(folded.values()) == body["tree"]["value"]

    def walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, int]]:
        if node["self"]:
            yield path, node["self"]
        for c in node["children"]:
            yield from walk(c, f"{path};{c['name']}" if path else c["name"])
    assert Counter(dict(walk(body["tree"], ""))) == folded  # nothing pruned at this size


def shares(folded: Counter[str], pattern: str) -> float:
    """flamegraph.pl's matched share, from folded lines."""
    rx = re.compile(pattern)
    hit = sum(v for stack, v in folded.items() if any(rx.search(f) for f in stack.split(";")))
    return hit / sum(folded.values())


def test_search_counts_the_whole_profile_not_what_is_drawn(api: Api) -> None:
    rng = random.Random(11)
    for i in range(4):
        api.store.write(stored(fleet_profile(rng, 300), at=i))
    folded = parse_folded(get(api, "/api/v1/profile", format="folded")[1].decode())
    for pattern in ("fn1$", "fn(2|3)", "_inl", "worker-1"):
        body = json.loads(get(api, "/api/v1/tree", search=pattern, max_nodes="5")[1])
        assert len(json.dumps(body["tree"])) < 2000  # five nodes drawn ...
        want = shares(folded, pattern)  # ... the share over every stack
        assert abs(body["matched"]["share"] - want) < 1e-9, pattern
    assert get(api, "/api/v1/tree", search="(")[0] == 400


def test_zoom_opens_frames_too_narrow_for_the_whole_view(api: Api) -> None:
    wide = Frame("wide", FrameKind.USER, EXE, 0x400010)
    narrow = Frame("narrow", FrameKind.USER, EXE, 0x400020)
    kids = [Frame(f"kid{i}", FrameKind.USER, EXE, 0x400100 + i) for i in range(50)]
    samples = [Sample((wide,), (10**6, 10**13), 1, 1, "t")]
    samples += [Sample((narrow, k), (1 + i, 10**7), 1, 1, "t") for i, k in enumerate(kids)]
    api.store.write(stored(replace(cpu_profile(), samples=tuple(samples))))
    whole = json.loads(get(api, "/api/v1/tree", max_nodes="4")[1])["tree"]
    t = whole["children"][0]
    assert [c["name"] for c in t["children"]] == ["wide", "narrow"]
    assert not t["children"][1]["children"]  # too narrow to draw here
    zoomed = json.loads(get(api, "/api/v1/tree", focus="t;narrow", max_nodes="100")[1])
    assert zoomed["focus"] == ["t", "narrow"]
    assert {c["name"]: c["value"] for c in zoomed["tree"]["children"]} == {
        f"kid{i}": 1 + i for i in range(50)}
    assert get(api, "/api/v1/tree", focus="t;nothing")[0] == 404


def test_top_agrees_with_the_folded_stacks(api: Api) -> None:
    rng = random.Random(5)
    prof = fleet_profile(rng, 400)
    api.store.write(stored(prof))
    body = json.loads(get(api, "/api/v1/top", limit="1000")[1])
    lines: Counter[str] = Counter()  # /top counts the main value (time)
    for s in prof.samples:
        lines[";".join([s.thread_name, *(f.name for f in s.frames)])] += s.values[1]
    want = top_functions(Stacks(lines, "ns", {}), 1000)
    want_total = {r["name"]: (r["self"], r["total"]) for r in want}
    assert {r["name"]: (r["self"], r["total"]) for r in body["rows"]} == want_total
    by_total = json.loads(get(api, "/api/v1/top", limit="5", sort="total")[1])["rows"]
    assert [r["total"] for r in by_total] == sorted((t for _, t in want_total.values()),
                                                    reverse=True)[:5]


def test_profiles_of_another_shape_are_counted(api: Api) -> None:
    heard: list[tuple[str, int]] = []
    api.on_skip = lambda reason, n: heard.append((reason, n))
    cpu = stored(cpu_profile())[0]
    off = stored(offcpu_profile())[0]
    api.store.write([cpu, replace(off, profile_id="other", type=cpu.type),
                     replace(cpu, profile_id="again", time_ns=cpu.time_ns - 1)])
    body = json.loads(get(api, "/api/v1/tree")[1])
    assert body["profiles"] == 2 and heard == [("shape", 1)]


def test_a_5000_frame_stack_makes_a_capped_tree(api: Api) -> None:
    """The tree keeps MAX_STACK_DEPTH levels (root, thread, [truncated],
    leafmost frames) and the JSON answer is written at that depth, where
    json.dumps gives up."""
    frames = tuple(Frame(f"f{i}", FrameKind.USER, EXE, 0x400000 + i) for i in range(5000))
    prof = replace(cpu_profile(), samples=(Sample(frames, (1, 10), 1, 1, "t"),
                                           *cpu_profile().samples))
    p = to_proto(prof)   # sent as an older agent would, past today's cap
    sp = stored(cpu_profile())[0]
    api.store.write([replace(sp, profile_id="deep", proto=p,
                             data=gzip.compress(p.SerializeToString()))])
    body = get(api, "/api/v1/tree", max_nodes="20000")[1]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(3 * MAX_STACK_DEPTH)
    try:
        tree = json.loads(body)["tree"]
    finally:
        sys.setrecursionlimit(limit)
    node = next(c for c in tree["children"] if c["name"] == "t")
    assert node["children"][0]["name"] == TRUNCATED
    levels = 1
    while node["children"]:
        node, levels = node["children"][0], levels + 1
    assert node["name"] == "f4999" and levels == MAX_STACK_DEPTH
    assert b"f4999 " in get(api, "/api/v1/profile", format="folded")[1]


def test_sums_past_int64_saturate(api: Api) -> None:
    def extreme(sign: int) -> Callable[[pb.Profile], None]:
        def change(p: pb.Profile) -> None:
            for s in p.sample:
                s.value[1] = sign * ((1 << 63) - 1)
        return change
    rows = []
    for i, sign in enumerate([1] * 3 + [-1] * 9):
        sp = stored(cpu_profile(), at=i)[0]
        p = to_proto(cpu_profile())
        extreme(sign)(p)
        rows.append(replace(sp, proto=p))
    api.store.write(rows)
    _, got = from_proto(decode_pprof(get(api, "/api/v1/profile", format="pprof")[1]))
    assert {s.values[1] for s in got} == {-(1 << 63)}
    assert get(api, "/api/v1/tree")[0] == 200


def test_an_older_store_is_converted_with_nothing_readable_lost(tmp_path: Path) -> None:
    """A store of the first format (SQLite blobs), with rows an older
    collector stored without today's checks: the collector converts it, keeps
    the old file, and serves the same merge the old one did."""
    rng = random.Random(1)
    good = [sp for i in range(30) for sp in stored(fleet_profile(rng), pid=10 + i % 3, at=i)]
    good += stored(offcpu_profile(), at=3)
    pid = list(to_proto(cpu_profile()).string_table).index("pid")

    def damaged(change: Callable[[pb.Profile], object]) -> bytes:
        p = to_proto(cpu_profile())
        change(p)
        return gzip.compress(p.SerializeToString())
    bad = [b"garbage", encode_pprof(cpu_profile())[:40],
           damaged(lambda p: setattr(p.function[0], "name", 10_000)),
           damaged(lambda p: p.sample[0].label.add(key=pid, str=1)),
           damaged(lambda p: p.sample[0].value.append(1))]
    rows = good + [replace(good[0], profile_id=f"bad{i}", data=d) for i, d in enumerate(bad)]
    path = tmp_path / "profiles.db"
    write_legacy(path, rows)
    store = Store(path)
    try:
        assert store.count() == len(good)
        assert (tmp_path / f"profiles.db{KEPT_SUFFIX}").exists()
        api = Api(store)
        for type_ in {sp.type for sp in good}:
            want = merge_samples([s for sp in good if sp.type == type_
                                  for s in from_proto(decode_pprof(sp.data))[1]])
            code, body = get(api, "/api/v1/profile", format="pprof", type=type_)
            assert code == 200
            assert {key(s): s.values for s in from_proto(decode_pprof(body))[1]} == {
                key(s): s.values for s in want}
        assert sorted(store.label_values("host")) == ["h10", "h11", "h12"]
    finally:
        store.close()
    again = Store(path)  # opened again: already converted, nothing to do
    assert again.count() == len(good)
    again.close()


def test_a_tree_asked_for_at_once_is_made_once(api: Api) -> None:
    """The page asks for the flame graph and the table together, and
    clients alike: one merge serves them; a write makes the next one new."""
    api.store.write(stored(fleet_profile(random.Random(2))))
    made = []
    real = api.store.aggregate

    def slow(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        time.sleep(0.3)
        return real(*args, **kwargs)
    api.store.aggregate = slow  # type: ignore[method-assign]
    q = dict(ALL)
    answers: list[int] = []
    threads = [threading.Thread(target=lambda: answers.append(
        api.handle("/api/v1/top", q)[0])) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [200] * 6 and len(made) == 1
    api.store.write(stored(fleet_profile(random.Random(3)), at=2))
    assert api.handle("/api/v1/top", q)[0] == 200 and len(made) == 2
