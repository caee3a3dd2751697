"""The query index: every stacked name the queries met, as one prefix tree.

Every stored (thread name, stack) is a leaf of one tree of names: the root
"all", then thread names, then frame names, root first, exactly the levels
of the folded format and the flame graph. A node is added the first time a
stack needs it and kept (a few bytes of arrays each); engine.Tree holds one
query's values over it. The collector builds it as it starts and keeps it
beside the store (index_file.py).
"""

from __future__ import annotations

import contextlib
import threading
from array import array

import numpy as np
import numpy.typing as npt

from ..encode.folded import clean
from ..flamegraph.inputs import _kind
from ..model import MAX_STACK_DEPTH, TRUNCATED, cap_depth
from .leaves import leaf_keys
from .store import Aggregate, Store
from .tables import stack_frames

#: Leaves added to the index at a time (a fleet hour's 800,000 in chunks).
CHUNK = 50_000
#: New children kept in a dict while the start builds the index, before
#: they are merged into the sorted arrays: a dict is faster to search, and
#: larger. Fleet hour: all in the dict, 11.8 s and a peak of 498 MB; merged
#: every 200,000, 15.3 s and 423 MB in-process, but no lower peak in a
#: collector whose first query arrives during the build (654 vs 647 MB).
WARM_MERGE_AT = 1 << 62


class Index:
    """All stacks the queries met, as one prefix tree of names."""

    def __init__(self, store: Store):
        self.store = store
        self._lock = threading.Lock()
        self.parent = array("q", [-1])
        self.name = array("q", [0])
        self.depth = array("q", [0])
        self.recursive = array("b", [0])   # the name is also an ancestor's (below threads)
        self.names = ["all"]
        self._name_ids = {"all": 0}
        self.kinds: dict[str, str] = {}
        # child node by parent << 32 | name id, as sorted arrays (a fleet's
        # hour has near a million nodes: as a dict they held 90 MB), and in a
        # dict those made since the arrays were last merged (``_merge_made``)
        self._edges = (np.zeros(0, np.uint64), np.zeros(0, np.int64))
        self._made: dict[int, int] = {}
        self._made_from = 1   # nodes from here on have their children in _made
        self.merge_at = 0     # children in _made past which an _add merges them
        self._keys = np.zeros(0, np.uint64)       # sorted (thread name, stack) keys
        self._leaves = np.zeros(0, np.int64)      # their nodes
        self._by_leaf = np.zeros(0, np.int64)     # node by the store's leaf id (-1: not yet)
        self._levels: list[npt.NDArray[np.int64]] = []
        self._levels_for = 0
        self._frame_names: dict[int, int] = {}
        self._arrays_for = -1
        self._arrays: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                            npt.NDArray[np.bool_], npt.NDArray[np.int64]] = (
            np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool),
            np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.parent)

    def _name_id(self, name: str) -> int:
        nid = self._name_ids.get(name)
        if nid is None:
            nid = self._name_ids[name] = len(self.names)
            self.names.append(name)
        return nid

    def _child(self, parent: int, nid: int, recursive: bool = False) -> int:
        """The node for name ``nid`` under ``parent``, made if new;
        ``recursive``: the name is also one of its frames' ancestors'."""
        node = self.child(parent, nid)
        if node is None:
            node = self._made[parent << 32 | nid] = len(self.parent)
            self.parent.append(parent)
            self.name.append(nid)
            self.depth.append(self.depth[parent] + 1)
            self.recursive.append(recursive)
        return node

    def child(self, parent: int, nid: int) -> int | None:
        """The node for name ``nid`` under ``parent``, if there is one yet."""
        key = parent << 32 | nid
        node = self._made.get(key)
        if node is not None or parent >= self._made_from:
            return node
        keys, nodes = self._edges
        i = int(np.searchsorted(keys, np.uint64(key)))
        return int(nodes[i]) if i < len(keys) and int(keys[i]) == key else None

    def _merge_made(self) -> None:
        """The children made since the last merge, into the sorted arrays."""
        if self._made:
            n = len(self._made)
            new = np.fromiter(self._made.keys(), np.uint64, n)
            order = np.argsort(new)
            new_nodes = np.fromiter(self._made.values(), np.int64, n)[order]
            new = new[order]
            keys, nodes = self._edges
            at = np.searchsorted(keys, new)
            self._edges = (np.insert(keys, at, new), np.insert(nodes, at, new_nodes))
            self._made = {}
        self._made_from = len(self.parent)

    def leaves(self, agg: Aggregate) -> npt.NDArray[np.int64]:
        """The node of each (thread name, stack) of an aggregate by name:
        by the store's leaf ids, one array lookup, once each id is known."""
        if agg.leaf is None:
            return self._ensure(agg.thread, agg.stack)
        return self._by_leaf_ids(agg.leaf, agg.thread, agg.stack)

    def _by_leaf_ids(self, ids: npt.NDArray[np.uint32], thread: npt.NDArray[np.uint64],
                     stack: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        leaf = ids.astype(np.int64)
        with self._lock:
            by_leaf = self._by_leaf
        nodes = np.full(len(leaf), -1, np.int64)
        inside = leaf < len(by_leaf)
        nodes[inside] = by_leaf[leaf[inside]]
        new = nodes < 0
        if new.any():
            nodes[new] = self._ensure(thread[new], stack[new])
            with self._lock:
                if len(self._by_leaf) <= int(leaf.max()):
                    grown = np.full(max(int(leaf.max()) + 1, 2 * len(self._by_leaf)), -1,
                                    np.int64)
                    grown[:len(self._by_leaf)] = self._by_leaf
                    self._by_leaf = grown
                self._by_leaf[leaf[new]] = nodes[new]
        return nodes

    def _ensure(self, thread: npt.NDArray[np.uint64],
                stack: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
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
        hour, 800,000 leaves take seconds). In chunks, so what a chunk needs
        on the way (its stacks' frames) stays small. Returns the leaves."""
        leaf = self.store.stored_leaves()
        with self._lock:
            self.merge_at = WARM_MERGE_AT
        try:
            for i in range(0, len(leaf), chunk):
                ids = leaf[i:i + chunk]
                thread, stack = self.store.leaves.pairs(ids)
                self._by_leaf_ids(ids, thread, stack)
        finally:
            with self._lock:
                self.merge_at = 0
                self._merge_made()
        return len(leaf)

    def _lookup(self, keys: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.int64],
                                                             npt.NDArray[np.bool_]]:
        if not len(self._keys):
            return np.zeros(len(keys), np.int64), np.zeros(len(keys), bool)
        order = np.argsort(keys)   # sorted queries search twice as fast
        pos = np.empty(len(keys), np.int64)
        pos[order] = np.searchsorted(self._keys, keys[order])
        pos[pos == len(self._keys)] = 0
        return self._leaves[pos], self._keys[pos] == keys

    def _add(self, keys: npt.NDArray[np.uint64], stacks: npt.NDArray[np.uint64],
             tnames: list[str]) -> None:
        """Leaves for new (thread name, stack) keys. Each stack becomes its
        names once; the keys are walked in sorted order, so a stack shares
        the path of the one before it as far as their names agree, and only
        the rest is looked up: work follows the nodes, not every frame of
        every stack (stacks grow as prefix trees)."""
        with contextlib.closing(self.store.cursor()) as cur:
            names_of = self._names_of(*stack_frames(cur, np.unique(stacks)))
        todo = sorted({(tname, names_of.get(stack, ()), key) for key, stack, tname
                       in zip(keys.tolist(), stacks.tolist(), tnames, strict=True)})
        new_keys, new_nodes = [], []
        thread = ""
        path: tuple[int, ...] = ()
        nodes: list[int] = []
        for tname, names, key in todo:
            if tname != thread or not nodes:
                thread, path, nodes = tname, (), [self._child(0, self._name_id(tname))]
            same = _common(path, names)
            del nodes[same + 1:]
            node = nodes[-1]
            for i in range(same, len(names)):
                nid = names[i]
                node = self._child(node, nid, nid in names[:i])
                nodes.append(node)
            path = names
            new_keys.append(key)
            new_nodes.append(node)
        added = np.array(new_keys, np.uint64)
        order = np.argsort(added)
        added = added[order]
        at = np.searchsorted(self._keys, added)
        self._keys = np.insert(self._keys, at, added)
        self._leaves = np.insert(self._leaves, at, np.array(new_nodes, np.int64)[order])
        if len(self._made) > self.merge_at:
            self._merge_made()

    def _names_of(self, sids: npt.NDArray[np.uint64], bounds: npt.NDArray[np.int64],
                  frames: npt.NDArray[np.uint64]) -> dict[int, tuple[int, ...]]:
        """Each stack's name ids, root first, capped as folded output is
        (the stacks as tables.stack_frames reads them)."""
        interned = self.store.interner.frames
        known = self._frame_names
        for fid in np.unique(frames).tolist():
            if fid not in known:
                f = interned.get(fid)
                name = TRUNCATED if f is None else clean(f.name)
                if f is not None:
                    self.kinds.setdefault(name, _kind(f))
                known[fid] = self._name_id(name)
        cut = self._name_id(TRUNCATED)
        out = {}
        lo = bounds[:-1].tolist()
        hi = bounds[1:].tolist()
        for stack, a, b in zip(sids.tolist(), lo, hi, strict=True):
            names = tuple(map(known.__getitem__, frames[a:b].tolist()))
            if len(names) > MAX_STACK_DEPTH - 1:
                names = tuple(cap_depth(names, cut, MAX_STACK_DEPTH - 1))
            out[stack] = names
        return out

    def levels(self) -> list[npt.NDArray[np.int64]]:
        """Node indices by depth (index 0: the root)."""
        with self._lock:
            if self._levels_for != len(self.parent):
                depth = np.array(self.depth, np.int64)
                order = np.argsort(depth, kind="stable")
                bounds = np.searchsorted(depth[order], np.arange(int(depth.max()) + 2))
                self._levels = [order[bounds[d]:bounds[d + 1]] for d in range(len(bounds) - 1)]
                self._levels_for = len(self.parent)
            return self._levels

    def arrays(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                              npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
        """(parent, name id, recursive, depth) as arrays: copies, since the
        index grows under them, one set shared by every tree made while the
        index has this size (the cached trees hold only their values)."""
        with self._lock:
            if self._arrays_for != len(self.parent):
                self._arrays = (np.array(self.parent, np.int64), np.array(self.name, np.int64),
                                np.array(self.recursive, bool), np.array(self.depth, np.int64))
                self._arrays_for = len(self.parent)
            return self._arrays


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """The length of the common prefix of a and b (slices compare in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
