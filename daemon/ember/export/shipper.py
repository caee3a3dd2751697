"""Sends spooled requests to a backend, oldest first, in its own thread: a
slow or absent backend never blocks a drain. The wire decides the protocol:
Parca's WriteRaw (ember's collector) or OTLP ProfilesService/Export.

Failures back off exponentially with full jitter (capped at max_backoff).
A request the collector rejects as invalid (INVALID_ARGUMENT, or too large:
RESOURCE_EXHAUSTED) will never be accepted: it is dropped and counted so it
cannot block the queue. Everything else is retried until it is accepted.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from ..encode import otlp, writeraw
from ..metrics import AgentMetrics
from ..model import Profile
from ..proto import profilestore_pb2 as ps
from ..proto import profilestore_pb2_grpc as ps_grpc
from .spool import Spool

log = logging.getLogger(__name__)

PERMANENT = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}


@dataclass(frozen=True)
class Endpoint:
    address: str
    token: str = ""
    tls_ca: bytes | None = None
    timeout: float = 10.0
    max_message: int = 64 << 20


def _writeraw_stub(channel: Any) -> Any:
    return ps_grpc.ProfileStoreServiceStub(channel)  # type: ignore[no-untyped-call]


def _writeraw(stub: Any, data: bytes, timeout: float, metadata: Any) -> int:
    stub.WriteRaw(ps.WriteRawRequest.FromString(data), timeout=timeout, metadata=metadata)
    return 0


def _otlp_stub(channel: Any) -> Any:
    from opentelemetry.proto.collector.profiles.v1development import (
        profiles_service_pb2_grpc as svc_grpc,
    )

    return svc_grpc.ProfilesServiceStub(channel)  # type: ignore[no-untyped-call]


def _otlp(stub: Any, data: bytes, timeout: float, metadata: Any) -> int:
    from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as svc

    resp = stub.Export(svc.ExportProfilesServiceRequest.FromString(data), timeout=timeout,
                       metadata=metadata)
    rejected = int(resp.partial_success.rejected_profiles)
    if rejected or resp.partial_success.error_message:
        log.warning("OTLP endpoint rejected %d profiles: %s", rejected,
                    resp.partial_success.error_message)
    return rejected


@dataclass(frozen=True)
class Wire:
    """One export protocol: how profiles become requests (at most a size
    each), how many profiles a request holds, how a channel becomes a stub,
    and how a spooled request is sent (returning how many profiles the
    backend rejected)."""

    name: str
    encode: Callable[[Sequence[Profile], int], list[bytes]]
    count: Callable[[bytes], int]
    stub: Callable[[Any], Any]
    send: Callable[[Any, bytes, float, Any], int]


WRITERAW = Wire("writeraw", writeraw.encode_requests, writeraw.profiles_in, _writeraw_stub,
                _writeraw)
OTLP = Wire("otlp", otlp.encode_requests, otlp.profiles_in, _otlp_stub, _otlp)
#: Every wire, by the name ``agent.exporters`` uses.
WIRES = {w.name: w for w in (WRITERAW, OTLP)}


class Shipper:
    def __init__(self, spool: Spool, endpoint: Endpoint, metrics: AgentMetrics,
                 max_backoff: float = 60.0, base_backoff: float = 0.5, wire: Wire = WRITERAW):
        self.spool = spool
        self.wire = wire
        self.metrics = metrics.shipping[wire.name]
        self.max_backoff = max_backoff
        self.base_backoff = base_backoff
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._endpoint = endpoint
        self._channel: Any = None
        self._stub: Any = None
        self._failures = 0
        self._thread: threading.Thread | None = None
        self.sent = 0

    # --- connection ---
    def set_endpoint(self, endpoint: Endpoint) -> None:
        with self._lock:
            if endpoint != self._endpoint:
                self._close_channel()
                self._endpoint = endpoint
                self._failures = 0
        self.spool.wake()

    def _stub_for(self) -> tuple[Any, Endpoint]:
        with self._lock:
            ep = self._endpoint
            if self._stub is None:
                options = [("grpc.max_send_message_length", ep.max_message),
                           ("grpc.max_receive_message_length", ep.max_message)]
                if ep.tls_ca is not None:
                    creds = grpc.ssl_channel_credentials(root_certificates=ep.tls_ca)
                    self._channel = grpc.secure_channel(ep.address, creds, options=options)
                else:
                    self._channel = grpc.insecure_channel(ep.address, options=options)
                self._stub = self.wire.stub(self._channel)
            return self._stub, ep

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    # --- sending ---
    def send_one(self, path: Path, data: bytes) -> bool:
        """Try one request. True when it left the spool (accepted or dropped)."""
        stub, ep = self._stub_for()
        metadata = [("authorization", f"Bearer {ep.token}")] if ep.token else None
        try:
            rejected = self.wire.send(stub, data, ep.timeout, metadata)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            self.metrics.send_failures.labels(code.name.lower()).inc()
            if code in PERMANENT:
                log.error("%s rejected a request for good (%s: %s); dropping it",
                          ep.address, code.name, exc.details() if hasattr(exc, "details") else "")
                self.metrics.spool_dropped.inc(self.wire.count(data))
                self.metrics.spool_dropped_bytes.inc(len(data))
                self.spool.remove(path)
                return True
            self._failures += 1
            if self._failures in (1, 10) or self._failures % 100 == 0:
                log.warning("%s %s: %s (%d failures in a row; spooling)", self.wire.name,
                            ep.address, code.name, self._failures)
            return False
        except ValueError as exc:  # a corrupt spool file
            log.error("dropping unreadable spooled request %s: %s", path.name, exc)
            self.spool.remove(path)
            return True
        self.spool.remove(path)
        self._failures = 0
        n = self.wire.count(data) - rejected
        if rejected:
            self.metrics.spool_dropped.inc(rejected)
        self.sent += n
        self.metrics.profiles_sent.inc(n)
        self.metrics.bytes_sent.inc(len(data))
        return True

    def backoff(self) -> float:
        cap = min(self.max_backoff, self.base_backoff * 2 ** min(self._failures, 30))
        return random.uniform(cap / 2, cap)

    def run(self) -> None:
        while not self._stop.is_set():
            item = self.spool.oldest(timeout=1.0)
            if item is None:
                continue
            if not self.send_one(*item):
                self._stop.wait(self.backoff())

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"ember-ship-{self.wire.name}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.spool.wake()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def flush(self, deadline: float) -> int:
        """After stop(): send what is spooled until time.monotonic() passes
        deadline; returns how many requests are left in the spool."""
        while time.monotonic() < deadline:
            item = self.spool.oldest()
            if item is None:
                break
            if not self.send_one(*item):
                break
        with self._lock:
            self._close_channel()
        return self.spool.stats()[0]
