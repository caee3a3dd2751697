"""Every metric ember exports, defined here against an injected registry.

Names follow Prometheus conventions: the ``ember_`` namespace, base units
(seconds, bytes), ``_total`` on counters, label values from fixed sets.
Counters that live in BPF maps (per-CPU ``ember_stats``) and kernel BPF
run-time statistics are read at scrape time by ``BpfStatsCollector``, never
copied on a timer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from . import __version__, abi
from .errors import ALL_ERRORS


class ProgramStats(Protocol):
    """What the scrape-time collector reads of a loaded BPF program
    (kernel/program.py Program)."""

    @property
    def block_sampling(self) -> bool: ...
    def stats(self) -> Mapping[abi.Stat, int]: ...
    def run_stats(self) -> tuple[int, int]: ...
    def map_memory(self) -> dict[str, int]: ...
    def runq_histogram(self) -> dict[int, list[int]]: ...

#: BPF stat -> (metric, labels) for the kernel-side drop and event counters.
_LOST = {
    abi.Stat.USER_STACK_COLLISION: "user_collision",
    abi.Stat.KERNEL_STACK_COLLISION: "kernel_collision",
    abi.Stat.USER_STACK_ERROR: "user_error",
    abi.Stat.KERNEL_STACK_ERROR: "kernel_error",
    abi.Stat.USER_STACK_LATE: "user_late",
    abi.Stat.KERNEL_STACK_STALE: "kernel_stale",
    abi.Stat.UNWIND_COLLISION: "user_unwound_collision",
}

#: BPF stat -> outcome of a user stack walk from unwind tables (or none).
_UNWIND = {
    abi.Stat.UNWIND_ROOT: "unwound",
    abi.Stat.UNWIND_NO_TABLE: "no_table",
    abi.Stat.UNWIND_TRUNCATED: "truncated",
    abi.Stat.UNWIND_UNSUPPORTED: "unsupported_rule",
    abi.Stat.UNWIND_READ_FAILED: "read_failed",
    abi.Stat.UNWIND_NO_MAPPING: "no_mapping",
    abi.Stat.UNWIND_BAD_FRAME: "bad_frame",
}


def _process_metrics(r: CollectorRegistry) -> None:
    """ember_build_info and the process's own CPU and memory (both roles)."""
    Info("ember_build", "ember version", registry=r).info({"version": __version__})
    ProcessCollector(namespace="ember", registry=r)


@dataclass(frozen=True)
class ShipCounters:
    """The counters one shipper updates (names as the WriteRaw ones)."""

    profiles_sent: Counter
    bytes_sent: Counter
    send_failures: Counter
    spool_dropped: Counter
    spool_dropped_bytes: Counter
    # children of the wire-labelled spool metrics below
    quarantined: Counter
    write_errors: Counter
    held_bytes: Gauge
    oldest_age: Gauge


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = r = registry
        _process_metrics(r)
        self.samples = Counter("ember_samples_total",
                               "Events drained from the kernel: on-CPU samples, off-CPU blocks",
                               ["type"], registry=r)
        self.offcpu_seconds = Counter("ember_offcpu_seconds_total", "Off-CPU time collected",
                                      registry=r)
        self.offcpu_in_flight_seconds = Counter(
            "ember_offcpu_in_flight_seconds_total",
            "Off-CPU time of blocks still in progress, charged to the interval it passed "
            "in (part of ember_offcpu_seconds_total)", registry=r)
        self.blocked_threads = Gauge(
            "ember_offcpu_blocked_threads",
            "Threads of the targets blocked at the last drain since before its previous one "
            "(sampled off-CPU), or at all (exact off-CPU)", registry=r)
        self.longest_block = Gauge("ember_offcpu_longest_block_seconds", "How long the "
                                   "longest-blocked of those threads has been blocked", registry=r)
        self.stacks_lost = Counter("ember_stacks_lost_total",
                                   "Stacks that reached a profile only as a marker frame, "
                                   "by reason (evicted: gone from the stack map; truncated: "
                                   "cut at 127 frames)", ["type", "reason"], registry=r)
        self.drain_seconds = Histogram("ember_drain_duration_seconds",
                                       "Time to drain one program's maps and build its samples",
                                       ["type"], registry=r,
                                       buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        self.frames = Counter("ember_symbolizer_frames_total", "Frames symbolized", registry=r)
        self.unknown_frames = Counter("ember_symbolizer_unknown_frames_total", "Frames named "
                                      "only by object+offset or [unknown]", registry=r)
        self.unknown_ratio = Gauge("ember_symbolizer_unknown_frame_ratio",
                                   "Share of unnamed frames in the last drain", registry=r)
        self.cache_hits = Counter("ember_symbolizer_cache_hits_total", "Symbol table cache hits",
                                  registry=r)
        self.cache_misses = Counter("ember_symbolizer_cache_misses_total",
                                    "Symbol table cache misses (object parsed)", registry=r)
        self.disk_cache = Counter("ember_symbolizer_disk_cache_total",
                                  "Symbol indexes on disk (agent.symbol_cache_dir) by result: "
                                  "hits, misses, stored, errors (corrupt or unwritable "
                                  "files), evicted", ["result"], registry=r)
        self.profiles_built = Counter("ember_profiles_built_total", "Profiles built", ["type"],
                                      registry=r)
        self.profiles_dropped = Counter("ember_profiles_dropped_total",
                                        "Profiles not shipped on purpose, by reason (relabel: "
                                        "a keep/drop rule)", ["reason"], registry=r)
        self.otlp_sent = Counter("ember_otlp_profiles_sent_total",
                                 "Profiles accepted by the OTLP endpoint", registry=r)
        self.otlp_bytes_sent = Counter("ember_otlp_sent_bytes_total",
                                       "Bytes of OTLP export requests accepted", registry=r)
        self.otlp_failures = Counter("ember_otlp_send_failures_total",
                                     "Failed OTLP exports, by gRPC status", ["reason"], registry=r)
        self.otlp_dropped = Counter("ember_otlp_dropped_profiles_total",
                                    "Profiles dropped on the OTLP path: spool full, or "
                                    "rejected by the endpoint", registry=r)
        self.otlp_dropped_bytes = Counter("ember_otlp_dropped_bytes_total",
                                          "Bytes dropped on the OTLP path", registry=r)
        self.pyroscope_sent = Counter("ember_pyroscope_profiles_sent_total",
                                      "Profiles accepted by Pyroscope", registry=r)
        self.pyroscope_bytes_sent = Counter("ember_pyroscope_sent_bytes_total",
                                            "Bytes of Pyroscope push requests accepted", registry=r)
        self.pyroscope_failures = Counter("ember_pyroscope_send_failures_total",
                                          "Failed Pyroscope pushes, by gRPC status",
                                          ["reason"], registry=r)
        self.pyroscope_dropped = Counter("ember_pyroscope_dropped_profiles_total",
                                         "Profiles dropped on the Pyroscope path: spool full, "
                                         "or refused by Pyroscope for good", registry=r)
        self.pyroscope_dropped_bytes = Counter("ember_pyroscope_dropped_bytes_total",
                                               "Bytes dropped on the Pyroscope path", registry=r)
        self.profiles_sent = Counter("ember_profiles_sent_total",
                                     "Profiles accepted by the collector", registry=r)
        self.bytes_sent = Counter("ember_sent_bytes_total",
                                  "Bytes of WriteRaw requests accepted", registry=r)
        self.send_failures = Counter("ember_send_failures_total",
                                     "Failed WriteRaw calls, by gRPC status", ["reason"],
                                     registry=r)
        self.spool_bytes = Gauge("ember_spool_bytes", "Bytes waiting in the spool", registry=r)
        self.spool_batches = Gauge("ember_spool_batches", "Requests waiting in the spool",
                                   registry=r)
        self.spool_dropped = Counter("ember_spool_dropped_profiles_total",
                                     "Profiles dropped: the spool over spool_max_size, the "
                                     "memory holding what a full disk refused over "
                                     "spool_memory_max, or refused by the collector for good",
                                     registry=r)
        self.spool_dropped_bytes = Counter("ember_spool_dropped_bytes_total",
                                           "Bytes of those dropped requests", registry=r)
        self.map_fill = Gauge("ember_bpf_map_fill_ratio",
                              "Entries over capacity at the last drain", ["type", "map"],
                              registry=r)
        self.memory_limit = Gauge("ember_memory_limit_bytes",
                                  "The RSS ceiling (memory_limit)", registry=r)
        self.memory_shrinks = Counter("ember_memory_shrinks_total",
                                      "Times a cache was shrunk to stay under memory_limit",
                                      ["cache"], registry=r)
        self.memory_released = Counter("ember_memory_released_bytes_total",
                                       "Cache bytes given up to stay under memory_limit",
                                       ["cache"], registry=r)
        self.cache_bytes = Gauge("ember_cache_bytes", "Approximate size of each cache",
                                 ["cache"], registry=r)
        self.cache_evictions = Counter("ember_cache_evictions_total",
                                       "Entries a cache gave up to stay within its bound",
                                       ["cache"], registry=r)
        self.spool_quarantined = Counter(
            "ember_spool_quarantined_total",
            "Spooled requests that could not be read or decoded, moved to the spool's "
            "quarantine/ folder", ["wire"], registry=r)
        self.spool_write_errors = Counter(
            "ember_spool_write_errors_total",
            "Spool writes the disk refused (full, read-only, I/O error): the request is held "
            "in memory instead", ["wire"], registry=r)
        self.spool_held_bytes = Gauge(
            "ember_spool_held_bytes",
            "Requests held in memory because the spool's disk refused them", ["wire"], registry=r)
        self.spool_oldest_age = Gauge(
            "ember_spool_oldest_age_seconds",
            "How long the oldest waiting request has waited (0: none waits)", ["wire"],
            registry=r)
        #: what each shipper counts, by wire
        self.shipping = {
            wire: ShipCounters(sent, sent_bytes, failures, dropped, dropped_bytes,
                               self.spool_quarantined.labels(wire),
                               self.spool_write_errors.labels(wire),
                               self.spool_held_bytes.labels(wire),
                               self.spool_oldest_age.labels(wire))
            for wire, sent, sent_bytes, failures, dropped, dropped_bytes in (
                ("writeraw", self.profiles_sent, self.bytes_sent, self.send_failures,
                 self.spool_dropped, self.spool_dropped_bytes),
                ("otlp", self.otlp_sent, self.otlp_bytes_sent, self.otlp_failures,
                 self.otlp_dropped, self.otlp_dropped_bytes),
                ("pyroscope", self.pyroscope_sent, self.pyroscope_bytes_sent,
                 self.pyroscope_failures, self.pyroscope_dropped, self.pyroscope_dropped_bytes))}
        self.errors = Counter("ember_errors_total", "Errors by kind", ["reason"], registry=r)
        for err in ALL_ERRORS:
            self.errors.labels(err.label)
        self.targets = Gauge("ember_targets", "Processes selected by the target rules "
                             "(0 when profiling the whole host)", registry=r)
        self.last_drain = Gauge("ember_last_drain_timestamp_seconds",
                                "When the last drain finished", registry=r)


class UnwindStats(Protocol):
    """What the scrape reads of the unwind table loader (unwind/loader.py)."""

    tables_loaded: int
    tables_evicted: int
    tables_failed: dict[str, int]
    rows_loaded: int
    processes: int
    processes_dropped: int
    mappings_dropped: int


class PythonStats(Protocol):
    """What the scrape reads of the Python frame namer (runtimes/pycode.py)."""

    @property
    def frames(self) -> int: ...
    def failed(self) -> Mapping[str, int]: ...
    def processes(self) -> Mapping[str, int]: ...
    def refused(self) -> Mapping[str, int]: ...


class BpfStatsCollector(Collector):
    """Reads the BPF programs' own counters when Prometheus scrapes."""

    def __init__(self, programs: Callable[[], Mapping[str, ProgramStats]],
                 comm_of: Callable[[int], str] | None = None,
                 unwind: Callable[[], tuple[UnwindStats, int] | None] = lambda: None,
                 python: PythonStats | None = None):
        self.programs = programs
        self.comm_of = comm_of or (lambda pid: "")
        self.unwind = unwind  # (loader stats, row capacity), None without tables
        self.python = python

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily("ember_bpf_events_total", "Events the BPF programs "
                                     "counted (kernel side)", labels=["type"])
        dropped = CounterMetricFamily("ember_bpf_dropped_total", "Events dropped in the "
                                      "kernel, by reason", labels=["type", "reason"])
        lost = CounterMetricFamily("ember_bpf_stacks_lost_total",
                                   "Stack captures that failed in the kernel, by reason",
                                   labels=["type", "reason"])
        blocks = CounterMetricFamily("ember_bpf_offcpu_blocks_total",
                                     "Off-CPU blocks seen, and those whose stacks were taken "
                                     "(duration-weighted sampling)", labels=["type", "stage"])
        run_s = CounterMetricFamily("ember_bpf_program_run_seconds_total",
                                    "Time the kernel spent running ember's programs "
                                    "(needs kernel.bpf_stats_enabled=1)", labels=["type"])
        map_bytes = GaugeMetricFamily("ember_bpf_map_memory_bytes",
                                      "Kernel memory of each BPF map (fdinfo memlock)",
                                      labels=["type", "map"])
        runs = CounterMetricFamily("ember_bpf_program_runs_total", "Runs of ember's programs "
                                   "(needs kernel.bpf_stats_enabled=1)", labels=["type"])
        unwind = CounterMetricFamily(
            "ember_bpf_unwind_stacks_total",
            "User stacks by how the table unwinder ended: unwound (to the root), "
            "no_table (the process has none yet: frame pointers), truncated, "
            "unsupported_rule, read_failed, no_mapping, bad_frame (each cut stack ends "
            "in an [unwind stopped: ...] frame)", labels=["type", "outcome"])
        fp_frames = CounterMetricFamily(
            "ember_bpf_unwind_fp_frames_total",
            "Frames inside table walks taken by frame pointers (code without a table: "
            "JIT, anonymous memory, vdso)", labels=["type"])
        py_frames = CounterMetricFamily(
            "ember_bpf_python_frames_total",
            "Python frames the kernel put into table-walked stacks", labels=["type"])
        py_failed = CounterMetricFamily(
            "ember_bpf_python_walks_failed_total",
            "Walks of a Python process's frames that gave up: no_thread_state (the "
            "thread has none: not a Python thread, or more than 32 threads before it), "
            "read_failed (a frame could not be read), not_code (a frame's code was no "
            "code object: a thread caught entering the eval loop)", labels=["type", "reason"])
        for kind, prog in self.programs().items():
            try:
                stats = prog.stats()
            except Exception:  # a program closing while scraped
                continue
            py_frames.add_metric([kind], stats[abi.Stat.PY_FRAMES])
            py_failed.add_metric([kind, "no_thread_state"], stats[abi.Stat.PY_NO_THREAD])
            py_failed.add_metric([kind, "read_failed"], stats[abi.Stat.PY_READ_FAILED])
            py_failed.add_metric([kind, "not_code"], stats[abi.Stat.PY_NOT_CODE])
            events.add_metric([kind], stats[abi.Stat.COUNTED])
            dropped.add_metric([kind, "counts_map_full"], stats[abi.Stat.COUNTS_FULL])
            dropped.add_metric([kind, "threads_map_full"], stats[abi.Stat.THREADS_FULL])
            for stat, reason in _LOST.items():
                lost.add_metric([kind, reason], stats[stat])
            for stat, outcome in _UNWIND.items():
                unwind.add_metric([kind, outcome], stats[stat])
            fp_frames.add_metric([kind], stats[abi.Stat.UNWIND_FP_FRAMES])
            if prog.block_sampling:
                blocks.add_metric([kind, "seen"], stats[abi.Stat.EVENTS])
                blocks.add_metric([kind, "sampled"], stats[abi.Stat.SAMPLED])
            t, n = prog.run_stats()
            run_s.add_metric([kind], t / 1e9)
            runs.add_metric([kind], n)
            for name, size in prog.map_memory().items():
                map_bytes.add_metric([kind, name], size)
        yield from (events, dropped, lost, blocks, run_s, runs, map_bytes, unwind, fp_frames,
                    py_frames, py_failed)
        yield from self._unwind_tables()
        yield from self._python()
        yield self._runq_histogram()

    def _unwind_tables(self) -> Iterator[Metric]:
        tables = CounterMetricFamily(
            "ember_unwind_tables_total",
            "Objects' unwind tables: loaded into the kernel, evicted (unused, to make "
            "room), or not loaded by reason (full: no room even after evicting; "
            "unreadable, empty, or the error that made it unusable)", labels=["outcome"])
        rows = GaugeMetricFamily("ember_unwind_rows",
                                 "Rows of unwind tables in the kernel, and room for them",
                                 labels=["state"])
        procs = GaugeMetricFamily("ember_unwind_processes",
                                  "Processes whose stacks are walked from unwind tables")
        dropped = CounterMetricFamily(
            "ember_unwind_dropped_total",
            "Left to frame pointers: processes (the process map was full) and "
            "executable mappings (past 128 in one process)", labels=["what"])
        got = self.unwind()
        if got is not None:
            st, capacity = got
            tables.add_metric(["loaded"], st.tables_loaded)
            tables.add_metric(["evicted"], st.tables_evicted)
            for reason, n in sorted(st.tables_failed.items()):
                tables.add_metric([reason], n)
            rows.add_metric(["used"], st.rows_loaded)
            rows.add_metric(["capacity"], capacity)
            procs.add_metric([], st.processes)
            dropped.add_metric(["processes"], st.processes_dropped)
            dropped.add_metric(["mappings"], st.mappings_dropped)
        yield from (tables, rows, procs, dropped)

    def _python(self) -> Iterator[Metric]:
        procs = GaugeMetricFamily("ember_python_processes",
                                  "CPython processes whose frames are walked, by version",
                                  labels=["version"])
        refused = CounterMetricFamily(
            "ember_python_refused_total",
            "CPython processes left without Python frames, by reason: "
            "unsupported_version, no_btf, layout_mismatch (the process disagrees with the "
            "layout of its version), free_threaded, read_failed, no_mapping",
            labels=["reason"])
        named = CounterMetricFamily(
            "ember_python_frames_named_total",
            "Python frames named from process memory: named, or why not (code_freed: "
            "the code object was freed since the sample; read_failed; bad_string; "
            "bad_linetable; not_python)", labels=["outcome"])
        if self.python is not None:
            for version, n in sorted(self.python.processes().items()):
                procs.add_metric([version], n)
            for reason, n in sorted(self.python.refused().items()):
                refused.add_metric([reason], n)
            failures = self.python.failed()
            named.add_metric(["named"], self.python.frames - sum(failures.values()))
            for reason, n in sorted(failures.items()):
                named.add_metric([reason], n)
        yield from (procs, refused, named)

    def _runq_histogram(self) -> Metric:
        """Run-queue latency per process from the kernel's log2 histogram:
        slot s counts waits of [2^s, 2^(s+1)) microseconds."""
        h = HistogramMetricFamily("ember_runqueue_latency_seconds",
                                  "Time runnable threads waited for a CPU, per process",
                                  labels=["pid", "comm"])
        for prog in self.programs().values():
            try:
                per_pid = prog.runq_histogram()
            except Exception:
                continue
            for pid, slots in sorted(per_pid.items()):
                buckets, acc = [], 0
                for s, n in enumerate(slots):
                    acc += n
                    buckets.append((f"{2 ** (s + 1) / 1e6:g}", acc))
                buckets[-1] = ("+Inf", acc)
                # the sum is not kept in the kernel: estimate from bucket midpoints
                total = sum(n * 1.5 * 2 ** s / 1e6 for s, n in enumerate(slots))
                h.add_metric([str(pid), self.comm_of(pid)], buckets, total)
        return h


class CollectorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = r = registry
        _process_metrics(r)
        self.requests = Counter("ember_collector_requests_total", "WriteRaw calls by gRPC status "
                                "(resource_exhausted: refused for load)", ["code"], registry=r)
        self.profiles = Counter("ember_collector_profiles_stored_total", "Profiles stored",
                                registry=r)
        self.duplicates = Counter("ember_collector_duplicate_profiles_total",
                                  "Profiles received again and stored once", registry=r)
        self.rejected = Counter("ember_collector_rejected_total", "Requests rejected, by reason",
                                ["reason"], registry=r)
        self.deleted = Counter("ember_collector_profiles_deleted_total",
                               "Profiles removed by retention", ["reason"], registry=r)
        self.storage_bytes = Gauge("ember_collector_storage_bytes", "Database size", registry=r)
        self.queries = Counter("ember_collector_queries_total", "HTTP API requests by status",
                               ["code"], registry=r)
        self.rows_skipped = Counter(
            "ember_collector_rows_skipped_total",
            "Stored profiles a query left out, by reason (corrupt: not a readable profile; "
            "shape: other sample types than the rest)", ["reason"], registry=r)
        self.repaired = Counter(
            "ember_collector_profiles_repaired_total",
            "Profiles accepted after a repair, by kind (utf8: strings made valid UTF-8; "
            "depth: stacks capped at the depth limit)", ["reason"], registry=r)
        self.trees = Counter(
            "ember_collector_trees_total",
            "Merged trees the query API made, by how (merged: summed from the stored rows; "
            "slid: the last tree of the same query and range length moved on in time)",
            ["how"], registry=r)
        self.cache_bytes = Gauge("ember_collector_cache_bytes", (
            "Approximate size of each query API cache (collector_trees: merged trees; "
            "collector_windows: the latest tree per query, to slide; collector_sums: merged sums; "
            "collector_block_sums: sealed blocks' sums; collector_answers: answers; "
            "collector_arrays: freed large arrays kept for the next query)"), ["cache"], registry=r)
        self.cache_evictions = Counter("ember_collector_cache_evictions_total", "Entries a query "
                                       "API cache gave up to stay in bounds", ["cache"], registry=r)
        self.sealed = Counter("ember_collector_blocks_sealed_total", "Blocks of a profile type "
                              "(five minutes, 30 minutes, three hours) summed into roll-ups "
                              "(merges of every series read them)", registry=r)
        self.clustered = Counter("ember_collector_rows_clustered_total", "Sealed blocks' rows "
                                 "grouped by series (a merge of a few reads fewer)", registry=r)
        self.interned = Gauge("ember_collector_interned", "What the store's tables hold, each "
                              "also held in memory: threads, series, stacks, frames, leaves "
                              "(distinct thread name and stack pairs)", ["table"], registry=r)


def reference() -> str:
    """Markdown of every metric exported (docs/metrics.md; tests/test_metrics.py)."""
    out = ["# Metrics reference", "",
           "Generated from `daemon/ember/metrics.py` (`ember metrics-reference`); "
           "`tests/test_metrics.py` fails when this file is stale. Also exported: "
           "`ember_process_*` (CPU seconds, resident memory, open file descriptors) from "
           "prometheus-client's process collector. Metrics marked *scrape time* are read "
           "from the kernel's BPF maps when Prometheus scrapes.", ""]
    agent = AgentMetrics(CollectorRegistry())
    collector = CollectorMetrics(CollectorRegistry())
    for title, where, holder, extra in (
            ("Agent", "`agent.metrics_listen` (`/metrics`)", agent, _BPF_FAMILIES),
            ("Collector", "the collector's HTTP address (`/metrics`)", collector, {})):
        rows = []
        for m in vars(holder).values():
            if isinstance(m, (Counter, Gauge, Histogram, Info)):
                name = m._name + ("_total" if isinstance(m, Counter) else "")
                kind = type(m).__name__.lower()
                rows.append(f"| `{name}` | {kind} | {', '.join(m._labelnames) or '-'} | "
                            f"{m._documentation} |")
        for name, (kind, labels, doc) in extra.items():
            rows.append(f"| `{name}` | {kind} | {', '.join(labels)} | {doc} (scrape time) |")
        out += [f"## {title}", "", f"Served on {where}.", "",
                "| metric | type | labels | meaning |", "|---|---|---|---|", *sorted(rows), ""]
    return "\n".join(out).rstrip() + "\n"


def _families() -> dict[str, tuple[str, tuple[str, ...], str]]:
    """The BPF collector's families: name -> (type, labels, help)."""
    return {fam.name + ("_total" if fam.type == "counter" else ""):
            (fam.type, _FAMILY_LABELS[fam.name], fam.documentation)
            for fam in BpfStatsCollector(lambda: {}).collect()}


_FAMILY_LABELS = {
    "ember_bpf_events": ("type",), "ember_bpf_dropped": ("type", "reason"),
    "ember_bpf_stacks_lost": ("type", "reason"), "ember_bpf_offcpu_blocks": ("type", "stage"),
    "ember_bpf_program_run_seconds": ("type",), "ember_bpf_program_runs": ("type",),
    "ember_bpf_map_memory_bytes": ("type", "map"), "ember_bpf_unwind_fp_frames": ("type",),
    "ember_bpf_unwind_stacks": ("type", "outcome"), "ember_unwind_tables": ("outcome",),
    "ember_unwind_rows": ("state",), "ember_unwind_processes": (),
    "ember_unwind_dropped": ("what",),
    "ember_bpf_python_frames": ("type",), "ember_bpf_python_walks_failed": ("type", "reason"),
    "ember_python_processes": ("version",), "ember_python_refused": ("reason",),
    "ember_python_frames_named": ("outcome",), "ember_runqueue_latency_seconds": ("pid", "comm"),
}
_BPF_FAMILIES = _families()
