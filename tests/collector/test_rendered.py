"""Answers kept by the API (``Api.rendered``): made once for the same
question, range and store generation, and never stale after a write."""

from __future__ import annotations

import random
import time

from ember.collector.api import RENDERED, Api, Route
from ember.httpserve import Reply
from tests.support.profiles import write_fleet

S = 10**9
T0 = (time.time_ns() // S - 600) * S


def ask(api: Api, path: str, **params: str) -> bytes:
    """The answer for the hour around the fleet's writes, a fixed range: a
    "since" is resolved to 10 s steps, and two asks on either side of a
    step are two ranges (a loaded CI machine's first tree took long enough
    to cross one, and the same question was made again)."""
    q = {"from": [str(T0 - 1800 * S)], "to": [str(T0 + 1800 * S)],
         **{k: [v] for k, v in params.items()}}
    if path == "/api/v1/sandwich":
        q["name"] = ["fn3"]
    code, body, _ = api.handle(path, q)
    assert code == 200, body
    return body


def test_the_same_question_is_answered_once(api: Api) -> None:
    write_fleet(api.store, random.Random(1), T0)
    made: list[str] = []
    for path in RENDERED:
        route = api.routes[path]

        def counted(q: dict[str, list[str]], path: str = path, route: Route = route) -> Reply:
            made.append(path)
            return route(q)
        api.routes[path] = counted
    for path in sorted(RENDERED):
        first = ask(api, path)
        assert ask(api, path) == first
    assert sorted(made) == sorted(RENDERED)
    ask(api, "/api/v1/top", limit="3")              # another question: made again
    assert made.count("/api/v1/top") == 2


def test_a_write_is_in_the_next_answer(api: Api) -> None:
    rng = random.Random(2)
    write_fleet(api.store, rng, T0)
    before = {path: ask(api, path) for path in RENDERED}
    write_fleet(api.store, rng, T0 + 5 * S)
    fresh = Api(api.store)
    for path in RENDERED:
        now = ask(api, path)
        assert now != before[path], path
        assert now == ask(fresh, path), path
