"""Roll-ups of sealed blocks (collector/rollup.py): a merge over every
series reads them for the blocks inside its range, and answers exactly as
the sample rows do, through late writes into sealed blocks, trees older
than a seal, retention cutting a block and a type's second shape."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import duckdb
import numpy as np
import pytest

from ember.collector import merge, rollup, server
from ember.collector import store as store_module
from ember.collector.api import Api
from ember.collector.matchers import selector
from ember.collector.rollup import BLOCK_NS, GRACE_NS, SPANS_NS
from ember.collector.server import Collector
from ember.collector.store import Store
from ember.config import CollectorConfig
from ember.errors import StorageError
from tests.support.profiles import write_fleet
from tests.support.store import FAR, T0, fill, seal_all
from tests.support.waits import wait_for

S = 10**9
VIEWS = (("/api/v1/tree", {"max_nodes": ["20000"]}),
         ("/api/v1/top", {"limit": ["1000"], "sort": ["total"]}),
         ("/api/v1/tree", {"search": ["fn3"]}))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db.duckdb")
    yield s
    s.close()


def ranges() -> list[tuple[int, int]]:
    """Whole, aligned to blocks, cutting blocks, inside one block."""
    b = T0 // BLOCK_NS * BLOCK_NS
    return [(0, FAR), (b + BLOCK_NS, b + 4 * BLOCK_NS), (T0 + 7 * S, T0 + 1234 * S),
            (b + 2 * BLOCK_NS + 5 * S, b + 2 * BLOCK_NS + 200 * S), (T0 + 300 * S, FAR)]


def views(store: Store, monkeypatch: pytest.MonkeyPatch, rolled: bool) -> list[Any]:
    """Every view of every range from an API with nothing cached, with the
    roll-ups read (rolled) or not."""
    with monkeypatch.context() as m:
        if not rolled:
            m.setattr(merge, "runs", lambda *a: [])
        out = []
        for lo, hi in ranges():
            api = Api(store)
            for path, extra in VIEWS:
                code, body, _ = api.handle(path, {"from": [str(lo)], "to": [str(hi)], **extra})
                out.append((code, body))
        return out


def used(monkeypatch: pytest.MonkeyPatch, spans: list[set[int]] | None = None) -> list[int]:
    """Records how much of each merge was read from roll-ups, in
    five-minute blocks (and in ``spans`` the lengths of the blocks read)."""
    seen: list[int] = []
    real = merge.runs

    def counting(*a: Any) -> list[tuple[int, int, int]]:
        got = real(*a)
        seen.append(sum((e - b) // BLOCK_NS for _, b, e in got))
        if spans is not None:
            spans.append({s for s, _, _ in got})
        return got
    monkeypatch.setattr(merge, "runs", counting)
    return seen


def sealed_blocks(store: Store) -> dict[rollup.Block, int]:
    """The sealed blocks of the store's (one) type, and their generations."""
    return store.seals.blocks(store.type_id(store.types()[0]) or 0)


def seals_of(store: Store, span: int) -> set[int]:
    return {b for s, b in sealed_blocks(store) if s == span}


def test_sealed_blocks_answer_as_the_rows(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(1)
    fill(store, rng, 30)
    raw = views(store, monkeypatch, rolled=False)
    # only closed blocks: at T0 + 12 min, the two ended a minute ago or more
    assert seal_all(store, now=T0 + 12 * 60 * S) == 2
    n = seal_all(store)
    assert n >= 5
    assert not store.seal(FAR)
    with store.cursor() as cur:
        assert cur.execute("SELECT COUNT(*) FROM seals").fetchone() == (n + 2,)
        rolled_rows, = cur.execute("SELECT COUNT(*) FROM rollups WHERE span = ?",
                                   (BLOCK_NS,)).fetchone()
        rows, = cur.execute("SELECT COUNT(*) FROM samples").fetchone()
    assert 0 < rolled_rows < rows
    # 30 minutes from T0, 16 minutes into a half hour: every five-minute
    # block, and the half hour that starts after T0 (the one before and
    # the three hours start before the oldest profile: left to the shorter)
    times = [T0 + at * S for at in range(0, 30 * 60, 40)]
    for span in SPANS_NS:
        assert seals_of(store, span) == {t // span * span for t in times
                                         if span == BLOCK_NS or t // span * span >= T0}
    spans: list[set[int]] = []
    seen = used(monkeypatch, spans)
    assert views(store, monkeypatch, rolled=True) == raw
    assert max(seen) >= 5                      # the whole range: its blocks rolled
    assert set().union(*spans) == set(SPANS_NS[:2])
    # a merge of some series reads their rows, never a roll-up
    seen.clear()
    agg = store.aggregate(0, FAR, selector(["host=h1"]), store.types()[0], by_name=True)
    assert agg is not None and not any(seen)


def test_late_rows_into_sealed_blocks_are_added(store: Store,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(2)
    fill(store, rng, 25)
    seal_all(store)
    sealed_at = store.generation
    with store.cursor() as cur:
        before, = cur.execute("SELECT COUNT(*) FROM rollups").fetchone()
    for at in (61, 400, 777, 900):             # an agent's retries, late
        write_fleet(store, rng, T0 + at * S, pids=(10, 20))
    with store.cursor() as cur:
        late = cur.execute("SELECT COUNT(*), min(written) FROM rollups WHERE written > ?",
                           (sealed_at,)).fetchone()
        assert cur.execute("SELECT COUNT(*) FROM rollups").fetchone()[0] > before
    assert late is not None and late[0] > 0 and late[1] == sealed_at + 1
    with store.cursor() as cur:   # added to the sealed blocks holding them (900 s: two)
        assert {s for s, in cur.execute("SELECT DISTINCT span FROM rollups WHERE written > ?",
                                        (sealed_at,)).fetchall()} == set(SPANS_NS[:2])
    assert views(store, monkeypatch, rolled=True) == views(store, monkeypatch, rolled=False)


def test_a_tree_older_than_a_seal_reads_that_block_s_rows(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    fill(store, rng, 25)
    before = store.generation
    seal_all(store)
    write_fleet(store, rng, T0 + 130 * S)      # into a sealed block, after the seal
    t = store.types()[0]
    seen = used(monkeypatch)

    def sums(upto: int) -> dict[int, int]:
        agg = store.aggregate(0, FAR, selector([]), t, by_name=True, value=1, upto=upto)
        assert agg is not None and agg.leaf is not None
        return dict(zip(agg.leaf.tolist(), agg.sums(1).tolist(), strict=True))

    old, new = sums(before), sums(store.generation)
    assert seen == [0, max(seen)] and max(seen) >= 4   # the old tree: no roll-up at all
    with monkeypatch.context() as m:
        m.setattr(merge, "runs", lambda *a: [])
        assert old == sums(before) and new == sums(store.generation)
    assert old != new


def test_retention_unseals_what_it_cuts(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(4)
    fill(store, rng, 30)
    seal_all(store)
    sealed = set(sealed_blocks(store))
    cut = T0 // BLOCK_NS * BLOCK_NS + 2 * BLOCK_NS + 100 * S   # inside a block
    with store._writing("test"):
        store._delete_before(cut)
    left = set(sealed_blocks(store))
    assert left == {b for b in sealed if b[1] >= cut} and len(left) < len(sealed)
    with store.cursor() as cur:
        assert cur.execute("SELECT COUNT(*) FROM rollups WHERE block < ?",
                           (cut,)).fetchone() == (0,)
    assert views(store, monkeypatch, rolled=True) == views(store, monkeypatch, rolled=False)
    # the five-minute block cut: sealed again from what is left; the longer
    # ones holding the cut start before the oldest profile: not again
    assert seal_all(store) == 1
    assert set(sealed_blocks(store)) == left | {
        (BLOCK_NS, cut // BLOCK_NS * BLOCK_NS)}
    assert views(store, monkeypatch, rolled=True) == views(store, monkeypatch, rolled=False)


def test_a_second_shape_drops_the_type_s_rollups(store: Store,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    fill(store, rng, 20)
    seal_all(store)
    assert store.seals.any()
    write_fleet(store, rng, T0 + 90 * S, hz=50)   # same type, another period
    assert len(store.shapes(store.types()[0])) == 2
    assert not store.seals.any() and not store.seal(FAR)
    with store.cursor() as cur:
        assert cur.execute("SELECT COUNT(*) FROM rollups").fetchone() == (0,)
        assert cur.execute("SELECT COUNT(*) FROM seals").fetchone() == (0,)
    assert views(store, monkeypatch, rolled=True) == views(store, monkeypatch, rolled=False)


def test_seals_survive_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "db.duckdb"
    store = Store(path)
    fill(store, random.Random(6), 20)
    n = seal_all(store)
    generation = store.generation
    store.close()
    store = Store(path)
    try:
        assert len(sealed_blocks(store)) == n
        assert store.generation == generation and not store.seal(FAR)
        seen = used(monkeypatch)
        assert views(store, monkeypatch, rolled=True) == views(store, monkeypatch,
                                                               rolled=False)
        assert max(seen) >= 3
    finally:
        store.close()


def test_runs_are_the_blocks_wholly_inside_and_old_enough() -> None:
    b = 100 * BLOCK_NS
    five = BLOCK_NS
    sealed = {(five, b): 5, (five, b + five): 6, (five, b + 2 * five): 9, (five, b + 4 * five): 5}
    assert rollup.runs(sealed, b, b + 5 * five, None) == [
        (five, b, b + 3 * five), (five, b + 4 * five, b + 5 * five)]
    assert rollup.runs(sealed, b, b + 5 * five, 6) == [
        (five, b, b + 2 * five), (five, b + 4 * five, b + 5 * five)]
    assert rollup.runs(sealed, b + 1, b + 5 * five - 1, None) == [
        (five, b + five, b + 3 * five)]
    assert rollup.runs(sealed, b, b + five - 1, None) == []


def test_runs_take_the_longest_blocks_that_fit() -> None:
    half, five = SPANS_NS[1], SPANS_NS[0]
    h = 1000 * SPANS_NS[-1]                   # aligned to every length
    sealed = {(five, h + i * five): 1 for i in range(18)}
    sealed |= {(half, h): 2, (half, h + half): 3, (half, h + 2 * half): 4}
    # [h + 10 min, h + 85 min): 5-min blocks, one half hour, 5-min blocks
    assert rollup.runs(sealed, h + 2 * five, h + 17 * five, None) == [
        (half, h + half, h + 2 * half), (five, h + 2 * half, h + 17 * five),
        (five, h + 2 * five, h + half)]
    # a tree older than the half hours' seals reads the shorter blocks
    assert rollup.runs(sealed, h, h + 2 * half, 2) == [(half, h, h + half),
                                                      (five, h + half, h + 2 * half)]
    assert rollup.runs(sealed, h, h + 2 * half, 1) == [(five, h, h + 2 * half)]


def test_a_longer_block_waits_for_the_shorter_ones_in_it(store: Store) -> None:
    fill(store, random.Random(8), 30)           # T0 is 16 minutes into a half hour
    tid = store.type_id(store.types()[0]) or 0
    half = SPANS_NS[1]
    first = T0 // half * half
    second = first + half
    # at the end of the next half hour (plus the grace): the five-minute
    # blocks first, then that half hour, never before; T0's own half hour
    # and three hours start before the oldest profile: never
    now = second + half + GRACE_NS
    order = []
    while store.seal(now):
        new = set(store.seals.blocks(tid)) - set(order)
        order += sorted(new)
    assert order[-1] == (half, second)
    assert {b for s, b in order[:-1]} == {
        t // BLOCK_NS * BLOCK_NS for t in range(T0, T0 + 30 * 60 * S, 40 * S)}
    assert all(s == BLOCK_NS for s, _ in order[:-1])


def test_a_collector_rolls_up_closed_blocks_by_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "db.duckdb"
    store = Store(path)
    now = time.time_ns()
    rng = random.Random(7)
    starts = [now - 60 * 60 * S + at * S for at in range(0, 40 * 60, 60)]
    for t in starts:                        # 40 minutes ending 20 minutes ago
        write_fleet(store, rng, t)
    store.close()

    def closed() -> int:
        """The blocks of each length holding a profile and closed by now
        (a longer one only from the first profile on)."""
        by = time.time_ns() - GRACE_NS
        return sum(len({b for t in starts if (b := t // span * span) + span <= by
                        and (span == BLOCK_NS or b >= starts[0])}) for span in SPANS_NS)
    monkeypatch.setattr(server, "SEAL_PAUSE_S", 0.01)
    c = Collector(CollectorConfig(storage=str(path), grpc_listen="127.0.0.1:0",
                                  http_listen="127.0.0.1:0"))
    c.start()
    try:
        def sealed() -> int:
            return len(sealed_blocks(c.store))

        assert wait_for(lambda: sealed() == closed(), 60), (sealed(), closed())
        assert sealed() >= len({t // BLOCK_NS for t in starts})
        assert wait_for(lambda: f"ember_collector_blocks_sealed_total {sealed()}.0" in
                        c.handle("/metrics", {}, "")[1].decode())
        assert not c.store.seal(time.time_ns())   # the collector left none
        # and then grouped the five-minute blocks' rows by series (cluster.py)
        with c.store.cursor() as cur:
            five = {b for (b,) in cur.execute("SELECT block FROM seals WHERE span = ?",
                                              (BLOCK_NS,)).fetchall()}
            held = sum(1 for (t,) in cur.execute("SELECT time_ns FROM samples").fetchall()
                       if t // BLOCK_NS * BLOCK_NS in five)

        def clustered() -> set[int]:
            with c.store.cursor() as cur:
                return {b for (b,) in cur.execute("SELECT block FROM clustered").fetchall()}
        assert wait_for(lambda: clustered() == five, 60), (clustered(), five)
        assert wait_for(lambda: f"ember_collector_rows_clustered_total {held}.0" in
                        c.handle("/metrics", {}, "")[1].decode())
    finally:
        c.close()


def test_the_seal_loop_rests_after_each_move_of_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Moves of rows (cluster.py) take at most 1 / (1 + CLUSTER_REST) of the
    time: after each, the loop rests CLUSTER_REST times as long as it took."""
    monkeypatch.setattr(server, "SEAL_PAUSE_S", 0.001)
    stop, began = threading.Event(), []

    class Moving:
        def seal(self, now_ns: int) -> bool:
            return False

        def cluster(self) -> int | None:
            began.append(time.monotonic())
            time.sleep(0.05)
            if len(began) == 4:
                stop.set()
            return 7

    class Counter:
        n = 0

        def inc(self, by: int = 1) -> None:
            self.n += by
    warmed = threading.Event()
    warmed.set()
    loop = SimpleNamespace(store=Moving(), _stop=stop, warmed=warmed,
                           metrics=SimpleNamespace(sealed=Counter(), clustered=Counter()))
    Collector._seal_loop(loop)  # type: ignore[arg-type]
    gaps = [b - a for a, b in itertools.pairwise(began)]
    assert len(gaps) == 3 and min(gaps) >= 0.05 * (1 + server.CLUSTER_REST), gaps
    assert loop.metrics.clustered.n == 4 * 7


def test_the_seal_loop_waits_for_the_query_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is rolled up or moved while the start builds the query index
    (the two's working sets together were the start's peak RSS); once it
    is built, the loop goes on; stopped before, it ends without a seal."""
    monkeypatch.setattr(server, "SEAL_PAUSE_S", 0.001)
    sealed: list[float] = []

    class Sealing:
        def seal(self, now_ns: int) -> bool:
            sealed.append(time.monotonic())
            return False

        def cluster(self) -> int | None:
            return None

    def loop_of(warmed: threading.Event, stop: threading.Event) -> threading.Thread:
        loop = SimpleNamespace(store=Sealing(), _stop=stop, warmed=warmed, metrics=None)
        t = threading.Thread(target=Collector._seal_loop, args=(loop,))
        t.start()
        return t

    warmed, stop = threading.Event(), threading.Event()
    t = loop_of(warmed, stop)
    time.sleep(0.2)
    assert sealed == [] and t.is_alive()
    built = time.monotonic()
    warmed.set()
    deadline = time.monotonic() + 30
    while not sealed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sealed and sealed[0] >= built
    stop.set()
    t.join(30)
    sealed.clear()
    t = loop_of(threading.Event(), stop)   # stopped while the index is built
    t.join(30)
    assert not t.is_alive() and sealed == []


def test_a_store_of_schema_5_keeps_its_seals_as_five_minute_blocks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "db.duckdb"
    store = Store(path)
    fill(store, random.Random(9), 20)
    assert seal_all(store, now=T0 + 12 * 60 * S) == 2     # five-minute blocks only
    sealed = set(sealed_blocks(store))
    with store.cursor() as cur:
        rolled = cur.execute("SELECT * EXCLUDE (span) FROM rollups ORDER BY ALL").fetchall()
    store.close()
    with duckdb.connect(str(path)) as db:                 # as the collector before made them
        for table in ("rollups", "seals"):
            db.execute(f"ALTER TABLE {table} DROP COLUMN span")
        db.execute("UPDATE meta SET value = '5' WHERE key = 'schema'")
    store = Store(path)
    try:
        assert set(sealed_blocks(store)) == sealed
        with store.cursor() as cur:
            assert cur.execute("SELECT value FROM meta WHERE key = 'schema'").fetchall() == [
                ("6",)]
            assert cur.execute("SELECT * EXCLUDE (span) FROM rollups ORDER BY ALL"
                               ).fetchall() == rolled
            assert cur.execute("SELECT DISTINCT span FROM rollups").fetchall() == [(BLOCK_NS,)]
        seen = used(monkeypatch)
        assert views(store, monkeypatch, rolled=True) == views(store, monkeypatch, rolled=False)
        assert max(seen) >= 1
        assert seal_all(store) >= 3                       # and on from there
        assert views(store, monkeypatch, rolled=True) == views(store, monkeypatch, rolled=False)
    finally:
        store.close()


@pytest.mark.parametrize("seed", range(3))
def test_any_history_of_writes_seals_and_cuts_merges_as_the_rows(
        store: Store, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Writes in order and late, seals as time passes, retention cutting
    anywhere: every merge (of any range, by a tree of any generation) sums
    the same with the roll-ups of every length as from the rows alone."""
    rng = random.Random(100 + seed)
    longest = SPANS_NS[-1]
    begin = T0 // longest * longest     # (so its first three hours are sealed)
    hours = 4
    ever: set[int] = set()
    clock = begin
    written: list[int] = []
    real = merge.runs
    checked = 0

    def sums(lo: int, hi: int, upto: int, rolled: bool) -> dict[int, int]:
        merge.runs = real if rolled else (lambda *a: [])  # type: ignore[assignment]
        try:
            agg = store.aggregate(lo, hi, selector([]), store.types()[0], by_name=True,
                                  value=1, upto=upto)
        finally:
            merge.runs = real  # type: ignore[assignment]
        if agg is None or agg.leaf is None:
            return {}
        return dict(zip(agg.leaf.tolist(), agg.sums(1).tolist(), strict=True))

    write_fleet(store, rng, begin)
    written.append(begin)
    while clock < begin + hours * 3600 * S:
        clock += rng.choice((60, 120, 300)) * S
        late = written and rng.random() < 0.2
        at = rng.choice(written) + rng.randrange(1, 59) * S if late else clock
        write_fleet(store, rng, at, pids=tuple(rng.sample((10, 11, 12, 13), 2)))
        written.append(at)
        for _ in range(rng.randrange(0, 4)):       # the seal loop, now and then
            store.seal(clock + 2 * S)
        ever |= {s for s, _ in sealed_blocks(store)}
        if rng.random() < 0.05 and set(SPANS_NS) <= ever:   # retention, behind
            with store._writing("test"):
                store._delete_before(rng.randrange(begin, clock))
        if rng.random() < 0.3 or clock >= begin + hours * 3600 * S:
            a, b = sorted(rng.randrange(begin - 600 * S, clock + 600 * S) for _ in range(2))
            for lo, hi in ((a, b), (0, FAR)):
                upto = rng.randrange(max(store.generation - 5, 0), store.generation + 1)
                assert sums(lo, hi, upto, True) == sums(lo, hi, upto, False), (lo, hi, upto)
                checked += 1
    assert ever == set(SPANS_NS) and checked >= 10


def test_a_failed_write_of_a_second_shape_keeps_the_seals(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(10)
    fill(store, rng, 20)
    seal_all(store)
    sealed = sealed_blocks(store)

    def failing(*a: Any) -> None:
        raise duckdb.IOException("the disk went away")
    with monkeypatch.context() as m:
        m.setattr(store_module, "insert", failing)
        with pytest.raises(StorageError):
            write_fleet(store, rng, T0 + 90 * S, hz=50)   # same type, another period
    # rolled back whole: the seals as stored, none made twice
    assert sealed_blocks(store) == sealed
    assert not store.seal(FAR)
    assert views(store, monkeypatch, rolled=True) == views(store, monkeypatch, rolled=False)


def test_late_sums_saturate_as_the_merges_do() -> None:
    seals = rollup.Seals()
    seals.sealed(7, (BLOCK_NS, 0), 1)
    big = (1 << 62) + 5
    cols = {"type": np.array([7, 7, 7], np.uint64), "time_ns": np.array([1, 2, 3], np.int64),
            "leaf": np.array([4, 4, 5], np.uint32), "written": np.array([2, 2, 2], np.uint64),
            **{f"v{i}": np.array([big, big, 1], np.int64) for i in range(rollup.MAX_VALUES)}}
    got = seals.late(cols)
    assert got is not None
    assert got["leaf"].tolist() == [4, 5] and got["v0"].tolist() == [(1 << 63) - 1, 1]
    assert seals.late(cols, dropped=[7]) is None
