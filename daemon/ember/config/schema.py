"""ember's configuration: one typed schema that validates YAML (with the file,
line and key of every mistake), holds the defaults and the documentation,
and renders the reference (docs/configuration.md, checked current by a test).

The file has two sections, ``agent`` and ``collector``; each role reads its
own. Command-line flags override file values.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|h|d)\s*$")
_DURATION_UNITS = {"us": 1e-6, "ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|TiB)?\s*$")
_SIZE_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
PROFILE_TYPES = ("cpu", "offcpu", "runqlat", "wakeup", "offwake")
EXPORTERS = ("writeraw", "otlp")


def parse_duration(text: str | int | float) -> float:
    """'10s', '500ms', '1us', '2m', '1h', '7d' -> seconds; a bare number is seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 50us, 500ms, 10s, 5m, 1h, 7d)")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2)]


def parse_size(text: str | int) -> int:
    """'256MiB', '1GiB', '4096' -> bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 4096, 64KiB, 256MiB, 1GiB)")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]


def parse_hostport(text: str) -> str:
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not HOST:PORT: {text!r}")
    return f"{host or '0.0.0.0'}:{port}"


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


# --- the schema ---------------------------------------------------------------

def _opt(doc: str, kind: str, lo: float | None = None, hi: float | None = None,
         choices: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"doc": doc, "kind": kind, "lo": lo, "hi": hi, "choices": choices}


@dataclass(frozen=True)
class Targets:
    pids: tuple[int, ...] = field(default=(), metadata=_opt(
        "Profile only these process IDs.", "int_list", 1))
    comm: tuple[str, ...] = field(default=(), metadata=_opt(
        "Profile processes whose command name matches one of these regular expressions.",
        "regex_list"))
    exe: tuple[str, ...] = field(default=(), metadata=_opt(
        "Profile processes whose executable path matches one of these regular expressions.",
        "regex_list"))
    cgroups: tuple[str, ...] = field(default=(), metadata=_opt(
        "Profile processes in these cgroup v2 paths (and below), e.g. /system.slice/nginx.service.",
        "str_list"))

    @property
    def whole_host(self) -> bool:
        return not (self.pids or self.comm or self.exe or self.cgroups)


@dataclass(frozen=True)
class KubernetesConfig:
    enabled: bool = field(default=False, metadata=_opt(
        "Label profiles with namespace, pod, container and pod labels (pod_label_*) of "
        "the pods on this node, watched from the API server.", "bool"))
    node_name: str = field(default="", metadata=_opt(
        "This node's name; empty: $NODE_NAME (the DaemonSet sets it from spec.nodeName).",
        "str"))
    api_server: str = field(default="", metadata=_opt(
        "API server URL; empty: in-cluster (https://$KUBERNETES_SERVICE_HOST:"
        "$KUBERNETES_SERVICE_PORT).", "str"))
    token_file: str = field(default="/var/run/secrets/kubernetes.io/serviceaccount/token",
                            metadata=_opt("Service account token (re-read on every request: "
                                          "projected tokens rotate).", "path"))
    ca_file: str = field(default="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                         metadata=_opt("CA certificate of the API server.", "path"))
    pod_labels: bool = field(default=True, metadata=_opt(
        "Add each pod label as pod_label_<name> (before relabeling).", "bool"))


@dataclass(frozen=True)
class AgentConfig:
    collector: str = field(default="127.0.0.1:7070", metadata=_opt(
        "gRPC address of the collector (ember collector, or a Parca server).", "hostport"))
    interval: float = field(default=10.0, metadata=_opt(
        "How often the kernel maps are drained and profiles shipped.", "duration", 1, 3600))
    frequency: int = field(default=19, metadata=_opt(
        "On-CPU samples per second per CPU.", "int", 1, 10000))
    cpu: bool = field(default=True, metadata=_opt("Collect on-CPU profiles.", "bool"))
    offcpu: bool = field(default=True, metadata=_opt(
        "Collect off-CPU profiles: time blocked, from switch-out to switch-in, with "
        "duration-weighted sampling (see offcpu_sample).", "bool"))
    runqlat: bool = field(default=False, metadata=_opt(
        "Collect run-queue latency: time runnable threads waited for a CPU, as a profile "
        "and as the ember_runqueue_latency_seconds histogram per process (stacks are "
        "walked at every switch: several times the off-CPU profile's cost).", "bool"))
    wakeup: bool = field(default=False, metadata=_opt(
        "Collect wakeup profiles: wakers' stacks weighted by the time their wakees were "
        "blocked (one more stack walk per wakeup).", "bool"))
    offwake: bool = field(default=False, metadata=_opt(
        "Collect off-wake profiles: blocked stacks joined with their wakers' stacks.", "bool"))
    kernel_stacks: tuple[str, ...] = field(default=PROFILE_TYPES, metadata=_opt(
        "Profile types that record kernel stacks: true (all), false (none) or a list of "
        "cpu, offcpu, runqlat, wakeup, offwake. Run-queue, wakeup and off-wake profiles "
        "come from one program: a stack kind one of them records, all three record.",
        "type_list", choices=PROFILE_TYPES))
    user_stacks: tuple[str, ...] = field(default=PROFILE_TYPES, metadata=_opt(
        "Profile types that record user stacks (as kernel_stacks).", "type_list",
        choices=PROFILE_TYPES))
    offcpu_sample: float = field(default=0.001, metadata=_opt(
        "Off-CPU: blocks at least this long are always recorded with their stacks; a "
        "shorter block of duration d with probability d/offcpu_sample, counted as "
        "offcpu_sample of time, so totals stay unbiased while short, frequent blocks cost "
        "almost nothing. 0 records every block with the exact program instead (stacks "
        "walked at every switch; time split at the wakeup, scheduler frames kept).",
        "duration", 0, 4))
    min_block: float = field(default=0.000001, metadata=_opt(
        "Off-CPU: ignore blocks shorter than this.", "duration", 0, 3600))
    max_block: float = field(default=0.0, metadata=_opt(
        "Off-CPU: ignore blocks longer than this (0: no limit).", "duration", 0, 86400 * 365))
    offcpu_sys_exit: bool = field(default=False, metadata=_opt(
        "Off-CPU: also take sampled blocks' user stacks at system call exit. Needed for "
        "programs that do not register rseq (Go, musl, glibc before 2.35), whose user "
        "stacks are otherwise lost (counted as user_late); costs about 0.1 us per system "
        "call on the whole host.", "bool"))
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig, metadata=_opt(
        "Pod metadata on Kubernetes.", "section"))
    relabel: tuple[Rule, ...] = field(default=(), metadata=_opt(
        "Prometheus-style relabeling of each profile's labels (source_labels, separator, "
        "regex, target_label, replacement, action: replace, keep, drop, labelmap, "
        "labeldrop, labelkeep), applied in order before shipping.", "relabel"))
    debug_dirs: tuple[str, ...] = field(default=("/usr/lib/debug",), metadata=_opt(
        "Where separate debug files are looked up, by build id (.build-id/xx/rest.debug) "
        "and by .gnu_debuglink name (CRC checked), in this order.", "str_list"))
    lines: bool = field(default=False, metadata=_opt(
        "Source files and lines from DWARF, with inlined functions as frames of "
        "their own (pprof Line entries). Parses debug info on the agent: more CPU and "
        "memory (within the symbol cache's share of memory_limit).", "bool"))
    symbol_cache_dir: str = field(default="", metadata=_opt(
        "Keep indexed symbol tables on disk here, by build id, so a restarted agent "
        "does not index every object again; empty: no disk cache. The systemd unit "
        "provides /var/cache/ember (CacheDirectory) for /var/cache/ember/symbols.", "str"))
    symbol_cache_size: int = field(default=256 << 20, metadata=_opt(
        "Bound of symbol_cache_dir; least recently used files are deleted past it.",
        "size", 1 << 20, 64 << 30))
    memory_limit: int = field(default=150 << 20, metadata=_opt(
        "The agent's memory ceiling (RSS). The symbol table cache gets a third of it; "
        "past 85% the caches shrink, counted in ember_memory_shrinks_total and "
        "ember_memory_released_bytes_total. Give systemd's MemoryMax or the container "
        "limit some headroom above it.", "size", 48 << 20))
    bpf_map_memory: int = field(default=64 << 20, metadata=_opt(
        "Kernel memory for ember's BPF maps, shared by the enabled profile types; the "
        "stack and counts map sizes are derived from it (ember_bpf_map_memory_bytes "
        "reports what the kernel charged).", "size", 8 << 20, 4 << 30))
    targets: Targets = field(default_factory=Targets, metadata=_opt(
        "What to profile; empty means the whole host. A process matching any rule is "
        "profiled. Filtering happens in the kernel.", "section"))
    target_refresh: float = field(default=2.0, metadata=_opt(
        "How often comm/exe/cgroup rules are re-evaluated against running processes.",
        "duration", 0.1, 3600))
    include_self: bool = field(default=False, metadata=_opt(
        "Profile the agent itself too.", "bool"))
    metrics_listen: str = field(default="127.0.0.1:7071", metadata=_opt(
        "HTTP address for /metrics, /healthz and /readyz.", "hostport"))
    spool_dir: str = field(default="/var/lib/ember/spool", metadata=_opt(
        "Where profiles wait while the collector is unreachable; survives restarts.", "path"))
    spool_max_size: int = field(default=256 << 20, metadata=_opt(
        "Spool size limit; past it the oldest profiles are dropped (and counted).", "size",
        1 << 20))
    send_timeout: float = field(default=10.0, metadata=_opt(
        "Deadline of one WriteRaw call.", "duration", 0.1, 600))
    max_backoff: float = field(default=60.0, metadata=_opt(
        "Upper bound of the exponential backoff between re-sends.", "duration", 0.1, 3600))
    token_file: str = field(default="", metadata=_opt(
        "File holding a bearer token sent to the collector (empty: none).", "path"))
    exporters: tuple[str, ...] = field(default=("writeraw",), metadata=_opt(
        "Where profiles go: writeraw (Parca's WriteRaw: ember collector or Parca, at "
        "collector) and/or otlp (OTLP profiles: an OpenTelemetry Collector, Grafana "
        "Pyroscope, at otlp_endpoint). Each has its own spool and retries.", "type_list",
        choices=EXPORTERS))
    otlp_endpoint: str = field(default="127.0.0.1:4317", metadata=_opt(
        "gRPC address of the OTLP endpoint (ProfilesService/Export).", "hostport"))
    otlp_token_file: str = field(default="", metadata=_opt(
        "File holding a bearer token for the OTLP endpoint (empty: none).", "path"))
    otlp_tls_ca: str = field(default="", metadata=_opt(
        "CA certificate (PEM) to verify the OTLP endpoint; set it to use TLS.", "path"))
    tls_ca: str = field(default="", metadata=_opt(
        "CA certificate (PEM) to verify the collector; set it to use TLS.", "path"))
    labels: tuple[tuple[str, str], ...] = field(default=(), metadata=_opt(
        "Extra labels on every profile (a mapping of Prometheus label names to values).",
        "labels"))


@dataclass(frozen=True)
class CollectorConfig:
    grpc_listen: str = field(default="127.0.0.1:7070", metadata=_opt(
        "gRPC address for ProfileStoreService/WriteRaw. Without a token, keep it on loopback.",
        "hostport"))
    http_listen: str = field(default="127.0.0.1:7072", metadata=_opt(
        "HTTP address of the query API.", "hostport"))
    storage: str = field(default="ember.db", metadata=_opt(
        "SQLite database file.", "path"))
    retention: float = field(default=7 * 86400.0, metadata=_opt(
        "Profiles older than this are deleted.", "duration", 60, 86400 * 3650))
    max_storage_size: int = field(default=1 << 30, metadata=_opt(
        "Past this database size, the oldest profiles are deleted.", "size", 1 << 20))
    max_request_size: int = field(default=16 << 20, metadata=_opt(
        "Largest WriteRaw request accepted; larger ones are rejected.", "size", 1 << 16,
        1 << 30))
    max_profile_size: int = field(default=64 << 20, metadata=_opt(
        "Largest decompressed pprof accepted (a gzip bomb is rejected).", "size", 1 << 16,
        1 << 31))
    token_file: str = field(default="", metadata=_opt(
        "File holding the bearer token clients must send (empty: no authentication).",
        "path"))
    tls_cert: str = field(default="", metadata=_opt(
        "Server certificate (PEM) for gRPC and HTTP; with tls_key, turns TLS on.", "path"))
    tls_key: str = field(default="", metadata=_opt("Private key (PEM) of tls_cert.", "path"))


@dataclass(frozen=True)
class Config:
    agent: AgentConfig = field(default_factory=AgentConfig, metadata=_opt(
        "The agent (ember agent).", "section"))
    collector: CollectorConfig = field(default_factory=CollectorConfig, metadata=_opt(
        "The collector (ember collector).", "section"))


# --- validation ---------------------------------------------------------------

def _where(path: str, node: yaml.Node | None, key: str) -> str:
    line = f":{node.start_mark.line + 1}" if node is not None else ""
    return f"{path}{line}: {key}"


def _scalar(node: yaml.Node) -> Any:
    return yaml.safe_load(yaml.serialize(node)) if node is not None else None


def _convert(kind: str, value: Any, meta: dict[str, Any]) -> Any:
    lo, hi = meta["lo"], meta["hi"]
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        out: Any = value
    elif kind == "duration":
        out = parse_duration(value)
    elif kind == "size":
        out = parse_size(value)
    elif kind == "hostport":
        if not isinstance(value, str):
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        return parse_hostport(value)
    elif kind == "path":
        if not isinstance(value, str):
            raise ValueError(f"expected a path, got {value!r}")
        return value
    elif kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {value!r}")
        return value
    elif kind == "relabel":
        if not isinstance(value, list):
            raise ValueError(f"expected a list of relabel rules, got {value!r}")
        rules = []
        allowed = {f.name for f in fields(Rule)}
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise ValueError(f"rule {i + 1}: expected a mapping, got {item!r}")
            unknown = set(item) - allowed
            if unknown:
                raise ValueError(f"rule {i + 1}: unknown key {sorted(unknown)[0]!r} "
                                 f"(known: {', '.join(sorted(allowed))})")
            args = dict(item)
            if "source_labels" in args:
                if not isinstance(args["source_labels"], list) or not all(
                        isinstance(x, str) for x in args["source_labels"]):
                    raise ValueError(f"rule {i + 1}: source_labels must be a list of names")
                args["source_labels"] = tuple(args["source_labels"])
            for k in ("separator", "regex", "target_label", "replacement", "action"):
                if k in args and not isinstance(args[k], str):
                    raise ValueError(f"rule {i + 1}: {k} must be a string")
            try:
                rules.append(Rule(**args))
            except ValueError as exc:
                raise ValueError(f"rule {i + 1}: {exc}") from None
        return tuple(rules)
    elif kind == "type_list":
        if isinstance(value, bool):
            return tuple(meta["choices"]) if value else ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"expected true, false or a list of profile types, got {value!r}")
        bad = [v for v in value if v not in meta["choices"]]
        if bad:
            raise ValueError(f"unknown profile type {bad[0]!r} "
                             f"(one of {', '.join(meta['choices'])})")
        return tuple(dict.fromkeys(value))
    elif kind in ("int_list", "str_list", "regex_list"):
        if not isinstance(value, list):
            raise ValueError(f"expected a list, got {value!r}")
        items = []
        for item in value:
            if kind == "int_list":
                if isinstance(item, bool) or not isinstance(item, int) or (lo and item < lo):
                    raise ValueError(f"expected positive integers, got {item!r}")
            elif not isinstance(item, str):
                raise ValueError(f"expected strings, got {item!r}")
            elif kind == "regex_list":
                try:
                    re.compile(item)
                except re.error as exc:
                    raise ValueError(f"bad regular expression {item!r}: {exc}") from None
            items.append(item)
        return tuple(items)
    elif kind == "labels":
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping of label names to values, got {value!r}")
        for k, v in value.items():
            if not isinstance(k, str) or not _LABEL_NAME.match(k) or k.startswith("__"):
                raise ValueError(f"not a valid label name: {k!r}")
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                raise ValueError(f"label {k} needs a string value, got {v!r}")
        return tuple(sorted((k, str(v)) for k, v in value.items()))
    else:  # pragma: no cover - schema error
        raise AssertionError(kind)
    if (lo is not None and out < lo) or (hi is not None and out > hi):
        raise ValueError(f"{value!r} is out of range [{lo}, {hi}]")
    return out


def _build(cls: type[Any], node: yaml.Node | None, path: str, prefix: str) -> Any:
    if node is None or (isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")):
        return cls()
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{_where(path, node, prefix or '(top level)')}: expected a mapping")
    known = {f.name: f for f in fields(cls)}
    values: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = _scalar(key_node)
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in known:
            hint = ", ".join(sorted(known))
            raise ConfigError(f"{_where(path, key_node, dotted)}: unknown key (known: {hint})")
        if key in values:
            raise ConfigError(f"{_where(path, key_node, dotted)}: duplicate key")
        f = known[key]
        kind = f.metadata["kind"]
        if kind == "section":
            sub = {"targets": Targets, "agent": AgentConfig, "collector": CollectorConfig,
                   "kubernetes": KubernetesConfig}[key]
            values[key] = _build(sub, value_node, path, dotted)
            continue
        try:
            values[key] = _convert(kind, _scalar(value_node), dict(f.metadata))
        except ValueError as exc:
            raise ConfigError(f"{_where(path, value_node, dotted)}: {exc}") from None
    return cls(**values)


def load(path: str | Path | None) -> Config:
    """Read and validate a config file; no file means all defaults."""
    if path is None:
        return Config()
    p = str(path)
    try:
        text = Path(p).read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text file") from None
    return loads(text, p)


def loads(text: str, path: str = "<config>") -> Config:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{line}: invalid YAML: {problem}") from None
    cfg: Config = _build(Config, node, path, "")
    return cfg


def read_token(path: str) -> str:
    """A bearer token from a file ('' when no file is configured)."""
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read token file: {exc.strerror}") from exc


def override(section: Any, **values: Any) -> Any:
    """A copy of a config section with the non-None values replaced."""
    return replace(section, **{k: v for k, v in values.items() if v is not None})


# --- reference documentation --------------------------------------------------

def _render_default(value: Any, kind: str) -> str:
    if kind == "duration":
        if 0 < value < 0.001:
            return f"{value * 1e6:g}us"
        if 0 < value < 1:
            return f"{value * 1e3:g}ms"
        return f"{value:g}s"
    if kind == "size":
        for unit in ("GiB", "MiB", "KiB"):
            if value % _SIZE_UNITS[unit] == 0 and value >= _SIZE_UNITS[unit]:
                return f"{value // _SIZE_UNITS[unit]}{unit}"
        return str(value)
    if kind == "bool":
        return "true" if value else "false"
    if kind == "type_list" and value == PROFILE_TYPES:
        return "true"
    if kind == "type_list":
        return "[" + ", ".join(value) + "]"
    if isinstance(value, tuple):
        return "[]" if not value else repr(list(value))
    return str(value) if value != "" else '""'


def reference() -> str:
    """Markdown reference of every key, generated from the schema."""
    out = ["# Configuration reference", "",
           "Generated from `daemon/ember/config.py` (`ember config-reference`); "
           "`tests/test_config.py` fails when this file is stale.", "",
           "Durations take `us`, `ms`, `s`, `m`, `h`, `d` suffixes; sizes take `KiB`, `MiB`, "
           "`GiB`. Command-line flags override the file.", ""]

    def section(cls: type[Any], prefix: str) -> None:
        rows = []
        subs = []
        for f in fields(cls):
            kind = f.metadata["kind"]
            name = f"{prefix}.{f.name}"
            if kind == "section":
                subs.append((f, name))
                continue
            default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[operator]
            rng = ""
            if f.metadata["lo"] is not None or f.metadata["hi"] is not None:
                rng = f" Range: {f.metadata['lo']} to {f.metadata['hi']}."
            rows.append(f"| `{name}` | {kind} | `{_render_default(default, kind)}` | "
                        f"{f.metadata['doc']}{rng} |")
        if rows:
            out.extend([f"## {prefix}", "", "| key | type | default | meaning |",
                        "|---|---|---|---|", *rows, ""])
        for f, name in subs:
            sub = {"targets": Targets, "kubernetes": KubernetesConfig}[f.name]
            out.extend([f"### {name}", "", f.metadata["doc"], ""])
            section(sub, name)

    for f in fields(Config):
        out.extend([f"# `{f.name}`", "", f.metadata["doc"], ""])
        section({"agent": AgentConfig, "collector": CollectorConfig}[f.name], f.name)
    return "\n".join(out).rstrip() + "\n"

