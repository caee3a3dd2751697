"""``ember collector``: receives WriteRaw over gRPC, stores profiles in SQLite,
answers queries over HTTP.

HTTP API (JSON errors as {"error": ...}):
  GET /api/v1/profile?type=cpu|offcpu|TYPE&since=1h|from=NS&to=NS&match=k=v...
                     &format=folded|pprof|json
  GET /api/v1/labels                 label names
  GET /api/v1/labels/NAME/values     values of one label
  GET /api/v1/types                  stored profile types
  GET /healthz, /metrics

With a token configured, gRPC calls and API requests need
``authorization: Bearer TOKEN``; without one, listening beyond loopback is
refused unless explicitly allowed.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import ssl
import threading
import time
from collections import Counter
from concurrent import futures
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..config import CollectorConfig, parse_duration, read_token
from ..errors import ConfigError
from ..flamegraph import graphs as flame
from ..flamegraph.inputs import Stacks, stacks_of
from ..httpserve import Reply, serve
from ..metrics import CollectorMetrics
from ..proto import profilestore_pb2 as ps
from ..proto import profilestore_pb2_grpc as ps_grpc
from . import web
from .query import FORMATS, TYPE_ALIASES, Merged, merge, render
from .store import Store
from .validate import InvalidRequest, Limits, check_request

log = logging.getLogger(__name__)


def _loopback(hostport: str) -> bool:
    host = hostport.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Servicer(ps_grpc.ProfileStoreServiceServicer):
    def __init__(self, collector: Collector):
        self.c = collector

    def WriteRaw(self, request: ps.WriteRawRequest, context: Any) -> ps.WriteRawResponse:
        c = self.c
        if not c.authorized(dict(context.invocation_metadata()).get("authorization", "")):
            c.metrics.requests.labels("unauthenticated").inc()
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        try:
            profiles = check_request(request, c.limits, time.time_ns())
        except InvalidRequest as exc:
            c.metrics.requests.labels("invalid_argument").inc()
            c.metrics.rejected.labels("invalid").inc()
            log.info("rejected WriteRaw: %s", exc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            stored, dup = c.store.write(profiles)
        except Exception as exc:
            log.exception("store failed")
            c.metrics.requests.labels("internal").inc()
            context.abort(grpc.StatusCode.INTERNAL, f"store failed: {exc}")
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
        self.limits = Limits(max_profile_size=cfg.max_profile_size)
        self.store = Store(cfg.storage)
        self._grpc: Any = None
        self._http: ThreadingHTTPServer | None = None
        self._stop = threading.Event()
        self._closed = False

    def authorized(self, header: str) -> bool:
        if not self.token:
            return True
        return hmac.compare_digest(header.encode(), f"Bearer {self.token}".encode())

    # --- lifecycle ---
    def start(self) -> None:
        cfg = self.cfg
        self.retention_once()
        options = [("grpc.max_receive_message_length", cfg.max_request_size),
                   ("grpc.max_send_message_length", 1 << 20)]
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=8,
                                                            thread_name_prefix="ember-grpc"),
                                 options=options, maximum_concurrent_rpcs=64)
        ps_grpc.add_ProfileStoreServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _Servicer(self), self._grpc)
        if cfg.tls_cert:
            creds = grpc.ssl_server_credentials([(Path(cfg.tls_key).read_bytes(),
                                                  Path(cfg.tls_cert).read_bytes())])
            port = self._grpc.add_secure_port(cfg.grpc_listen, creds)
        else:
            port = self._grpc.add_insecure_port(cfg.grpc_listen)
        if not port:
            raise ConfigError(f"collector.grpc_listen {cfg.grpc_listen}: cannot listen")
        self.grpc_port = int(port)
        self._grpc.start()
        self._serve_http()
        assert self._http is not None
        self.http_port = int(self._http.server_address[1])
        threading.Thread(target=self._retention_loop, name="ember-retention",
                         daemon=True).start()
        log.info("collector: gRPC on %s, HTTP on %s, storage %s", cfg.grpc_listen,
                 cfg.http_listen, cfg.storage)

    def retention_once(self) -> None:
        by_age, by_size = self.store.enforce_retention(self.cfg.retention,
                                                       self.cfg.max_storage_size)
        self.metrics.deleted.labels("age").inc(by_age)
        self.metrics.deleted.labels("size").inc(by_size)
        self.metrics.storage_bytes.set(self.store.size_bytes())

    def _retention_loop(self) -> None:
        while not self._stop.wait(60):
            try:
                self.retention_once()
            except Exception:
                log.exception("retention failed")

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
        self.store.close()

    # --- HTTP API ---
    def handle(self, path: str, query: dict[str, list[str]], auth: str) -> Reply:
        def error(code: int, msg: str) -> Reply:
            return code, json.dumps({"error": msg}).encode(), "application/json"

        def ok(obj: Any) -> Reply:
            return 200, json.dumps(obj).encode(), "application/json"

        if path == "/healthz":
            return 200, b"ok\n", "text/plain"
        if path == "/metrics":
            return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST
        if not self.authorized(auth):
            return error(401, "missing or wrong bearer token")
        if path == "/api/v1/labels":
            return ok({"labels": self.store.label_names()})
        if path.startswith("/api/v1/labels/") and path.endswith("/values"):
            name = unquote(path[len("/api/v1/labels/"):-len("/values")])
            return ok({"label": name, "values": self.store.label_values(name)})
        if path == "/api/v1/types":
            return ok({"types": self.store.types(), "aliases": TYPE_ALIASES})
        routes = {"/api/v1/profile": self._profile, "/api/v1/flamegraph": self._flamegraph,
                  "/api/v1/diff": self._diff, "/api/v1/top": self._top,
                  "/api/v1/timeline": self._timeline}
        if path in routes:
            try:
                return routes[path](query)
            except ValueError as exc:
                return error(400, str(exc))
            except LookupError as exc:
                return error(404, str(exc))
        if path == "/" or path.startswith("/ui/"):
            return web.asset(path)
        return error(404, f"no such endpoint: {path}")

    # --- query helpers ---
    def _select(self, q: dict[str, list[str]], prefix: str = ""
                ) -> tuple[int, int, dict[str, str]]:
        """(start_ns, end_ns, matchers) from since / from+to and match params
        (prefix "a_" / "b_" for the two sides of a diff)."""
        def get(name: str, default: str | None = None) -> str | None:
            v = q.get(prefix + name) or ([default] if default is not None else None)
            return v[-1] if v else None

        now = time.time_ns()
        if get("from") is not None or get("to") is not None:
            try:
                start = int(get("from", "0") or 0)
                end = int(get("to", str(now)) or now)
            except ValueError:
                raise ValueError("from and to are Unix times in nanoseconds") from None
        else:
            start = now - int(parse_duration(get("since", "1h") or "1h") * 1e9)
            end = now
        if end <= start:
            raise ValueError("the time range is empty")
        matchers = {}
        for m in q.get(prefix + "match", []):
            if not m:
                continue
            name, sep, value = m.partition("=")
            if not sep or not name:
                raise ValueError(f"match must be LABEL=VALUE, not {m!r}")
            matchers[name] = value
        return start, end, matchers

    def _merged(self, q: dict[str, list[str]], type_: str, prefix: str = "") -> Merged:
        start, end, matchers = self._select(q, prefix)
        merged = merge(self.store.query(start, end, matchers, TYPE_ALIASES.get(type_, type_)),
                       start, end)
        if merged is None:
            raise LookupError("no profiles match")
        return merged

    def _stacks(self, q: dict[str, list[str]], type_: str, prefix: str = "") -> Stacks:
        p = self._merged(q, type_, prefix).profile
        return stacks_of(p.type, p.samples)

    def _profile(self, q: dict[str, list[str]]) -> Reply:
        fmt = q.get("format", ["folded"])[-1]
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}")
        body, ctype = render(self._merged(q, q.get("type", ["cpu"])[-1]), fmt)
        return 200, body, ctype

    @staticmethod
    def _width(q: dict[str, list[str]]) -> int:
        try:
            return max(300, min(8000, int(q.get("width", ["1200"])[-1])))
        except ValueError:
            raise ValueError("width must be a number of pixels") from None

    def _flamegraph(self, q: dict[str, list[str]]) -> Reply:
        type_ = q.get("type", ["cpu"])[-1]
        title = q.get("title", [""])[-1] or None
        width = self._width(q)
        if type_ == "hotcold":
            text = flame.hotcold_graph(self._stacks(q, "cpu"), self._stacks(q, "offcpu"), title,
                                       width=width)
        else:
            text = flame.graph(self._stacks(q, type_), title, width=width)
        return 200, text.encode(), "image/svg+xml"

    def _diff(self, q: dict[str, list[str]]) -> Reply:
        type_ = q.get("type", ["cpu"])[-1]
        sides: list[Stacks | None] = []
        for prefix in ("a_", "b_"):
            try:
                sides.append(self._stacks(q, type_, prefix))
            except LookupError:
                sides.append(None)  # no data on one side: everything on the other is new
        if sides[0] is None and sides[1] is None:
            raise LookupError("no profiles match either side")
        some = next(s for s in sides if s is not None)
        before, after = (s if s is not None else Stacks(Counter(), some.unit, {}) for s in sides)
        normalize = q.get("normalize", ["1"])[-1] not in ("0", "false", "")
        text, _ = flame.diff_graph(before, after, normalize=normalize, strip=True,
                                   title=q.get("title", [""])[-1] or None, width=self._width(q))
        return 200, text.encode(), "image/svg+xml"

    def _top(self, q: dict[str, list[str]]) -> Reply:
        s = self._stacks(q, q.get("type", ["cpu"])[-1])
        rows = flame.top_functions(s, limit=int(q.get("limit", ["50"])[-1]))
        body = {"unit": s.unit, "total": s.total, "rows": rows}
        return 200, json.dumps(body).encode(), "application/json"

    def _timeline(self, q: dict[str, list[str]]) -> Reply:
        start, end, matchers = self._select(q)
        type_ = q.get("type", ["cpu"])[-1]
        n = max(1, min(500, int(q.get("buckets", ["60"])[-1])))
        width = (end - start) / n
        buckets = [0] * n
        for row in self.store.query(start, end, matchers, TYPE_ALIASES.get(type_, type_)):
            i = int((row.time_ns - start) / width)
            buckets[min(n - 1, max(0, i))] += row.samples
        body = {"start": start, "end": end, "bucket_ns": width, "values": buckets}
        return 200, json.dumps(body).encode(), "application/json"

    def _serve_http(self) -> None:
        tls = None
        if self.cfg.tls_cert:
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(self.cfg.tls_cert, self.cfg.tls_key)
        self._http = serve(self.cfg.http_listen, self.handle, "collector.http_listen", tls,
                           on_reply=lambda code: self.metrics.queries.labels(str(code)).inc())
