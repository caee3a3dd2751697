"""The query engine: one merge per view, as arrays over one prefix tree.

Every stored (thread name, stack) is a leaf of one tree of names, the
``Index`` (index.py). A query's samples, summed per (thread, stack) by the store,
become self values at their leaves; each node's total is then added into
its parent's, from the last node up (scatter.py: every node's parent is an
earlier node), and the flame graph, the table, search and zoom all read
those two arrays (``Tree``):

- a pruned tree: the nodes worth drawing (at least ``1/max_nodes`` of the
  focus), as nested JSON or folded lines, never 200k stacks of text;
- zoom: the subtree under a path of names, pruned against its own total,
  so frames too narrow to draw in the whole profile open;
- search: the share of the total under frames whose name matches, each
  stack counted once (flamegraph.pl's "Matched"), over the whole profile,
  not only what is drawn;
- top: self and total per function name (total counts a name once per
  stack, however often it recurs).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from ..flamegraph import svg
from ..httpserve import check_cancelled
from . import scatter
from .index import Index, Nodes
from .store import Aggregate

_tree_json: ModuleType | None
try:   # the text in C (_tree_json.c), built by the install where it can be
    from . import _tree_json
except ImportError:   # pragma: no cover  (an install without a compiler)
    _tree_json = None

#: How many nodes a pruned answer holds at most.
MAX_NODES = 20_000
DEFAULT_NODES = 5_000


@dataclass
class Tree:
    """One query's values over the index: the total per node. Each node's
    own (self) value is its total less its children's, made when a view
    asks for it, and the index's arrays (parent, name, ...) are the index's
    own: a cached tree holds one array of 8 bytes a node, not six."""

    index: Index
    total: npt.NDArray[np.int64]
    profiles: int
    unit: str
    offcpu: bool = False
    scale: int = 1              # nested() shows values divided by this
    sample_types: tuple[tuple[str, str], ...] = ()
    own: npt.NDArray[np.int64] | None = None   # self values, kept only when saturated
    # self values in units of own_unit, where the tree was summed in them
    # (scatter.slot_totals): own_of is then a lookup (a view's 5,000 nodes:
    # 3 ms less than their children searched)
    own_units: npt.NDArray[np.uint32] | None = None
    own_unit: int = 1

    @classmethod
    def build(cls, index: Index, agg: Aggregate, value: int, unit: str,
              offcpu: bool = False, scale: int = 1,
              sample_types: tuple[tuple[str, str], ...] = ()) -> Tree:
        if agg.rows is not None:   # a few series' rows, as read: straight into the nodes
            got = scatter.slot_totals(agg.rows.of(value), index.slots(), index.slots)
            if got is not None:
                return cls(index, got.total, agg.profiles, unit, offcpu, scale, sample_types,
                           own_units=got.own, own_unit=got.unit)
            agg = agg.summed()
        leaves = index.leaves(agg)
        parent = index.arrays()[0]
        values = agg.sums(value)
        in_units = scatter.unit_totals(leaves, values, parent)
        if in_units is not None:
            return cls(index, in_units, agg.profiles, unit, offcpu, scale, sample_types)
        own = np.zeros(len(parent), np.int64)
        # sums past int64 saturate; a saturated total no longer gives its
        # node's own value back (total less children), so that is kept
        wide = scatter.add_at(own, leaves, values) >= 2.0**62
        total = own.copy() if wide else own
        check_cancelled()
        scatter.roll_up(total, parent, index.levels)
        return cls(index, total, agg.profiles, unit, offcpu, scale, sample_types,
                   own if wide else None)

    @property
    def nbytes(self) -> int:
        """What the tree holds (what caches weigh it by)."""
        return sum(a.nbytes for a in (self.total, self.own, self.own_units) if a is not None)

    def _column(self, i: int) -> npt.NDArray[Any]:
        return self.index.arrays()[i][:len(self.total)]

    @property
    def parent(self) -> npt.NDArray[np.int64]:
        return self._column(0)

    @property
    def name(self) -> npt.NDArray[np.int64]:
        return self._column(1)

    @property
    def recursive(self) -> npt.NDArray[np.bool_]:
        return self._column(2)

    @property
    def depth(self) -> npt.NDArray[np.int64]:
        return self._column(3)

    @property
    def self_(self) -> npt.NDArray[np.int64]:
        """Each node's own value: its total less its children's."""
        if self.own is not None:
            return self.own
        if self.own_units is not None:
            return self.own_units.astype(np.int64) * self.own_unit
        out = np.zeros(len(self.total), np.int64)
        scatter.add_at(out, self.parent[1:], self.total[1:])
        return np.subtract(self.total, out, out=out)

    def own_of(self, nodes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """``self_[nodes]``, from those nodes' children alone, found in the
        index's edges: a view of 5,000 nodes needs no tree-sized array (a
        slot per node of a fleet hour's tree was 3.2 MB, its pages faulted
        in anew for each answer)."""
        if self.own is not None:
            return self.own[nodes]
        if self.own_units is not None:
            got: npt.NDArray[np.int64] = self.own_units[nodes].astype(np.int64) * self.own_unit
            return got
        # (asked for in ascending order: each search starts where the last
        # ended, in the part of the edges it read: 1.2 ms, not 2.1, for 5,000)
        order = np.argsort(nodes, kind="stable")
        owner, kids = self.index.children(nodes[order])
        made = kids < len(self.total)   # (nodes the index gained since: nothing in them)
        below = np.zeros(len(nodes), np.int64)
        scatter.add_at(below, order[owner[made]], self.total[kids[made]])
        out: npt.NDArray[np.int64] = self.total[nodes] - below
        return out

    def slid(self, gained: Aggregate, lost: Aggregate | None, value: int) -> Tree | None:
        """This tree with the sums of ``gained`` added and of ``lost`` taken
        away (collector/window.py); None where int64 could overflow, for
        Tree.build to saturate as it does."""
        limit = 2.0**61
        if self.own is not None or float(np.abs(self.total.astype(np.float64)).max(
                initial=0)) >= limit or any(
                float(np.abs(a.sums(value).astype(np.float64)).sum()) >= limit
                for a in (gained, lost) if a is not None):
            return None
        nodes = self.index.leaves(gained)
        delta = gained.sums(value)
        if lost is not None:
            nodes = np.concatenate([nodes, self.index.leaves(lost)])
            delta = np.concatenate([delta, -lost.sums(value)])
        parent = self.index.arrays()[0]
        total = np.zeros(len(parent), np.int64)
        total[:len(self.total)] = self.total
        _add_up(total, parent, nodes, delta)
        return Tree(self.index, total, gained.profiles, self.unit, self.offcpu, self.scale,
                    self.sample_types)

    # --- the nodes of one view ---
    def find(self, path: list[str]) -> int:
        """The node at a path of names below the root; LookupError if none."""
        node = 0
        for name in path:
            nid = self.index._name_ids.get(name)
            child = None if nid is None else self.index.child(node, nid)
            if child is None or child >= len(self.total) or not self.total[child]:
                raise LookupError(f"no frame {name!r} under {self.path(node) or 'all'}")
            node = child
        return node

    def path(self, node: int) -> list[str]:
        out = []
        parent, name = self.parent, self.name
        while node > 0:
            out.append(self.index.names[name[node]])
            node = int(parent[node])
        return out[::-1]

    def subtree(self, focus: int) -> npt.NDArray[np.bool_]:
        inside = np.zeros(len(self.total), bool)
        inside[focus] = True
        levels = self.index.levels()
        parent = self.parent
        for level in levels[int(self.depth[focus]) + 1:]:
            level = level[level < len(inside)]
            inside[level] = inside[parent[level]]
        return inside

    def kept(self, focus: int = 0, max_nodes: int = DEFAULT_NODES) -> npt.NDArray[np.int64]:
        """The nodes of a pruned view under ``focus`` (itself first): at most
        ``max_nodes``, the widest, each with its ancestors."""
        total = self.total
        inside = self.subtree(focus) if focus else None
        # the widest are among the nodes of at least 1/max_nodes of the focus
        # when those are enough (at most max_nodes a depth: a few times
        # max_nodes, not the 500,000 of a host's hour), and partitioned there
        # (at least 1: not zero, without a pass of its own)
        floor = max(abs(int(total[focus])) // max_nodes, 1)
        # (totals from 32-bit units are not negative: one compare over the
        # 800,000 nodes, and one array, not three: 1 ms of 2.4)
        wide = total >= floor
        if self.own_units is None:
            wide |= total <= -floor
        if inside is not None:
            wide &= inside
        wide[focus] = True
        cand = np.flatnonzero(wide)
        if len(cand) < max_nodes and floor > 1:
            mask = total != 0
            if inside is not None:
                mask &= inside
            mask[focus] = True
            cand = np.flatnonzero(mask)
        if len(cand) > max_nodes:
            totals = np.abs(self.total[cand]).view(np.uint64)
            floor = np.partition(totals, len(cand) - max_nodes)[len(cand) - max_nodes]
            cand = cand[totals >= floor]
            # the widest first and, among equals, parents before children: a
            # node is never kept without its ancestors
            order = np.lexsort((self.depth[cand], -np.abs(self.total[cand])))
            cand = cand[order[:max_nodes]]
            if focus not in cand:
                cand = np.concatenate([[focus], cand[:max_nodes - 1]])
        return cand[np.argsort(self.depth[cand], kind="stable")]

    def nested(self, focus: int = 0, max_nodes: int = DEFAULT_NODES) -> dict[str, Any]:
        """The pruned view as {name, value, self, children}, children widest first."""
        kept = self.kept(focus, max_nodes)
        made: dict[int, dict[str, Any]] = {}
        names = self.index.names
        for node, nid, value, own, up in zip(
                kept.tolist(), self.name[kept].tolist(), self.total[kept].tolist(),
                self.own_of(kept).tolist(), self.parent[kept].tolist(), strict=True):
            item: dict[str, Any] = {"name": names[nid] if node else "all",
                                    "value": value // self.scale, "self": own // self.scale,
                                    "children": []}
            made[node] = item
            if node != focus and up in made:
                made[up]["children"].append(item)
        for item in made.values():
            item["children"].sort(key=lambda c: (-c["value"], c["name"]))
        return made[focus]

    def _by_name(self, order: npt.NDArray[np.int64], up: npt.NDArray[np.int64],
                 value: npt.NDArray[np.int64], nids: npt.NDArray[np.int64]
                 ) -> npt.NDArray[np.int64]:
        """``order`` (kept nodes by parent, then widest first) with each run
        of siblings of one value put in the order of their names. Only the
        tied nodes' names are compared: sorting the names of all 5,000 took
        1.3 ms of a view's 9."""
        u, v = up[order], value[order]
        tied = (u[1:] == u[:-1]) & (v[1:] == v[:-1])
        if not tied.any():
            return order
        at = np.flatnonzero(np.r_[tied, False] | np.r_[False, tied])
        ids = nids[order[at]].tolist()
        ranked = sorted(set(ids), key=self.index.names.__getitem__)
        rank = {nid: k for k, nid in enumerate(ranked)}
        run = np.cumsum(np.r_[True, ~tied])[at]   # (a run's positions are next to each other)
        out = order.copy()
        out[at] = order[at[np.lexsort((np.array([rank[i] for i in ids], np.int64), run))]]
        return out

    def nested_json(self, focus: int = 0, max_nodes: int = DEFAULT_NODES) -> str:
        """``query.tree_json(self.nested(focus, max_nodes))``, written from
        arrays: children ordered by one lexsort, the text of the nodes in
        preorder made in one pass (_tree_json.c where built), names encoded
        once per index. For 5,000 nodes of a fleet hour 45 ms became about 10,
        then 6.5 (3.5 of them ``kept`` and ``own_of``), then 4-5.3 against
        5.3-7.4 (one compare in ``kept``, names sorted only where tied)."""
        kept = self.kept(focus, max_nodes)
        n = len(kept)
        value = self.total[kept] // self.scale
        own = self.own_of(kept) // self.scale
        nids = self.name[kept]
        table = self.index.json_names(nids)
        first = '"all"' if focus == 0 and kept[0] == focus else None
        # each kept node's parent among the kept (-1: none)
        by_id = np.argsort(kept)
        parent = self.parent[kept]
        at = np.searchsorted(kept[by_id], parent).clip(0, n - 1)
        up = np.where(kept[by_id][at] == parent, by_id[at], -1)
        up[0] = -1
        up_or_focus = np.maximum(up, 0)   # (the focus, and nodes not shown: size 0)
        depth = self.depth[kept] - self.depth[kept[0]]
        bounds = np.searchsorted(depth, np.arange(int(depth.max(initial=0)) + 2))
        # shown: the nodes whose parents are, up to the focus (kept is by
        # depth: a parent's level comes before its children's)
        reach = up >= 0
        reach[0] = True
        for lo, hi in pairwise(bounds[1:]):
            reach[lo:hi] &= reach[up_or_focus[lo:hi]]
        # the children of each in the order nested() gives them: (-value, name)
        attached = np.flatnonzero(reach & (up >= 0))
        order = attached[np.lexsort((-value[attached], up[attached]))]
        order = self._by_name(order, up, value, nids)
        # preorder: a node's place is its parent's + 1 + the sizes of the
        # subtrees of the siblings before it
        shown = np.r_[[0], order]
        size = np.zeros(n, np.int64)
        size[shown] = 1
        scatter.roll_up(size, up_or_focus,
                        lambda: [np.arange(lo, hi) for lo, hi in pairwise(bounds)])
        offset = np.zeros(n, np.int64)
        if len(order):
            sizes = size[order]
            before = np.cumsum(sizes) - sizes
            ups = up[order]
            starts = np.flatnonzero(np.r_[True, ups[1:] != ups[:-1]])
            offset[order] = before - np.repeat(before[starts],
                                               np.diff(np.r_[starts, len(order)]))
        place = np.zeros(n, np.int64)
        for lo, hi in pairwise(bounds[1:]):   # a depth at a time, below the focus
            place[lo:hi] = place[up_or_focus[lo:hi]] + 1 + offset[lo:hi]
        pre = np.empty(len(shown), np.int64)
        pre[place[shown]] = shown
        # after each node, its subtree closes as deep as the next one starts
        d = depth[pre]
        closes = np.r_[d[:-1] - d[1:] + 1, d[-1] + 1].astype(np.int64)
        if _tree_json is not None:
            return str(_tree_json.text(pre, closes, nids.astype(np.int64), table,
                                       value.astype(np.int64), own.astype(np.int64), first))
        names = [table[i] for i in nids.tolist()]
        names[0] = first or names[0]
        tails = ["]}" * c + (", " if c else "") for c in range(int(closes.max()) + 1)]
        tail = [tails[c] for c in closes.tolist()]
        tail[-1] = tail[-1].removesuffix(", ")
        vs, os_ = value.tolist(), own.tolist()
        return "".join(f'{{"name": {names[i]}, "value": {vs[i]}, "self": {os_[i]}, '
                       f'"children": [{t}' for i, t in zip(pre.tolist(), tail, strict=True))

    def folded(self, focus: int = 0, max_nodes: int = MAX_NODES) -> Iterator[tuple[str, int]]:
        """The pruned view as folded lines: what is left out of a kept node
        stays in it as its own (self) value, so every total is exact."""
        kept = self.kept(focus, max_nodes)
        paths: dict[int, str] = {}
        child_sum: dict[int, int] = {}
        names = self.index.names
        totals = dict(zip(kept.tolist(), self.total[kept].tolist(), strict=True))
        for node, up, nid in zip(kept.tolist(), self.parent[kept].tolist(),
                                 self.name[kept].tolist(), strict=True):
            if node == 0:
                continue
            name = names[nid]
            paths[node] = f"{paths[up]};{name}" if up in paths else name
            child_sum[up] = child_sum.get(up, 0) + totals[node]
        for node, p in paths.items():
            own = totals[node] - child_sum.get(node, 0)
            if own > 0:
                yield p, own

    def matched(self, pattern: str, focus: int = 0) -> tuple[int, float]:
        """(value, share of the focus) under frames whose name matches
        ``pattern``, each stack once; ValueError for a bad pattern."""
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"search is not a valid regular expression: {exc}") from None
        hit_names = np.array([i for i, n in enumerate(self.index.names) if i and rx.search(n)],
                             np.int64)
        hit = np.isin(self.name, hit_names) & (self.total != 0)
        hit[0] = False
        if focus:
            hit &= self.subtree(focus)
        below = np.zeros(len(hit), bool)   # a matching ancestor already counts it
        parent = self.parent
        for level in self.index.levels()[1:]:
            level = level[level < len(hit)]
            up = parent[level]
            below[level] = below[up] | hit[up]
        value = int(self.total[hit & ~below].sum())
        whole = int(self.total[focus])
        return value, (value / whole if whole else 0.0)

    def top(self, limit: int, sort: str = "self") -> list[dict[str, object]]:
        """Self and total per function name, frames only (not threads)."""
        frames = self.depth >= 2
        n = len(self.index.names)
        name = self.name
        self_by = np.zeros(n, np.int64)
        np.add.at(self_by, name[frames], self.self_[frames])
        counted = frames & ~self.recursive
        total_by = np.zeros(n, np.int64)
        np.add.at(total_by, name[counted], self.total[counted])
        present = np.flatnonzero(total_by > 0)
        first, second = (self_by, total_by) if sort == "self" else (total_by, self_by)
        if len(present) > limit:   # only those that can be among the first: ties included
            floor = np.partition(first[present], len(present) - limit)[len(present) - limit]
            present = present[first[present] >= floor]
        names = self.index.names
        order = sorted(present.tolist(), key=lambda i: (-first[i], -second[i], names[i]))
        return [{"name": names[i], "self": int(self_by[i]), "total": int(total_by[i])}
                for i in order[:limit]]

    def sandwich(self, name: str, max_nodes: int = DEFAULT_NODES) -> dict[str, Any]:
        """The callers and callees of one function (sandwich.py)."""
        from .sandwich import sandwich
        return sandwich(self, name, max_nodes)


def _add_up(total: npt.NDArray[np.int64], parent: Nodes, nodes: Nodes,
            delta: npt.NDArray[np.int64]) -> None:
    """``delta`` added to the totals of ``nodes`` and of all their
    ancestors: a level per step, the nodes of a level made distinct first,
    so a slide costs what its rows touch, not a pass over the whole tree."""
    while len(nodes):
        check_cancelled()
        nodes, at = np.unique(nodes, return_inverse=True)
        summed = np.zeros(len(nodes), np.int64)
        np.add.at(summed, at, delta)
        total[nodes] += summed
        up = parent[nodes]
        keep = up >= 0
        nodes, delta = up[keep], summed[keep]


def kinds_of(index: Index) -> dict[str, str]:
    """Frame name -> kind for the flame graph's colours."""
    return svg.merge_kinds(index.kinds.items())
