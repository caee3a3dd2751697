"""The query index on disk, beside the store (``STORE.index.npz``).

Building the index from every stored stack takes seconds for a fleet's
hour (800,000 leaves: about 6 s), and queries wait for it after a start.
A collector saves it when it stops (and once built), loads it when it
starts, and then adds only the stacks it lacks: the first answer comes in
seconds.

Every id in the file is a content hash (thread names, stacks, frames), the
same in any store, so a saved index is right for any store: stacks it lacks
are added as for a new write, stacks the store no longer has cost a few
bytes. A file that is not of this format, or whose arrays do not hold
together, is ignored with a warning (the index is then built as before);
it is written to a temporary name and renamed, so a crash never leaves half
of one.
"""

from __future__ import annotations

import json
import logging
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .index import NODE, Index

log = logging.getLogger(__name__)

FORMAT = 1


def path_for(storage: str) -> Path | None:
    """Where the index of the store at ``storage`` is kept (None: in memory)."""
    return None if storage == ":memory:" else Path(storage + ".index.npz")


def save(index: Index, path: Path) -> int:
    """Write the index; returns its nodes. Its arrays are taken as they
    are (an index replaces them as it grows, never writes them in place)
    and each is widened to the file's type only as it is written: copied
    all at once, as a fleet hour's were, they held 45 MB more for the
    moment of a save, the collector's peak RSS as it stopped (464 MB)."""
    with index._lock:
        fids = np.fromiter(index._frame_names.keys(), np.uint64, len(index._frame_names))
        fnames = np.fromiter(index._frame_names.values(), np.int64, len(index._frame_names))
        arrays: dict[str, tuple[npt.NDArray[Any], type[np.generic]]] = {
            "format": (np.array([FORMAT]), np.int64),
            "parent": (index.parent, np.int64), "name": (index.name, np.int64),
            "depth": (index.depth, np.int64), "recursive": (index.recursive, np.int8),
            "names": (np.frombuffer(json.dumps(index.names).encode(), np.uint8), np.uint8),
            "kinds": (np.frombuffer(json.dumps(index.kinds).encode(), np.uint8), np.uint8),
            "keys": (index._keys, np.uint64), "leaves": (index._leaves, np.int64),
            "fids": (fids, np.uint64), "fnames": (fnames, np.int64)}
    tmp = path.with_name(path.name + ".tmp")
    # (as np.savez writes them: one .npy member each, stored, not compressed)
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, (array, dtype) in arrays.items():
            with z.open(name + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, array.astype(dtype, copy=False),
                                          allow_pickle=False)
    os.replace(tmp, path)
    return len(arrays["parent"][0])


def load(index: Index, path: Path) -> int:
    """Fill an empty index from ``path``; returns the nodes loaded (0: no
    usable file, or the index already has nodes)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            got = {k: z[k] for k in z.files}
        problem = _check(got)
        names = json.loads(bytes(got["names"]).decode()) if not problem else []
        kinds = json.loads(bytes(got["kinds"]).decode()) if not problem else {}
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        problem = f"unreadable ({exc})"
    if not problem and (len(names) <= max(int(got["name"].max(initial=0)),
                                          int(got["fnames"].max(initial=0)))
                        or not all(isinstance(n, str) for n in names)
                        or not isinstance(kinds, dict)):
        problem = "names do not match the nodes"
    if problem:
        log.warning("collector: query index %s ignored (it is built again): %s", path, problem)
        return 0
    parent, name = got["parent"], got["name"]
    with index._lock:
        if len(index.parent) > 1:
            return 0
        index.parent = parent.astype(NODE)
        index.name = name.astype(NODE)
        index.depth = got["depth"].astype(NODE)
        index.recursive = got["recursive"].astype(np.bool_)
        index.names = names
        index._name_ids = {n: i for i, n in enumerate(names)}
        index.kinds = {str(k): str(v) for k, v in kinds.items()}
        edges = (parent[1:].astype(np.uint64) << np.uint64(32)) | name[1:].astype(np.uint64)
        order = np.argsort(edges)
        index._edges = (edges[order], np.arange(1, len(parent), dtype=NODE)[order])
        index._keys, index._leaves = got["keys"], got["leaves"].astype(NODE)
        index._frame_names = dict(zip(got["fids"].tolist(), got["fnames"].tolist(), strict=True))
    return len(parent)


def _check(got: dict[str, npt.NDArray[Any]]) -> str:
    """What is wrong with the arrays of a file, or ''."""
    need = {"format", "parent", "name", "depth", "recursive", "names", "kinds", "keys",
            "leaves", "fids", "fnames"}
    if missing := need - got.keys():
        return f"not an index file (no {', '.join(sorted(missing))})"
    if got["format"].tolist() != [FORMAT]:
        return f"format {got['format'].tolist()}, not [{FORMAT}]"
    parent, n = got["parent"], len(got["parent"])
    if not n or any(len(got[k]) != n for k in ("name", "depth", "recursive")):
        return "node arrays of different lengths"
    if parent[0] != -1 or (n > 1 and not (parent[1:] < np.arange(1, n)).all()) \
            or (parent[1:] < 0).any() or (got["name"] < 0).any():
        return "a node's parent is not an earlier node"
    keys, leaves = got["keys"], got["leaves"]
    if len(keys) != len(leaves) or keys.dtype != np.uint64 or leaves.dtype != np.int64 \
            or (len(keys) > 1 and not (keys[1:] > keys[:-1]).all()):
        return "leaf keys not sorted and distinct"
    if len(leaves) and (leaves.min() < 0 or leaves.max() >= n):
        return "a leaf is not a node"
    if len(got["fids"]) != len(got["fnames"]) or (got["fnames"] < 0).any():
        return "frame names of different lengths"
    return ""
