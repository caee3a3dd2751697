"""``ember collector``: receives WriteRaw over gRPC, stores profiles in SQLite,
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

import hmac
import ipaddress
import logging
import ssl
import threading
import time
from concurrent import futures
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..config import CollectorConfig, read_token
from ..errors import ConfigError
from ..httpserve import Reply, serve
from ..metrics import CollectorMetrics
from ..proto import profilestore_pb2 as ps
from ..proto import profilestore_pb2_grpc as ps_grpc
from . import web
from .api import Api, error
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
        self.api = Api(self.store)
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

    # --- HTTP ---
    def handle(self, path: str, query: dict[str, list[str]], auth: str) -> Reply:
        """(status, body, content type) of one GET: health, metrics and the
        web UI's files for anyone (the page signs in itself), the API only
        with the token."""
        if path == "/healthz":
            return 200, b"ok\n", "text/plain"
        if path == "/metrics":
            return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST
        if path == "/" or path.startswith("/ui/"):
            return web.asset(path)
        if not self.authorized(auth):
            return error(401, "missing or wrong bearer token")
        return self.api.handle(path, query)

    def _serve_http(self) -> None:
        tls = None
        if self.cfg.tls_cert:
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(self.cfg.tls_cert, self.cfg.tls_key)
        self._http = serve(self.cfg.http_listen, self.handle, "collector.http_listen", tls,
                           on_reply=lambda code: self.metrics.queries.labels(str(code)).inc())
