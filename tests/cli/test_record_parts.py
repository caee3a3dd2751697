"""The parts of ``ember record`` that need no BPF: the command it starts is
held until released and reports its status as a shell does; the progress
line (terminal only, from 2 s on); the last line's counts, taken from the
file as written."""

from __future__ import annotations

import io
import signal
import time
from pathlib import Path

from ember.cli.record import PROGRESS_AFTER_S, ProgressLine, Workload, file_summary
from ember.encode.folded import encode_folded, parse_folded
from ember.encode.pprof import decode_pprof, encode_pprof
from ember.model import CPU, OFFCPU
from ember.record import Progress
from tests.support.profiles import cpu_profile, offcpu_profile
from tests.support.waits import wait_for


def test_the_command_waits_for_its_release(tmp_path: Path) -> None:
    mark = tmp_path / "started"
    w = Workload("/bin/sh", ["sh", "-c", f"echo $$ > {mark}; exit 3"])
    time.sleep(0.3)
    assert not mark.exists() and w.poll() is None  # held at the gate
    w.release()
    assert wait_for(w.exited, timeout=10)
    assert mark.read_text().strip() == str(w.pid)  # exec'd in the process ember profiles
    assert w.poll() == 3 and w.end() == 3


def test_a_command_never_released_never_runs(tmp_path: Path) -> None:
    mark = tmp_path / "started"
    w = Workload("/bin/sh", ["sh", "-c", f"touch {mark}"])
    assert w.end() is None  # ember failed before attaching: the gate closes
    assert not mark.exists()


def test_a_stopped_command_gets_sigterm_and_a_signal_is_128_plus_n(tmp_path: Path) -> None:
    w = Workload("/bin/sleep", ["sleep", "30"])
    w.release()
    w.terminate()
    assert w.end() is None  # stopped by ember: not the command's own status
    assert w.poll() == 128 + signal.SIGTERM
    w = Workload("/bin/sh", ["sh", "-c", "kill -KILL $$"])
    w.release()
    assert wait_for(w.exited, timeout=10) and w.end() == 128 + signal.SIGKILL


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_on_a_terminal_only() -> None:
    tty = Terminal()
    line = ProgressLine(tty, CPU, None)
    line(Progress(PROGRESS_AFTER_S - 1, 8.0, 50))  # a short recording says nothing
    assert tty.getvalue() == ""
    line(Progress(PROGRESS_AFTER_S, 7.2, 150))
    assert tty.getvalue() == "\rember record: 8s left, 150 samples so far\x1b[K"
    line.clear()
    assert tty.getvalue().endswith("\r\x1b[K")

    tty = Terminal()
    ProgressLine(tty, OFFCPU, "/usr/bin/make")(Progress(12.4, None, 9))
    assert tty.getvalue() == "\rember record: 12s, 9 blocks so far (until make exits)\x1b[K"
    tty = Terminal()
    ProgressLine(tty, CPU, None)(Progress(5, None, 9))
    assert tty.getvalue() == "\rember record: 5s, 9 samples so far (Ctrl-C stops)\x1b[K"

    log = io.StringIO()  # not a terminal
    line = ProgressLine(log, CPU, None)
    line(Progress(30, 1, 10))
    line.clear()
    assert log.getvalue() == ""


def test_the_summary_counts_the_file() -> None:
    """Distinct stacks and totals of the bytes written, not of the
    recorder's per-thread samples (cpu_profile has two threads on one
    stack: four samples, three stacks)."""
    cpu, off = cpu_profile(), offcpu_profile()
    folded = parse_folded(encode_folded(cpu))
    data = encode_folded(cpu).encode()
    assert file_summary(data, "folded", CPU) == \
        f"{len(data.splitlines())} stacks, {sum(folded.values())} samples"
    assert len(data.splitlines()) < len(cpu.samples)
    p = decode_pprof(encode_pprof(cpu))
    stacks = {tuple(s.location_id) for s in p.sample}
    assert file_summary(encode_pprof(cpu), "pprof", CPU) == \
        f"{len(stacks)} stacks, {sum(s.value[0] for s in p.sample)} samples"
    assert len(stacks) < len(p.sample)
    folded = parse_folded(encode_folded(off))
    assert file_summary(encode_folded(off).encode(), "folded", OFFCPU) == \
        f"{len(folded)} stacks, {sum(folded.values())} us off_cpu"
    p = decode_pprof(encode_pprof(off))
    assert file_summary(encode_pprof(off), "pprof", OFFCPU) == (
        f"{len(p.sample)} stacks, {sum(s.value[0] for s in p.sample)} blocks, "
        f"{sum(s.value[1] for s in p.sample) // 1000} us off_cpu")
