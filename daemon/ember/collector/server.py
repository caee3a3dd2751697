"""``ember collector``: receives WriteRaw over gRPC, stores profiles (store.py),
answers queries over HTTP (the routes are in api.py; here: /healthz,
/metrics, the web UI, and the lifecycle of both servers and of retention).

With a token configured, gRPC calls and API requests need
``authorization: Bearer TOKEN``; without one, listening beyond loopback is
refused unless explicitly allowed. The web UI's static files hold no secret
and are served to anyone: the page asks a person for the token and sends it
with each API request (collector/web/app.js). /healthz and /metrics stay
open too: Prometheus and probes send no token, and the metrics are the
collector's own counters, not profile data. With tls_cert/tls_key, both
servers speak TLS.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hmac
import ipaddress
import logging
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .. import cache
from ..config import CollectorConfig, read_token
from ..errors import ConfigError, StorageError
from ..httpserve import Reply, Server, serve
from ..metrics import CollectorMetrics
from ..proto import profilestore_pb2 as ps
from ..proto import profilestore_pb2_grpc as ps_grpc
from . import arena, index_file, web
from .api import Api, error
from .intern import Rows
from .store import Store
from .validate import InvalidRequest, Limits, check_request
from .workers import Workers

log = logging.getLogger(__name__)

#: The metadata key of the retry hint (seconds) sent with a refusal to store.
RETRY_AFTER = "retry-after"
#: How long agents are told to wait when the store refuses writes.
STORAGE_RETRY_AFTER = 15
#: Between two blocks rolled up, and between looks for closed blocks (rollup.py).
SEAL_PAUSE_S, SEAL_EVERY_S = 1.0, 30.0
#: After a move of rows (cluster.py), the seal loop rests this many times as
#: long as the move took: the moves take a fifth of the time at most, and
#: the writes beside them the rest.
CLUSTER_REST = 4.0
#: How long the start waits for the decode workers to have imported what
#: they run before taking writes (about half a second here).
WORKERS_READY_S = 60.0
#: Threads serving WriteRaw calls (at most max_concurrent_writes). A call
#: holds its thread while a worker reads it and while it waits for the
#: group commit (about 100 ms at a fleet's 100 a second), so the calls a
#: second it can serve are these threads over that wait: with 8, calls
#: queued in gRPC and were refused at 64 waiting while the two cores
#: were 70% busy.
WRITE_THREADS = 32
#: HTTP/2 flow-control window of each call's stream before a thread reads
#: it, with the transport's own estimate of the link (BDP probing) off: a
#: call waiting for a thread then holds at most this much of its request.
#: With probing on, gRPC let each waiting call send it all: 40 calls of
#: 8 MB waiting behind two threads took 379 MB, against 89 MB with a
#: 256 KB window. A thread reading a call asks for the whole message at
#: once, so a larger one costs one more round trip, not one a window.
WAITING_WINDOW = 256 << 10


def _loopback(hostport: str) -> bool:
    host = hostport.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _LoadRefusals(grpc.ServerInterceptor):  # type: ignore[misc]
    """Counts the calls gRPC refuses past ``max_concurrent_writes``
    (``ember_collector_requests_total{code="resource_exhausted"}``), which
    it answers before any of the collector's code runs. gRPC runs
    interceptors under its server's lock, right after comparing its count
    of calls in hand with the limit, so the same comparison here gives the
    same answer. That count is gRPC's own state (``watch``, once the server
    exists): where a version lacks it, nothing is counted and the start
    says so."""

    def __init__(self, refused: Callable[[], None]) -> None:
        self.state: Any = None
        self._refused = refused

    def watch(self, server: grpc.Server) -> bool:
        """Read the calls in hand from ``server``'s private state; False
        (nothing counted) where this gRPC does not keep them there."""
        state = getattr(server, "_state", None)
        if isinstance(getattr(state, "active_rpc_count", None), int) and isinstance(
                getattr(state, "maximum_concurrent_rpcs", None), int):
            self.state = state
            return True
        return False

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        st = self.state
        if st is not None and st.active_rpc_count >= st.maximum_concurrent_rpcs:
            self._refused()
        return continuation(details)


def _bind_problem(hostport: str) -> str:
    """Why a host:port cannot be listened on, asked of the OS directly (gRPC
    says only that it failed): "Address already in use", ..."""
    host, _, port = hostport.rpartition(":")
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind(addr)
    except (OSError, ValueError, IndexError) as exc:
        return str(getattr(exc, "strerror", None) or exc)
    return "gRPC could not bind it"


class _Servicer(ps_grpc.ProfileStoreServiceServicer):
    def __init__(self, collector: Collector):
        self.c = collector
        # One request read at a time in this process: reading is Python and
        # numpy under one GIL, so two at once only take turns at each numpy
        # call and push each other's arrays out of the cache. Its store write
        # (DuckDB, without the GIL) goes on beside the next read: 30 -> 34-37
        # profiles a second on bench/ingest_fleet.py.
        self._reading = threading.Lock()

    def WriteRaw(self, request: ps.WriteRawRequest, context: Any) -> ps.WriteRawResponse:
        c = self.c
        if not c.authorized(dict(context.invocation_metadata()).get("authorization", "")):
            c.metrics.requests.labels("unauthenticated").inc()
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        made: list[tuple[str, Rows]] = []
        try:
            repairs: Counter[str] = Counter()
            if c.workers is not None:
                prepared, repairs = c.workers.prepare(request, time.time_ns())
                profiles = [x.profile for x in prepared]
                made = [(x.shape, x.rows) for x in prepared]
            else:
                with self._reading:
                    profiles = check_request(request, c.limits, time.time_ns(), repairs)
        except InvalidRequest as exc:
            c.metrics.requests.labels("invalid_argument").inc()
            c.metrics.rejected.labels("invalid").inc()
            log.info("rejected WriteRaw: %s", exc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            c.store.make_room(c.cfg.max_storage_size, sum(len(p.data) for p in profiles))
            stored, dup = c.store.write(profiles, made)
        except StorageError as exc:
            # retryable: the agent keeps the request spooled and comes back
            c.metrics.requests.labels("unavailable").inc()
            c.metrics.rejected.labels(exc.label).inc()
            c.storage_refused(exc)
            context.set_trailing_metadata(((RETRY_AFTER, str(STORAGE_RETRY_AFTER)),))
            context.abort(grpc.StatusCode.UNAVAILABLE, f"collector cannot store now: {exc}")
        except Exception as exc:
            log.exception("store failed")
            c.metrics.requests.labels("internal").inc()
            context.abort(grpc.StatusCode.INTERNAL, f"store failed: {exc}")
        for kind, n in repairs.items():
            c.metrics.repaired.labels(kind).inc(n)
        c.metrics.profiles.inc(stored)
        c.metrics.duplicates.inc(dup)
        c.metrics.requests.labels("ok").inc()
        return ps.WriteRawResponse()


class Collector:
    def __init__(self, cfg: CollectorConfig, registry: CollectorRegistry | None = None,
                 allow_public: bool = False):
        self.cfg = cfg
        self.token = read_token(cfg.token_file)
        if cfg.token_file and not self.token:
            raise ConfigError(f"{cfg.token_file}: the token file is empty")
        if not self.token and not allow_public:
            for what, addr in (("grpc_listen", cfg.grpc_listen), ("http_listen", cfg.http_listen)):
                if not _loopback(addr):
                    raise ConfigError(
                        f"collector.{what} {addr} is not loopback and no token_file is set: "
                        "anyone could write profiles; set a token (or --allow-public)")
        if bool(cfg.tls_cert) != bool(cfg.tls_key):
            raise ConfigError("collector: tls_cert and tls_key go together")
        self.registry = registry or CollectorRegistry()
        self.metrics = CollectorMetrics(self.registry)
        self._evicted: dict[str, int] = {}   # per query API cache, as last reported
        self.limits = Limits(max_profile_size=cfg.max_profile_size)
        self.workers = Workers(cfg.decode_workers, self.limits) if cfg.decode_workers else None
        self.store = Store(cfg.storage)
        self.metrics.storage_bytes.set_function(self.store.size_bytes)
        self._refused_at, self._refused_why = -1e9, ""
        self.api = Api(self.store,
                       on_skip=lambda why, n: self.metrics.rows_skipped.labels(why).inc(n))
        self.api.windows.on_tree = lambda how: self.metrics.trees.labels(how).inc()
        self._grpc: Any = None
        self._http: Server | None = None
        self._stop = threading.Event()
        self._closed = False
        self._index_path = index_file.path_for(cfg.storage)
        self._index_saved = 0  # nodes in the index file
        # set once the start's index build (and its full collection) is over
        self.warmed = threading.Event()

    def authorized(self, header: str) -> bool:
        if not self.token:
            return True
        return hmac.compare_digest(header.encode(), f"Bearer {self.token}".encode())

    # --- lifecycle ---
    def start(self) -> None:
        cfg = self.cfg
        try:
            self.retention_once()
        except StorageError as exc:  # a full disk: serve queries, refuse writes
            log.error("retention at start: %s", exc)
        if self.workers is not None and not self.workers.ready(WORKERS_READY_S):
            log.warning("collector: decode workers not ready after %.0f s; serving anyway",
                        WORKERS_READY_S)
        options = [("grpc.max_receive_message_length", cfg.max_request_size),
                   ("grpc.max_send_message_length", 1 << 20)]
        # no SO_REUSEPORT: a second collector on the port must fail, not
        # silently take half the writes
        options.append(("grpc.so_reuseport", 0))
        options += [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", WAITING_WINDOW)]
        threads = min(WRITE_THREADS, cfg.max_concurrent_writes)
        refusals = _LoadRefusals(self.metrics.requests.labels("resource_exhausted").inc)
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=threads,
                                                            thread_name_prefix="ember-grpc"),
                                 interceptors=[refusals], options=options,
                                 maximum_concurrent_rpcs=cfg.max_concurrent_writes)
        if not refusals.watch(self._grpc):
            log.warning("collector: this gRPC does not show its calls in hand; writes refused "
                        "for load are not counted here (agents count them)")
        ps_grpc.add_ProfileStoreServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _Servicer(self), self._grpc)
        try:
            if cfg.tls_cert:
                creds = grpc.ssl_server_credentials([(Path(cfg.tls_key).read_bytes(),
                                                      Path(cfg.tls_cert).read_bytes())])
                port = self._grpc.add_secure_port(cfg.grpc_listen, creds)
            else:
                port = self._grpc.add_insecure_port(cfg.grpc_listen)
        except RuntimeError:
            port = 0
        if not port:
            raise ConfigError(f"collector.grpc_listen {cfg.grpc_listen}: cannot listen: "
                              f"{_bind_problem(cfg.grpc_listen)}")
        self.grpc_port = int(port)
        self._grpc.start()
        self._serve_http()
        assert self._http is not None
        self.http_port = int(self._http.server_address[1])
        threading.Thread(target=self._retention_loop, name="ember-retention",
                         daemon=True).start()
        threading.Thread(target=self._seal_loop, name="ember-seal", daemon=True).start()
        threading.Thread(target=self._warm_index, name="ember-index", daemon=True).start()
        log.info("collector: gRPC on %s, HTTP on %s, storage %s", cfg.grpc_listen,
                 cfg.http_listen, cfg.storage)

    def _warm_index(self) -> None:
        """The query index over every stored stack, built now rather than
        by the first query (seconds for a fleet's hour); queries arriving
        meanwhile wait for it, writes do not. From the one saved beside the
        store when there is one (index_file.py): only what it lacks is added."""
        try:
            self._build_index()
        finally:
            self.warmed.set()

    def _build_index(self) -> None:
        began = time.monotonic()
        index, path = self.api.index, self._index_path
        loaded = self._index_saved = index_file.load(index, path) if path is not None else 0
        try:
            n = index.warm()
        except StorageError as exc:   # the first query builds what it needs
            log.warning("collector: query index not built ahead: %s", exc)
            return
        self._save_index()
        frozen = _freeze_objects()
        _trim_heap()
        log.info("collector: query index of %d stacks built in %.1f s (%d nodes loaded from %s; "
                 "%d objects kept out of full collections)",
                 n, time.monotonic() - began, loaded, path, frozen)

    def _save_index(self) -> None:
        """Write the index beside the store, unless the file already holds it."""
        path = self._index_path
        if path is None or len(self.api.index) == self._index_saved:
            return
        try:
            self._index_saved = index_file.save(self.api.index, path)
        except OSError as exc:  # a full disk: the next start builds it again
            log.warning("collector: query index not saved to %s: %s", path, exc)

    def storage_refused(self, exc: StorageError) -> None:
        """A write the store refused: logged at the first of a run, shown by
        /healthz for a minute."""
        now = time.monotonic()
        if now - self._refused_at > 60:
            log.error("refusing writes (agents keep them spooled and retry): %s", exc)
        self._refused_at, self._refused_why = now, str(exc)

    def health(self) -> str:
        """'' when healthy, else why not."""
        if time.monotonic() - self._refused_at < 60:
            return f"storage refuses writes: {self._refused_why}"
        return ""

    def retention_once(self) -> None:
        by_age, by_size = self.store.enforce_retention(self.cfg.retention,
                                                       self.cfg.max_storage_size)
        self.metrics.deleted.labels("age").inc(by_age)
        self.metrics.deleted.labels("size").inc(by_size)

    def _retention_loop(self) -> None:
        while not self._stop.wait(60):
            try:
                self.retention_once()
            except Exception:
                log.exception("retention failed")

    def _seal_loop(self) -> None:
        """Roll up closed blocks (store.seal), one at a time with a pause
        between (each holds the store's lock: writes wait), then group the
        sealed blocks' rows by series (store.cluster, beside the writes) a
        move at a time, resting ``CLUSTER_REST`` times as long after each;
        look again every SEAL_EVERY_S once nothing is left to do. Not
        before the query index is built: the two's working sets together
        made the start's peak RSS."""
        while not self.warmed.wait(SEAL_PAUSE_S):
            if self._stop.is_set():
                return
        rest = SEAL_PAUSE_S
        while not self._stop.wait(rest):
            rest = SEAL_PAUSE_S
            try:
                if self.store.seal(time.time_ns()):
                    self.metrics.sealed.inc()
                    continue
                began = time.monotonic()
                moved = self.store.cluster()
                if moved is not None:
                    self.metrics.clustered.inc(moved)
                    rest = max(rest, CLUSTER_REST * (time.monotonic() - began))
                    continue
            except StorageError as exc:   # a full disk, a conflict: tried again later
                log.warning("collector: cannot roll up or cluster a block now: %s", exc)
            except Exception:
                log.exception("sealing failed")
            if self._stop.wait(SEAL_EVERY_S):
                return

    def wait(self, stop: threading.Event) -> None:
        stop.wait()
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._grpc is not None:
            self._grpc.stop(grace=2).wait()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self.workers is not None:
            self.workers.close()
        self._save_index()
        self.store.close()

    # --- HTTP ---
    def handle(self, path: str, query: dict[str, list[str]], auth: str) -> Reply:
        """(status, body, content type) of one GET: health, metrics and the
        web UI's files for anyone (the page signs in itself), the API only
        with the token."""
        if path == "/healthz":
            problem = self.health()
            if problem:
                return 503, f"{problem}\n".encode(), "text/plain"
            return 200, b"ok\n", "text/plain"
        if path == "/metrics":
            self._report_caches()
            return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST
        if path == "/" or path.startswith(("/ui/", "/vendor/")):
            return web.asset(path)
        if not self.authorized(auth):
            return error(401, "missing or wrong bearer token")
        return self.api.handle(path, query)

    def _report_caches(self) -> None:
        """The query API caches' bytes and evictions (and the freed arrays
        kept: arena.py), and the interned tables' rows, into the metrics."""
        st = self.store
        for table, n in (("threads", len(st.interner.threads)), ("series", st.series_count()),
                         ("stacks", len(st.interner.stacks)), ("frames", len(st.interner.frames)),
                         ("leaves", len(st.leaves))):
            self.metrics.interned.labels(table).set(n)
        for name, (size, evicted) in cache.sizes().items():
            if name.startswith("collector_"):
                self.metrics.cache_bytes.labels(name).set(size)
                self.metrics.cache_evictions.labels(name).inc(
                    max(0, evicted - self._evicted.get(name, 0)))
                self._evicted[name] = evicted
        # (freed large arrays kept for the next query: bounded, not a cache of values)
        self.metrics.cache_bytes.labels("collector_arrays").set(arena.stats().kept_bytes)

    def _serve_http(self) -> None:
        tls = None
        if self.cfg.tls_cert:
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(self.cfg.tls_cert, self.cfg.tls_key)
        self._http = serve(self.cfg.http_listen, self.handle, "collector.http_listen", tls,
                           on_reply=lambda code: self.metrics.queries.labels(str(code)).inc())


#: glibc's mallopt parameters: the most heaps (arenas) threads get, the
#: size from which an allocation is mapped on its own (and unmapped when
#: freed), and the free memory at a heap's top it keeps rather than return
M_ARENA_MAX, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD = -8, -3, -1
#: Arrays the size of a fleet hour's index (800,000 nodes: 3-6 MB) and up
MMAP_FROM = 4 << 20
#: What a heap keeps free at its top: more than one host's answer frees
#: there (DuckDB's batches, the arrays below MMAP_FROM)
KEEP_FREE = 16 << 20


def few_heaps() -> None:
    """At most two malloc heaps, and arrays of MMAP_FROM bytes and more
    mapped on their own, set before the collector's threads start.

    glibc gives threads heaps of their own (up to eight per core), and each
    keeps the large arrays its merges freed: on the fleet hour with 8
    clients, peak RSS 836 MB with the default, 674 MB with two; p99 90 vs
    95 ms (bench/store_engine.py). glibc also raises its mmap threshold to
    the size of each mapped block freed, so the views' index-sized arrays
    soon came from the heap and left it fragmented: fixed at 4 MB, peak RSS
    551 -> 471 MB (p99 310-332 -> 266-379 ms, within this machine's drift).
    A fixed threshold of glibc's 128 KB default had cost p99 201 ms where
    95 were measured before, when views were made together.

    A fixed mmap threshold also fixes the trim threshold, at 128 KB (glibc
    moves it with the other, to twice it): each answer's memory from the
    heaps went back to the system when freed and was faulted in again by
    the next, 1,100-2,200 page faults an answer of one host's hour. Keeping
    ``KEEP_FREE`` at each heap's top: 380-580, and the answer 44.8-46.4 ms
    in-process against 49.3-52.1."""
    with contextlib.suppress(OSError, AttributeError):   # not glibc
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_ARENA_MAX, 2)
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_FROM)
        libc.mallopt(M_TRIM_THRESHOLD, KEEP_FREE)


def _freeze_objects() -> int:
    """What the start built and keeps (the interned frames and stacks,
    the index's names: 88,600 objects for a fleet hour) moved out of
    Python's full collections, which walked every one of them, holding the
    GIL, at about 500 ns an object: 44-47 ms each in-process, and 45-91 ms
    in a bench run (30 of them, most in the write thread, one in a
    query's); a fleet's million frames would make each take seconds.
    Collected first, so what is frozen is what is alive; each is still
    freed when nothing refers to it. How many were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _trim_heap() -> None:
    """Give back to the system the heap the index build freed (glibc keeps
    it otherwise: 90 MB of RSS after a fleet hour's build)."""
    with contextlib.suppress(OSError, AttributeError):   # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)
