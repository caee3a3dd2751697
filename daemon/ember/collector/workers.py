"""WriteRaw requests validated and turned into rows in worker processes.

Reading a 1,000-stack profile (decompress, parse, check, intern) is about
20 ms of Python, and one process holds one core however many gRPC threads
wait on it: the collector took at most about 28 profiles a second on a
2-core machine with the second core idle. With ``decode_workers`` set,
each request goes to a pool of processes that run ``check_request`` and
``Interner.add`` and send back what the store needs: the profile's
metadata, its rows as arrays, and the frames and stacks new to that
worker. The collector keeps the store, its lock and the one writer.

A worker's interner is only a memo: what it calls new is new to it. A
frame or stack it made for a write that then failed here is not resent,
so ``Interner.adopt`` checks that everything a worker's rows name is
either stored or sent along; if not, the collector makes that profile's
rows itself from the stored bytes (``Store.write``'s own path).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import NamedTuple

from ..encode.pprof import profile_shape
from ..proto import profilestore_pb2 as ps
from .intern import Interner, Rows
from .rows import StoredProfile
from .tables import shape_json
from .validate import Limits, check_request

log = logging.getLogger(__name__)


class Prepared(NamedTuple):
    """One profile of a request, ready to store: its metadata (without the
    parsed message), its shape, and its rows."""

    profile: StoredProfile
    shape: str
    rows: Rows


_interner: Interner | None = None


def prepare(data: bytes, limits: Limits, now_ns: int
            ) -> tuple[list[Prepared], Counter[str]]:
    """In a worker: the serialized WriteRawRequest ``data`` checked
    (InvalidRequest as in the collector) and made into rows."""
    global _interner
    if _interner is None:
        _interner = Interner()
    it = _interner
    repairs: Counter[str] = Counter()
    out = []
    for sp in check_request(ps.WriteRawRequest.FromString(data), limits, now_ns, repairs):
        assert sp.proto is not None
        rows = Rows()
        it.add(rows, sp.proto, sp.series_labels, sp.type, sp.time_ns,
               sp.time_ns + sp.duration_ns, sp.tables)
        # frames, stacks and locations are remembered; threads and series are
        # sent with every profile (a few each), so the collector always has them
        it.frames.update(rows.new_frames)
        it.stacks.update(rows.new_stacks)
        it.remember_locations(rows)
        rows.new_locations, rows.new_location_rows = {}, {}
        out.append(Prepared(replace(sp, proto=None, tables=None),
                            shape_json(profile_shape(sp.proto)), rows))
    return out, repairs


class Workers:
    """A pool of ``n`` decode processes, started at once: each process is
    handed an empty request, so it has imported what it runs and made its
    interner before the first write comes (a pool started by the first
    writes held them about a second longer)."""

    def __init__(self, n: int, limits: Limits):
        self.n, self.limits = n, limits
        self._restart = threading.Lock()
        self._pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        # forkserver: the collector has threads, which fork would copy mid-state
        pool = ProcessPoolExecutor(self.n, mp_context=multiprocessing.get_context("forkserver"))
        for _ in range(self.n):   # (each submit with none idle starts a process)
            pool.submit(prepare, b"", self.limits, 0)
        return pool

    def prepare(self, request: ps.WriteRawRequest, now_ns: int
                ) -> tuple[list[Prepared], Counter[str]]:
        data = request.SerializeToString()
        pool = self._pool
        try:
            return pool.submit(prepare, data, self.limits, now_ns).result()
        except BrokenProcessPool:
            with self._restart:  # once, for every request the death failed
                if self._pool is pool:
                    log.error("collector: a decode worker died; starting the pool again")
                    pool.shutdown(wait=False, cancel_futures=True)
                    self._pool = self._start()
            return self._pool.submit(prepare, data, self.limits, now_ns).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
