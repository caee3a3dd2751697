"""The epoch-flip drain: nothing lost, nothing counted twice, every stack the
one that was captured, however events and drains interleave."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember import abi
from ember.kernel.drain import STACK_MISSING, Drainer, Record
from tests.support.fakes import FakeProgram, NoGrace

STACKS = [(0x1000 + i, 0x2000 + i * 7, 0x3000) for i in range(6)]
KSTACKS = [(0xFFFFFFFF81000000 + i,) for i in range(3)]


def totals(records: list[Record]) -> Counter[tuple[object, ...]]:
    out: Counter[tuple[object, ...]] = Counter()
    for r in records:
        out[(r.tid, r.user.ips, r.kernel.ips, "n")] += r.count
        out[(r.tid, r.user.ips, r.kernel.ips, "ns")] += r.total_ns
    return out


def test_oncpu_samples_across_drains() -> None:
    fake = FakeProgram(generations=2)
    d = Drainer(fake, NoGrace(), clock=lambda: fake.clock)
    records: list[Record] = []
    fake.sample(1, 1, STACKS[0], KSTACKS[0])
    fake.sample(1, 1, STACKS[0], KSTACKS[0])
    records += d.drain().records
    fake.sample(1, 2, STACKS[1], KSTACKS[1])
    records += d.drain().records
    records += d.drain(final=True).records
    t = totals(records)
    assert t[(1, STACKS[0], KSTACKS[0], "n")] == 2
    assert t[(2, STACKS[1], KSTACKS[1], "n")] == 1
    assert not fake.counts_


def test_block_spanning_many_drains_keeps_its_stack() -> None:
    """A thread blocked for several intervals wakes after its stack slot was
    cleared and reused for other stacks: the carried copy names it."""
    fake = FakeProgram(generations=3)
    d = Drainer(fake, NoGrace(), clock=lambda: fake.clock)
    fake.switch_out(1, 10, STACKS[0], KSTACKS[0])
    records: list[Record] = []
    for i in range(5):
        fake.clock += 100
        # other threads reuse the same small stack ids in later epochs
        fake.switch_out(1, 11 + i, STACKS[1 + i % 4], KSTACKS[1])
        fake.clock += 1
        fake.switch_in(11 + i)
        records += d.drain().records
    fake.clock += 7
    fake.switch_in(10)
    records += d.drain().records
    t = totals(records)
    assert t[(10, STACKS[0], KSTACKS[0], "ns")] == 5 * 101 + 7
    assert all(r.user.problem is None for r in records)


def test_final_drain_reports_blocks_in_flight() -> None:
    fake = FakeProgram(generations=3)
    d = Drainer(fake, NoGrace(), clock=lambda: fake.clock)
    fake.switch_out(1, 10, STACKS[0], KSTACKS[0])
    fake.clock = 500
    result = d.drain(final=True, now_ns=500)
    [r] = result.records
    assert r.in_flight and r.total_ns == 500 and r.user.ips == STACKS[0]


def test_final_drain_in_flight_respects_limits() -> None:
    fake = FakeProgram(generations=3)
    d = Drainer(fake, NoGrace(), clock=lambda: fake.clock)
    fake.switch_out(1, 10, STACKS[0], KSTACKS[0])
    assert d.drain(final=True, now_ns=500, min_ns=600).records == []


def test_stack_errors_are_named() -> None:
    fake = FakeProgram(generations=2)
    d = Drainer(fake, NoGrace(), clock=lambda: fake.clock)
    key = abi.Key(pid=1, tid=1, user_stack_id=-17, kernel_stack_id=-14, comm=b"x")
    fake.counts_[bytes(key)] = (key, abi.Value(count=3))
    key2 = abi.Key(pid=1, tid=1, user_stack_id=42, kernel_stack_id=abi.STACK_NONE, comm=b"x")
    fake.counts_[bytes(key2)] = (key2, abi.Value(count=1))
    result = d.drain()
    problems = sorted((r.user.problem or "", r.kernel.problem or "") for r in result.records)
    assert problems == [("collision", "unavailable"), (STACK_MISSING, "not-requested")]
    assert result.stats.stacks_missing == 1


def test_sampled_offcpu_markers_are_named() -> None:
    """The sampled program marks a user stack it could not take where the
    block was (late) and a kernel stack whose slot was recycled (stale)."""
    fake = FakeProgram(generations=3)
    d = Drainer(fake, NoGrace(), clock=lambda: fake.clock)
    key = abi.Key(pid=1, tid=1, user_stack_id=abi.STACK_LATE, kernel_stack_id=abi.STACK_STALE,
                  comm=b"x", kind=abi.KIND_BLOCKED)
    fake.counts_[bytes(key)] = (key, abi.Value(count=12, total_ns=1_000_000))
    (r,) = d.drain().records
    assert (r.user.problem, r.kernel.problem) == ("late", STACK_MISSING)
    assert (r.count, r.total_ns) == (12, 1_000_000)


def test_generations_checked() -> None:
    with pytest.raises(ValueError):
        Drainer(FakeProgram(generations=4), NoGrace())


# when: 0 now, 1 during the next drain before its flip, 2 just after it
WHEN = st.integers(0, 3)
ops = st.lists(st.one_of(
    st.tuples(st.just("out"), st.integers(0, 4), st.integers(0, 5), st.integers(0, 2), WHEN),
    st.tuples(st.just("in"), st.integers(0, 4), WHEN),
    st.tuples(st.just("sample"), st.integers(0, 4), st.integers(0, 5), st.integers(0, 2)),
    st.tuples(st.just("drain")),
    st.tuples(st.just("tick"), st.integers(1, 1000)),
), max_size=80)


def schedule(fake: FakeProgram, when: int, event: Callable[[], None]) -> None:
    """Run event now (0), or inside the next drain: before (1) or after (2) its
    flip, or (3) after it has read the blocks in flight."""
    if when == 0:
        event()
    elif when == 1:
        fake.before_flip.append(event)
    elif when == 2:
        fake.after_flip.append(event)
    else:
        fake.after_starts.append(event)


def run_offcpu(program: list[tuple[int | str, ...]], generations: int) -> None:
    fake = FakeProgram(generations=generations)
    d = Drainer(fake, NoGrace(), clock=lambda: fake.clock)
    d.begin(fake.clock)
    blocks: list[list[object]] = []  # [tid, start, end or None, user, kernel]
    blocked: dict[int, list[object]] = {}
    drains: list[list[Record]] = []
    bounds = [fake.clock]

    def switch_out(tid: int, u: tuple[int, ...], k: tuple[int, ...]) -> None:
        if tid in blocked:
            return  # a blocked thread cannot run
        fake.switch_out(1, tid, u, k)
        blocked[tid] = [tid, fake.clock, None, u, k]
        blocks.append(blocked[tid])

    def switch_in(tid: int) -> None:
        if tid in blocked:
            blocked.pop(tid)[2] = fake.clock
            fake.switch_in(tid)

    def at(when: int, event: Callable[[], None]) -> None:
        schedule(fake, when, event)

    for op in program:
        if op[0] == "out":
            tid, u, k = int(op[1]), STACKS[int(op[2])], KSTACKS[int(op[3])]
            at(int(op[4]), lambda tid=tid, u=u, k=k: switch_out(tid, u, k))
        elif op[0] == "in":
            at(int(op[2]), lambda tid=int(op[1]): switch_in(tid))
        elif op[0] == "drain":
            drains.append(d.drain().records)
            bounds.append(fake.clock)
        elif op[0] == "tick":
            fake.clock += int(op[1])
    drains.append(d.drain(final=True).records)  # no now_ns: blocks in flight stop at the last drain

    # Each drain holds exactly the time that passed in its interval: the part
    # of every block between the previous drain and this one, blocks still in
    # flight included. The last one (final) holds what ended after the last
    # drain.
    expected: Counter[tuple[object, ...]] = Counter()
    for i, records in enumerate(drains):
        lo = bounds[i]
        hi = bounds[i + 1] if i + 1 < len(bounds) else None
        want: Counter[int] = Counter()
        for tid, start, end, u, k in blocks:
            assert isinstance(start, int) and isinstance(tid, int)
            stop = end if hi is None else (hi if end is None else min(hi, end))
            if isinstance(stop, int) and stop > max(start, lo):
                want[tid] += stop - max(start, lo)
                expected[(tid, u, k, "ns")] += stop - max(start, lo)
        got: Counter[int] = Counter()
        for r in records:
            got[r.tid] += r.total_ns
        assert +got == +want, f"drain {i}"
    for tid, _, end, u, k in blocks:
        if end is not None:
            expected[(tid, u, k, "n")] += 1
    records = [r for rs in drains for r in rs]
    assert +totals(records) == +expected
    assert all(r.user.problem is None and r.kernel.problem is None for r in records)
    assert sum(r.count for r in records) == fake.counted
    assert not fake.crossed_


@settings(max_examples=400, deadline=None)
@given(ops)
def test_offcpu_conservation_any_interleaving(program: list[tuple[int | str, ...]]) -> None:
    run_offcpu(program, generations=3)


def test_block_out_before_the_flip_in_after() -> None:
    """A thread switches out during the drain, before its flip, and wakes
    after the flip: its stack is carried (the blocks in flight are read after
    the flip), though another stack reuses the freed slot's ids."""
    program: list[tuple[int | str, ...]] = [
        ("out", 1, 0, 0, 1),   # blocks during the drain, before the flip
        ("drain",),
        ("out", 2, 1, 1, 0),   # another stack reuses the freed slot's ids
        ("tick", 5),
        ("drain",),
        ("in", 1, 0),
    ]
    run_offcpu(program, generations=3)


def test_block_in_flight_charged_in_every_interval() -> None:
    """A thread blocked across five drains is charged in each of them, and
    counted as one block when it wakes."""
    fake = FakeProgram(generations=3)
    d = Drainer(fake, NoGrace(), clock=lambda: fake.clock)
    d.begin(0)
    fake.switch_out(1, 10, STACKS[0], KSTACKS[0])
    per_drain = []
    for _ in range(5):
        fake.clock += 100
        per_drain.append([(r.total_ns, r.count, r.in_flight) for r in d.drain().records])
    fake.clock += 30
    fake.switch_in(10)
    fake.clock += 70
    per_drain.append([(r.total_ns, r.count, r.in_flight) for r in d.drain().records])
    assert per_drain == [[(100, 0, True)]] * 5 + [[(30, 1, False)]]


def test_block_ending_between_flip_and_read_charged_once() -> None:
    """Woken after the flip, before the drain reads the blocks in flight: the
    part before the boundary comes from ember_crossed, once."""
    for when in (2, 3):
        fake = FakeProgram(generations=3)
        d = Drainer(fake, NoGrace(), clock=lambda fake=fake: fake.clock)  # type: ignore[misc]
        d.begin(0)
        fake.switch_out(1, 10, STACKS[0], KSTACKS[0])
        fake.clock = 100
        schedule(fake, when, lambda fake=fake: fake.switch_in(10))  # type: ignore[misc]
        first = d.drain().records
        fake.clock = 150
        second = d.drain().records
        assert [r.total_ns for r in first] == [100]
        assert [(r.total_ns, r.count) for r in second] == [(0, 1)]
        assert not fake.crossed_


@settings(max_examples=200, deadline=None)
@given(ops)
def test_oncpu_conservation_any_interleaving(program: list[tuple[int | str, ...]]) -> None:
    fake = FakeProgram(generations=2)
    d = Drainer(fake, NoGrace(), clock=lambda: fake.clock)
    expected: Counter[tuple[object, ...]] = Counter()
    records: list[Record] = []

    def sample(tid: int, u: tuple[int, ...], k: tuple[int, ...]) -> None:
        fake.sample(1, tid, u, k)
        expected[(tid, u, k, "n")] += 1

    for op in program:
        if op[0] == "sample":
            def ev(tid: int = int(op[1]), u: tuple[int, ...] = STACKS[int(op[2])],
                   k: tuple[int, ...] = KSTACKS[int(op[3])]) -> None:
                sample(tid, u, k)

            schedule(fake, int(op[2]) % 3, ev)  # before, during or after a flip
        elif op[0] == "drain":
            records += d.drain().records
    records += d.drain(final=True).records
    assert +totals(records) == +expected
