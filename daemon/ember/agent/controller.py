"""``ember agent``: continuous profiling, shipped to backends.

The controller owns the lifecycle. Start order: the host checks and kernel
symbols (session), the HTTP endpoint, the pod watcher, the BPF programs
(built and configured, targets applied, then attached), the shipper
threads. Loop: every ``target_refresh`` re-resolve the target rules; every
``interval`` drain (pipeline.py: drain, split, label, export, account,
check memory). New processes' maps are read by the session's watcher
thread, at once. SIGHUP reloads what can change without re-attaching;
SIGTERM/SIGINT detach, drain a last time, spool, try to flush, and exit 0.
``shutdown`` is idempotent.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .. import config
from ..errors import ConfigError, EmberError, KubernetesError, UsageError
from ..export.exporter import Exporter, endpoint, exporters
from ..export.spool import Spool
from ..httpserve import Reply, Server, serve
from ..metrics import AgentMetrics, BpfStatsCollector
from ..session import Session, SessionOptions
from ..symbols.diskcache import DiskSymbolCache
from ..symbols.objects import ObjectCache
from ..symbols.procmaps import ProcessTable, ProcFS
from ..symbols.symbolizer import Symbolizer
from ..threads import Dumper
from . import sdnotify
from .kube import pod_watcher
from .labels import ProcessLabeler
from .memory import MemoryGovernor, ShrinkReport, rss_bytes, symbol_budget
from .pipeline import DrainAccounting, Window, process_profiles
from .targets import TargetResolver

log = logging.getLogger(__name__)

#: The controller's loop: SIGHUP, target rules and drains are checked this
#: often (new processes are the session's watcher thread's, at once).
LOOP_INTERVAL = 0.5
#: /healthz turns unhealthy when a spooled request has waited this many
#: intervals, and at least SHIP_STALL_MIN seconds.
SHIP_STALL_INTERVALS = 5
SHIP_STALL_MIN = 30.0


def session_options(cfg: config.AgentConfig) -> SessionOptions:
    """What the agent's configuration asks the BPF programs for."""
    return SessionOptions(
        kinds=cfg.enabled_kinds(),
        frequency=cfg.frequency, user_stacks=frozenset(cfg.user_stacks),
        kernel_stacks=frozenset(cfg.kernel_stacks), min_block_ns=int(cfg.min_block * 1e9),
        max_block_ns=int(cfg.max_block * 1e9), sample_ns=int(cfg.offcpu_sample * 1e9),
        sys_exit=cfg.offcpu_sys_exit, include_self=cfg.include_self,
        map_memory=cfg.bpf_map_memory, unwinder=cfg.unwinder,
        python_frames=cfg.python_frames,
        unwind_cache_dir=cfg.unwind_cache_dir)


def common_labels(cfg: config.AgentConfig) -> dict[str, str]:
    """Labels every profile of this host carries (before its process's)."""
    return {"host": os.uname().nodename, **dict(cfg.labels)}


class Agent:
    def __init__(self, cfg: config.AgentConfig, config_path: str | None = None,
                 registry: CollectorRegistry | None = None, procfs: ProcFS | None = None):
        self.cfg = cfg
        self.config_path = config_path
        self.registry = registry or CollectorRegistry()
        self.metrics = AgentMetrics(self.registry)
        self.metrics.memory_limit.set(cfg.memory_limit)
        # the drain and /threads share the symbolizer: one at a time
        self._symbols_lock = threading.Lock()
        self.symbolizer = Symbolizer(ProcessTable(procfs or ProcFS()), objects=ObjectCache(
            max_bytes=symbol_budget(cfg.memory_limit, rss_bytes()), debug_dirs=cfg.debug_dirs,
            disk=_disk_cache(cfg)), lines=cfg.lines)
        try:
            self.session = Session(session_options(cfg), self.symbolizer)
        except UsageError as exc:
            raise ConfigError(f"agent: {exc}") from None
        if not self.session.plan:
            raise ConfigError("agent: no profile type is enabled")
        self.governor = MemoryGovernor(cfg.memory_limit, on_shrink=self._shrunk)
        self.pods = pod_watcher(cfg.kubernetes, self._kube_error)
        self.labeler = ProcessLabeler(self.symbolizer, common_labels(cfg), cfg.relabel,
                                      self.pods, cfg.kubernetes.pod_labels)
        self.exporters: dict[str, Exporter] = exporters(cfg, self.metrics)
        self.accounting = DrainAccounting(self.metrics, self.symbolizer)
        self.registry.register(BpfStatsCollector(self.session.programs, self.labeler.comm,
                                                 self.session.unwind_stats, self.session.python))
        self.resolver = TargetResolver(cfg.targets)
        self.last_loop = time.monotonic()
        self._window_start_ns = time.time_ns()
        self._http: Server | None = None
        self._closed = False

    @property
    def spool(self) -> Spool:
        """The WriteRaw spool (where profiles wait for the collector)."""
        return self.exporters["writeraw"].spool

    @property
    def attached(self) -> bool:
        return self.session.attached

    # --- start ---
    def start(self) -> None:
        self.session.check_host()
        self._http = serve(self.cfg.metrics_listen, self.route, "metrics_listen", workers=2)
        if self.pods is not None:
            self.pods.start()
        self.session.load()
        self._apply_targets()
        self.session.attach()
        # the symbol tables get a share of what the limit leaves above the
        # agent as it runs: measured now, with the programs compiled and
        # loaded (10-25 MB more than at construction), or the cache alone
        # would keep RSS above the governor's high-water mark
        self.symbolizer.objects.resize(symbol_budget(self.cfg.memory_limit, rss_bytes()))
        self._window_start_ns = time.time_ns()
        for exporter in self.exporters.values():
            exporter.shipper.start()
        sdnotify.notify("READY=1")
        log.info("agent attached (%s), exporting (%s) every %gs",
                 ", ".join(k.name for k in self.session.kinds), ", ".join(self.exporters),
                 self.cfg.interval)

    def _apply_targets(self) -> None:
        resolved = self.resolver.resolve()
        self.session.set_targets(resolved.filter, resolved.pids, resolved.cgroups)
        self.metrics.targets.set(len(resolved.pids) + len(resolved.cgroups))

    # --- the loop ---
    def run(self, stop: threading.Event, reload: threading.Event) -> None:
        if not self.attached:
            self.start()
        now = time.monotonic()
        next_drain = now + self.cfg.interval
        next_targets = now + self.cfg.target_refresh
        try:
            while not stop.is_set():
                self.last_loop = time.monotonic()
                if stop.wait(LOOP_INTERVAL):
                    break
                if reload.is_set():
                    reload.clear()
                    self.reload()
                    next_drain = min(next_drain, time.monotonic() + self.cfg.interval)
                now = time.monotonic()
                if not self.cfg.targets.whole_host and now >= next_targets:
                    self._apply_targets()
                    next_targets = now + self.cfg.target_refresh
                if now >= next_drain:
                    self.drain_once()
                    next_drain = now + self.cfg.interval
        finally:
            self.shutdown()

    def drain_once(self, final: bool = False, end_ns: int | None = None,
                   window_end_ns: int | None = None) -> int:
        with self._symbols_lock:
            return self._drain_once(final, end_ns, window_end_ns)

    def _drain_once(self, final: bool, end_ns: int | None, window_end_ns: int | None) -> int:
        """One drain, stage by stage; returns the profiles exported. The final
        one (programs detached) charges blocks still in flight up to end_ns
        (monotonic), which is the window's end (window_end_ns, wall clock)."""
        self.accounting.begin()
        self.session.discover()
        # (the window ends as the programs flip: after discovering, which a
        # loaded machine makes slow)
        window = self._next_window(window_end_ns)
        drained = self.session.drain(final=final, end_ns=end_ns)
        profiles, dropped = process_profiles(drained, self.labeler, window)
        for exporter in self.exporters.values():
            exporter.export(profiles)
        self.accounting.end(drained, profiles, dropped, self._spooled())
        self.governor.check()
        return len(profiles)

    def _next_window(self, end_ns: int | None = None) -> Window:
        end_ns = time.time_ns() if end_ns is None else end_ns
        window = Window(self._window_start_ns, end_ns)
        self._window_start_ns = end_ns
        return window

    def _spooled(self) -> tuple[int, int]:
        """(requests, bytes) waiting in every exporter's spool."""
        sizes = [e.spool.stats() for e in self.exporters.values()]
        return sum(n for n, _ in sizes), sum(b for _, b in sizes)

    def _kube_error(self, exc: KubernetesError) -> None:
        self.metrics.errors.labels(exc.label).inc()

    def _shrunk(self, report: ShrinkReport) -> None:
        self.metrics.memory_shrinks.labels(report.cache).inc()
        self.metrics.memory_released.labels(report.cache).inc(report.released)

    # --- reload ---
    def reload(self) -> None:
        if not self.config_path:
            log.warning("SIGHUP: no config file to reload")
            return
        try:
            new = config.load(self.config_path).agent
            endpoints = {name: endpoint(new, name) for name in self.exporters}
        except Exception as exc:
            # Any failure keeps the agent running on what it has. Loading raises only
            # ConfigError (FILE:LINE: KEY: problem); anything else is a bug: log its trace.
            known = exc if isinstance(exc, EmberError) else None
            log.error("SIGHUP: keeping the running configuration: %s", exc,
                      exc_info=known is None)
            self.metrics.errors.labels(known.label if known else ConfigError.label).inc()
            return
        fixed = config.fixed_changes(self.cfg, new)
        if fixed:
            log.warning("SIGHUP: %s changed but need a restart; kept as they were",
                        ", ".join(fixed))
            new = config.override(new, **{f: getattr(self.cfg, f) for f in fixed})
        self.cfg = new
        self.resolver = TargetResolver(new.targets)
        self.session.reconfigure(session_options(new))
        self._apply_targets()
        self.labeler.common, self.labeler.rules = common_labels(new), new.relabel
        for name, exporter in self.exporters.items():
            exporter.shipper.set_endpoint(endpoints[name], new.max_backoff)
        log.warning("SIGHUP: configuration reloaded")
        sdnotify.notify("READY=1")

    # --- shutdown ---
    def shutdown(self, flush_seconds: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        sdnotify.notify("STOPPING=1")
        try:
            if self.attached:
                # the last window ends here: blocks in flight are charged up to it
                end, wall = time.monotonic_ns(), time.time_ns()
                self.session.detach()
                self.drain_once(final=True, end_ns=end, window_end_ns=wall)
        finally:
            if self.pods is not None:
                self.pods.stop()
            deadline = time.monotonic() + flush_seconds
            shippers = [e.shipper for e in self.exporters.values()]
            for shipper in shippers:
                shipper.stop()
            for shipper in shippers:
                left = shipper.flush(deadline)
                if left:
                    log.warning("%d %s requests stay in the spool (%s) for the next start",
                                left, shipper.wire.name, shipper.spool.dir)
            self.session.close()
            if self._http is not None:
                self._http.shutdown()
                self._http.server_close()

    # --- health endpoints ---
    def liveness(self) -> list[str]:
        """What restarting the agent would fix: a stuck loop, a dead thread."""
        problems = []
        if time.monotonic() - self.last_loop > 3 * self.cfg.interval + 10:
            problems.append(f"the drain loop has not run for "
                            f"{time.monotonic() - self.last_loop:.0f}s")
        if self.attached and not self._closed:
            problems += [f"{name} shipper thread is not running"
                         for name, e in self.exporters.items() if not e.shipper.alive()]
        return problems

    def health(self) -> list[str]:
        """liveness() and what needs a person: profiles not leaving the host.
        A request waiting longer than SHIP_STALL_INTERVALS intervals means
        the backend has refused or not answered that long."""
        problems = self.liveness()
        limit = max(SHIP_STALL_INTERVALS * self.cfg.interval, SHIP_STALL_MIN)
        for name, e in self.exporters.items():
            age = e.spool.oldest_age_ns() / 1e9
            if age > limit:
                why = e.shipper.last_error or "not sent yet"
                problems.append(f"{name}: the oldest spooled request has waited {age:.0f}s "
                                f"(last error: {why}; spool {e.spool.dir})")
            if e.spool.last_write_error:
                problems.append(f"{name}: the spool cannot write ({e.spool.last_write_error}); "
                                f"{e.spool.held_bytes()} bytes held in memory")
        return problems

    def threads(self, query: dict[str, list[str]]) -> Reply:
        """/threads: the targets' threads now, the longest-blocked first
        (``min_blocked`` seconds, ``limit``), as JSON."""
        census = self.session.census
        if census is None:
            return 404, (b"no thread census: off-CPU profiling is off, or the census "
                         b"program does not load here\n"), "text/plain"
        try:
            min_blocked = float(query.get("min_blocked", ["0"])[0])
            limit = int(query.get("limit", ["100"])[0])
            if not (min_blocked >= 0 and 1 <= limit <= 100_000):
                raise ValueError
        except ValueError:
            return 400, (b"min_blocked: seconds >= 0; limit: 1 to 100000\n"), "text/plain"
        with self._symbols_lock:
            reports = Dumper(census, self.symbolizer, self.session.python).take(
                self.session.target_pids())
        rows = [r.as_json() for r in reports
                if r.off_cpu_s is not None and r.state not in ("running", "runnable")
                and r.off_cpu_s >= min_blocked][:limit]
        body = json.dumps({"host": os.uname().nodename, "threads": rows}).encode()
        return 200, body, "application/json"

    def route(self, path: str, query: dict[str, list[str]], _auth: str) -> Reply:
        if path == "/metrics":
            return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST
        if path in ("/healthz", "/livez"):
            problems = self.health() if path == "/healthz" else self.liveness()
            if problems:
                return 503, "".join(f"{p}\n" for p in problems).encode(), "text/plain"
            return 200, b"ok\n", "text/plain"
        if path == "/readyz":
            ok = self.attached and not self._closed
            return (200 if ok else 503), (b"ready\n" if ok else b"not ready\n"), "text/plain"
        if path == "/threads":
            return self.threads(query)
        return 404, b"not found\n", "text/plain"


def _disk_cache(cfg: config.AgentConfig) -> DiskSymbolCache | None:
    if not cfg.symbol_cache_dir:
        return None
    try:
        return DiskSymbolCache(cfg.symbol_cache_dir, cfg.symbol_cache_size)
    except OSError as exc:
        raise ConfigError(f"agent.symbol_cache_dir: cannot use {cfg.symbol_cache_dir}: "
                          f"{exc.strerror or exc}") from exc
