"""``ember record -- COMMAND ARGS...`` as a user runs it: ember starts the
command, profiles it from its first instructions, and stops when it exits
(exiting with its status) or when the duration ends (the command then gets
SIGTERM). The last line says what was written, counted in the file; a
terminal also sees a progress line. Truth is what the workload measured of
its own CPU time."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ember.encode.folded import parse_folded
from ember.encode.pprof import decode_pprof

pytestmark = pytest.mark.bpf

EMBER = [sys.executable, "-m", "ember.cli"]
WROTE = re.compile(r"^ember record: wrote (\S+) \((\d+) stacks, (\d+) samples\)$")
FREQUENCY = 499

#: Burns CPU in burn() until it has used argv[1] seconds (forever for 0),
#: printing its PID first; it prints or, on SIGTERM, writes to argv[2] its
#: CPU time since exec (the truth), and exits with status 7.
WORKLOAD = """
import os, signal, sys, time

def report(*_):
    text = f"cpu {time.process_time()}"
    if len(sys.argv) > 2:
        open(sys.argv[2], "w").write(text)
    print(text, flush=True)
    sys.exit(7)

def burn(seconds):
    x = 0
    while not seconds or time.process_time() < seconds:
        x += 1

signal.signal(signal.SIGTERM, report)
print("pid", os.getpid(), flush=True)
burn(float(sys.argv[1]))
report()
"""


def wrote(stderr: str) -> tuple[str, int, int]:
    m = WROTE.match(stderr.strip().splitlines()[-1])
    assert m, stderr
    return m[1], int(m[2]), int(m[3])


def test_command_is_profiled_until_it_exits(tmp_path: Path) -> None:
    """No -o: the profile goes to NAME-DATETIME.folded (the command's
    output has standard output); ember exits with the command's status."""
    r = subprocess.run([*EMBER, "record", "-F", str(FREQUENCY), "--",
                        sys.executable, "-c", WORKLOAD, "1.5"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 7, r.stderr
    pid_line, cpu_line = r.stdout.split("\n")[:2]  # the command's output, untouched
    assert pid_line.startswith("pid ")
    cpu = float(cpu_line.split()[1])
    name, stacks, samples = wrote(r.stderr)
    assert "\r" not in r.stderr  # not a terminal: no progress line
    out = tmp_path / name
    assert re.fullmatch(rf"{re.escape(Path(sys.executable).name)}-\d{{8}}T\d{{6}}\.folded",
                        name), name
    lines = out.read_text().splitlines()
    folded = parse_folded(out.read_text())
    assert stacks == len(lines) and samples == sum(folded.values())
    # profiled from exec to exit: the samples are its CPU time
    assert 0.85 * cpu * FREQUENCY <= samples <= 1.15 * cpu * FREQUENCY, (samples, cpu)
    # its maps were read after the exec: whole stacks of the interpreter that
    # runs the workload (Python frames come once its unwind tables load, in
    # its first half second or so)
    in_main = sum(v for k, v in folded.items() if "Py_RunMain" in k.split(";"))
    in_burn = sum(v for k, v in folded.items()
                  if any(f.startswith("burn ") for f in k.split(";")))  # 'burn (<string>:13)'
    assert in_main >= 0.9 * samples, sorted(folded.items(), key=lambda kv: -kv[1])[:5]
    assert in_burn >= 0.3 * samples, sorted(folded.items(), key=lambda kv: -kv[1])[:5]


def test_duration_ends_the_command_and_a_terminal_sees_progress(tmp_path: Path) -> None:
    """-d 4s on a command that would run forever: at 4 s it gets SIGTERM and
    ember exits 0. On a terminal, a progress line counts down from 2 s."""
    out, truth = tmp_path / "cpu.pb.gz", tmp_path / "truth"
    main_fd, sub_fd = pty.openpty()
    proc = subprocess.Popen([*EMBER, "record", "-d", "4s", "-F", str(FREQUENCY),
                             "--format", "pprof", "-o", str(out), "--",
                             sys.executable, "-c", WORKLOAD, "0", str(truth)],
                            stdout=subprocess.PIPE, stderr=sub_fd, text=True)
    os.close(sub_fd)
    terminal = b""
    try:
        while chunk := _read(main_fd):
            terminal += chunk
        assert proc.wait(timeout=60) == 0, terminal
    finally:
        proc.kill()
        os.close(main_fd)
    assert proc.stdout is not None
    pid = int(proc.stdout.readline().split()[1])
    assert not Path(f"/proc/{pid}").exists()  # ended and reaped
    cpu = float(truth.read_text().split()[1])  # what it measured when SIGTERM came
    text = terminal.decode()
    progress = re.findall(r"\rember record: (\d+)s left, (\d+) samples so far\x1b\[K", text)
    assert progress, repr(text)
    assert [int(left) for left, _ in progress] == sorted(
        (int(left) for left, _ in progress), reverse=True)
    assert all(1 <= int(left) <= 2 for left, _ in progress)  # shown from 2 s on
    name, stacks, samples = wrote(text.replace("\r\x1b[K", "\n"))
    assert name == str(out)
    p = decode_pprof(out.read_bytes())
    assert stacks == len({tuple(s.location_id) for s in p.sample})
    assert samples == sum(s.value[0] for s in p.sample)
    assert all(int(n) <= samples for _, n in progress)
    assert 0.85 * cpu * FREQUENCY <= samples <= 1.15 * cpu * FREQUENCY, (samples, cpu)


def _read(fd: int) -> bytes:
    """What the terminal shows next; b'' once every writer closed it."""
    try:
        return os.read(fd, 4096)
    except OSError:  # EIO: the other side is closed
        return b""
