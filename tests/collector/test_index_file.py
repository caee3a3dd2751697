"""The query index saved beside the store (collector/index_file.py): loaded,
it answers exactly what an index built from the rows answers, also after
writes it never saw; a damaged or foreign file is ignored, never trusted;
a collector saves it when it stops and loads it when it starts."""

from __future__ import annotations

import gc
import logging
import random
import time
import weakref
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from ember.collector import index_file
from ember.collector.api import Api
from ember.collector.server import Collector
from ember.collector.store import Store
from ember.config import CollectorConfig
from tests.support.profiles import write_fleet

S = 10**9
T0 = (time.time_ns() // S - 600) * S


def answers(api: Api) -> list[bytes]:
    """The tree, the table and a search over everything stored."""
    q = {"from": [str(T0)], "to": [str(T0 + 100 * S)], "max_nodes": ["20000"]}
    out = []
    for path, extra in (("/api/v1/tree", {}), ("/api/v1/top", {"limit": ["10000"]}),
                        ("/api/v1/tree", {"search": ["fn1"]}),
                        ("/api/v1/profile", {"format": ["folded"]})):
        code, body, _ = api.handle(path, {**q, **extra})
        assert code == 200, body
        out.append(body)
    return out


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "db.duckdb")
    rng = random.Random(7)
    for at in range(5):
        write_fleet(s, rng, T0 + at * S)
    return s


def test_a_loaded_index_answers_as_one_built_from_the_rows(store: Store, tmp_path: Path) -> None:
    built = Api(store)
    built.index.warm()
    path = tmp_path / "index.npz"
    nodes = index_file.save(built.index, path)
    assert nodes == len(built.index) > 100
    loaded = Api(store)
    assert index_file.load(loaded.index, path) == nodes
    assert loaded.index.warm() > 0 and len(loaded.index) == nodes  # nothing was missing
    assert answers(loaded) == answers(built)
    # stacks written after the save are added as for any write
    rng = random.Random(8)
    for at in range(5, 8):
        write_fleet(store, rng, T0 + at * S, pids=(20, 21))
    fresh = Api(store)
    assert answers(loaded) == answers(fresh)
    assert len(loaded.index) > nodes
    store.close()


def test_the_file_is_the_format_s_npz_as_numpy_writes_it(store: Store, tmp_path: Path) -> None:
    """Written array by array, the file is what np.savez makes of the
    format's arrays (its types, its values): one written by np.savez, as
    before, loads into an index that answers the same."""
    api = Api(store)
    api.index.warm()
    path = tmp_path / "index.npz"
    index_file.save(api.index, path)
    ix = api.index
    want = {"parent": (ix.parent, np.int64), "name": (ix.name, np.int64),
            "depth": (ix.depth, np.int64), "recursive": (ix.recursive, np.int8),
            "keys": (ix._keys, np.uint64), "leaves": (ix._leaves, np.int64)}
    with np.load(path, allow_pickle=False) as z:
        got = {k: z[k] for k in z.files}
    assert set(got) == {"format", "parent", "name", "depth", "recursive", "names", "kinds",
                        "keys", "leaves", "fids", "fnames"}
    for k, (array, dtype) in want.items():
        assert got[k].dtype == dtype, k
        assert (got[k] == array).all(), k
    assert got["format"].tolist() == [index_file.FORMAT]
    older = tmp_path / "older.npz"
    np.savez(older, **got)  # type: ignore[arg-type]
    again = Api(store)
    assert index_file.load(again.index, older) == len(ix)
    assert answers(again) == answers(api)
    store.close()


def test_an_index_loads_only_into_an_empty_one(store: Store, tmp_path: Path) -> None:
    a = Api(store)
    a.index.warm()
    path = tmp_path / "index.npz"
    index_file.save(a.index, path)
    assert index_file.load(a.index, path) == 0
    store.close()


Arrays = dict[str, npt.NDArray[Any]]


def _damaged(good: Arrays) -> list[tuple[str, Arrays]]:
    def but(**change: npt.NDArray[Any]) -> Arrays:
        return {**good, **change}
    parent = good["parent"].copy()
    parent[-1] = len(parent) + 5
    leaves = good["leaves"].copy()
    leaves[0] = len(parent)
    keys = good["keys"][::-1].copy()
    return [("format", but(format=np.array([99]))),
            ("parent", but(parent=parent)),
            ("lengths", but(depth=good["depth"][:-1])),
            ("leaf", but(leaves=leaves)),
            ("keys", but(keys=keys)),
            ("names", but(names=np.frombuffer(b'["all"]', np.uint8))),
            ("json", but(kinds=np.frombuffer(b"{nope", np.uint8))),
            ("missing", {k: v for k, v in good.items() if k != "fids"})]


def test_a_damaged_or_foreign_file_is_ignored(store: Store, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    built = Api(store)
    built.index.warm()
    path = tmp_path / "index.npz"
    index_file.save(built.index, path)
    with np.load(path) as z:
        good = {k: z[k] for k in z.files}
    cases = _damaged(good)
    raw = path.read_bytes()
    for what, data in [("truncated", raw[:len(raw) // 2]), ("garbage", b"\x00ember" * 100),
                       ("empty", b"")]:
        bad = tmp_path / f"{what}.npz"
        bad.write_bytes(data)
        cases.append((what, {"__file__": np.array([str(bad)])}))
    for what, arrays in cases:
        bad = tmp_path / f"{what}.npz"
        if "__file__" not in arrays:
            with open(bad, "wb") as f:
                np.savez(f, **arrays)
        api = Api(store)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert index_file.load(api.index, bad) == 0, what
        assert "ignored" in caplog.text, what
        assert len(api.index) == 1, what  # untouched: built from the rows as before
        assert answers(api) == answers(built), what
    assert zipfile.is_zipfile(path)
    store.close()


def test_a_collector_saves_its_index_when_it_stops_and_loads_it_at_start(
        store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store.close()
    storage = str(tmp_path / "db.duckdb")
    cfg = CollectorConfig(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0", storage=storage)
    path = index_file.path_for(storage)
    assert path is not None and not path.exists()

    def run() -> tuple[int, list[bytes]]:
        c = Collector(cfg)
        with caplog.at_level(logging.INFO):
            c.start()
            deadline = time.monotonic() + 60
            while "query index of" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
        got = answers(c.api)
        c.close()
        return len(c.api.index), got

    nodes, first = run()
    assert path.exists()
    caplog.clear()
    again, second = run()
    assert again == nodes and second == first
    assert f"({nodes} nodes loaded from {path};" in caplog.text
    assert index_file.path_for(":memory:") is None


def test_what_a_collector_s_start_built_is_kept_out_of_full_collections(
        store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Once the query index is built, the objects the start made and keeps
    (the index's names among them) are frozen: Python's full collections,
    which walked them all with the GIL held, pass them by. What is made
    later is collected as before."""
    store.close()
    cfg = CollectorConfig(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0",
                          storage=str(tmp_path / "db.duckdb"))
    gc.unfreeze()
    c = Collector(cfg)
    try:
        with caplog.at_level(logging.INFO):
            c.start()
            deadline = time.monotonic() + 60
            while "query index of" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
        assert "objects kept out of full collections" in caplog.text
        assert gc.get_freeze_count() > 0
        names = c.api.index.names
        assert len(names) > 1 and gc.is_tracked(names)
        assert all(o is not names for o in gc.get_objects())   # (frozen: in no generation)

        class Later:
            me: object = None
        later = Later()
        later.me = later   # (a cycle: refcounts alone do not free it)
        gone = weakref.ref(later)
        del later
        gc.collect()
        assert gone() is None
    finally:
        c.close()
        gc.unfreeze()
