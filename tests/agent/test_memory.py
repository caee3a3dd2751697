"""The memory ceiling: caches shrink before the limit, every shrink counted;
BPF map sizes derived from one budget."""

from __future__ import annotations

from dataclasses import dataclass

from ember.agent.memory import (
    COUNT_ENTRY_BYTES,
    STACK_ENTRY_BYTES,
    MemoryGovernor,
    ShrinkReport,
    map_entries,
)


@dataclass
class FakeCache:
    name: str
    size: int

    def size_bytes(self) -> int:
        return self.size

    def shrink(self, fraction: float) -> int:
        freed = int(self.size * fraction)
        self.size -= freed
        return freed


def test_no_shrink_below_high_water() -> None:
    cache = FakeCache("a", 50 << 20)
    gov = MemoryGovernor(100 << 20, [cache], rss=lambda: 80 << 20)
    assert gov.check() == [] and cache.size == 50 << 20


def test_shrinks_largest_first_until_under_low_water() -> None:
    big, small = FakeCache("big", 60 << 20), FakeCache("small", 10 << 20)
    base = 20 << 20
    reports: list[ShrinkReport] = []
    gov = MemoryGovernor(100 << 20, [small, big], reports.append,
                         rss=lambda: base + big.size + small.size)
    out = gov.check()
    assert out[0].cache == "big"  # largest first
    assert base + big.size + small.size < 0.70 * (100 << 20)
    assert reports == out and sum(r.released for r in out) == (70 << 20) - big.size - small.size
    assert gov.shrinks == 1


def test_map_entries_stay_within_budget() -> None:
    for budget in (8 << 20, 64 << 20, 1 << 30):
        for kinds in (["cpu"], ["cpu", "offcpu"], ["cpu", "offcpu", "sched"]):
            entries = map_entries(budget, kinds)
            stack_maps = {"cpu": 2, "offcpu": 6, "sched": 3}
            used = sum(s * stack_maps[k] * STACK_ENTRY_BYTES + c * COUNT_ENTRY_BYTES
                       for k, (s, c) in entries.items())
            floor = sum(1024 * stack_maps[k] * STACK_ENTRY_BYTES + 2048 * COUNT_ENTRY_BYTES
                        for k in kinds)
            assert used <= max(budget, floor), (budget, kinds, entries)
            for s, c in entries.values():
                assert s & (s - 1) == 0 and c & (c - 1) == 0  # powers of two
    # more budget, bigger maps
    assert map_entries(256 << 20, ["cpu"])["cpu"][0] > map_entries(32 << 20, ["cpu"])["cpu"][0]
