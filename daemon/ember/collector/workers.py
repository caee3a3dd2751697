"""WriteRaw requests validated and turned into rows in worker processes.

Reading a 1,000-stack profile (decompress, parse, check, intern) is about
20 ms of Python, and one process holds one core however many gRPC threads
wait on it: the collector took at most about 28 profiles a second on a
2-core machine with the second core idle. With ``decode_workers`` set,
requests go to that many processes, which run ``check_request`` and
``Interner.add`` and send back what the store needs: the profile's
metadata, its rows as arrays, and the frames and stacks new to that
worker. The collector keeps the store, its lock and the one writer.

A worker's interner is only a memo: what it calls new is new to it. A
frame or stack it made for a write that then failed here is not resent,
so ``Interner.adopt`` checks that everything a worker's rows name is
either stored or sent along; if not, the collector makes that profile's
rows itself from the stored bytes (``Store.write``'s own path).

Each program's profiles go to one worker (``Router``): a program's first
profile costs a worker three times a known one's (its 5,000 locations made
into frames), and every frame a worker calls new is sent to the collector,
unpickled and checked there. Sent to whichever process was free, every
worker learned every program, and a fleet's first seconds took twice that
work on both sides. A program is the series' executable (or command): an
agent's request holds the series of many programs, so a request is split by
program, each part read by its worker, the results put back in the
request's order. When the workers that know a program have ``SPILL`` more
profiles in hand than the least busy, that one learns it too: a program's
worker is a preference, not a queue to wait in. A request refused in one
part is refused whole; the parts other workers read meanwhile were only
learned by them (``adopt`` covers that, as for a failed write).
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import NamedTuple

from ..encode.pprof import profile_shape
from ..proto import profilestore_pb2 as ps
from .intern import Interner, Rows
from .rows import StoredProfile, shape_json
from .validate import InvalidRequest, Limits, check_request, check_series_count

log = logging.getLogger(__name__)


class Prepared(NamedTuple):
    """One profile of a request, ready to store: its metadata (without the
    parsed message), its shape, and its rows."""

    profile: StoredProfile
    shape: str
    rows: Rows


#: What a worker sends back for a request: its profiles, and the repairs made.
Read = tuple[list["Prepared"], Counter[str]]
#: A prepared profile's data when it is the request's own bytes, which the
#: collector still holds: sending 130 KB back to it and unpickling them took
#: a loaded worker and the collector about 1 ms a profile. (An empty
#: raw_profile is refused, so no stored profile has these bytes.)
AS_SENT = b""

_interner: Interner | None = None


def prepare(data: bytes, limits: Limits, now_ns: int, numbers: Sequence[int] | None = None
            ) -> Read:
    """In a worker: the serialized WriteRawRequest ``data`` checked
    (InvalidRequest as in the collector) and made into rows; ``numbers``:
    its series' numbers in the request it was split from."""
    global _interner
    if _interner is None:
        _interner = Interner()
    it = _interner
    repairs: Counter[str] = Counter()
    out = []
    request = ps.WriteRawRequest.FromString(data)
    for sp, sample in zip(check_request(request, limits, now_ns, repairs, numbers),
                          _samples(request), strict=True):
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
        # (the collector has the bytes it sent: only a profile repaired or
        # compressed anew goes back with its data)
        out.append(Prepared(replace(sp, proto=None, tables=None,
                                    data=AS_SENT if sp.data == sample.raw_profile
                                    else sp.data),
                            shape_json(profile_shape(sp.proto)), rows))
    return out, repairs


#: Labels naming what a series' profiles share frames with, first found first.
PROGRAM_LABELS = ("executable", "comm")
#: Profiles in hand past the least busy worker's at which the workers that
#: know a program hand its new ones on (a worker learning a program anew
#: costs it about 40 ms; a queue of two waits longer).
SPILL = 2
#: Programs remembered; past it the table starts again.
MAX_PROGRAMS = 1 << 16


def program_of(labels: ps.LabelSet) -> bytes:
    """The program of a series: its executable or command, else its labels
    (a digest: the labels are not checked yet, and the router keeps it)."""
    got = {lb.name: lb.value for lb in labels.labels}
    key = next((f"{name}={got[name]}" for name in PROGRAM_LABELS if got.get(name)),
               repr(sorted(got.items())))
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def with_data(prepared: list[Prepared], request: ps.WriteRawRequest) -> list[Prepared]:
    """What ``prepare`` made of ``request``, each profile with its data
    (the request's own bytes where the worker left them ``AS_SENT``)."""
    return [x if x.profile.data != AS_SENT
            else x._replace(profile=replace(x.profile, data=sample.raw_profile))
            for x, sample in zip(prepared, _samples(request), strict=True)]


def _samples(request: ps.WriteRawRequest) -> list[ps.RawSample]:
    """The request's samples (profiles) in order, as check_request reads them."""
    return [sample for series in request.series for sample in series.samples]


def _series_number(exc: InvalidRequest) -> int:
    """The number of the series a refusal names (check_request's messages
    begin "series N"), else none before it."""
    m = re.match(r"series (\d+)", str(exc))
    return int(m.group(1)) if m else -1


class Router:
    """Which of ``n`` workers reads a program's profiles: of the workers
    that know it, the least busy, unless that one has ``SPILL`` more
    profiles in hand than the least busy of all, which then learns it too.
    A new program goes to the worker given the fewest."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._lock = threading.Lock()
        self._known: dict[bytes, int] = {}   # program -> the workers knowing it, as bits
        self._programs = [0] * n           # programs given to each
        self.busy = [0] * n                # profiles in hand, each

    def pick(self, program: bytes) -> int:
        with self._lock:
            busy = self.busy
            least = min(range(self.n), key=busy.__getitem__)
            known = self._known.get(program, 0)
            if not known:
                if len(self._known) >= MAX_PROGRAMS:
                    self._known, self._programs = {}, [0] * self.n
                w = min(range(self.n), key=lambda i: (self._programs[i], busy[i]))
            else:
                w = min((i for i in range(self.n) if known >> i & 1), key=busy.__getitem__)
                if busy[w] < busy[least] + SPILL:
                    return w
                w = least
            self._known[program] = known | 1 << w
            self._programs[w] += 1
            return w

    def taken(self, w: int, profiles: int) -> None:
        with self._lock:
            self.busy[w] += profiles

    def done(self, w: int, profiles: int) -> None:
        with self._lock:
            self.busy[w] -= profiles


class Workers:
    """``n`` decode processes, started at once: each process is handed an
    empty request, so it has imported what it runs and made its interner
    before the first write comes (a pool started by the first writes held
    them about a second longer). Each is a pool of one, so that what a
    request holds of a program goes to the worker that knows it."""

    def __init__(self, n: int, limits: Limits):
        self.n, self.limits = n, limits
        self.router = Router(n)
        self._restart = threading.Lock()
        self._pools = [self._start() for _ in range(n)]

    def _start(self) -> ProcessPoolExecutor:
        # forkserver: the collector has threads, which fork would copy mid-state
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver"))
        pool.submit(prepare, b"", self.limits, 0)
        return pool

    def ready(self, timeout: float) -> bool:
        """Whether every worker has answered once within ``timeout`` s (one
        found dead is started again and asked)."""
        deadline = time.monotonic() + timeout
        try:
            for w in range(self.n):
                pool, future = self._submit(w, b"", None, 0, 0)
                self._result(w, b"", None, 0, 0, pool, future, deadline)
        except Exception:
            return False
        return True

    def prepare(self, request: ps.WriteRawRequest, now_ns: int) -> Read:
        """``request`` checked and made into rows, each program's series by
        its worker at once; the results in the request's order."""
        check_series_count(request)   # (of the whole request, before it is split)
        parts: dict[int, list[int]] = {}
        for i, series in enumerate(request.series):
            parts.setdefault(self.router.pick(program_of(series.labels)), []).append(i)
        if len(parts) == 1:
            ((w, _),) = parts.items()
            return self._read([(w, None, request)], len(request.series), now_ns)
        return self._read([(w, numbers, ps.WriteRawRequest(
            series=[request.series[i] for i in numbers], normalized=request.normalized))
            for w, numbers in parts.items()], len(request.series), now_ns)

    def _read(self, parts: list[tuple[int, list[int] | None, ps.WriteRawRequest]],
              n_series: int, now_ns: int) -> Read:
        """Each part (worker, its series' numbers, the request of them) read
        by its worker, all at once. A part refused refuses the request, with
        the message of its lowest-numbered series, as one check of the whole
        request gives it."""
        sent: list[tuple[int, list[int] | None, ps.WriteRawRequest, bytes, int,
                         ProcessPoolExecutor, Future[Read]]] = []
        got: dict[int, list[Prepared]] = {}
        repairs: Counter[str] = Counter()
        refused: list[tuple[int, InvalidRequest]] = []
        try:
            for w, numbers, part in parts:
                data = part.SerializeToString()
                n = sum(len(s.samples) for s in part.series)
                sent.append((w, numbers, part, data, n,
                             *self._submit(w, data, numbers, now_ns, n)))
            for w, numbers, part, data, n, pool, future in sent:
                try:
                    prepared, fixed = self._result(w, data, numbers, now_ns, n, pool, future)
                except InvalidRequest as exc:
                    refused.append((_series_number(exc), exc))
                    continue
                repairs.update(fixed)
                each = iter(with_data(prepared, part))
                for i, series in zip(numbers or range(n_series), part.series, strict=True):
                    got[i] = [next(each) for _ in series.samples]
        finally:
            for *_, future in sent:   # (a failure here: the parts not begun are not read)
                future.cancel()
        if refused:
            raise min(refused, key=lambda x: x[0])[1]
        return [x for i in range(n_series) for x in got[i]], repairs

    def _submit(self, w: int, data: bytes, numbers: list[int] | None, now_ns: int, n: int,
                broken: ProcessPoolExecutor | None = None
                ) -> tuple[ProcessPoolExecutor, Future[Read]]:
        """``data`` (``n`` profiles) handed to worker ``w`` (started again
        first if it is still ``broken``, or breaks now): the pool, and the
        future, whose profiles count as the worker's in hand until it is done."""
        pool = self._pools[w] if broken is None else self._restarted(w, broken)
        try:
            future = pool.submit(prepare, data, self.limits, now_ns, numbers)
        except BrokenProcessPool:
            pool = self._restarted(w, pool)
            future = pool.submit(prepare, data, self.limits, now_ns, numbers)
        self.router.taken(w, n)
        future.add_done_callback(lambda _: self.router.done(w, n))
        return pool, future

    def _result(self, w: int, data: bytes, numbers: list[int] | None, now_ns: int, n: int,
                pool: ProcessPoolExecutor, future: Future[Read],
                deadline: float | None = None) -> Read:
        """What ``future`` (``data`` handed to worker ``w``'s ``pool``)
        gives, or, if the worker died meanwhile, what ``data`` handed to it
        started again gives; by ``deadline`` (monotonic) if one is given."""
        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return future.result(left())
        except BrokenProcessPool:
            return self._submit(w, data, numbers, now_ns, n, pool)[1].result(left())

    def _restarted(self, w: int, pool: ProcessPoolExecutor) -> ProcessPoolExecutor:
        """Worker ``w``'s pool, started again if it is still ``pool`` (once,
        for every request its death failed)."""
        with self._restart:
            if self._pools[w] is pool:
                log.error("collector: decode worker %d died; starting it again", w)
                pool.shutdown(wait=False, cancel_futures=True)
                self._pools[w] = self._start()
            return self._pools[w]

    def close(self) -> None:
        for pool in self._pools:
            pool.shutdown(wait=False, cancel_futures=True)
