"""The sandwich view (/api/v1/sandwich): one function's callees and callers
agree with numbers computed from the folded stacks, its total and self with
the top table's; recursion counts once."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from ember.agent.labels import ProcessLabels, series_labels
from ember.collector.api import Api
from ember.collector.store import StoredProfile
from ember.collector.validate import DEFAULT_LIMITS, INT64_MAX, check_request
from ember.encode.writeraw import make_series
from ember.model import Frame, FrameKind, Profile, Sample
from ember.proto import profilestore_pb2 as ps
from tests.support.profiles import FLEET_EXE, cpu_profile, fleet_profile

NOW = time.time_ns()
ALL = {"from": ["0"], "to": [str(INT64_MAX)]}
NS = 10**7  # nanoseconds per sample in these profiles: the tree's value over folded's


def stored(prof: Profile, pid: int = 10, at: int = 0) -> list[StoredProfile]:
    labels = series_labels(prof.type, ProcessLabels(pid=pid, comm="app"), {"host": f"h{pid}"})
    sent = replace(prof, start_ns=NOW - (at + 1) * 10**9, duration_ns=10**9, labels=labels)
    return check_request(ps.WriteRawRequest(series=[make_series(sent)[0]]), DEFAULT_LIMITS, NOW)


def even(prof: Profile) -> Profile:
    """Nanoseconds a fixed multiple of samples, so folded (samples) and the
    sandwich (nanoseconds) compare."""
    return replace(prof, samples=tuple(replace(s, values=(s.values[0], s.values[0] * NS))
                                       for s in prof.samples))


def get(api: Api, path: str, **params: str) -> tuple[int, Any]:
    code, body, _ = api.handle(path, {**ALL, **{k: [v] for k, v in params.items()}})
    return code, json.loads(body) if body.startswith(b"{") else body


def folded(api: Api) -> list[tuple[list[str], int]]:
    code, body = get(api, "/api/v1/profile", format="folded")
    assert code == 200
    out = []
    for line in body.decode().splitlines():
        stack, _, n = line.rpartition(" ")
        out.append((stack.split(";"), int(n)))
    return out


def flat(node: dict[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    """Each path below a nested tree's root -> its value."""
    out: dict[tuple[str, ...], int] = {}
    for c in node["children"]:
        path = (*prefix, c["name"])
        out[path] = c["value"]
        out.update(flat(c, path))
    return out


def expected(stacks: list[tuple[list[str], int]], name: str) -> tuple[Counter[tuple[str, ...]],
                                                                      Counter[tuple[str, ...]]]:
    """(callee paths, caller paths) -> samples, from folded stacks: what
    follows the first ``name`` of a stack, and what precedes it, inverted
    (the thread name included)."""
    callees: Counter[tuple[str, ...]] = Counter()
    callers: Counter[tuple[str, ...]] = Counter()
    for frames, n in stacks:
        if name not in frames[1:]:
            continue
        at = frames.index(name, 1)
        for i in range(at + 1, len(frames)):
            callees[tuple(frames[at + 1:i + 1])] += n
        up = frames[:at][::-1]
        for i in range(len(up)):
            callers[tuple(up[:i + 1])] += n
    return callees, callers


def check(api: Api, name: str) -> dict[str, Any]:
    code, got = get(api, "/api/v1/sandwich", name=name, max_nodes="20000")
    assert code == 200, got
    callees, callers = expected(folded(api), name)
    assert flat(got["callees"]) == {k: v * NS for k, v in callees.items()}
    assert flat(got["callers"]) == {k: v * NS for k, v in callers.items()}
    _, top = get(api, "/api/v1/top", limit="10000")
    row = next(r for r in top["rows"] if r["name"] == name)
    assert (got["total"], got["self"]) == (row["total"], row["self"])
    assert got["callees"]["value"] == got["callers"]["value"] == got["total"]
    assert got["callees"]["name"] == got["callers"]["name"] == name
    return dict(got)


def test_callees_and_callers_agree_with_the_folded_stacks(api: Api) -> None:
    rng = random.Random(11)
    for i in range(4):
        api.store.write(stored(even(fleet_profile(rng, 200)), pid=10 + i % 2, at=i))
    names = {f for frames, _ in folded(api) for f in frames[1:]}
    for name in ("fn0", "fn3", "fn17", "fn5_inl", *sorted(names)[:12]):
        if name in names:
            check(api, name)


def test_a_recursive_function_counts_once(api: Api) -> None:
    def f(name: str) -> Frame:
        return Frame(name, FrameKind.USER, FLEET_EXE, 0x400000 + 16 * int(name[1:]))
    a, b, c = f("f1"), f("f2"), f("f3")
    samples = (Sample((a, b, a, b, c), (3, 3 * NS), 10, 11, "t"),
               Sample((a, b), (2, 2 * NS), 10, 11, "t"),
               Sample((c, b), (5, 5 * NS), 10, 12, "u"))
    api.store.write(stored(replace(cpu_profile(), samples=samples)))
    got = check(api, "f2")
    assert got["total"] == 10 * NS and got["self"] == 7 * NS
    assert flat(got["callees"]) == {("f1",): 3 * NS, ("f1", "f2"): 3 * NS,
                                    ("f1", "f2", "f3"): 3 * NS}
    assert flat(got["callers"]) == {("f1",): 5 * NS, ("f1", "t"): 5 * NS,
                                    ("f3",): 5 * NS, ("f3", "u"): 5 * NS}


def test_pruned_to_max_nodes(api: Api) -> None:
    api.store.write(stored(even(fleet_profile(random.Random(5), 300))))
    code, got = get(api, "/api/v1/sandwich", name="fn0", max_nodes="7")
    assert code == 200
    assert len(flat(got["callees"])) == 6 and len(flat(got["callers"])) <= 6


def test_missing_name_is_400_and_an_unknown_one_404(api: Api) -> None:
    api.store.write(stored(even(fleet_profile(random.Random(1)))))
    assert get(api, "/api/v1/sandwich")[0] == 400
    assert get(api, "/api/v1/sandwich", name="fn0", max_nodes="0")[0] == 400
    code, body = get(api, "/api/v1/sandwich", name="no_such_function")
    assert code == 404 and "no_such_function" in body["error"]
    assert get(api, "/api/v1/sandwich", name="worker-0")[0] == 404  # a thread, not a frame
