"""`ember record` as a user runs it: real BPF, real output files."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ember.encode.folded import parse_folded
from ember.encode.pprof import decode_pprof
from tests.support import SRC

pytestmark = pytest.mark.bpf

EMBER = [sys.executable, "-m", "ember.cli"]


def test_folded_with_delimiter(start_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("offcpu_waits")
    out = tmp_path / "off.folded"
    r = subprocess.run([*EMBER, "record", "--mode", "offcpu", "-p", str(w.pid),
                        "-d", "2s", "--delimiter", "-o", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    folded = parse_folded(out.read_text())
    waiter = {k: v for k, v in folded.items() if k.startswith("waiter;")}
    assert waiter
    for stack in waiter:
        frames = stack.split(";")
        # thread; user frames; -; kernel frames; state
        assert "-" in frames and frames.index("wait_epoll" if "wait_epoll" in frames
                                              else "wait_sleep") < frames.index("-")
        assert frames.index("-") < frames.index("do_syscall_64")
        assert frames[-1] == "[sleeping]"
    # microseconds: about 2 s in total
    assert 1.7e6 <= sum(waiter.values()) <= 2.2e6
    # the last line counts the file: its lines, and its total in its unit
    assert r.stderr.splitlines()[-1] == (
        f"ember record: wrote {out} ({len(out.read_text().splitlines())} stacks, "
        f"{sum(folded.values())} us off_cpu)")


@pytest.mark.skipif(not shutil.which("go"), reason="go (golang-go) not installed")
def test_pprof_read_by_go_tool_pprof(start_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("pie_main")
    out = tmp_path / "cpu.pb.gz"
    r = subprocess.run([*EMBER, "record", "--pid", str(w.pid), "--duration", "2",
                        "--frequency", "499", "--format", "pprof", "-o", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    p = decode_pprof(out.read_bytes())
    s = p.string_table
    assert s[0] == "" and [s[t.type] for t in p.sample_type] == ["samples", "cpu"]
    assert p.period == 1_000_000_000 // 499
    for kind in (p.mapping, p.location, p.function):
        assert [x.id for x in kind] == list(range(1, len(kind) + 1))
    assert all(len(x.value) == 2 and x.value[1] == x.value[0] * p.period for x in p.sample)
    assert {s[f.name] for f in p.function} >= {"lib_burn", "exe_burn", "main"}
    env = {**os.environ, "HOME": str(tmp_path), "GOCACHE": str(tmp_path / "gocache"),
           "GOFLAGS": "-mod=mod", "PPROF_TMPDIR": str(tmp_path)}
    top = subprocess.run(["go", "tool", "pprof", "-top", "-sample_index=samples", str(out)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert top.returncode == 0, top.stderr
    assert "lib_spin" in top.stdout and "exe_burn" in top.stdout, top.stdout
    assert "Type: samples" in top.stdout


def test_ctrl_c_still_writes(start_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = start_workload("cpu_shares")
    out = tmp_path / "cpu.folded"
    proc = subprocess.Popen([*EMBER, "-v", "record", "--pid", str(w.pid), "-o", str(out)],
                            stderr=subprocess.PIPE, text=True)
    # its own word that its programs are attached (another ember's programs
    # in /proc/kallsyms, a CI run beside this one, said nothing of these)
    lines: list[str] = []
    attached = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("recording "):
                attached.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert attached.wait(120), "".join(lines)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    reader.join(timeout=30)
    assert proc.returncode == 0, "".join(lines)
    folded = parse_folded(out.read_text())
    assert sum(v for k, v in folded.items() if "work_b" in k) > 50


def test_programs_compile_with_warnings_as_errors() -> None:
    from ember.kernel.program import Program
    from ember.kernel.programs import PROGRAMS
    for kind in PROGRAMS:
        Program(kind, strict=True).close()


def test_lines_and_inlined_frames_in_pprof(start_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """ember record --lines on an -O2 program: the hot loop's samples land in
    one Location per address whose Lines are scramble (inlined) at its loop,
    mix (inlined) at the call of scramble, work at the call of mix; go tool
    pprof reads them as inlined frames."""
    src = SRC / "inline_lines.c"
    marks = {m: n for n, text in enumerate(src.read_text().splitlines(), start=1)
             for m in ("SCRAMBLE_FOR", "SCRAMBLE_LOOP", "SCRAMBLE_MUL", "MIX_CALL",
                       "WORK_CALL")
             if f"/* {m} */" in text}
    w = start_workload("inline_lines")
    out = tmp_path / "cpu.pb.gz"
    r = subprocess.run([*EMBER, "record", "--pid", str(w.pid), "--duration", "3",
                        "--frequency", "499", "--lines", "--format", "pprof", "-o", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    p = decode_pprof(out.read_bytes())
    s = p.string_table
    fn = {f.id: (s[f.name], s[f.filename]) for f in p.function}
    locs = {loc.id: [(*fn[ln.function_id], ln.line) for ln in loc.line] for loc in p.location}
    total = inlined = 0
    for sample in p.sample:
        leaf = locs[sample.location_id[0]]
        total += sample.value[0]
        if ([(name, line) for name, _, line in leaf[1:]]
                == [("mix", marks["MIX_CALL"]), ("work", marks["WORK_CALL"])]
                and leaf[0][0] == "scramble"
                and leaf[0][2] in (marks["SCRAMBLE_FOR"], marks["SCRAMBLE_LOOP"],
                                   marks["SCRAMBLE_MUL"])
                and all(file == str(src.resolve()) for _, file, _ in leaf)):
            inlined += sample.value[0]
    assert total >= 200, total  # enough for the share below to mean something
    assert inlined >= 0.9 * total, (inlined, total, sorted(locs.values())[:10])
    env = {**os.environ, "HOME": str(tmp_path), "GOCACHE": str(tmp_path / "gocache"),
           "PPROF_TMPDIR": str(tmp_path)}
    top = subprocess.run(["go", "tool", "pprof", "-traces", str(out)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert top.returncode == 0, top.stderr
    assert re.search(r"scramble\s*\(inline\)", top.stdout), top.stdout[:2000]
    assert re.search(r"mix\s*\(inline\)", top.stdout), top.stdout[:2000]
