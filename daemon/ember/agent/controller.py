"""``ember agent``: continuous profiling, shipped to a collector.

The controller owns the lifecycle. Start order: host checks, kernel symbols,
BPF programs (configured before they are attached), spool, shipper thread,
HTTP endpoint. Loop: every 100 ms read new processes' maps; every
``target_refresh`` re-resolve target rules; every ``interval`` drain both
programs, build one pprof per process and type, and spool the WriteRaw
requests (the shipper thread sends them, so a slow collector never delays a
drain). SIGHUP reloads what can change without re-attaching; SIGTERM/SIGINT
detach, drain a last time, spool, try to flush, and exit 0. ``close`` is
idempotent.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .. import abi, config
from ..encode.otlp import ProcessProfile, to_otlp
from ..encode.writeraw import batch_requests, make_series
from ..errors import ConfigError, EmberError, KubernetesError, SymbolizationError
from ..export.shipper import OTLP, Endpoint, Shipper, otlp_profiles_in, profiles_in
from ..export.spool import Spool
from ..httpserve import Reply, serve
from ..kernel import preflight as host
from ..kernel.drain import Drainer
from ..kernel.program import (
    Program,
    offcpu_sampled_spec,
    offcpu_spec,
    oncpu_spec,
    self_tgid,
    wait_new_processes,
)
from ..metrics import AgentMetrics, BpfStatsCollector
from ..model import (
    OFFCPU_TYPE,
    OFFWAKE_TYPE,
    RUNQ_TYPE,
    WAKEUP_TYPE,
    ProfileType,
    cpu_type,
    merge_samples,
)
from ..stacks import MODE_OF, SampleBuilder
from ..symbols.diskcache import DiskSymbolCache
from ..symbols.kallsyms import KernelSymbols
from ..symbols.procmaps import ProcessTable, ProcessWatcher, ProcFS
from ..symbols.symbolizer import ObjectCache, Symbolizer
from . import sdnotify
from .kube import ContainerRef, pod_watcher, read_container
from .labels import (
    ProcessLabels,
    cgroup_of,
    read_comm,
    series_labels,
    split_by_process,
)
from .memory import SYMBOL_CACHE_SHARE, MemoryGovernor, ShrinkReport, map_entries
from .relabel import relabel
from .targets import TargetResolver

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 4 << 20
#: The controller's loop: SIGHUP, target rules and drains are checked this
#: often (new processes are the ProcessWatcher thread's, at once).
LOOP_INTERVAL = 0.5
#: Keys SIGHUP can change; the rest need a restart (they change what is attached).
RELOADABLE = {"collector", "interval", "targets", "target_refresh", "include_self", "min_block",
              "max_block", "send_timeout", "max_backoff", "token_file",
              "tls_ca", "labels", "relabel", "otlp_endpoint", "otlp_token_file", "otlp_tls_ca"}
#: Pipelines in start order: the on-CPU program, the sampled off-CPU program,
#: and the exact off-CPU program (run-queue, wakeup, off-wake).
PIPELINES = ("cpu", "offcpu", "sched")
SPECS = {"cpu": oncpu_spec, "offcpu": offcpu_sampled_spec, "sched": offcpu_spec}
# (cpu, offcpu, runqlat, wakeup, offwake, frequency... change what is attached)


@dataclass
class Pipeline:
    """One BPF program and what turns its maps into samples: the on-CPU
    program makes one profile type, the off-CPU program up to four."""

    kind: str
    program: Program
    drainer: Drainer
    outputs: list[tuple[ProfileType, SampleBuilder]]


@dataclass
class AgentState:
    attached: bool = False
    last_loop: float = field(default_factory=time.monotonic)


def _endpoint(address: str, token_file: str, tls_ca: str, timeout: float) -> Endpoint:
    ca = None
    if tls_ca:
        try:
            ca = Path(tls_ca).read_bytes()
        except OSError as exc:
            raise ConfigError(f"{tls_ca}: cannot read CA certificate: {exc.strerror}") from exc
    return Endpoint(address, config.read_token(token_file), ca, timeout)


def endpoint_of(cfg: config.AgentConfig) -> Endpoint:
    return _endpoint(cfg.collector, cfg.token_file, cfg.tls_ca, cfg.send_timeout)


def otlp_endpoint_of(cfg: config.AgentConfig) -> Endpoint:
    return _endpoint(cfg.otlp_endpoint, cfg.otlp_token_file, cfg.otlp_tls_ca, cfg.send_timeout)


class Agent:
    def __init__(self, cfg: config.AgentConfig, config_path: str | None = None,
                 registry: CollectorRegistry | None = None, procfs: ProcFS | None = None):
        self.cfg = cfg
        self.config_path = config_path
        self.registry = registry or CollectorRegistry()
        self.metrics = AgentMetrics(self.registry)
        self.metrics.memory_limit.set(cfg.memory_limit)
        self.state = AgentState()
        self.pipelines: list[Pipeline] = []
        self.symbolizer = Symbolizer(ProcessTable(procfs or ProcFS()), objects=ObjectCache(
            max_bytes=int(cfg.memory_limit * SYMBOL_CACHE_SHARE), debug_dirs=cfg.debug_dirs,
            disk=_disk_cache(cfg)),
            lines=cfg.lines)
        self._disk_seen: dict[str, int] = {}
        self.governor = MemoryGovernor(
            cfg.memory_limit, [self.symbolizer.objects, self.symbolizer.memos(),
                               self.symbolizer.processes], self._shrunk)
        self.host = os.uname().nodename
        self._meta: dict[int, tuple[int, ProcessLabels]] = {}
        self._window_start_ns = time.time_ns()
        self._http: ThreadingHTTPServer | None = None
        self._closed = False
        self.spool = Spool(cfg.spool_dir, cfg.spool_max_size, count_profiles=profiles_in)
        self.shipper = Shipper(self.spool, endpoint_of(cfg), self.metrics, cfg.max_backoff)
        self.otlp: tuple[Spool, Shipper] | None = None
        if "otlp" in cfg.exporters:
            spool = Spool(Path(cfg.spool_dir) / "otlp", cfg.spool_max_size,
                          count_profiles=otlp_profiles_in)
            self.otlp = (spool, Shipper(spool, otlp_endpoint_of(cfg), self.metrics,
                                        cfg.max_backoff, wire=OTLP))
        self.shippers = ([self.shipper] if "writeraw" in cfg.exporters else []) + (
            [self.otlp[1]] if self.otlp else [])
        self.registry.register(BpfStatsCollector(
            lambda: {p.kind: p.program for p in self.pipelines},
            lambda pid: self._labels(pid, "").comm))
        self.resolver = TargetResolver(cfg.targets)
        self.pods = pod_watcher(cfg.kubernetes, self._kube_error)
        self.watcher: ProcessWatcher | None = None

    # --- start ---
    def _bpf_config(self, kind: str) -> abi.Config:
        c = self.cfg
        names = [t.name for t in self._types(kind)]
        return abi.Config(
            epoch=0, filter=0, self_tgid=0 if c.include_self else self_tgid(),
            stack_flags=(abi.STACK_USER if set(names) & set(c.user_stacks) else 0)
            | (abi.STACK_KERNEL if set(names) & set(c.kernel_stacks) else 0),
            min_block_ns=int(c.min_block * 1e9), max_block_ns=int(c.max_block * 1e9),
            sample_ns=int(c.offcpu_sample * 1e9),
            modes=sum(MODE_OF.get(n, 0) for n in names) if kind == "sched" else 0)

    def _types(self, kind: str) -> list[ProfileType]:
        """The profile types one pipeline builds: "cpu" (on-CPU program),
        "offcpu" (sampled off-CPU program), "sched" (the exact off-CPU program:
        run-queue, wakeup, off-wake, and off-CPU when offcpu_sample is 0)."""
        c = self.cfg
        if kind == "cpu":
            return [cpu_type(c.frequency)] if c.cpu else []
        sampled = c.offcpu_sample > 0
        if kind == "offcpu":
            return [OFFCPU_TYPE] if c.offcpu and sampled else []
        return [t for t, on in ((OFFCPU_TYPE, c.offcpu and not sampled), (RUNQ_TYPE, c.runqlat),
                                (WAKEUP_TYPE, c.wakeup), (OFFWAKE_TYPE, c.offwake)) if on]

    def start(self) -> None:
        c = self.cfg
        plan = [(kind, self._types(kind)) for kind in PIPELINES if self._types(kind)]
        if not plan:
            raise ConfigError("agent: no profile type is enabled")
        for kind, types in plan:
            cfg = self._bpf_config(kind)
            if not cfg.stack_flags & (abi.STACK_USER | abi.STACK_KERNEL):
                raise ConfigError(f"agent: {types[0].name} records neither user nor kernel "
                                  "stacks (user_stacks, kernel_stacks)")
        host.preflight(tracepoints=any(kind == "sched" for kind, _ in plan))
        if c.kernel_stacks:
            try:
                self.symbolizer.kernel = KernelSymbols()
            except SymbolizationError as exc:
                log.warning("%s", exc)
        self._serve_http()
        if self.pods is not None:
            self.pods.start()
        entries = map_entries(c.bpf_map_memory, [kind for kind, _ in plan])
        for kind, types in plan:
            stacks, counts = entries[kind]
            prog = Program(SPECS[kind](stack_entries=stacks, count_entries=counts))
            self.pipelines.append(Pipeline(kind, prog, Drainer(prog),
                                           [(t, SampleBuilder(self.symbolizer, t))
                                            for t in types]))
        kinds = [t.name for _, types in plan for t in types]
        self._apply_bpf_config()
        self._apply_targets()
        programs = [p.program for p in self.pipelines]
        self.watcher = ProcessWatcher(self.symbolizer.processes,
                                      lambda t: wait_new_processes(programs, t))
        self.watcher.start()
        for p in self.pipelines:
            if p.kind == "cpu":
                p.program.attach_cpu_clock(c.frequency)
            elif p.kind == "offcpu":
                p.program.attach_sampled_offcpu(sys_exit=c.offcpu_sys_exit)
            else:
                p.program.attach_sched_switch()
        self._window_start_ns = time.time_ns()
        self.state.attached = True
        for shipper in self.shippers:
            shipper.start()
        sdnotify.notify("READY=1")
        log.info("agent attached (%s), shipping to %s every %gs", ", ".join(kinds), c.collector,
                 c.interval)

    def _apply_bpf_config(self) -> None:
        for p in self.pipelines:
            cfg = self._bpf_config(p.kind)
            cfg.epoch = p.drainer.epoch
            cfg.filter = p.program.config().filter
            p.program.configure(cfg)

    def _apply_targets(self) -> None:
        resolved = self.resolver.resolve()
        for p in self.pipelines:
            p.program.set_targets(resolved.pids)
            p.program.set_cgroups(resolved.cgroups)
            cfg = p.program.config()
            cfg.filter = resolved.filter
            p.program.configure(cfg)
        self.metrics.targets.set(len(resolved.pids) + len(resolved.cgroups))

    # --- the loop ---
    def run(self, stop: threading.Event, reload: threading.Event) -> None:
        if not self.state.attached:
            self.start()
        now = time.monotonic()
        next_drain = now + self.cfg.interval
        next_targets = now + self.cfg.target_refresh
        try:
            while not stop.is_set():
                self.state.last_loop = time.monotonic()
                # new processes' maps are read as soon as the kernel notes them
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

    def drain_once(self, final: bool = False) -> int:
        """Drain every program and spool the profiles; returns profiles built."""
        end_ns = time.time_ns()
        start_ns, self._window_start_ns = self._window_start_ns, end_ns
        series = []
        otlp: list[ProcessProfile] = []
        for p in self.pipelines:
            # processes the watcher's ring missed (it was full: new_pids_full)
            self.symbolizer.processes.discover(p.program.take_active_pids())
        for p in self.pipelines:
            t0 = time.monotonic()
            sym_before = (self.symbolizer.stats.frames, self.symbolizer.stats.unknown_frames,
                          self.symbolizer.stats.cache_hits, self.symbolizer.stats.cache_misses)
            result = p.drainer.drain(final=final)
            m = self.metrics
            m.samples.labels(p.kind).inc(result.stats.events)
            if p.kind != "cpu":
                m.offcpu_seconds.inc(sum(r.total_ns for r in result.records
                                         if r.kind == abi.KIND_BLOCKED) / 1e9)
            m.stacks_lost.labels(p.kind, "evicted").inc(result.stats.stacks_missing)
            m.stacks_lost.labels(p.kind, "truncated").inc(result.stats.stacks_truncated)
            m.map_fill.labels(p.kind, "counts").set(
                result.stats.records / p.program.counts_map.max_entries)
            if p.program.starts_map is not None:
                m.map_fill.labels(p.kind, "starts").set(
                    result.stats.pending / p.program.starts_map.max_entries)
            for ptype, builder in p.outputs:
                samples = builder.build(result.records)
                for pid, ss in split_by_process(samples).items():
                    meta = self._labels(pid, ss[0].thread_name)
                    labels = relabel(series_labels(
                        ptype, meta, {"host": self.host, **dict(self.cfg.labels)},
                        self._pod_labels(meta)), self.cfg.relabel)
                    if labels is None:
                        m.profiles_dropped.labels("relabel").inc()
                        continue
                    if "writeraw" in self.cfg.exporters:
                        s, _ = make_series(ptype, ss, labels, start_ns, end_ns - start_ns)
                        series.append(s)
                    if self.otlp is not None:
                        otlp.append(ProcessProfile(ptype, merge_samples(ss), labels, start_ns,
                                                   end_ns - start_ns))
                    m.profiles_built.labels(ptype.name).inc()
            st = self.symbolizer.stats
            frames = st.frames - sym_before[0]
            unknown = st.unknown_frames - sym_before[1]
            m.frames.inc(frames)
            m.unknown_frames.inc(unknown)
            m.unknown_ratio.set(unknown / frames if frames else 0)
            m.cache_hits.inc(st.cache_hits - sym_before[2])
            m.cache_misses.inc(st.cache_misses - sym_before[3])
            if (disk := self.symbolizer.objects.disk) is not None:
                for outcome in ("hits", "misses", "stored", "errors", "evicted"):
                    now = getattr(disk.stats, outcome)
                    m.disk_cache.labels(outcome).inc(now - self._disk_seen.get(outcome, 0))
                    self._disk_seen[outcome] = now
            m.drain_seconds.labels(p.kind).observe(time.monotonic() - t0)
        for req in batch_requests(series, MAX_REQUEST_BYTES):
            dropped = self.spool.put(req.SerializeToString())
            if dropped.requests:
                self.metrics.spool_dropped.inc(dropped.profiles)
                self.metrics.spool_dropped_bytes.inc(dropped.bytes)
        if self.otlp is not None:
            self._spool_otlp(otlp)
        n, size = self.spool.stats()
        self.metrics.spool_batches.set(n)
        self.metrics.spool_bytes.set(size)
        self.metrics.last_drain.set(time.time())
        self._prune_meta()
        self.governor.check()
        for cache in self.governor.caches:
            self.metrics.cache_bytes.labels(cache.name).set(cache.size_bytes())
        return len(series)

    def _spool_otlp(self, profiles: list[ProcessProfile]) -> None:
        """One OTLP request per drain, split in halves while too large."""
        assert self.otlp is not None
        spool = self.otlp[0]
        pending = [profiles] if profiles else []
        while pending:
            part = pending.pop()
            data = to_otlp(part).SerializeToString()
            if len(data) > MAX_REQUEST_BYTES and len(part) > 1:
                pending += [part[:len(part) // 2], part[len(part) // 2:]]
                continue
            dropped = spool.put(data)
            if dropped.requests:
                self.metrics.otlp_dropped.inc(dropped.profiles)
                self.metrics.otlp_dropped_bytes.inc(dropped.bytes)

    def _kube_error(self, exc: KubernetesError) -> None:
        self.metrics.errors.labels(exc.label).inc()

    def _shrunk(self, report: ShrinkReport) -> None:
        self.metrics.memory_shrinks.labels(report.cache).inc()
        self.metrics.memory_released.labels(report.cache).inc(report.released)

    def _labels(self, pid: int, thread_name: str) -> ProcessLabels:
        proc = self.symbolizer.processes.get(pid)
        start = proc.start_time if proc else -1
        cached = self._meta.get(pid)
        if cached and cached[0] == start:
            return cached[1]
        build_id = ""
        if proc is not None and proc.exe:
            _, obj = self.symbolizer.objects.open([Path(f"/proc/{pid}/exe"),
                                                   Path(proc.exe)])
            build_id = (obj.build_id or "") if obj else ""
        ref = read_container(pid)
        meta = ProcessLabels(pid=pid, comm=read_comm(pid) or thread_name,
                             executable=(proc.exe or "") if proc else "", build_id=build_id,
                             cgroup=cgroup_of(pid), container_id=ref.container_id,
                             pod_uid=ref.pod_uid)
        self._meta[pid] = (start, meta)
        return meta

    def _pod_labels(self, meta: ProcessLabels) -> dict[str, str]:
        """namespace, pod, container, pod_label_* (looked up at each drain: the
        watch may learn of a pod after its first profile)."""
        if self.pods is None or not (meta.container_id or meta.pod_uid):
            return {}
        pod = self.pods.cache.lookup(ContainerRef(meta.container_id, meta.pod_uid))
        if pod is None:
            return {}
        return pod.labels_for(meta.container_id, self.cfg.kubernetes.pod_labels)

    def _prune_meta(self) -> None:
        if len(self._meta) > 2 * len(self.symbolizer.processes) + 1000:
            live = {pid for pid in self._meta if self.symbolizer.processes.get(pid)}
            self._meta = {k: v for k, v in self._meta.items() if k in live}

    # --- reload ---
    def reload(self) -> None:
        if not self.config_path:
            log.warning("SIGHUP: no config file to reload")
            return
        try:
            new = config.load(self.config_path).agent
            endpoint = endpoint_of(new)
        except EmberError as exc:
            log.error("SIGHUP: keeping the running configuration: %s", exc)
            self.metrics.errors.labels(exc.label).inc()
            return
        fixed = [f for f in new.__dataclass_fields__
                 if f not in RELOADABLE and getattr(new, f) != getattr(self.cfg, f)]
        if fixed:
            log.warning("SIGHUP: %s changed but need a restart; kept as they were",
                        ", ".join(fixed))
            new = config.override(new, **{f: getattr(self.cfg, f) for f in fixed})
        self.cfg = new
        self.resolver = TargetResolver(new.targets)
        self._apply_bpf_config()
        self._apply_targets()
        self.shipper.set_endpoint(endpoint)
        if self.otlp is not None:
            self.otlp[1].set_endpoint(otlp_endpoint_of(new))
        for shipper in self.shippers:
            shipper.max_backoff = new.max_backoff
        log.warning("SIGHUP: configuration reloaded")
        sdnotify.notify("READY=1")

    # --- shutdown ---
    def shutdown(self, flush_seconds: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        sdnotify.notify("STOPPING=1")
        try:
            if self.watcher is not None:
                self.watcher.stop()
            if self.state.attached:
                for p in self.pipelines:
                    p.program.detach()
                self.drain_once(final=True)
        finally:
            if self.pods is not None:
                self.pods.stop()
            deadline = time.monotonic() + flush_seconds
            for shipper in self.shippers:
                shipper.stop()
            for shipper in self.shippers:
                left = shipper.flush(deadline)
                if left:
                    log.warning("%d %s requests stay in the spool (%s) for the next start",
                                left, shipper.wire.name, shipper.spool.dir)
            for p in self.pipelines:
                p.program.close()
            if self._http is not None:
                self._http.shutdown()
                self._http.server_close()

    # --- health endpoint ---
    def healthy(self) -> bool:
        return time.monotonic() - self.state.last_loop < 3 * self.cfg.interval + 10

    def route(self, path: str, _query: dict[str, list[str]], _auth: str) -> Reply:
        if path == "/metrics":
            return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST
        if path == "/healthz":
            ok = self.healthy()
            return (200 if ok else 503), (b"ok\n" if ok else b"stalled\n"), "text/plain"
        if path == "/readyz":
            ok = self.state.attached and not self._closed
            return (200 if ok else 503), (b"ready\n" if ok else b"not ready\n"), "text/plain"
        return 404, b"not found\n", "text/plain"

    def _serve_http(self) -> None:
        self._http = serve(self.cfg.metrics_listen, self.route, "metrics_listen")


def _disk_cache(cfg: config.AgentConfig) -> DiskSymbolCache | None:
    if not cfg.symbol_cache_dir:
        return None
    try:
        return DiskSymbolCache(cfg.symbol_cache_dir, cfg.symbol_cache_size)
    except OSError as exc:
        raise ConfigError(f"agent.symbol_cache_dir: cannot use {cfg.symbol_cache_dir}: "
                          f"{exc.strerror or exc}") from exc
