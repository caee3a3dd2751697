"""On-CPU sampling on the real kernel against programs with known shares."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ember.model import FrameKind, Profile
from ember.record import Recorder, RecordOptions
from tests.support.record import (
    expected_samples,
    inclusive,
    record,
    record_window,
    share_tolerance,
    where,
)

pytestmark = pytest.mark.bpf

DURATION = 6.0
FREQ = 999


def test_function_shares_within_sampling_error(start_workload) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("cpu_shares")
    profile, rec, got = record_window(RecordOptions(pids=(w.pid,), frequency=FREQ), [w.pid],
                                      DURATION)
    cpu = got.cpu
    mine = where(profile, lambda s: s.pid == w.pid)
    assert len(mine) == len(profile.samples), "the PID filter let other processes through"
    total = sum(s.values[0] for s in mine)
    # One sample per 1/FREQ s of CPU the thread received, give or take the
    # few milliseconds between the window's end and the detach.
    expected = cpu * FREQ / 1e9
    assert expected > 0.2 * DURATION * FREQ, "the workload hardly ran"
    low, high = expected_samples(cpu, cpu, FREQ)
    assert low <= total <= high, (total, expected)
    # Shares: four standard errors allowed (about 2.5 points at the ~6000
    # samples of a quiet machine, more when it is busy).
    shares = inclusive(mine, ["work_a", "work_b", "work_c", "spin", "main"], 0)
    for fn, truth in (("work_a", 35), ("work_b", 50), ("work_c", 15)):
        assert abs(shares[fn] - truth) <= share_tolerance(truth, total), (fn, shares, total)
    assert shares["main"] >= 99 and shares["spin"] >= 98, shares
    # cpu/nanoseconds = samples x period
    assert all(s.values[1] == s.values[0] * profile.type.period for s in mine)
    # everything the kernel counted was drained, exactly once
    assert rec.stats.drain.events == rec.stats.kernel["counted"]
    assert rec.stats.kernel["counts_full"] == 0
    assert rec.stats.drains >= 4


def test_cpp_names_demangled(start_workload) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("cpp_names")
    profile, _ = record(RecordOptions(pids=(w.pid,), duration=2, frequency=499,
                                      kernel_stacks=False))
    names = {f.name for s in profile.samples for f in s.frames}
    assert "ember_test::Accumulator<unsigned long>::operator()(unsigned long)" in names
    assert "ember_test::Accumulator<unsigned long>::operator+=(unsigned long)" in names
    assert ("void ember_test::detail::churn<unsigned long>"
            "(ember_test::Accumulator<unsigned long>&)") in names
    raw = {f.system_name for s in profile.samples for f in s.frames}
    assert "_ZN10ember_test11AccumulatorImEclEm" in raw
    # no kernel frames were asked for
    assert all(f.kind != "kernel" for s in profile.samples for f in s.frames)


def test_pie_and_shared_library_named(start_workload) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("pie_main")
    profile, _ = record(RecordOptions(pids=(w.pid,), duration=2, frequency=499))
    by_name = {f.name: f for s in profile.samples for f in s.frames}
    for fn, obj in [("lib_spin", "libember_demo.so"), ("lib_burn", "libember_demo.so"),
                    ("exe_burn", "pie_main"), ("main", "pie_main")]:
        assert fn in by_name, sorted(by_name)
        mapping = by_name[fn].mapping
        assert mapping is not None and mapping.path.endswith(obj)
        assert mapping.build_id
    shares = inclusive(profile.samples, ["lib_burn", "exe_burn"], 0)
    assert shares["lib_burn"] > shares["exe_burn"] > 20


def test_process_that_exits_before_the_drain_is_named(start_workload) -> None:  # type: ignore[no-untyped-def]
    """cpu_shares 0.5 exits after about a second (alarm); the only drain is
    after that, so only the maps read while it lived can name its frames."""
    recorder = Recorder(RecordOptions(duration=3, frequency=499, drain_interval=10))
    recorder.start()  # attached: compiling takes longer than the process lives
    w = start_workload("cpu_shares", seconds=0.5)
    profile = recorder.run(threading.Event())
    assert w.proc.wait(timeout=5) != 0  # killed by SIGALRM long before the drain
    mine = where(profile, lambda s: s.pid == w.pid)
    assert mine, "no samples of the short-lived process"
    shares = inclusive(mine, ["work_b", "main"], 0)
    assert shares["main"] > 95 and abs(shares["work_b"] - 50) < 10, shares


def test_vdso_frames_named(start_workload) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("vdso_clock")
    profile, _ = record(RecordOptions(pids=(w.pid,), duration=2, frequency=499,
                                      kernel_stacks=False))
    vdso = [f for s in profile.samples for f in s.frames
            if f.mapping is not None and f.mapping.path == "[vdso]"]
    assert vdso and {f.name for f in vdso} <= {"clock_gettime", "__vdso_clock_gettime"}


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_jit_frames_named_through_perf_map(tmp_path: Path) -> None:
    script = tmp_path / "hot.js"
    script.write_text(
        "function hotLoop(n) { let x = 0; for (let i = 0; i < n; i++) "
        "{ x = (x * 1103515245 + 12345) & 0x7fffffff; } return x; }\n"
        "let s = 0; const end = Date.now() + 300000; console.log('ready ' + process.pid);\n"
        "while (Date.now() < end) { s += hotLoop(100000); }\n")
    # it spins until killed (300 s at most): on a busy machine the recording
    # may start many seconds after "ready" (its programs compile first), and
    # a loop of 15 s had ended by then once in CI (no samples at all)
    # no inlining: hotLoop stays a function of its own in the perf map (V8
    # inlines it into the script's top level on some runs otherwise)
    node = subprocess.Popen(["node", "--perf-basic-prof", "--no-turbo-inlining", str(script)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert node.stdout is not None and node.stdout.readline().startswith("ready")
        time.sleep(1)  # let the JIT optimise hotLoop
        profile, _ = record(RecordOptions(pids=(node.pid,), duration=2, frequency=499,
                                          kernel_stacks=False))
        # JIT code of the script, named from the perf map: hotLoop, or the
        # script's top level when V8 has inlined hotLoop into it (it does on
        # a busy machine, where CI once saw 48% for hotLoop alone)
        hot = [s for s in profile.samples
               if any("hot.js" in f.name and f.mapping is not None
                      and f.mapping.path == "[perf-map]" for f in s.frames)]
        share = sum(s.values[0] for s in hot) / sum(s.values[0] for s in profile.samples)
        assert share > 0.6, share  # the rest: the JIT compiler threads, GC, startup
        assert any("hotLoop" in f.name for s in hot for f in s.frames)
    finally:
        node.kill()
        node.wait()
        Path(f"/tmp/perf-{node.pid}.map").unlink(missing_ok=True)


def test_short_lived_process_storm(fixture_bin) -> None:  # type: ignore[no-untyped-def]
    """Hundreds of processes that work 30 ms each and exit 100 ms later,
    long before the drain: the kernel notes each new process on a ring
    buffer and ember reads its maps at once, so its frames are named.

    The 100 ms after the work are the watcher's time to be scheduled: on a
    2-core machine busy with other work a thread can wait tens of
    milliseconds for a CPU, and with processes that exited as their 30 ms
    ended, 7% of the samples of a CI run under load were left unnamed.

    What is measured is naming itself: the leaf of each user stack has a
    name. Maps read too late leave ``[unknown]`` leaves (no mapping). The
    share in storm_work is not the measure: it falls on a busy machine, where
    each process gets less CPU in its 30 ms while its start-up in ld.so costs
    the same. Stacks lost in the kernel (stack map collisions) are counted
    there (ember_bpf_stacks_lost_total), not here."""
    rec = Recorder(RecordOptions(mode="cpu", duration=60, frequency=999))
    rec.start()
    stop = threading.Event()
    holder: dict[str, Profile] = {}
    t = threading.Thread(target=lambda: holder.setdefault("p", rec.run(stop)))
    t.start()
    time.sleep(1)  # past the first look at every process already running
    try:
        running: list[subprocess.Popen[bytes]] = []
        for _ in range(300):
            running.append(subprocess.Popen([str(fixture_bin / "short_lived"), "30", "100"]))
            if len(running) >= 4:   # (four alive at a time, most of them asleep)
                running.pop(0).wait()
        for p in running:
            p.wait()
        time.sleep(0.3)
    finally:
        stop.set()
        t.join(timeout=60)
    samples = [s for s in holder["p"].samples if s.thread_name == "short_lived"]
    user = [(s, [f for f in s.frames if f.kind == FrameKind.USER]) for s in samples]
    walked = [(s, u) for s, u in user if u and not u[0].name.startswith("[lost")]
    total = sum(s.values[0] for s, _ in walked)
    named = sum(s.values[0] for s, u in walked
                if u[-1].name != "[unknown]" and not re.search(r"\+0x[0-9a-f]+$", u[-1].name))
    in_work = sum(s.values[0] for s, u in walked if any(f.name == "storm_work" for f in u))
    assert total > 1000, total  # 300 x 30 ms at 999 Hz: about 9000 samples on a quiet machine
    assert named >= 0.97 * total, (named, total)
    assert in_work >= 0.5 * total, (in_work, total)  # the frames are the right ones, too
    assert len({s.pid for s, _ in walked}) >= 250
