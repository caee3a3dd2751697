"""User stacks walked from CFI tables in the kernel, against programs whose
whole stacks are known: built without frame pointers, blocking inside libc
(which has none), Debian's python3.11, and recursion past the depth limit.
Each test's other side, frame pointers alone, shows the difference the
tables make (so the tests can fail)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from ember import abi
from ember.model import FrameKind, Profile, Sample
from ember.record import RecordOptions
from tests.support.record import record

pytestmark = pytest.mark.bpf

CHAIN = ("main", "chain_one", "chain_two", "chain_three")
PYTHON = Path("/usr/bin/python3.11")


def names(s: Sample) -> list[str]:
    return [f.name for f in s.frames if f.kind == FrameKind.USER]


def has_chain(s: Sample, chain: Sequence[str]) -> bool:
    """chain appears in s's user frames, in order from the root, adjacent."""
    n = names(s)
    k = len(chain)
    return any(tuple(n[i:i + k]) == tuple(chain) for i in range(len(n) - k + 1))


def share(samples: Iterable[Sample], pred: object, index: int = 0) -> tuple[float, int]:
    """(% of the value at index in samples where pred holds, the total)."""
    total = hit = 0
    for s in samples:
        total += s.values[index]
        if pred(s):  # type: ignore[operator]
            hit += s.values[index]
    assert total > 0, "no samples"
    return 100.0 * hit / total, total


def on_cpu(pid: int, unwinder: str, seconds: float = 3) -> Profile:
    profile, _ = record(RecordOptions(pids=(pid,), duration=seconds, frequency=499,
                                      kernel_stacks=False, unwinder=unwinder))
    return profile


def test_whole_chain_without_frame_pointers_on_cpu(start_workload) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("nofp_chain", 120, "cpu")
    chain = (*CHAIN, "leaf_spin")
    tables, n = share(on_cpu(w.pid, "auto").samples, lambda s: has_chain(s, chain))
    assert tables >= 95, (tables, n)
    # the frame-pointer walk stops at the leaf
    fp, n_fp = share(on_cpu(w.pid, "fp", 2).samples, lambda s: has_chain(s, chain))
    assert fp <= 50, (fp, n_fp)


def test_whole_chain_without_frame_pointers_off_cpu(start_workload) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("nofp_chain", 120, "sleep")
    chain = (*CHAIN, "leaf_sleep")
    for sample_us in (1000, 0):  # the sampled (default) and the exact program
        profile, _ = record(RecordOptions(mode="offcpu", pids=(w.pid,), duration=3,
                                          kernel_stacks=False, sample_us=sample_us))
        got, total_ns = share(profile.samples, lambda s: has_chain(s, chain), index=1)
        assert got >= 95, (sample_us, got, total_ns)
    profile, _ = record(RecordOptions(mode="offcpu", pids=(w.pid,), duration=2,
                                      kernel_stacks=False, unwinder="fp"))
    fp, _ = share(profile.samples, lambda s: has_chain(s, chain), index=1)
    assert fp <= 50, fp


def test_blocking_in_libc_names_the_application(start_workload) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("libc_waits", 120)
    for sample_us in (1000, 0):
        profile, _ = record(RecordOptions(mode="offcpu", pids=(w.pid,), duration=3,
                                          kernel_stacks=False, sample_us=sample_us))
        consumer = [s for s in profile.samples if s.tid != w.pid]
        main = [s for s in profile.samples if s.tid == w.pid]
        # every block of the consumer is in wait_for_item, every block of
        # main in nap (the mutexes are hardly contended: a few per mille)
        got, total = share(consumer, lambda s: "wait_for_item" in names(s), index=1)
        assert got >= 95, (sample_us, got, total)
        got, total = share(main, lambda s: has_chain(s, ("main", "nap")), index=1)
        assert got >= 95, (sample_us, got, total)
    # the wakeup's other side: the waker's stack names produce
    profile, _ = record(RecordOptions(mode="offwake", pids=(w.pid,), duration=3,
                                      kernel_stacks=False))
    woken_by_main = [s for s in profile.samples
                     if s.tid != w.pid and dict(s.labels).get("waker_pid") == str(w.pid)]
    got, total = share(woken_by_main, lambda s: "produce" in names(s), index=1)
    assert got >= 95, (got, total)
    # frame pointers alone stop in libc
    profile, _ = record(RecordOptions(mode="offcpu", pids=(w.pid,), duration=2,
                                      kernel_stacks=False, unwinder="fp"))
    consumer = [s for s in profile.samples if s.tid != w.pid]
    fp, _ = share(consumer, lambda s: "wait_for_item" in names(s), index=1)
    assert fp <= 50, fp


def test_debian_python_reaches_py_runmain() -> None:
    if not PYTHON.is_file():
        pytest.skip(f"{PYTHON} is not installed")
    loop = ("import time\nend = time.time() + 120\nwhile time.time() < end:\n"
            "    sum(i * i for i in range(1000))\n")
    proc = subprocess.Popen([str(PYTHON), "-c", loop])
    try:
        tables, n = share(on_cpu(proc.pid, "auto").samples,
                          lambda s: "Py_RunMain" in names(s))
        assert tables >= 95, (tables, n)
        fp, n_fp = share(on_cpu(proc.pid, "fp", 2).samples,
                         lambda s: "Py_RunMain" in names(s))
        assert fp <= 50, (fp, n_fp)
    finally:
        proc.kill()
        proc.wait()


def test_deep_recursion_is_whole_to_the_limit_then_truncated(start_workload) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("nofp_chain", 120, "deep")
    profile = on_cpu(w.pid, "auto")
    deep = [s for s in profile.samples if "recurse" in names(s)]
    got, n = share(profile.samples, lambda s: "recurse" in names(s))
    assert got >= 95, (got, n)
    for s in deep:
        user = [f for f in s.frames if f.kind == FrameKind.USER]
        assert user[0].name == "[truncated]", names(s)[:3]
        walked = [f for f in user if f.address]
        assert len(walked) == abi.MAX_STACK_DEPTH, len(walked)
        # root first: recurse all the way, then at most the leaf and what it
        # calls (leaf_spin, or now() in the vdso)
        assert {f.name for f in walked[:-3]} == {"recurse"}, names(s)[-4:]


def test_unwind_outcomes_are_counted(start_workload) -> None:  # type: ignore[no-untyped-def]
    """The kernel counts every table walk by how it ended; the recorder
    reports them."""
    w = start_workload("nofp_chain", 120, "cpu")
    _, rec = record(RecordOptions(pids=(w.pid,), duration=2, frequency=499,
                                  kernel_stacks=False))
    k = rec.stats.kernel
    walked = k["unwind_root"]
    assert walked > 0, k
    assert walked >= 0.95 * rec.stats.drain.events, k


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
