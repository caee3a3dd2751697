"""The sandwich view of one function: its callers and its callees.

Over the nodes of a ``Tree`` named like the function, leaving out those with
an ancestor of the same name (recursion counts once, as in ``Tree.top``):

- callees: the subtrees under those nodes merged by their paths of names,
  the function at the root;
- callers: the inverted paths, the function at the root, its immediate
  callers below it, and so on up to the thread names, each node's value the
  total of the function's nodes whose ancestors pass through it.

Both are built a depth at a time with numpy (``np.unique`` over each level's
(merged parent, name) keys), then pruned to the widest ``max_nodes``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from .engine import Tree

Ints = npt.NDArray[np.int64]


def sandwich(tree: Tree, name: str, max_nodes: int) -> dict[str, Any]:
    """{name, self, total, callees, callers} (and the unit, profiles and
    the whole profile's total, "all"); LookupError if no frame is
    named ``name`` in the tree."""
    nid = tree.index._name_ids.get(name)
    n = len(tree.total)
    if nid is None:
        raise LookupError(f"no frame named {name!r}")
    named = (tree.name[:n] == nid) & (tree.depth[:n] >= 2)
    roots = np.flatnonzero(named & ~tree.recursive[:n] & (tree.total != 0))
    if not len(roots):
        raise LookupError(f"no frame named {name!r}")
    n_names = len(tree.index.names) + 1
    return {"name": name, "unit": tree.unit, "profiles": tree.profiles,
            "all": int(tree.total[0]) // tree.scale,
            "self": int(tree.self_[named].sum()) // tree.scale,
            "total": int(tree.total[roots].sum()) // tree.scale,
            "callees": _nested(tree, name, *_callees(tree, roots, n_names), max_nodes),
            "callers": _nested(tree, name, *_callers(tree, roots, n_names), max_nodes)}


def _callees(tree: Tree, roots: Ints, n_names: int) -> tuple[Ints, Ints, Ints, Ints]:
    """(parent, name id, total, depth) of the merged subtrees under roots.
    Roots lie at different depths, so a merged node's id is kept by its
    (merged parent, name) key across the levels of the index (a sorted
    array of the keys met, searched per level)."""
    n = len(tree.total)
    merged = np.full(n, -1, np.int64)   # node -> merged node
    merged[roots] = 0
    known, known_ids = np.zeros(0, np.int64), np.zeros(0, np.int64)   # sorted keys, their ids
    keys_of = [np.array([-1], np.int64)]   # per merged node: parent * n_names + name
    depth_of = np.zeros(1, np.int64)
    count = 1
    last = int(tree.depth[roots].max())
    for d, level in enumerate(tree.index.levels()[int(tree.depth[roots].min()) + 1:],
                              start=int(tree.depth[roots].min()) + 1):
        level = level[level < n]
        level = level[(merged[tree.parent[level]] >= 0) & (tree.total[level] != 0)]
        if not len(level):
            if d > last:
                break
            continue
        uniq, inverse = np.unique(merged[tree.parent[level]] * n_names + tree.name[level],
                                  return_inverse=True)
        pos = np.searchsorted(known, uniq)
        found = pos < len(known)
        found[found] = known[pos[found]] == uniq[found]
        ids = np.empty(len(uniq), np.int64)
        ids[found] = known_ids[pos[found]]
        new = uniq[~found]
        ids[~found] = count + np.arange(len(new))
        count += len(new)
        keys_of.append(new)
        depth_of = np.concatenate([depth_of, depth_of[new // n_names] + 1])
        known = np.concatenate([known, new])
        known_ids = np.concatenate([known_ids, ids[~found]])
        order = np.argsort(known, kind="stable")
        known, known_ids = known[order], known_ids[order]
        merged[level] = ids[inverse]
    inside = merged >= 0
    total = np.zeros(count, np.int64)
    np.add.at(total, merged[inside], tree.total[inside])
    keys = np.concatenate(keys_of)
    parent, name = keys // n_names, keys % n_names
    parent[0], name[0] = -1, 0
    return parent, name, total, depth_of


def _callers(tree: Tree, roots: Ints, n_names: int) -> tuple[Ints, Ints, Ints, Ints]:
    """(parent, name id, total, depth) of the inverted paths from roots up
    to their thread names."""
    parents, names = [np.array([-1])], [np.array([0])]
    totals, depths = [np.array([int(tree.total[roots].sum())])], [np.array([0])]
    cur, mid, values = roots, np.zeros(len(roots), np.int64), tree.total[roots]
    count, d = 1, 0
    while len(cur):
        up = tree.parent[cur]
        keep = tree.depth[up] >= 1
        cur, mid, values = up[keep], mid[keep], values[keep]
        if not len(cur):
            break
        d += 1
        keys = mid * n_names + tree.name[cur]
        uniq, inverse = np.unique(keys, return_inverse=True)
        level_totals = np.zeros(len(uniq), np.int64)
        np.add.at(level_totals, inverse, values)
        parents.append(uniq // n_names)
        names.append(uniq % n_names)
        totals.append(level_totals)
        depths.append(np.full(len(uniq), d, np.int64))
        mid = count + inverse
        count += len(uniq)
    return (np.concatenate(parents), np.concatenate(names), np.concatenate(totals),
            np.concatenate(depths))


def _nested(tree: Tree, name: str, parent: Ints, nid: Ints, total: Ints, depth: Ints,
            max_nodes: int) -> dict[str, Any]:
    """A merged tree as {name, value, self, children} like Tree.nested: the
    widest ``max_nodes`` (a child is never wider than its parent, so each
    kept node's parent is kept), self the part not in any child."""
    child_sum = np.zeros(len(total), np.int64)
    np.add.at(child_sum, parent[1:], total[1:])
    order = np.lexsort((depth, -np.abs(total)))[:max(1, max_nodes)]
    kept = order[np.argsort(depth[order], kind="stable")]
    names = tree.index.names
    made: dict[int, dict[str, Any]] = {}
    for node in kept.tolist():
        item: dict[str, Any] = {
            "name": names[int(nid[node])] if node else name,
            "value": int(total[node]) // tree.scale,
            "self": int(total[node] - child_sum[node]) // tree.scale, "children": []}
        made[node] = item
        up = int(parent[node])
        if node and up in made:
            made[up]["children"].append(item)
    for item in made.values():
        item["children"].sort(key=lambda c: (-c["value"], c["name"]))
    return made[0]
