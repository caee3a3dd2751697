"""Running the real recorder in-process and reading its profiles."""

from __future__ import annotations

import subprocess
import threading
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
    measured_ns: dict[str, int]            # wall time in wait_short / wait_long
    measured_blocks: dict[str, int]

    def estimate(self, fn: str, index: int) -> int:
        """Off-CPU value index (0 blocks, 1 ns) of the waiter's stacks through fn."""
        return sum(s.values[index] for s in self.profile.samples
                   if s.thread_name == "waiter" and any(f.name == fn for f in s.frames))


def record_short_waits(binary: Path, sample_us: int, seconds: float = 3.0) -> ShortWaits:
    """Record short_waits off-CPU from before it starts until after it ends."""
    proc = subprocess.Popen([str(binary), str(seconds)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        pid = int(proc.stdout.readline().split()[1])
        rec = Recorder(RecordOptions(mode="offcpu", pids=(pid,), duration=seconds + 1,
                                     sample_us=sample_us))
        rec.start()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        profile = rec.run(threading.Event())
        _, short_ns, long_ns, short_n, long_n = proc.stdout.readline().split()
        proc.wait(timeout=5)
    finally:
        proc.kill()
        proc.wait()
    return ShortWaits(profile, rec.stats.kernel,
                      {"wait_short": int(short_ns), "wait_long": int(long_ns)},
                      {"wait_short": int(short_n), "wait_long": int(long_n)})
