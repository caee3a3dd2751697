"""One exporter per wire: profiles -> requests on disk -> a backend.

An exporter encodes a drain's profiles into its wire's requests (WriteRaw
and Pyroscope: series packed into requests of at most ``MAX_REQUEST_BYTES``;
OTLP: one request per drain, halved while larger), writes them to its own spool, and
owns the shipper thread that sends them, so a slow or absent backend never
delays a drain. What the spool drops when full is counted here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..config import AgentConfig, read_token
from ..errors import ConfigError
from ..metrics import AgentMetrics
from ..model import Profile
from .shipper import WIRES, Endpoint, Shipper, Wire
from .spool import Spool

MAX_REQUEST_BYTES = 4 << 20


def flush_jitter(interval: float) -> float:
    """How long a fresh request may wait before it is sent: up to a tenth
    of the interval (at most 5 s), so the agents of a fleet whose drains
    line up reach the collector spread over that time, not at once."""
    return min(5.0, interval / 10)


class Exporter:
    def __init__(self, wire: Wire, spool: Spool, endpoint: Endpoint, metrics: AgentMetrics,
                 max_backoff: float, jitter: float = 0.0):
        self.wire = wire
        self.spool = spool
        self.counters = c = metrics.shipping[wire.name]
        spool.on_quarantine, spool.on_write_error = c.quarantined.inc, c.write_errors.inc
        c.held_bytes.set_function(lambda: spool.held_bytes())
        c.oldest_age.set_function(lambda: spool.oldest_age_ns() / 1e9)
        self.shipper = Shipper(spool, endpoint, metrics, max_backoff, wire=wire, jitter=jitter)

    def export(self, profiles: Sequence[Profile]) -> None:
        """Encode and spool (the shipper thread sends)."""
        for request in self.wire.encode(profiles, MAX_REQUEST_BYTES):
            dropped = self.spool.put(request)
            if dropped.requests:
                self.counters.spool_dropped.inc(dropped.profiles)
                self.counters.spool_dropped_bytes.inc(dropped.bytes)


def endpoint(cfg: AgentConfig, wire: str) -> Endpoint:
    """Where a wire sends, with its credentials and CA, from the configuration
    keys its prefix names (WriteRaw: collector, token_file, tls_ca)."""
    prefix = WIRES[wire].config_prefix
    address = getattr(cfg, f"{prefix}endpoint") if prefix else cfg.collector
    tls_ca = getattr(cfg, f"{prefix}tls_ca")
    ca = None
    if tls_ca:
        try:
            ca = Path(tls_ca).read_bytes()
        except OSError as exc:
            raise ConfigError(f"{tls_ca}: cannot read CA certificate: {exc.strerror}") from exc
    return Endpoint(address, read_token(getattr(cfg, f"{prefix}token_file")), ca,
                    cfg.send_timeout, username=getattr(cfg, f"{prefix}basic_auth_user", ""),
                    tenant=getattr(cfg, f"{prefix}tenant_id", ""))


def exporters(cfg: AgentConfig, metrics: AgentMetrics) -> dict[str, Exporter]:
    """An exporter per configured wire. WriteRaw spools in spool_dir, the
    others in a directory of their own below it."""
    out = {}
    for name in cfg.exporters:
        wire = WIRES[name]
        directory = Path(cfg.spool_dir) if name == "writeraw" else Path(cfg.spool_dir) / name
        try:
            spool = Spool(directory, cfg.spool_max_size, count_profiles=wire.count,
                          memory_max=cfg.spool_memory_max)
        except OSError as exc:
            raise ConfigError(f"agent.spool_dir: cannot use {directory}: "
                              f"{exc.strerror or exc}") from None
        out[name] = Exporter(wire, spool, endpoint(cfg, name), metrics, cfg.max_backoff,
                             jitter=flush_jitter(cfg.interval))
    return out
