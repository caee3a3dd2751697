"""Trees slid along time (collector/window.py) answer exactly what a merge
of the rows answers: through writes of newer profiles and writes inside the
range (late ones too, and one landing while the tree is merged), and not
slid after a deletion or a range that moved back."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from ember.collector.api import Api
from ember.collector.server import Collector
from ember.collector.store import Store
from ember.config import CollectorConfig
from tests.support.profiles import write_fleet

S = 10**9
T0 = (time.time_ns() // S - 3600) * S   # the first profile's start: an hour ago, kept


def write(store: Store, rng: random.Random, at: int, pids: tuple[int, ...] = (10, 11, 12)) -> None:
    """One profile per pid starting ``at`` seconds after T0, lasting 1 s."""
    write_fleet(store, rng, T0 + at * S, pids)


def views(api: Api, lo: int, hi: int, match: str = "") -> tuple[bytes, bytes]:
    """(folded, pruned tree JSON) of [T0+lo s, T0+hi s)."""
    q = {"from": [str(T0 + lo * S)], "to": [str(T0 + hi * S)], "max_nodes": ["20000"]}
    if match:
        q["match"] = [match]
    out = []
    for path, extra in (("/api/v1/profile", {"format": ["folded"]}), ("/api/v1/tree", {})):
        code, body, _ = api.handle(path, {**q, **extra})
        assert code == 200, body
        out.append(body)
    return out[0], out[1]


def merged(api: Api, lo: int, hi: int, match: str = "") -> tuple[bytes, bytes]:
    """The same views merged from the rows, by an API with nothing cached."""
    return views(Api(api.store), lo, hi, match)


@pytest.mark.parametrize("match", ["", "pid=11", "host!=h1"])
def test_a_range_moving_on_through_writes_is_slid_and_exact(api: Api, match: str) -> None:
    rng = random.Random(7)
    for at in range(20):
        write(api.store, rng, at)
    views(api, 0, 15, match)
    for step in range(1, 8):
        write(api.store, rng, 19 + step)             # newer than any range asked yet
        lo, hi = step, 15 + step
        got = views(api, lo, hi, match)
        assert got == merged(api, lo, hi, match), step
        assert json.loads(got[1])["total"] > 0
    assert api.windows.slid == 7   # folded and the JSON tree share one tree


def test_the_same_range_after_a_write_beyond_it_is_unchanged(api: Api) -> None:
    rng = random.Random(1)
    for at in range(10):
        write(api.store, rng, at)
    before = views(api, 0, 10)
    write(api.store, rng, 30)
    assert views(api, 0, 10) == before == merged(api, 0, 10)
    assert api.windows.slid == 1


@pytest.mark.parametrize("match", ["", "pid=11"])
def test_writes_inside_the_range_are_slid_and_exact(api: Api, match: str) -> None:
    """Agents ship profiles that end now, inside a range that ends now: the
    same range asked again after each write, then moved on past a late one."""
    rng = random.Random(9)
    for at in range(10):
        write(api.store, rng, at)
    views(api, 0, 20, match)
    for at in range(10, 16):
        write(api.store, rng, at)                    # inside [0, 20)
        assert views(api, 0, 20, match) == merged(api, 0, 20, match), at
    write(api.store, rng, 3, pids=(11, 13))          # late: long inside the range
    assert views(api, 2, 22, match) == merged(api, 2, 22, match)
    assert api.windows.slid == 7


def test_a_write_while_a_tree_is_merged_is_counted_once(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tree sums what was written by the generation it is filed under:
    a write landing between the two is added by the next slide, not twice."""
    rng = random.Random(11)
    for at in range(6):
        write(api.store, rng, at)
    real = api.store.aggregate
    landed = []

    def racing(*args: object, **kwargs: object) -> object:
        if not landed and kwargs.get("by_name"):     # the tree's merge
            landed.append(True)
            write(api.store, rng, 7)                 # after the generation was read
        return real(*args, **kwargs)                  # type: ignore[arg-type]
    monkeypatch.setattr(api.store, "aggregate", racing)
    views(api, 0, 10)
    monkeypatch.setattr(api.store, "aggregate", real)
    write(api.store, rng, 8)
    assert views(api, 0, 10) == merged(api, 0, 10)
    assert landed and api.windows.slid == 1


@pytest.mark.parametrize("change", ["deletion", "back in time"])
def test_a_deletion_or_a_range_moved_back_merges_again(api: Api, change: str) -> None:
    rng = random.Random(3)
    for at in range(2, 20):
        write(api.store, rng, at)
    views(api, 2, 14)
    lo, hi = 4, 16
    if change == "deletion":
        api.store.enforce_retention((T0 + 7 * S) / 1e9, 1 << 40)   # nothing: too recent
        with api.store._writing("test"):
            api.store._delete_before(T0 + 5 * S)
    else:
        lo, hi = 1, 13
    assert views(api, lo, hi) == merged(api, lo, hi)
    assert api.windows.slid == 0


def distinct_pairs(store: Store) -> int:
    with store.cursor() as cur:
        return int(cur.execute("SELECT COUNT(DISTINCT leaf) FROM samples").fetchone()[0])


def test_a_warm_index_holds_every_stored_stack(api: Api) -> None:
    rng = random.Random(5)
    for at in range(6):
        write(api.store, rng, at)
    assert api.index.warm(chunk=7) == distinct_pairs(api.store) > 7
    nodes = len(api.index)
    before = views(api, 0, 6)
    assert len(api.index) == nodes            # the query found every leaf made
    assert before == merged(api, 0, 6)


def test_a_collector_builds_its_index_as_it_starts(tmp_path: Path) -> None:
    path = tmp_path / "db.duckdb"
    store = Store(path)
    rng = random.Random(2)
    for at in range(4):
        write(store, rng, at)
    stored = distinct_pairs(store)
    store.close()
    c = Collector(CollectorConfig(storage=str(path), grpc_listen="127.0.0.1:0",
                                  http_listen="127.0.0.1:0"))
    c.start()
    try:
        deadline = time.monotonic() + 60
        while len(c.api.index._keys) < stored and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(c.api.index._keys) == stored
    finally:
        c.close()


def test_the_collector_counts_trees_merged_and_slid(tmp_path: Path) -> None:
    c = Collector(CollectorConfig(storage=str(tmp_path / "db.duckdb")))
    try:
        rng = random.Random(4)
        for at in range(8):
            write(c.store, rng, at)
        views(c.api, 0, 6)
        write(c.store, rng, 9)
        views(c.api, 1, 7)
        text = c.handle("/metrics", {}, "")[1].decode()
        assert 'ember_collector_trees_total{how="merged"} 1.0' in text
        assert 'ember_collector_trees_total{how="slid"} 1.0' in text
    finally:
        c.close()
