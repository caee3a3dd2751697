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


def cpu_ns(pid: int) -> int:
    """CPU time the process's threads have received, from the scheduler's
    own accounting (/proc/PID/task/TID/schedstat: run time in ns). What a
    workload actually got on a shared machine, where wall time says little."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just exited
    return total


def record_window(options: RecordOptions, pid: int, seconds: float
                  ) -> tuple[Profile, Recorder, int]:
    """Record for ``seconds`` from the moment the programs are attached; also
    the CPU time ``pid`` received in that window (read at its two ends, both
    inside the attached period)."""
    recorder = Recorder(options)
    recorder.start()
    stop = threading.Event()
    out: dict[str, Profile] = {}
    t = threading.Thread(target=lambda: out.setdefault("p", recorder.run(stop)))
    before = cpu_ns(pid)
    t.start()
    stop.wait(seconds)
    received = cpu_ns(pid) - before
    stop.set()
    t.join(timeout=60)
    return out["p"], recorder, received
