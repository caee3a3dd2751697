"""The query index (collector/index.py): every stored (thread name, stack)
is the path of names a plain walk of its frames gives (capped as folded
output is, each name marked recursive when its stack had it before), in
one tree whose nodes are shared by every path through them, however the
leaves came in (one chunk, many, or a second write's new stacks)."""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import replace

import numpy as np
import pytest

from ember.collector.engine import Tree
from ember.collector.index import Index
from ember.collector.matchers import selector
from ember.collector.query import tree_json
from ember.collector.store import Store
from ember.collector.tables import stack_frames
from ember.encode.folded import clean
from ember.model import MAX_STACK_DEPTH, TRUNCATED, Profile, cap_depth
from tests.support.profiles import FLEET_EXE, fleet_profile, write_fleet

S = 10**9
T0 = (time.time_ns() // S - 600) * S


def deep_profile(rng: random.Random) -> Profile:
    """fleet_profile with a few stacks deeper than the tree keeps."""
    p = fleet_profile(rng, 20)
    deep = []
    for x in p.samples[:4]:
        extra = rng.randint(MAX_STACK_DEPTH - 3, 2 * MAX_STACK_DEPTH)
        frames = tuple(replace(x.frames[-1], name=f"deep{rng.randint(0, 9)}", inlined=False,
                               address=FLEET_EXE.start + 0x10000 + 4 * i)
                       for i in range(extra))
        deep.append(replace(x, frames=(*x.frames, *frames)))
    return replace(p, samples=(*p.samples, *deep))


def expected(store: Store) -> dict[tuple[int, int], list[tuple[str, bool]]]:
    """Each stored (thread name, stack): its path from a plain walk."""
    ids = store.stored_leaves()
    thread, stack = store.leaves.pairs(ids)
    with contextlib.closing(store.cursor()) as cur:
        sids, bounds, frames = stack_frames(cur, np.unique(stack))
    names_of = {}
    for sid, a, b in zip(sids.tolist(), bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        names = [clean(store.interner.frames[f].name) for f in frames[a:b].tolist()]
        names_of[sid] = list(cap_depth(names, TRUNCATED, MAX_STACK_DEPTH - 1))
    out = {}
    for t, s in zip(thread.tolist(), stack.tolist(), strict=True):
        names = names_of.get(s, [])
        out[(t, s)] = [(store.thread_names[t], False),
                       *((n, n in names[:i]) for i, n in enumerate(names))]
    return out


def paths(index: Index, store: Store) -> dict[tuple[int, int], list[tuple[str, bool]]]:
    parent, name, recursive, depth = index.arrays()
    ids = store.stored_leaves()
    thread, stack = store.leaves.pairs(ids)
    out = {}
    for t, s, node in zip(thread.tolist(), stack.tolist(),
                          index._by_leaf_ids(ids).tolist(), strict=True):
        path = []
        while node > 0:
            path.append((index.names[name[node]], bool(recursive[node])))
            assert depth[node] == depth[parent[node]] + 1
            node = int(parent[node])
        out[(t, s)] = path[::-1]
    return out


def check_tree(index: Index) -> None:
    parent, name, _, _ = index.arrays()
    n = len(parent)
    assert (parent[1:] < np.arange(1, n)).all() and (parent[1:] >= 0).all()
    edges = parent[1:].astype(np.int64) << 32 | name[1:]
    assert len(np.unique(edges)) == n - 1, "a (parent, name) pair made twice"
    for node in random.Random(3).sample(range(1, n), min(n - 1, 200)):
        assert index.child(int(parent[node]), int(name[node])) == node


def test_the_index_holds_each_stack_as_a_plain_walk_of_its_frames() -> None:
    rng = random.Random(11)
    store = Store(":memory:")
    for at in range(3):
        write_fleet(store, rng, T0 + at * S)
    for chunk in (1, 7, 10_000):
        index = Index(store)
        assert index.warm(chunk) == len(store.stored_leaves())
        assert paths(index, store) == expected(store)
        check_tree(index)
    # stacks written after the index was built come in beside its nodes
    before = len(index)
    for at in range(3, 5):
        write_fleet(store, rng, T0 + at * S, pids=(13, 14))
    index.warm(5)
    assert len(index) > before
    assert paths(index, store) == expected(store)
    check_tree(index)


def test_deep_and_recursive_stacks_are_capped_and_marked_as_folded_output_is() -> None:
    from ember.agent.labels import ProcessLabels, series_labels
    from ember.collector.validate import DEFAULT_LIMITS, check_request
    from ember.encode.writeraw import make_series
    from ember.proto import profilestore_pb2 as ps

    rng = random.Random(5)
    store = Store(":memory:")
    p = deep_profile(rng)
    labels = series_labels(p.type, ProcessLabels(pid=10, comm="app"), {})
    series = make_series(replace(p, start_ns=T0, duration_ns=S, labels=labels))[0]
    store.write(check_request(ps.WriteRawRequest(series=[series]), DEFAULT_LIMITS, T0 + S))
    index = Index(store)
    index.warm(3)
    got = paths(index, store)
    assert got == expected(store)
    assert max(map(len, got.values())) == MAX_STACK_DEPTH   # thread name + the capped stack
    assert any(path[1][0] == TRUNCATED for path in got.values())
    assert any(rec for path in got.values() for _, rec in path)
    check_tree(index)


def test_a_pair_asked_for_twice_at_once_is_one_leaf() -> None:
    store = Store(":memory:")
    write_fleet(store, random.Random(2), T0)
    ids = store.stored_leaves()
    thread, stack = store.leaves.pairs(ids)
    index = Index(store)
    twice = index._ensure(np.concatenate([thread, thread]), np.concatenate([stack, stack]))
    assert (twice[:len(ids)] == twice[len(ids):]).all()
    assert (index._keys[1:] > index._keys[:-1]).all() and len(index._keys) == len(ids)
    assert paths(index, store) == expected(store)


@pytest.mark.parametrize("text_in_c", [True, False])
def test_the_json_written_from_arrays_is_the_nested_tree_s(
        scatter_kind: str, text_in_c: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tree.nested_json, which the API serves, against query.tree_json of
    Tree.nested: whole and zoomed, pruned hard and not at all, scaled (the
    sums in C and in numpy; the text in C and in Python)."""
    from ember.collector import engine
    if text_in_c:
        assert engine._tree_json is not None   # (the set-up builds it)
    else:
        monkeypatch.setattr(engine, "_tree_json", None)
    store = Store(":memory:")
    rng = random.Random(21)
    for at in range(6):
        write_fleet(store, rng, T0 + at * 10**9, pids=(10, 11, 12, 13))
    agg = store.aggregate(0, 1 << 62, selector([]), store.types()[0], by_name=True)
    assert agg is not None
    index = Index(store)
    for value, scale in ((0, 1), (1, 1000)):
        tree = Tree.build(index, agg, value, "x", scale=scale)
        worker = tree.find(["worker-0"])
        deeper = tree.find(["worker-1", "fn0"])
        for focus in (0, worker, deeper):
            for max_nodes in (1, 2, 7, 40, 20_000):
                assert tree.nested_json(focus, max_nodes) == tree_json(
                    tree.nested(focus, max_nodes)), (focus, max_nodes)
        # (both views take their nodes' own values from those nodes alone)
        every = np.arange(len(tree.total))
        some = np.sort(np.random.default_rng(value).choice(every, 50, replace=False))
        for nodes in (every, some, every[:1], every[:0]):
            assert tree.own_of(nodes).tolist() == tree.self_[nodes].tolist()
        assert (tree.self_ >= 0).all() and tree.self_.sum() == tree.total[0]
    # the index grows after a tree is made: the nodes it gained are no
    # children of the tree's (they hold nothing in it)
    write_fleet(store, rng, T0 + 60 * 10**9, pids=(20, 21))
    more = store.aggregate(0, 1 << 62, selector([]), store.types()[0], by_name=True)
    assert more is not None
    index.leaves(more)
    assert len(index) > len(tree.total)
    every = np.arange(len(tree.total))
    assert len(index.children(every)[1]) > len(tree.total) - 1
    assert tree.own_of(every).tolist() == tree.self_.tolist()

    store.close()


def test_a_tree_summed_from_rows_as_read_is_the_tree_of_their_sums(
        scatter_kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A few series' rows handed over as read (``raw``) and summed straight
    into the tree's nodes: the same totals and own values as the tree of
    the same rows summed per leaf, whether the index knew the leaves' nodes
    (a warm index), some of them, or none (a fresh one: it learns them as
    the sum goes); in numpy, the rows are summed per leaf first."""
    store = Store(":memory:")
    rng = random.Random(5)
    for at in range(4):
        write_fleet(store, rng, T0 + at * 10**9, pids=(10, 11, 12, 13, 14, 15, 16, 17))
    one = selector(["pid=13"])
    raw = store.aggregate(0, 1 << 62, one, store.types()[0], by_name=True, raw=True)
    summed = store.aggregate(0, 1 << 62, one, store.types()[0], by_name=True)
    assert raw is not None and summed is not None and raw.rows is not None
    assert raw.leaf is None and raw.profiles == summed.profiles == 4
    with pytest.raises(LookupError, match="summed\\(\\) sums them"):
        raw.sums(0)
    assert raw.summed().leaf.tolist() == summed.leaf.tolist()
    warm = Index(store)
    warm.leaves(store.aggregate(0, 1 << 62, selector([]), store.types()[0], by_name=True))
    half = Index(store)
    half.leaves(store.aggregate(0, 1 << 62, selector(["pid=13"]), store.types()[0],
                                by_name=True, upto=None, ended_before=T0 + 2 * 10**9))
    learned: list[int] = []
    slots = Index.slots
    monkeypatch.setattr(Index, "slots", lambda self, learn=None: (
        learned.append(len(learn)) if learn is not None else None, slots(self, learn))[1])
    for index, learns in ((warm, False), (half, True), (Index(store), True)):
        learned.clear()
        for value in (0, 1):
            got = Tree.build(index, raw, value, "x")
            want = Tree.build(index, summed, value, "x")
            assert (got.own_units is not None) == (scatter_kind == "c")
            n = min(len(got.total), len(want.total))
            assert got.total[:n].tolist() == want.total[:n].tolist()
            assert not got.total[n:].any() and not want.total[n:].any()
            every = np.arange(n)
            assert got.own_of(every).tolist() == want.own_of(every).tolist()
            assert got.self_[:n].tolist() == want.self_[:n].tolist()
            assert got.nested_json(0, 50) == want.nested_json(0, 50)
        # (learned once, by the first tree: the second finds every node)
        assert (len(learned) == 1 and learned[0] > 0) == (learns and scatter_kind == "c")
    store.close()


def test_the_c_text_of_a_tree_checks_what_it_is_given() -> None:
    """_tree_json.text writes what engine.py ordered; what does not fit
    (an index or a name outside its array, a name not a str, a negative
    count of closes) is an error, not a read past an array."""
    from ember.collector import _tree_json
    i64 = lambda *v: np.array(v, np.int64)   # noqa: E731
    names: list[str | None] = ['"a"', '"b\\u00e9"', None]
    ok = (i64(0, 1), i64(0, 2), i64(0, 1), names, i64(9, 4), i64(5, 4), '"all"')
    assert _tree_json.text(*ok) == ('{"name": "all", "value": 9, "self": 5, "children": ['
                                    '{"name": "b\\u00e9", "value": 4, "self": 4, '
                                    '"children": []}]}')
    bad = [(0, i64(0, 2), ValueError, r"pre\[1\] = 2 is not one of the 2 nodes"),
           (1, i64(0, -1), ValueError, r"closes\[1\] = -1"),
           (2, i64(0, 3), ValueError, "name 3 is not one of the 3 names"),
           (2, i64(0, 2), TypeError, "name 2 is not a str"),
           (1, i64(0), ValueError, "1 closes for 2 nodes"),
           (4, np.array([9, 4], np.int32), TypeError, "value: int64"),
           (6, b"all", TypeError, "first: a str or None")]
    for at, arg, error, message in bad:
        with pytest.raises(error, match=message):
            _tree_json.text(*ok[:at], arg, *ok[at + 1:])
    assert _tree_json.text(*ok[:6], None).startswith('{"name": "a", ')
