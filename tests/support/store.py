"""Profiles through a real (in-memory) store, as the collector serves them."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import duckdb

from ember.collector.api import Api
from ember.collector.ids import thread_name_id
from ember.collector.query import FORMATS
from ember.collector.store import Store, StoredProfile
from ember.collector.validate import INT64_MAX
from ember.encode.pprof import decode_pprof, from_proto
from tests.support.profiles import write_fleet

#: The whole of time, as a query's range.
ALL = {"from": ["0"], "to": [str(INT64_MAX)]}
_S = 10**9
#: A fleet's first write (a minute into a five-minute block), and "now",
#: long after everything ``fill`` writes (tests of roll-ups and their sums).
T0 = 1_700_000_160 * _S
FAR = T0 + 10 * 3600 * _S


def served(stored: Sequence[StoredProfile], copies: int = 1) -> tuple[dict[str, bytes], Api]:
    """Every rendering (folded, pprof, json) of the stored profiles merged,
    each stored ``copies`` times under its own id; and the API over them
    (close ``api.store`` when done)."""
    store = Store(":memory:")
    store.write([replace(p, profile_id=f"{p.profile_id}-{i}")
                 for i in range(copies) for p in stored])
    api = Api(store)
    q = {"from": ["0"], "to": [str(INT64_MAX)], "type": [stored[0].type]}
    out = {}
    for fmt in FORMATS:
        code, body, _ = api.handle("/api/v1/profile", {**q, "format": [fmt]})
        assert code == 200, body
        out[fmt] = body
    return out, api


#: ``profiles`` as collectors of schema 2 to 4 created it.
PROFILES_4 = """(profile_id VARCHAR PRIMARY KEY, series UBIGINT, type VARCHAR, type_id UBIGINT,
    shape VARCHAR, time_ns BIGINT, duration_ns BIGINT, received_ns BIGINT, samples BIGINT,
    bytes BIGINT)"""


def to_schema_4(path: Path) -> None:
    """A store of today's schema made as the schema-4 collector left it:
    the rows name series, threads, thread names and stacks by their 64-bit
    ids, in the same order; ``series`` and ``threads`` have no numbers."""
    db = duckdb.connect(str(path))
    db.execute("SET preserve_insertion_order = true")
    db.execute("CREATE TABLE old AS SELECT s.time_ns, s.end_ns, se.id AS series, s.type, "
               "th.id AS thread, l.tname, l.stack, s.v0, s.v1, s.v2, s.v3, s.leaf, s.written "
               "FROM samples s JOIN series se ON se.num = s.series "
               "JOIN threads th ON th.num = s.thread JOIN leaves l ON l.id = s.leaf")
    db.execute("DROP TABLE samples")
    db.execute("ALTER TABLE old RENAME TO samples")
    db.execute(f"CREATE TABLE old {PROFILES_4}")
    db.execute("INSERT INTO old SELECT p.profile_id, se.id, p.type, p.type_id, p.shape, "
               "p.time_ns, p.duration_ns, p.received_ns, p.samples, p.bytes "
               "FROM profiles p JOIN series se ON se.num = p.series")
    db.execute("DROP TABLE profiles")
    db.execute("ALTER TABLE old RENAME TO profiles")
    db.execute("ALTER TABLE series DROP COLUMN num")
    db.execute("ALTER TABLE threads DROP COLUMN num")
    db.execute("UPDATE meta SET value = '4' WHERE key = 'schema'")
    db.close()


def check_ids(store: Store) -> int:
    """Each stored pair has one id, ids are 0..n-1, each row's leaf is a
    pair of its own thread's name, and the in-memory view agrees with the
    table; returns n."""
    with store.cursor() as cur:
        table = cur.execute("SELECT id, tname, stack FROM leaves ORDER BY id").fetchall()
        named = cur.execute("SELECT DISTINCT s.leaf, t.name FROM samples s "
                            "JOIN threads t ON t.num = s.thread").fetchall()
    assert [i for i, _, _ in table] == list(range(len(table)))
    assert len({(t, s) for _, t, s in table}) == len(table)
    tname = {i: t for i, t, _ in table}
    assert all(tname[leaf] == thread_name_id(name) for leaf, name in named)
    assert len(store.leaves) == len(table)
    assert list(zip(store.leaves.tname.tolist(), store.leaves.stack.tolist(),
                    strict=True)) == [(t, s) for _, t, s in table]
    return len(table)


def answers(store: Store) -> list[object]:
    """Every view of everything stored, from an API with nothing cached (the
    pprof as its samples: their order is the merge's)."""
    api = Api(store)
    out = []
    for path, extra in (("/api/v1/profile", {"format": ["folded"]}),
                        ("/api/v1/profile", {"format": ["pprof"]}),
                        ("/api/v1/tree", {"max_nodes": ["20000"]}),
                        ("/api/v1/top", {"limit": ["1000"]}),
                        ("/api/v1/tree", {"match": ["host=h1"], "search": ["fn3"]})):
        code, body, _ = api.handle(path, {**ALL, **extra})
        assert code == 200, body
        if extra.get("format") == ["pprof"]:
            out.append(sorted(repr((s.frames, s.pid, s.tid, s.thread_name, s.labels, s.values))
                              for s in from_proto(decode_pprof(body))[1]))
        else:
            out.append(body)
    return out


def fill(store: Store, rng: random.Random, minutes: int, every_s: int = 40) -> None:
    """A fleet's writes (write_fleet) every ``every_s`` for ``minutes`` from T0."""
    for at in range(0, minutes * 60, every_s):
        write_fleet(store, rng, T0 + at * _S)


def seal_all(store: Store, now: int = FAR) -> int:
    """Every closed block sealed, as the collector's seal loop does; how many."""
    n = 0
    while store.seal(now):
        n += 1
    return n
