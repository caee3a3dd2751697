"""Sends spooled requests to a backend, oldest first, in its own thread: a
slow or absent backend never blocks a drain. The wire decides the protocol:
Parca's WriteRaw (ember's collector), OTLP ProfilesService/Export, or
Grafana Pyroscope's PusherService/Push.

Retry by meaning (docs/reliability.md): a failure is retried with jittered
exponential backoff (at least as long as the server's ``retry-after`` hint)
unless the server says it will never accept the request. Overload is no
such answer: ``RESOURCE_EXHAUSTED`` from a concurrency limit, a full store,
``UNAVAILABLE`` and deadlines are all retried. What is dropped (and
counted): a request refused as invalid (``INVALID_ARGUMENT``), and a request
too large for the server that holds a single profile; one with several is
split in two in its place in the queue first. An entry that cannot be read
or decoded is quarantined by the spool. Nothing ends the thread: an
unexpected error is logged, counted and retried after a backoff.

A fresh request waits a random moment (up to ``jitter`` seconds) before it
is sent, so a fleet whose drains line up does not hit its collector at once.
"""

from __future__ import annotations

import base64
import enum
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from ..encode import otlp, pyroscope, writeraw
from ..metrics import AgentMetrics
from ..model import Profile
from ..proto import profilestore_pb2 as ps
from ..proto import profilestore_pb2_grpc as ps_grpc
from ..proto import pyroscope_push_pb2 as push
from ..proto import pyroscope_push_pb2_grpc as push_grpc
from .spool import Entry, Spool

log = logging.getLogger(__name__)

#: The metadata key of a server's hint, in seconds, of when to come back.
RETRY_AFTER = "retry-after"
#: What gRPC (and ember's collector) say of a message over the receive limit.
_TOO_LARGE = ("larger than max", "too large")


class Verdict(enum.Enum):
    RETRY = "retry"   # keep it; send again after a backoff
    SPLIT = "split"   # too large: send its halves instead
    DROP = "drop"     # the server will never accept it


def verdict(code: grpc.StatusCode, details: str) -> Verdict:
    """What a failed send means for its request: only a refusal of the
    request itself drops it; overload and outages are retried."""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return Verdict.DROP
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and any(
            t in details.lower() for t in _TOO_LARGE):
        return Verdict.SPLIT
    return Verdict.RETRY


def retry_hint(exc: grpc.RpcError) -> float:
    """The server's ``retry-after`` (seconds; 0 without one)."""
    try:
        for key, value in exc.trailing_metadata() or ():
            if key == RETRY_AFTER:
                return max(0.0, min(3600.0, float(value)))
    except (AttributeError, TypeError, ValueError):
        pass
    return 0.0


@dataclass(frozen=True)
class Endpoint:
    address: str
    token: str = ""
    tls_ca: bytes | None = None
    timeout: float = 10.0
    max_message: int = 64 << 20
    #: with a username, the token is the password of HTTP basic auth, not a bearer token
    username: str = ""
    #: the tenant of a multi-tenant backend (X-Scope-OrgID); '' for none
    tenant: str = ""

    def metadata(self) -> list[tuple[str, str]] | None:
        """The call's gRPC metadata: credentials and tenant, if any."""
        out = []
        if self.username:
            pair = base64.b64encode(f"{self.username}:{self.token}".encode()).decode()
            out.append(("authorization", f"Basic {pair}"))
        elif self.token:
            out.append(("authorization", f"Bearer {self.token}"))
        if self.tenant:
            out.append(("x-scope-orgid", self.tenant))
        return out or None


def _writeraw_stub(channel: Any) -> Any:
    return ps_grpc.ProfileStoreServiceStub(channel)  # type: ignore[no-untyped-call]


def _writeraw(stub: Any, data: bytes, timeout: float, metadata: Any) -> int:
    stub.WriteRaw(ps.WriteRawRequest.FromString(data), timeout=timeout, metadata=metadata)
    return 0


def _writeraw_split(data: bytes) -> list[bytes]:
    """A WriteRaw request as two holding its profiles between them (one
    request back when it holds a single profile)."""
    req = ps.WriteRawRequest.FromString(data)
    flat = [(s.labels, p) for s in req.series for p in s.samples]
    if len(flat) < 2:
        return [data]
    halves = []
    for part in (flat[:len(flat) // 2], flat[len(flat) // 2:]):
        out = ps.WriteRawRequest(normalized=req.normalized)
        for labels, sample in part:
            series = out.series.add()
            series.labels.CopyFrom(labels)
            series.samples.append(sample)
        halves.append(out.SerializeToString())
    return halves


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


def _pyroscope_stub(channel: Any) -> Any:
    return push_grpc.PusherServiceStub(channel)  # type: ignore[no-untyped-call]


def _pyroscope(stub: Any, data: bytes, timeout: float, metadata: Any) -> int:
    stub.Push(push.PushRequest.FromString(data), timeout=timeout, metadata=metadata)
    return 0


def _cannot_split(data: bytes) -> list[bytes]:
    return [data]


@dataclass(frozen=True)
class Wire:
    """One export protocol: how profiles become requests (at most a size
    each), how many profiles a request holds, how a channel becomes a stub,
    how a spooled request is sent (returning how many profiles the backend
    rejected), how a request too large for the backend is split, and the
    prefix of its ``agent`` keys (``PREFIXendpoint``, ``PREFIXtoken_file``,
    ``PREFIXtls_ca``, ...; WriteRaw's are ``collector``, ``token_file``,
    ``tls_ca``)."""

    name: str
    encode: Callable[[Sequence[Profile], int], list[bytes]]
    count: Callable[[bytes], int]
    stub: Callable[[Any], Any]
    send: Callable[[Any, bytes, float, Any], int]
    # OTLP requests share one dictionary across their profiles: they are
    # already halved at encoding while too large, and not split again
    split: Callable[[bytes], list[bytes]] = _cannot_split
    config_prefix: str = ""


WRITERAW = Wire("writeraw", writeraw.encode_requests, writeraw.profiles_in, _writeraw_stub,
                _writeraw, _writeraw_split)
OTLP = Wire("otlp", otlp.encode_requests, otlp.profiles_in, _otlp_stub, _otlp,
            config_prefix="otlp_")
PYROSCOPE = Wire("pyroscope", pyroscope.encode_requests, pyroscope.profiles_in, _pyroscope_stub,
                 _pyroscope, pyroscope.split, config_prefix="pyroscope_")
#: Every wire, by the name ``agent.exporters`` uses.
WIRES = {w.name: w for w in (WRITERAW, OTLP, PYROSCOPE)}


def reconnect_options(base: float, cap: float) -> list[tuple[str, int]]:
    """gRPC's own reconnect backoff bounded by the shipper's: left at its
    default (growing to 120 s) a channel that failed for a minute does not
    try to connect again for up to two more, whatever the shipper retries,
    so profiles wait long after the collector is back. (Not its minimum:
    gRPC takes that as the shortest connect timeout too, 20 s by default,
    which a TLS handshake over a long link needs.)"""
    low, high = max(1, int(base * 1000)), max(1, int(cap * 1000))
    return [("grpc.initial_reconnect_backoff_ms", min(low, high)),
            ("grpc.max_reconnect_backoff_ms", high)]


class Shipper:
    def __init__(self, spool: Spool, endpoint: Endpoint, metrics: AgentMetrics,
                 max_backoff: float = 60.0, base_backoff: float = 0.5, wire: Wire = WRITERAW,
                 jitter: float = 0.0):
        self.spool = spool
        self.wire = wire
        self.metrics = metrics.shipping[wire.name]
        self.max_backoff = max_backoff
        self.base_backoff = base_backoff
        self.jitter = jitter
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._endpoint = endpoint
        self._channel: Any = None
        self._stub: Any = None
        self._failures = 0
        self._hint = 0.0
        self._thread: threading.Thread | None = None
        self._idle = True
        self.sent = 0
        #: the last failure's gRPC status name ('' after a success)
        self.last_error = ""

    # --- connection ---
    def set_endpoint(self, endpoint: Endpoint, max_backoff: float | None = None) -> None:
        """A new endpoint or backoff ceiling: the next send opens a channel
        with them (the channel's reconnect backoff is fixed when it opens)."""
        with self._lock:
            if endpoint != self._endpoint:
                self._close_channel()
                self._endpoint = endpoint
                self._failures = 0
            if max_backoff is not None and max_backoff != self.max_backoff:
                self._close_channel()
                self.max_backoff = max_backoff
        self.spool.wake()

    def _stub_for(self) -> tuple[Any, Endpoint]:
        with self._lock:
            ep = self._endpoint
            if self._stub is None:
                options = [("grpc.max_send_message_length", ep.max_message),
                           ("grpc.max_receive_message_length", ep.max_message),
                           *reconnect_options(self.base_backoff, self.max_backoff)]
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
    def send_one(self, entry: Entry) -> bool:
        """Try one request. True when it left the queue (accepted, split,
        dropped or quarantined), False to retry after a backoff."""
        stub, ep = self._stub_for()
        data = entry.data
        try:
            rejected = self.wire.send(stub, data, ep.timeout, ep.metadata())
        except grpc.RpcError as exc:
            return self._failed(entry, exc, ep)
        except (DecodeError, ValueError) as exc:  # a corrupt request: it does not decode
            self.spool.quarantine(entry, f"not a {self.wire.name} request: {exc}")
            self.metrics.send_failures.labels("corrupt").inc()
            return True
        self.spool.remove(entry)
        self._failures, self._hint, self.last_error = 0, 0.0, ""
        n = self.wire.count(data) - rejected
        if rejected:
            self.metrics.spool_dropped.inc(rejected)
        self.sent += n
        self.metrics.profiles_sent.inc(n)
        self.metrics.bytes_sent.inc(len(data))
        return True

    def _failed(self, entry: Entry, exc: grpc.RpcError, ep: Endpoint) -> bool:
        code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
        details = (exc.details() if hasattr(exc, "details") else "") or ""
        self.metrics.send_failures.labels(code.name.lower()).inc()
        self.last_error = code.name
        what = verdict(code, details)
        if what is Verdict.SPLIT:
            halves = self.wire.split(entry.data)
            if len(halves) > 1:
                log.warning("%s: a request of %d bytes is too large (%s); sending it in %d "
                            "parts", ep.address, len(entry.data), details, len(halves))
                stem = entry.path.name[:-len(self.spool.suffix)]
                for i, half in enumerate(halves):
                    self.spool.put_named(f"{stem}.{i}{self.spool.suffix}", half)
                self.spool.remove(entry)
                return True
            what = Verdict.DROP
        if what is Verdict.DROP:
            log.error("%s refused a request for good (%s: %s); dropping it", ep.address,
                      code.name, details)
            self.metrics.spool_dropped.inc(self.wire.count(entry.data))
            self.metrics.spool_dropped_bytes.inc(len(entry.data))
            self.spool.remove(entry)
            return True
        self._failures += 1
        self._hint = retry_hint(exc)
        if self._failures in (1, 10) or self._failures % 100 == 0:
            log.warning("%s %s: %s: %s (%d failures in a row; kept in the spool)",
                        self.wire.name, ep.address, code.name, details, self._failures)
        return False

    def backoff(self) -> float:
        """Full jitter over [cap/2, cap], never under the server's hint."""
        cap = min(self.max_backoff, self.base_backoff * 2 ** min(self._failures, 30))
        wait = random.uniform(cap / 2, cap)
        if self._hint:
            wait = max(wait, random.uniform(self._hint, self._hint * 1.25))
        return wait

    def step(self) -> None:
        """Send the oldest request, or wait for one; back off after a failure."""
        entry = self.spool.oldest(timeout=1.0)
        if entry is None:
            self._idle = True
            return
        if self._idle and self.jitter:
            self._idle = False
            if self._stop.wait(random.uniform(0, self.jitter)):
                return
        self._idle = False
        if not self.send_one(entry):
            self._stop.wait(self.backoff())

    def run(self) -> None:
        errors = 0
        while not self._stop.is_set():
            try:
                self.step()
                errors = 0
            except Exception:  # the thread must not die: log, count, back off
                errors += 1
                self.metrics.send_failures.labels("exception").inc()
                if errors in (1, 10) or errors % 100 == 0:
                    log.exception("%s shipper: unexpected error (%d in a row)", self.wire.name,
                                  errors)
                self._stop.wait(min(self.max_backoff, self.base_backoff * 2 ** min(errors, 10)))

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

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
            entry = self.spool.oldest()
            if entry is None:
                break
            try:
                if not self.send_one(entry):
                    break
            except Exception:
                log.exception("%s shipper: flush failed", self.wire.name)
                break
        with self._lock:
            self._close_channel()
        lost = self.spool.persist()
        if lost.requests:
            self.metrics.spool_dropped.inc(lost.profiles)
            self.metrics.spool_dropped_bytes.inc(lost.bytes)
        return self.spool.stats()[0]
