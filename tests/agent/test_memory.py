"""The memory ceiling: caches shrink before the limit, every shrink counted."""

from __future__ import annotations

from dataclasses import dataclass

from ember.agent.memory import MemoryGovernor, ShrinkReport


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
    gov = MemoryGovernor(100 << 20, lambda: [cache], rss=lambda: 80 << 20)
    assert gov.check() == [] and cache.size == 50 << 20


def test_shrinks_largest_first_until_under_low_water() -> None:
    big, small = FakeCache("big", 60 << 20), FakeCache("small", 10 << 20)
    base = 20 << 20
    reports: list[ShrinkReport] = []
    gov = MemoryGovernor(100 << 20, lambda: [small, big], reports.append,
                         rss=lambda: base + big.size + small.size)
    out = gov.check()
    assert out[0].cache == "big"  # largest first
    assert base + big.size + small.size < 0.70 * (100 << 20)
    assert reports == out and sum(r.released for r in out) == (70 << 20) - big.size - small.size
    assert gov.shrinks == 1
