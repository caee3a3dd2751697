"""ember's configuration schema: every key of the file, with its type, its
default and the facts about it (documentation, kind, range, whether SIGHUP
may change it), as frozen dataclasses. Loading (``load``) and the reference
(``reference``) read it; nothing else describes a key.

The file has two sections, ``agent`` and ``collector``; each role reads its
own. Command-line flags override file values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..kernel.programs import DEFAULT_MAP_MEMORY
from ..model import KIND_NAMES, PROFILE_KINDS, ProfileKind
from ..symbols import DEFAULT_DEBUG_DIRS
from ..unwind import UNWINDERS
from .options import keys_of, opt, section

#: What agent.kernel_stacks and agent.user_stacks choose from: the profile kinds.
PROFILE_TYPES = KIND_NAMES
EXPORTERS = ("writeraw", "otlp", "pyroscope")
RELABEL_ACTIONS = ("replace", "keep", "drop", "labelmap", "labeldrop", "labelkeep")


@dataclass(frozen=True)
class Rule:
    """One Prometheus-style relabeling rule (agent.relabel applies them)."""

    source_labels: tuple[str, ...] = ()
    separator: str = ";"
    regex: str = "(.*)"
    target_label: str = ""
    replacement: str = "$1"
    action: str = "replace"

    def __post_init__(self) -> None:
        if self.action not in RELABEL_ACTIONS:
            raise ValueError(f"unknown relabel action {self.action!r} (one of "
                             f"{', '.join(RELABEL_ACTIONS)})")
        try:
            re.compile(self.regex)
        except re.error as exc:
            raise ValueError(f"bad regex {self.regex!r}: {exc}") from None
        if self.action == "replace" and not self.target_label:
            raise ValueError("action replace needs a target_label")
        if self.action in ("keep", "drop", "replace") and not self.source_labels:
            raise ValueError(f"action {self.action} needs source_labels")


@dataclass(frozen=True)
class Targets:
    pids: tuple[int, ...] = field(default=(), metadata=opt(
        "Profile only these process IDs.", "int_list", 1))
    comm: tuple[str, ...] = field(default=(), metadata=opt(
        "Profile processes whose command name matches one of these regular expressions.",
        "regex_list"))
    exe: tuple[str, ...] = field(default=(), metadata=opt(
        "Profile processes whose executable path matches one of these regular expressions.",
        "regex_list"))
    cgroups: tuple[str, ...] = field(default=(), metadata=opt(
        "Profile processes in these cgroup v2 paths (and below), e.g. /system.slice/nginx.service.",
        "str_list"))

    @property
    def whole_host(self) -> bool:
        return not (self.pids or self.comm or self.exe or self.cgroups)


@dataclass(frozen=True)
class KubernetesConfig:
    enabled: bool = field(default=False, metadata=opt(
        "Label profiles with namespace, pod, container and pod labels (pod_label_*) of "
        "the pods on this node, watched from the API server.", "bool"))
    node_name: str = field(default="", metadata=opt(
        "This node's name; empty: $NODE_NAME (the DaemonSet sets it from spec.nodeName).",
        "str"))
    api_server: str = field(default="", metadata=opt(
        "API server URL; empty: in-cluster (https://$KUBERNETES_SERVICE_HOST:"
        "$KUBERNETES_SERVICE_PORT).", "str"))
    token_file: str = field(default="/var/run/secrets/kubernetes.io/serviceaccount/token",
                            metadata=opt("Service account token (re-read on every request: "
                                          "projected tokens rotate).", "path"))
    ca_file: str = field(default="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                         metadata=opt("CA certificate of the API server.", "path"))
    pod_labels: bool = field(default=True, metadata=opt(
        "Add each pod label as pod_label_<name> (before relabeling).", "bool"))


@dataclass(frozen=True)
class AgentConfig:
    collector: str = field(default="127.0.0.1:7070", metadata=opt(
        "gRPC address of the collector (ember collector, or a Parca server).", "hostport",
        reloadable=True))
    interval: float = field(default=10.0, metadata=opt(
        "How often the kernel maps are drained and profiles shipped.", "duration", 1, 3600,
        reloadable=True))
    frequency: int = field(default=19, metadata=opt(
        "On-CPU samples per second per CPU.", "int", 1, 10000))
    cpu: bool = field(default=True, metadata=opt("Collect on-CPU profiles.", "bool"))
    offcpu: bool = field(default=True, metadata=opt(
        "Collect off-CPU profiles: time blocked, from switch-out to the wakeup, with "
        "duration-weighted sampling (see offcpu_sample).", "bool"))
    runqlat: bool = field(default=False, metadata=opt(
        "Collect run-queue latency: time runnable threads waited for a CPU, as a profile "
        "and as the ember_runqueue_latency_seconds histogram per process (stacks are "
        "walked at every switch: several times the off-CPU profile's cost).", "bool"))
    wakeup: bool = field(default=False, metadata=opt(
        "Collect wakeup profiles: wakers' stacks weighted by the time their wakees were "
        "blocked (one more stack walk per wakeup).", "bool"))
    offwake: bool = field(default=False, metadata=opt(
        "Collect off-wake profiles: blocked stacks joined with their wakers' stacks.", "bool"))
    kernel_stacks: tuple[str, ...] = field(default=PROFILE_TYPES, metadata=opt(
        "Profile types that record kernel stacks: true (all), false (none) or a list of "
        f"{', '.join(KIND_NAMES)}. Run-queue, wakeup and off-wake profiles "
        "come from one program: a stack kind one of them records, all three record.",
        "type_list", choices=PROFILE_TYPES))
    user_stacks: tuple[str, ...] = field(default=PROFILE_TYPES, metadata=opt(
        "Profile types that record user stacks (as kernel_stacks).", "type_list",
        choices=PROFILE_TYPES))
    offcpu_sample: float = field(default=0.001, metadata=opt(
        "Off-CPU: blocks at least this long are always recorded with their stacks; a "
        "shorter block of duration d with probability d/offcpu_sample, counted as "
        "offcpu_sample of time, so totals stay unbiased while short, frequent blocks cost "
        "almost nothing. 0 records every block with the exact program instead (stacks "
        "walked at every switch, scheduler frames kept). Either way a block ends at its "
        "wakeup.",
        "duration", 0, 4))
    min_block: float = field(default=0.000001, metadata=opt(
        "Off-CPU: ignore blocks shorter than this.", "duration", 0, 3600, reloadable=True))
    max_block: float = field(default=0.0, metadata=opt(
        "Off-CPU: ignore blocks longer than this (0: no limit).", "duration", 0, 86400 * 365,
        reloadable=True))
    offcpu_sys_exit: bool = field(default=False, metadata=opt(
        "Off-CPU: also take sampled blocks' user stacks at system call exit. Needed for "
        "programs that do not register rseq (Go, musl, glibc before 2.35), whose user "
        "stacks are otherwise lost (counted as user_late); costs about 0.1 us per system "
        "call on the whole host.", "bool"))
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig, metadata=section(
        "Pod metadata on Kubernetes."))
    relabel: tuple[Rule, ...] = field(default=(), metadata=opt(
        "Prometheus-style relabeling of each profile's labels (source_labels, separator, "
        f"regex, target_label, replacement, action: {', '.join(RELABEL_ACTIONS)}), applied "
        "in order before shipping.", "relabel", reloadable=True))
    debug_dirs: tuple[str, ...] = field(default=DEFAULT_DEBUG_DIRS, metadata=opt(
        "Where separate debug files are looked up, by build id (.build-id/xx/rest.debug) "
        "and by .gnu_debuglink name (CRC checked), in this order.", "str_list"))
    lines: bool = field(default=False, metadata=opt(
        "Source files and lines from DWARF, with inlined functions as frames of "
        "their own (pprof Line entries). Parses debug info on the agent: more CPU and "
        "memory (within the symbol cache's share of memory_limit).", "bool"))
    unwinder: str = field(default="auto", metadata=opt(
        "How user stacks are walked: " + "; ".join(f"{k}: {v}" for k, v in UNWINDERS.items())
        + ". Tables are built from each object's .eh_frame (or .debug_frame) and kept "
        "in unwind_cache_dir.", "choice", choices=tuple(UNWINDERS)))
    python_frames: bool = field(default=True, metadata=opt(
        "CPython 3.10-3.13 processes: their Python functions, with the line running, in "
        "place of the interpreter loop's frames (read from the processes' memory; needs "
        "the table unwinder).", "bool"))
    unwind_cache_dir: str = field(default="", metadata=opt(
        "Keep unwind tables on disk here, by build id, so a restarted agent does not "
        "build them again; empty: no disk cache. The systemd unit provides "
        "/var/cache/ember (CacheDirectory) for /var/cache/ember/unwind.", "str"))
    symbol_cache_dir: str = field(default="", metadata=opt(
        "Keep indexed symbol tables on disk here, by build id, so a restarted agent "
        "does not index every object again; empty: no disk cache. The systemd unit "
        "provides /var/cache/ember (CacheDirectory) for /var/cache/ember/symbols.", "str"))
    symbol_cache_size: int = field(default=256 << 20, metadata=opt(
        "Bound of symbol_cache_dir; least recently used files are deleted past it.",
        "size", 1 << 20, 64 << 30))
    memory_limit: int = field(default=150 << 20, metadata=opt(
        "The agent's memory ceiling (RSS). The symbol table cache gets 60% of what it "
        "leaves above the agent's own footprint (about 60 MiB); "
        "past 85% the caches shrink, counted in ember_memory_shrinks_total and "
        "ember_memory_released_bytes_total. Give systemd's MemoryMax or the container "
        "limit some headroom above it.", "size", 48 << 20))
    bpf_map_memory: int = field(default=DEFAULT_MAP_MEMORY, metadata=opt(
        "Kernel memory for ember's BPF maps, shared by the enabled profile types; the "
        "stack and counts map sizes are derived from it (ember_bpf_map_memory_bytes "
        "reports what the kernel charged).", "size", 8 << 20, 4 << 30))
    targets: Targets = field(default_factory=Targets, metadata=section(
        "What to profile; empty means the whole host. A process matching any rule is "
        "profiled. Filtering happens in the kernel.", reloadable=True))
    target_refresh: float = field(default=2.0, metadata=opt(
        "How often comm/exe/cgroup rules are re-evaluated against running processes.",
        "duration", 0.1, 3600, reloadable=True))
    include_self: bool = field(default=False, metadata=opt(
        "Profile the agent itself too.", "bool", reloadable=True))
    metrics_listen: str = field(default="127.0.0.1:7071", metadata=opt(
        "HTTP address for /metrics, /healthz and /readyz.", "hostport"))
    spool_dir: str = field(default="/var/lib/ember/spool", metadata=opt(
        "Where profiles wait while the collector is unreachable; survives restarts.", "path"))
    spool_max_size: int = field(default=256 << 20, metadata=opt(
        "Spool size limit; past it the oldest profiles are dropped (and counted).", "size",
        1 << 20))
    spool_memory_max: int = field(default=32 << 20, metadata=opt(
        "When the spool's disk refuses writes (full, read-only), requests are held in memory "
        "up to this size and written once it accepts them again; past it the oldest held "
        "are dropped (and counted).", "size", 0))
    send_timeout: float = field(default=10.0, metadata=opt(
        "Deadline of one WriteRaw call.", "duration", 0.1, 600, reloadable=True))
    max_backoff: float = field(default=60.0, metadata=opt(
        "Upper bound of the exponential backoff between re-sends, and of gRPC's wait "
        "before it reconnects to a collector that refused connections.", "duration", 0.1, 3600,
        reloadable=True))
    token_file: str = field(default="", metadata=opt(
        "File holding a bearer token sent to the collector (empty: none).", "path",
        reloadable=True))
    exporters: tuple[str, ...] = field(default=("writeraw",), metadata=opt(
        "Where profiles go: writeraw (Parca's WriteRaw: ember collector or Parca, at "
        "collector) and/or otlp (OTLP profiles: an OpenTelemetry Collector, Grafana "
        "Pyroscope, at otlp_endpoint) and/or pyroscope (Grafana Pyroscope's push API, as "
        "Grafana Alloy sends it, at pyroscope_endpoint). Each has its own spool and "
        "retries. docs/fleet.md compares them.", "type_list",
        choices=EXPORTERS, item="exporter"))
    otlp_endpoint: str = field(default="127.0.0.1:4317", metadata=opt(
        "gRPC address of the OTLP endpoint (ProfilesService/Export).", "hostport", reloadable=True))
    otlp_token_file: str = field(default="", metadata=opt(
        "File holding a bearer token for the OTLP endpoint (empty: none).", "path",
        reloadable=True))
    otlp_tls_ca: str = field(default="", metadata=opt(
        "CA certificate (PEM) to verify the OTLP endpoint; set it to use TLS.", "path",
        reloadable=True))
    tls_ca: str = field(default="", metadata=opt(
        "CA certificate (PEM) to verify the collector; set it to use TLS.", "path",
        reloadable=True))
    pyroscope_endpoint: str = field(default="127.0.0.1:4040", metadata=opt(
        "gRPC address of Grafana Pyroscope (push.v1.PusherService/Push; Pyroscope serves it "
        "on its HTTP port). Profiles are named process_cpu and off_cpu; service_name is the "
        "service_name label if set, else NAMESPACE/CONTAINER on Kubernetes, else the "
        "command name.", "hostport", reloadable=True))
    pyroscope_token_file: str = field(default="", metadata=opt(
        "File holding the token for Pyroscope (empty: none): a bearer token, or the "
        "password when pyroscope_basic_auth_user is set.", "path", reloadable=True))
    pyroscope_basic_auth_user: str = field(default="", metadata=opt(
        "User of HTTP basic auth for Pyroscope (Grafana Cloud: the stack's profiles user "
        "id), with pyroscope_token_file as its password; empty: bearer token.", "str",
        reloadable=True))
    pyroscope_tenant_id: str = field(default="", metadata=opt(
        "Tenant of a multi-tenant Pyroscope, sent as X-Scope-OrgID (empty: none).", "str",
        reloadable=True))
    pyroscope_tls_ca: str = field(default="", metadata=opt(
        "CA certificate (PEM) to verify Pyroscope; set it to use TLS (the system bundle, "
        "e.g. /etc/ssl/certs/ca-certificates.crt, for Grafana Cloud).", "path",
        reloadable=True))
    labels: tuple[tuple[str, str], ...] = field(default=(), metadata=opt(
        "Extra labels on every profile (a mapping of Prometheus label names to values).",
        "labels", reloadable=True))

    def enabled_kinds(self) -> tuple[ProfileKind, ...]:
        """The profile kinds whose key (cpu, offcpu, ...) is true, in registry order."""
        return tuple(kind for kind in PROFILE_KINDS if getattr(self, kind.name))


@dataclass(frozen=True)
class CollectorConfig:
    grpc_listen: str = field(default="127.0.0.1:7070", metadata=opt(
        "gRPC address for ProfileStoreService/WriteRaw. Without a token, keep it on loopback.",
        "hostport"))
    http_listen: str = field(default="127.0.0.1:7072", metadata=opt(
        "HTTP address of the query API.", "hostport"))
    storage: str = field(default="ember.db", metadata=opt(
        "The store: one DuckDB file (docs/storage.md). A store of the older SQLite format "
        "found there is converted at start; the old file is kept as FILE.sqlite-v1.", "path"))
    retention: float = field(default=7 * 86400.0, metadata=opt(
        "Profiles older than this are deleted.", "duration", 60, 86400 * 3650))
    max_storage_size: int = field(default=1 << 30, metadata=opt(
        "Past this size (the store's blocks in use with its write-ahead log), the oldest "
        "profiles are deleted, checked at every write.", "size", 1 << 20))
    max_request_size: int = field(default=16 << 20, metadata=opt(
        "Largest WriteRaw request accepted; larger ones are rejected.", "size", 1 << 16,
        1 << 30))
    max_concurrent_writes: int = field(default=512, metadata=opt(
        "WriteRaw calls served or queued at once; past it a call is refused with "
        "RESOURCE_EXHAUSTED, which agents retry after a jittered backoff (nothing is "
        "dropped). 32 calls are served at once, each holding its request; a queued call "
        "holds at most 256 KB of it until then (its HTTP/2 window). The default holds a "
        "1,000-host fleet's first seconds at a new collector (about 5 s of queue at 100 "
        "writes a second, within agents' 10 s send_timeout).", "int", 1, 100_000))
    decode_workers: int = field(default=0, metadata=opt(
        "Processes that validate WriteRaw requests and turn them into rows, beside the "
        "collector's own (0: it does this itself). Reading a 1,000-stack profile is about "
        "4-5 ms of CPU once its program's frames are known (35-45 ms the first time), so "
        "one process takes up to about 200 profiles a second; give the cores the collector "
        "may use. Each program's profiles go to one of them, "
        "which learns its frames once (docs/storage.md, Ingest).", "int", 0, 64))
    max_profile_size: int = field(default=64 << 20, metadata=opt(
        "Largest decompressed pprof accepted (a gzip bomb is rejected).", "size", 1 << 16,
        1 << 31))
    token_file: str = field(default="", metadata=opt(
        "File holding the bearer token clients must send (empty: no authentication).",
        "path"))
    tls_cert: str = field(default="", metadata=opt(
        "Server certificate (PEM) for gRPC and HTTP; with tls_key, turns TLS on.", "path"))
    tls_key: str = field(default="", metadata=opt("Private key (PEM) of tls_cert.", "path"))


@dataclass(frozen=True)
class Config:
    agent: AgentConfig = field(default_factory=AgentConfig, metadata=section(
        "The agent (ember agent). On SIGHUP it reads the file again and applies the keys "
        "marked *Reloaded on SIGHUP*; a change to any other key is logged and waits for a "
        "restart."))
    collector: CollectorConfig = field(default_factory=CollectorConfig, metadata=section(
        "The collector (ember collector)."))


def reloadable_keys() -> frozenset[str]:
    """The agent keys SIGHUP applies; a change to any other needs a restart."""
    return frozenset(k.name for k in keys_of(AgentConfig) if k.option.reloadable)


def fixed_changes(old: AgentConfig, new: AgentConfig) -> list[str]:
    """The agent keys that differ from old to new but only a restart applies,
    in the order of the file."""
    return [k.name for k in keys_of(AgentConfig)
            if not k.option.reloadable and getattr(old, k.name) != getattr(new, k.name)]
