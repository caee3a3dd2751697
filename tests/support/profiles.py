"""Small hand-made profiles shared by the encoder tests."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import TYPE_CHECKING

from ember.agent.labels import ProcessLabels, series_labels
from ember.collector.validate import DEFAULT_LIMITS, check_request
from ember.encode.writeraw import make_series
from ember.model import (
    KERNEL_MAPPING,
    OFFCPU_TYPE,
    Frame,
    FrameKind,
    Mapping,
    Profile,
    Sample,
    cpu_type,
)
from ember.proto import profilestore_pb2 as ps

if TYPE_CHECKING:
    from ember.collector.store import Store

EXE = Mapping(0x400000, 0x401000, 0, "/usr/bin/app", "abcd")
LIB = Mapping(0x7F0000000000, 0x7F0000100000, 0x1000, "/lib/libfoo.so")

MAIN = Frame("main", FrameKind.USER, EXE, 0x400100)
WORK = Frame("ns::Box<int>::operator()(int) const", FrameKind.USER, EXE, 0x400200,
             "_ZNK2ns3BoxIiEclEi")
LIBF = Frame("libfoo.so+0x1a2b", FrameKind.USER, LIB, 0x7F0000000A2B)
SYSCALL = Frame("entry_SYSCALL_64", FrameKind.KERNEL, KERNEL_MAPPING, 0xFFFFFFFF81000010)
SCHED = Frame("schedule", FrameKind.KERNEL, KERNEL_MAPPING, 0xFFFFFFFF81000100)
LOST_K = Frame.marker("[lost kernel stack: collision]", FrameKind.KERNEL)


def cpu_profile() -> Profile:
    return Profile(cpu_type(100), (
        Sample((MAIN, WORK), (7, 70_000_000), 10, 11, "app"),
        Sample((MAIN, WORK), (3, 30_000_000), 10, 12, "app"),        # another thread
        Sample((MAIN, LIBF, SYSCALL), (2, 20_000_000), 10, 11, "app"),
        Sample((MAIN, LOST_K), (1, 10_000_000), 10, 11, "app"),
    ), start_ns=1_700_000_000_000_000_000, duration_ns=5_000_000_000)


def offcpu_profile() -> Profile:
    sleeping = Frame.marker("[sleeping]")
    return Profile(OFFCPU_TYPE, (
        Sample((MAIN, WORK, SYSCALL, SCHED, sleeping), (4, 40_000_123), 10, 11, "app",
               (("thread_state", "sleeping"),)),
        Sample((SCHED, Frame.marker("[runnable]")), (1, 2_500), 20, 20, "kworker/0:1",
               (("thread_state", "runnable"),)),
    ), start_ns=1_700_000_000_000_000_000, duration_ns=5_000_000_000)


FLEET_EXE = Mapping(0x400000, 0x500000, 0, "/usr/bin/app", "feedface")


def fleet_profile(rng: random.Random, n: int = 60, program: int = 0) -> Profile:
    """Stacks from a small call tree, with source lines and inlined frames
    (the functions of another ``program`` have other names)."""
    names = [f"{f'p{program}' if program else ''}fn{i}" for i in range(40)]
    frames = []
    for i, name in enumerate(names):
        frames.append(Frame(name, FrameKind.USER, FLEET_EXE, 0x400000 + 16 * i,
                            file=f"src/{name}.c", line=10 + i))
    samples = []
    for _ in range(n):
        depth = rng.randint(1, 12)
        stack = [frames[0]] + [rng.choice(frames[1:]) for _ in range(depth)]
        leaf = stack[-1]
        inl = Frame(f"{leaf.name}_inl", FrameKind.USER, FLEET_EXE, leaf.address, file="inl.h",
                    line=3, inlined=True)
        if rng.random() < 0.3:  # an inlined function at the leaf's address
            stack = [*stack[:-1], replace(leaf, line=leaf.line), inl]
        tid = rng.choice([11, 12, 13])
        samples.append(Sample(tuple(stack), (rng.randint(1, 9), rng.randint(1, 9) * 10**7),
                              10, tid, f"worker-{tid % 2}"))
    return replace(cpu_profile(), samples=tuple(samples))


def write_fleet(store: Store, rng: random.Random, start_ns: int,
                pids: tuple[int, ...] = (10, 11, 12), hz: int = 100) -> list[Profile]:
    """One fleet_profile per pid (comm "app", host h0/h1) from ``start_ns``,
    lasting 1 s, sampled at ``hz``, written to ``store`` as the collector
    writes a request; returns the profiles written."""
    series, sent = [], []
    for pid in pids:
        labels = series_labels(fleet_profile(rng).type, ProcessLabels(pid=pid, comm="app"),
                               {"host": f"h{pid % 2}"})
        prof = replace(fleet_profile(rng, 30), type=cpu_type(hz), start_ns=start_ns,
                       duration_ns=10**9, labels=labels)
        series.append(make_series(prof)[0])
        sent.append(prof)
    store.write(check_request(ps.WriteRawRequest(series=series), DEFAULT_LIMITS,
                              start_ns + 10**9))
    return sent
