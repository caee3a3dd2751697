"""Running the real recorder in-process and reading its profiles."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ember.model import Profile, Sample
from ember.record import Recorder, RecordOptions


def record(options: RecordOptions) -> tuple[Profile, Recorder]:
    recorder = Recorder(options)
    profile = recorder.run(threading.Event())
    return profile, recorder


def inclusive(samples: Iterable[Sample], names: Iterable[str], index: int) -> dict[str, float]:
    """Each name's inclusive share of the samples' value at index."""
    names = list(names)
    total = 0
    acc: Counter[str] = Counter()
    for s in samples:
        v = s.values[index]
        total += v
        present = {f.name for f in s.frames}
        for n in names:
            if n in present:
                acc[n] += v
    assert total > 0, "no samples"
    return {n: 100.0 * acc[n] / total for n in names}


def where(profile: Profile, pred: Callable[[Sample], bool]) -> list[Sample]:
    return [s for s in profile.samples if pred(s)]


@dataclass(frozen=True)
class ShortWaits:
    """One run of tests/fixtures/bin/short_waits under ember: what ember
    estimated per function, beside what the program measured of itself."""

    profile: Profile
    kernel: dict[str, int]                 # the recorder's kernel counters
    measured_ns: dict[str, int]            # blocked time in wait_short / wait_long
    measured_blocks: dict[str, int]

    def estimate(self, fn: str, index: int) -> int:
        """Off-CPU value index (0 blocks, 1 ns) of the waiter's stacks through fn."""
        return sum(s.values[index] for s in self.profile.samples
                   if s.thread_name == "waiter" and any(f.name == fn for f in s.frames))


def record_run(binary: Path, seconds: float, **options: object
               ) -> tuple[Profile, Recorder, list[int]]:
    """Record a fixture that starts on a line on stdin, runs for ``seconds``
    and then prints ``totals N...`` (what it measured of itself), from
    before it starts until after it ends. The recorder follows its PID."""
    proc = subprocess.Popen([str(binary), str(seconds)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        pid = int(proc.stdout.readline().split()[1])
        rec = Recorder(RecordOptions(pids=(pid,), duration=seconds + 1,
                                     **options))  # type: ignore[arg-type]
        rec.start()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        profile = rec.run(threading.Event())
        line = proc.stdout.readline().split()
        proc.wait(timeout=5)
    finally:
        proc.kill()
        proc.wait()
    assert line and line[0] == "totals", f"{binary.name} printed {line}"
    return profile, rec, [int(x) for x in line[1:]]


def record_short_waits(binary: Path, sample_us: int, seconds: float = 3.0) -> ShortWaits:
    """Record short_waits off-CPU from before it starts until after it ends."""
    profile, rec, (short_ns, long_ns, short_n, long_n) = record_run(
        binary, seconds, mode="offcpu", sample_us=sample_us)
    return ShortWaits(profile, rec.stats.kernel, {"wait_short": short_ns, "wait_long": long_ns},
                      {"wait_short": short_n, "wait_long": long_n})


@dataclass(frozen=True)
class Sched:
    """What the scheduler counted of some threads (ns), from
    /proc/PID/task/TID/schedstat: time on a CPU, and time runnable waiting
    for one (run_delay). What a workload actually got on a shared machine,
    where wall time says little."""

    cpu: int = 0
    run_delay: int = 0
    wall: int = 0       # over a window: its length

    def __sub__(self, other: Sched) -> Sched:
        return Sched(self.cpu - other.cpu, self.run_delay - other.run_delay,
                     self.wall - other.wall)

    @property
    def blocked(self) -> int:
        """Over a window: the time the threads were neither running nor
        waiting to run (per thread, summed)."""
        return self.wall - self.cpu - self.run_delay


def sched(pids: Iterable[int], thread: str | None = None) -> Sched:
    """The scheduler's counts for the processes' threads (only those named
    thread, if given), with the wall clock (times the number of threads
    counted, so that ``blocked`` of a difference is per thread summed)."""
    cpu = delay = n = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                if thread is not None and (task / "comm").read_text().strip() != thread:
                    continue
                run, wait = (task / "schedstat").read_text().split()[:2]
            except (OSError, ValueError):
                continue  # a thread that just exited
            cpu, delay, n = cpu + int(run), delay + int(wait), n + 1
    return Sched(cpu, delay, n * time.monotonic_ns())


def cpu_ns(pid: int) -> int:
    """CPU time the process's threads have received (schedstat)."""
    return sched([pid]).cpu


def expected_samples(low_ns: int, high_ns: int, hz: int) -> tuple[float, float]:
    """The on-CPU sample count to expect of a sampler attached for at least
    a window in which the workload got ``low_ns`` of CPU and at most one in
    which it got ``high_ns``: one sample per 1/hz s of CPU (the scheduler's
    count, whatever else the machine runs), with slack for sqrt-of-count
    noise and a few periods at either end."""
    low, high = low_ns * hz / 1e9, high_ns * hz / 1e9
    return low - 4 * low ** 0.5 - 0.02 * hz, high + 4 * high ** 0.5 + 0.02 * hz


def share_tolerance(p: float, n: int) -> float:
    """Four standard errors, in points, of a share of ``p`` percent measured
    from ``n`` independent samples: 100 * sqrt(p (1 - p) / n) each."""
    return 4 * 100 * (p / 100 * (1 - p / 100) / n) ** 0.5


def record_window(options: RecordOptions, pids: Iterable[int], seconds: float,
                  thread: str | None = None) -> tuple[Profile, Recorder, Sched]:
    """Record for ``seconds`` from the moment the programs are attached; also
    what the scheduler counted of the processes' threads (those named thread,
    if given) in that window, read at its two ends, both inside the attached
    period."""
    pids = list(pids)
    recorder = Recorder(options)
    recorder.start()
    stop = threading.Event()
    out: dict[str, Profile] = {}
    t = threading.Thread(target=lambda: out.setdefault("p", recorder.run(stop)))
    before = sched(pids, thread)
    t.start()
    stop.wait(seconds)
    during = sched(pids, thread) - before
    stop.set()
    t.join(timeout=60)
    return out["p"], recorder, during
