"""One drain of the agent, stage by stage, and the metrics of a drain in
one place.

    drain each program       session.drain (records -> samples per kind)
    split by process         one profile per process and kind
    label                    process labels, pod metadata, relabeling
    export                   each exporter encodes and spools
    account                  every counter a drain moves
    check memory             the governor shrinks caches past the ceiling
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass

from .. import abi, cache
from ..metrics import AgentMetrics
from ..model import Profile, merge_samples
from ..session import Drained
from ..symbols.objects import SymbolizerStats
from ..symbols.symbolizer import Symbolizer
from .labels import ProcessLabeler, split_by_process


@dataclass(frozen=True)
class Window:
    """The wall-clock interval a drain's profiles cover."""

    start_ns: int
    end_ns: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def process_profiles(drained: Iterable[Drained], labeler: ProcessLabeler, window: Window
                     ) -> tuple[list[Profile], int]:
    """One labelled profile per process and kind; and how many profiles the
    relabeling rules dropped."""
    profiles, dropped = [], 0
    for d in drained:
        for builder, samples in d.samples:
            for pid, own in split_by_process(samples).items():
                labels = labeler.labels(builder.ptype, pid, own[0].thread_name)
                if labels is None:
                    dropped += 1
                    continue
                profiles.append(Profile(builder.ptype, merge_samples(own), window.start_ns,
                                        window.duration_ns, labels))
    return profiles, dropped


class DrainAccounting:
    """Every counter one drain moves: events and drops per program, map fill,
    symbolization, the disk symbol cache, profiles built and dropped, spool
    sizes, cache sizes."""

    def __init__(self, metrics: AgentMetrics, symbolizer: Symbolizer):
        self.m = metrics
        self.symbolizer = symbolizer
        self._symbolized = SymbolizerStats()
        self._disk: dict[str, int] = {}
        self._evicted: dict[str, int] = {}

    def begin(self) -> None:
        """Note the symbolizer's counters before the drain."""
        self._symbolized = SymbolizerStats(*astuple(self.symbolizer.stats))

    def end(self, drained: Sequence[Drained], profiles: Sequence[Profile],
            relabel_dropped: int, spooled: tuple[int, int]) -> None:
        """Every counter of the drain that began at ``begin``."""
        self._programs(drained)
        for p in profiles:
            self.m.profiles_built.labels(p.type.name).inc()
        self.m.profiles_dropped.labels("relabel").inc(relabel_dropped)
        self._symbolization()
        self._storage(spooled)

    def _programs(self, drained: Sequence[Drained]) -> None:
        m = self.m
        for d in drained:
            kind, stats, program = d.program.name, d.result.stats, d.program
            m.samples.labels(kind).inc(stats.events)
            blocked = sum(r.total_ns for r in d.result.records if r.kind == abi.KIND_BLOCKED)
            if blocked:
                m.offcpu_seconds.inc(blocked / 1e9)
            m.stacks_lost.labels(kind, "evicted").inc(stats.stacks_missing)
            m.stacks_lost.labels(kind, "truncated").inc(stats.stacks_truncated)
            m.map_fill.labels(kind, "counts").set(stats.records / program.counts_map.max_entries)
            if program.starts_map is not None:
                m.map_fill.labels(kind, "starts").set(
                    stats.pending / program.starts_map.max_entries)
                m.offcpu_in_flight_seconds.inc(sum(
                    r.total_ns for r in d.result.records
                    if r.in_flight and r.kind == abi.KIND_BLOCKED) / 1e9)
                m.blocked_threads.set(stats.blocked_threads)
                m.longest_block.set(stats.longest_block_ns / 1e9)
            m.drain_seconds.labels(kind).observe(d.seconds)

    def _symbolization(self) -> None:
        """Over the whole drain; the disk symbol cache too."""
        m, before, now = self.m, self._symbolized, self.symbolizer.stats
        frames = now.frames - before.frames
        unknown = now.unknown_frames - before.unknown_frames
        m.frames.inc(frames)
        m.unknown_frames.inc(unknown)
        m.unknown_ratio.set(unknown / frames if frames else 0)
        m.cache_hits.inc(now.cache_hits - before.cache_hits)
        m.cache_misses.inc(now.cache_misses - before.cache_misses)
        if (disk := self.symbolizer.objects.disk) is not None:
            for outcome in ("hits", "misses", "stored", "errors", "evicted"):
                value = getattr(disk.stats, outcome)
                m.disk_cache.labels(outcome).inc(value - self._disk.get(outcome, 0))
                self._disk[outcome] = value

    def _storage(self, spooled: tuple[int, int]) -> None:
        """Spool and cache sizes, evictions, when the drain ended."""
        m = self.m
        m.spool_batches.set(spooled[0])
        m.spool_bytes.set(spooled[1])
        m.last_drain.set(time.time())
        for name, (size, evicted) in cache.sizes().items():
            m.cache_bytes.labels(name).set(size)
            m.cache_evictions.labels(name).inc(max(0, evicted - self._evicted.get(name, 0)))
            self._evicted[name] = evicted
