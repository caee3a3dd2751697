"""One drain's profiles: one per process and kind, labelled, relabeled, and
what the rules drop counted (the kernel side is tests/bpf/test_agent.py's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ember.agent.labels import ProcessLabeler
from ember.agent.pipeline import Window, process_profiles
from ember.config import Rule
from ember.kernel.drain import DrainResult
from ember.model import CPU, OFFCPU, Frame, FrameKind, Sample
from ember.session import Drained
from ember.stacks import SampleBuilder
from ember.symbols.procmaps import ProcessTable, ProcFS
from ember.symbols.symbolizer import Symbolizer
from tests.support.procfs import write_proc


def sample(pid: int, tid: int, name: str, value: int) -> Sample:
    return Sample((Frame(name, FrameKind.USER),), (value, value * 1000), pid, tid, f"t{tid}")


def test_one_profile_per_process_and_kind(tmp_path: Path) -> None:
    for pid, comm in ((10, "api"), (20, "batch")):
        write_proc(tmp_path, pid, "00400000-00401000 r-xp 00000000 08:01 1 /bin/app\n", comm)
        (tmp_path / str(pid) / "comm").write_text(comm + "\n")
    symbolizer = Symbolizer(ProcessTable(ProcFS(tmp_path)))
    labeler = ProcessLabeler(symbolizer, {"host": "h"},
                             [Rule(source_labels=("comm",), regex="batch", action="drop")],
                             proc=tmp_path)
    cpu, off = SampleBuilder(symbolizer, CPU, 99), SampleBuilder(symbolizer, OFFCPU)
    program: Any = None  # process_profiles reads only the samples
    drained = [Drained(program, DrainResult(), [
        (cpu, [sample(10, 10, "a", 3), sample(10, 11, "b", 4), sample(10, 10, "a", 1),
               sample(20, 20, "c", 5)]),
        (off, [sample(10, 12, "wait", 7)])])]
    profiles, dropped = process_profiles(drained, labeler, Window(1000, 3000))
    assert dropped == 1  # the batch process's profile, by the drop rule
    assert [(p.type.name, p.labels["__name__"], p.labels["pid"], p.labels["comm"])
            for p in profiles] == [("cpu", "ember_cpu", "10", "api"),
                                   ("offcpu", "ember_offcpu", "10", "api")]
    cpu_profile = profiles[0]
    assert (cpu_profile.start_ns, cpu_profile.duration_ns) == (1000, 2000)
    assert cpu_profile.labels["host"] == "h"
    # the two samples of thread 10 in "a" merged, thread 11 kept apart
    assert sorted((s.tid, s.values[0]) for s in cpu_profile.samples) == [(10, 4), (11, 4)]


def test_labels_read_once_per_process_and_again_on_pid_reuse(tmp_path: Path) -> None:
    write_proc(tmp_path, 10, "00400000-00401000 r-xp 00000000 08:01 1 /bin/app\n", "old")
    (tmp_path / "10" / "comm").write_text("old\n")
    procs = ProcessTable(ProcFS(tmp_path))
    labeler = ProcessLabeler(Symbolizer(procs), {}, proc=tmp_path)
    assert labeler.process(10).comm == "old"
    (tmp_path / "10" / "comm").write_text("renamed\n")
    assert labeler.process(10).comm == "old"  # cached while the process is the same
    stat = tmp_path / "10" / "stat"
    stat.write_text(stat.read_text().replace(" 4242 ", " 9999 "))  # a new start time
    procs.refresh([10])
    assert labeler.process(10).comm == "renamed"
