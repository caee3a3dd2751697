"""The query index: every stacked name the queries met, as one prefix tree.

Every stored (thread name, stack) is a leaf of one tree of names: the root
"all", then thread names, then frame names, root first, exactly the levels
of the folded format and the flame graph. A node is added the first time a
stack needs it and kept (a few bytes of arrays each); engine.Tree holds one
query's values over it. The collector builds it as it starts and keeps it
beside the store (index_file.py).
"""

from __future__ import annotations

import json
import threading

import numpy as np
import numpy.typing as npt

from ..encode.folded import clean
from ..flamegraph.inputs import _kind
from ..model import MAX_STACK_DEPTH, TRUNCATED
from .leaves import leaf_keys
from .scatter import Slots, ranges
from .store import Aggregate, Store
from .tables import stack_frames

#: Leaves added to the index at a time (a fleet hour's 800,000 in chunks).
CHUNK = 50_000
#: A node number, as the index's arrays hold it: 4 bytes, not 8 (a fleet
#: hour's index: 58 -> 37 MB)
NODE = np.int32
Nodes = npt.NDArray[np.int32]


class Index:
    """All stacks the queries met, as one prefix tree of names."""

    def __init__(self, store: Store):
        self.store = store
        self._lock = threading.Lock()
        # the nodes, one entry each (the root: node 0); replaced, never
        # written in place, as nodes are added: an array a reader took stays
        # as it was (``arrays``)
        self.parent = np.array([-1], NODE)
        self.name = np.array([0], NODE)
        self.depth = np.array([0], NODE)
        self.recursive = np.zeros(1, np.bool_)  # the name is also an ancestor's (below threads)
        self.names = ["all"]
        self._name_ids = {"all": 0}
        self.kinds: dict[str, str] = {}
        # child node by parent << 32 | name id, as sorted arrays (a fleet's
        # hour has near a million nodes: as a dict they held 90 MB)
        self._edges = (np.zeros(0, np.uint64), np.zeros(0, NODE))
        self._keys = np.zeros(0, np.uint64)       # sorted (thread name, stack) keys
        self._leaves = np.zeros(0, NODE)          # their nodes
        self._by_leaf = np.zeros(0, NODE)         # node by the store's leaf id (-1: not yet)
        self._levels: list[Nodes] = []
        self._levels_for = 0
        self._frame_names: dict[int, int] = {}
        self._json_lock = threading.Lock()
        self._json_names: list[str | None] = []     # by name id, encoded when first shown
        self._json_done = np.zeros(0, np.bool_)

    def __len__(self) -> int:
        return len(self.parent)

    def _name_id(self, name: str) -> int:
        nid = self._name_ids.get(name)
        if nid is None:
            nid = self._name_ids[name] = len(self.names)
            self.names.append(name)
        return nid

    def json_names(self, nids: npt.NDArray[np.int64]) -> list[str | None]:
        """The names as JSON strings, by name id: those of ``nids`` (and
        any shown before) encoded, once each; None for the others."""
        with self._json_lock:
            table, done = self._json_names, self._json_done
            if len(table) < len(self.names):
                table.extend([None] * (len(self.names) - len(table)))
                done = self._json_done = np.concatenate(
                    [done, np.zeros(len(table) - len(done), np.bool_)])
            missing = np.unique(nids[~done[nids]])
            for i in missing.tolist():
                table[i] = json.dumps(self.names[i])
            done[missing] = True
            return table

    def child(self, parent: int, nid: int) -> int | None:
        """The node for name ``nid`` under ``parent``, if there is one yet."""
        found = _search(self._edges, np.array([parent << 32 | nid], np.uint64))[0]
        return None if found < 0 else int(found)

    def children(self, nodes: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.intp], Nodes]:
        """Every child of each of ``nodes``, from the sorted edges (nothing
        the size of the index): the position in ``nodes`` of each child's
        parent, and the child."""
        keys, kids = self._edges
        first = np.asarray(nodes, np.uint64) << np.uint64(32)
        lo = np.searchsorted(keys, first)
        count = np.searchsorted(keys, first + np.uint64(1 << 32)) - lo
        return np.repeat(np.arange(len(count)), count), kids[ranges(lo, count)]

    def leaves(self, agg: Aggregate) -> Nodes:
        """The node of each (thread name, stack) of an aggregate by name:
        by the store's leaf ids, one array lookup, once each id is known."""
        if agg.leaf is not None:
            return self._by_leaf_ids(agg.leaf)
        if agg.thread is None or agg.stack is None:
            raise ValueError("an aggregate names its pairs by leaf ids or by ids")
        return self._ensure(agg.thread, agg.stack)

    def slots(self, learn: npt.NDArray[np.uint32] | None = None) -> Slots:
        """(the node of each of the store's leaf ids, -1 where none yet; the
        parent of each node) as one state, after giving the ids ``learn``
        their nodes: a query's rows summed straight into their nodes
        (scatter.slot_totals)."""
        if learn is not None and len(learn):
            self._by_leaf_ids(learn)
        with self._lock:
            return self._by_leaf, self.parent

    def _by_leaf_ids(self, ids: npt.NDArray[np.uint32]) -> Nodes:
        with self._lock:
            by_leaf = self._by_leaf
        top = int(ids.max(initial=0))
        if top < len(by_leaf):   # (every id has had its slot: one gather)
            nodes = by_leaf[ids]
        else:
            nodes = np.full(len(ids), -1, NODE)
            inside = ids < len(by_leaf)
            nodes[inside] = by_leaf[ids[inside]]
        new = nodes < 0
        if new.any():
            nodes[new] = self._ensure(*self.store.leaves.pairs(ids[new]))
            with self._lock:
                if len(self._by_leaf) <= top:
                    grown = np.full(max(top + 1, 2 * len(self._by_leaf)), -1, NODE)
                    grown[:len(self._by_leaf)] = self._by_leaf
                    self._by_leaf = grown
                self._by_leaf[ids[new]] = nodes[new]
        return nodes

    def _ensure(self, thread: npt.NDArray[np.uint64],
                stack: npt.NDArray[np.uint64]) -> Nodes:
        """The leaf node of each (thread name, stack), the new ones added
        ``CHUNK`` at a time: what adding needs on the way (the stacks'
        frames and names) stays small however many a query brings (the
        first query of a whole hour, when the start did not build them)."""
        keys = leaf_keys(thread, stack)
        with self._lock:
            nodes, found = self._lookup(keys)
        missing = np.flatnonzero(~found)
        names = self.store.thread_names
        for i in range(0, len(missing), CHUNK):
            part = missing[i:i + CHUNK]
            with self._lock:
                part = part[~self._lookup(keys[part])[1]]   # not added meanwhile
                if len(part):
                    self._add(keys[part], stack[part],
                              [names.get(t, "") for t in thread[part].tolist()])
        if len(missing):
            with self._lock:
                nodes, _ = self._lookup(keys)
        return nodes

    def warm(self, chunk: int = CHUNK) -> int:
        """Every stored (thread name, stack) made a leaf, as a collector
        starts: the first query then finds the index built (for a fleet's
        hour, 800,000 leaves). In chunks, so what a chunk needs on the way
        (its stacks' frames) stays small. Returns the leaves."""
        leaf = self.store.stored_leaves()
        for i in range(0, len(leaf), chunk):
            self._by_leaf_ids(leaf[i:i + chunk])
        return len(leaf)

    def _lookup(self, keys: npt.NDArray[np.uint64]) -> tuple[Nodes, npt.NDArray[np.bool_]]:
        if not len(self._keys):
            return np.zeros(len(keys), NODE), np.zeros(len(keys), bool)
        order = np.argsort(keys)   # sorted queries search twice as fast
        pos = np.empty(len(keys), np.int64)
        pos[order] = np.searchsorted(self._keys, keys[order])
        pos[pos == len(self._keys)] = 0
        return self._leaves[pos], self._keys[pos] == keys

    def _add(self, keys: npt.NDArray[np.uint64], stacks: npt.NDArray[np.uint64],
             tnames: list[str]) -> None:
        """Leaves for new (thread name, stack) keys, made a level at a time
        for all of them: the thread names' nodes, then each stack's first
        frame under those, and so on. A level is one search of the sorted
        edges, and its missing (parent, name) pairs become nodes at once, so
        the work is array passes over the stacks' frames, with no Python
        object per node or frame. A key asked twice is added once (the
        sorted keys stay distinct, as index_file checks them)."""
        keys, once = np.unique(keys, return_index=True)
        stacks, tnames = stacks[once], [tnames[i] for i in once.tolist()]
        with self.store.reading() as cur:
            sids, bounds, frames = stack_frames(cur, np.unique(stacks))
        names, starts, recursive = self._paths(bounds, frames)
        # each leaf's stack among those read (in the store's order)
        by_id = np.argsort(sids)
        at = by_id[np.searchsorted(sids, stacks, sorter=by_id).clip(0, len(sids) - 1)] \
            if len(sids) else np.zeros(len(stacks), np.int64)
        known = sids[at] == stacks if len(sids) else np.zeros(len(stacks), bool)
        length = np.where(known, np.diff(starts)[at] if len(sids) else 0, 0)
        first = starts[at]
        made = _Made(len(self.parent))
        # (a stack the store lacks has no frames: its leaf is its thread name)
        tids = np.fromiter(map(self._name_id, tnames), np.int64, len(tnames))
        node = made.children(self._edges, np.zeros(len(tids), NODE), tids,
                             np.zeros(len(tids), bool), 1)
        for level in range(int(length.max(initial=0))):
            on = np.flatnonzero(length > level)
            pos = first[on] + level
            node[on] = made.children(self._edges, node[on], names[pos], recursive[pos],
                                     level + 2)
        self.parent, self.name, self.depth, self.recursive = made.nodes(
            self.parent, self.name, self.depth, self.recursive)
        self._edges = made.edges(self._edges)
        at = np.searchsorted(self._keys, keys)   # (keys: sorted, by np.unique)
        self._keys = np.insert(self._keys, at, keys)
        self._leaves = np.insert(self._leaves, at, node)

    def _paths(self, bounds: npt.NDArray[np.int64], frames: npt.NDArray[np.uint64]
               ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """The stacks (as tables.stack_frames reads them) as name ids, root
        first, capped as folded output is: (names one stack after another,
        where each stack starts (and the end), whether each name is also an
        earlier one of its stack)."""
        interned = self.store.interner.frames
        known = self._frame_names
        ufids = np.sort(np.unique(frames))   # (hashed, then sorted: twice as fast)
        for fid in ufids.tolist():
            if fid not in known:
                f = interned.get(fid)
                name = TRUNCATED if f is None else clean(f.name)
                if f is not None:
                    self.kinds.setdefault(name, _kind(f))
                known[fid] = self._name_id(name)
        names = np.fromiter(map(known.__getitem__, ufids.tolist()), np.int64,
                            len(ufids))[np.searchsorted(ufids, frames)]
        lens = np.diff(bounds)
        limit = MAX_STACK_DEPTH - 1
        if len(lens) and lens.max() > limit:
            # cap_depth: the marker, then the limit - 1 leafmost frames
            ends = np.repeat(bounds[1:], lens)
            names = names[ends - np.arange(len(names)) <= limit - 1]
            lens = np.minimum(lens, limit - 1)
            capped = np.flatnonzero(np.diff(bounds) > limit)
            bounds = np.concatenate(([0], np.cumsum(lens)))
            names = np.insert(names, bounds[capped], self._name_id(TRUNCATED))
            lens[capped] += 1
            bounds = np.concatenate(([0], np.cumsum(lens)))
        # recursive: the same name earlier in the same stack (a stable sort
        # by stack and name: the stacks are in order already, and short)
        pairs = np.repeat(np.arange(len(lens), dtype=np.int64), lens) * len(self.names) + names
        order = np.argsort(pairs, kind="stable")
        again = np.zeros(len(names), bool)
        again[1:] = pairs[order][1:] == pairs[order][:-1]
        recursive = np.empty(len(names), bool)
        recursive[order] = again
        return names, bounds, recursive

    def levels(self) -> list[Nodes]:
        """Node indices by depth (index 0: the root)."""
        with self._lock:
            if self._levels_for != len(self.parent):
                depth = self.depth
                order = np.argsort(depth, kind="stable").astype(NODE)
                bounds = np.searchsorted(depth[order], np.arange(int(depth.max()) + 2))
                self._levels = [order[bounds[d]:bounds[d + 1]] for d in range(len(bounds) - 1)]
                self._levels_for = len(self.parent)
            return self._levels

    def arrays(self) -> tuple[Nodes, Nodes, npt.NDArray[np.bool_], Nodes]:
        """(parent, name id, recursive, depth) as arrays, the ones every
        tree made while the index has this size shares (nodes added later
        come in new arrays: the cached trees hold only their values)."""
        with self._lock:
            return self.parent, self.name, self.recursive, self.depth


def _search(edges: tuple[npt.NDArray[np.uint64], Nodes],
            keys: npt.NDArray[np.uint64]) -> Nodes:
    """The child node of each parent << 32 | name key, -1 where none."""
    sorted_keys, nodes = edges
    if not len(sorted_keys):
        return np.full(len(keys), -1, NODE)
    at = np.searchsorted(sorted_keys, keys).clip(0, len(sorted_keys) - 1)
    return np.where(sorted_keys[at] == keys, nodes[at], NODE(-1))


class _Made:
    """The nodes one ``Index._add`` makes, numbered from ``base`` on, until
    they join the index's arrays at once."""

    def __init__(self, base: int):
        self.base = base
        self.count = 0
        self._parts: list[tuple[npt.NDArray[np.uint64], Nodes, Nodes, npt.NDArray[np.bool_],
                                int]] = []

    def children(self, edges: tuple[npt.NDArray[np.uint64], Nodes],
                 parents: Nodes, names: npt.NDArray[np.int64],
                 recursive: npt.NDArray[np.bool_], depth: int) -> Nodes:
        """The child named ``names[i]`` of each ``parents[i]`` (all of one
        depth), made where there is none. A parent made by this add has no
        child in ``edges`` yet, and no other level's pairs can be these."""
        keys = (parents.astype(np.uint64) << np.uint64(32)) | names.astype(np.uint64)
        out = _search(edges, keys)
        missing = np.flatnonzero(out < 0)
        if len(missing):
            new, first, which = np.unique(keys[missing], return_index=True,
                                          return_inverse=True)
            ids = self.base + self.count + np.arange(len(new), dtype=np.int64)
            out[missing] = ids[which.reshape(-1)]
            at = missing[first]
            self._parts.append((new, parents[at], names[at].astype(NODE), recursive[at], depth))
            self.count += len(new)
        return out

    def nodes(self, parent: Nodes, name: Nodes, depth: Nodes, recursive: npt.NDArray[np.bool_]
              ) -> tuple[Nodes, Nodes, Nodes, npt.NDArray[np.bool_]]:
        """The index's node arrays with these nodes after them (new arrays)."""
        if not self._parts:
            return parent, name, depth, recursive
        return (np.concatenate([parent, *(p[1] for p in self._parts)]),
                np.concatenate([name, *(p[2] for p in self._parts)]),
                np.concatenate([depth, *(np.full(len(p[0]), p[4], NODE)
                                         for p in self._parts)]),
                np.concatenate([recursive, *(p[3] for p in self._parts)]))

    def edges(self, edges: tuple[npt.NDArray[np.uint64], Nodes]
              ) -> tuple[npt.NDArray[np.uint64], Nodes]:
        """``edges`` with these nodes' (sorted arrays, new)."""
        if not self._parts:
            return edges
        new = np.concatenate([p[0] for p in self._parts])
        nodes = (self.base + np.arange(len(new), dtype=np.int64)).astype(NODE)
        order = np.argsort(new)
        new, nodes = new[order], nodes[order]
        at = np.searchsorted(edges[0], new)
        return np.insert(edges[0], at, new), np.insert(edges[1], at, nodes)
