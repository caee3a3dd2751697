"""A query's result as numpy columns (the merges: merge.py, leaves.py).

DuckDB hands a result over as an Arrow C stream (the Arrow PyCapsule
interface, ``__arrow_c_stream__``); where the install built it, the C
module (_arrow.c) reads that stream batch by batch and each column of a
batch becomes a numpy array over the batch's own memory: no copy and no
conversion. One host's hour (1.25 million rows of a leaf id and a value)
took 12-15 ms through DuckDB's ``fetchnumpy``, 7-8 ms this way. Without
the module, or for a column it does not read (one holding NULL, which
``fetchnumpy`` masks; anything but fixed-width numbers), the result is
read again by ``fetchnumpy``: the same rows, as one array a column.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:   # (DuckDB is imported by the store, not by a decode worker: workers.py)
    import duckdb

_arrow: ModuleType | None
try:   # the stream reader in C (_arrow.c), built by the install where it can be
    from . import _arrow
except ImportError:   # pragma: no cover  (an install without a compiler)
    _arrow = None

#: numpy's type of each Arrow format _arrow.c reads
DTYPES: dict[str, type[np.generic]] = {
    "c": np.int8, "C": np.uint8, "s": np.int16, "S": np.uint16, "i": np.int32,
    "I": np.uint32, "l": np.int64, "L": np.uint64, "f": np.float32, "g": np.float64}


def batches(cur: duckdb.DuckDBPyConnection, sql: str, args: Sequence[Any] = (),
            most: int = -1) -> dict[str, list[Any]] | None:
    """A query's columns, each as a list of arrays (one a batch, read-only,
    in the result's order; at least one, if empty); None when it has more
    than ``most`` rows (``most`` < 0: no limit), read no further than that
    where it can be. A failed or interrupted query raises ``duckdb.Error``,
    as DuckDB's own reads do."""
    rel = cur.sql(sql, params=list(args))
    if _arrow is not None:
        try:
            got = _arrow.read(rel.__arrow_c_stream__(), most)
        except _arrow.Unread:
            pass   # (read again below: fetchnumpy masks a NULL, converts any type)
        except RuntimeError as exc:   # the stream's own error: the query's
            import duckdb
            raise duckdb.Error(str(exc)) from None
        else:
            if got is None:
                return None
            names, formats, parts = got
            return {name: [np.frombuffer(b[i], DTYPES[f]) for b in parts]
                    or [np.zeros(0, DTYPES[f])]
                    for i, (name, f) in enumerate(zip(names, formats, strict=True))}
    whole = rel.fetchnumpy()
    if most >= 0 and whole and len(next(iter(whole.values()))) > most:
        return None
    return {name: [col] for name, col in whole.items()}


def columns(cur: duckdb.DuckDBPyConnection, sql: str, args: Sequence[Any] = ()
            ) -> dict[str, Any]:
    """A query's result as one numpy array a column (``batches`` joined)."""
    got = batches(cur, sql, args)
    assert got is not None   # (no limit)
    return {name: parts[0] if len(parts) == 1 else np.concatenate(parts)
            for name, parts in got.items()}
