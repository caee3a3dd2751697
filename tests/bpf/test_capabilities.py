"""The agent's least privilege, on the real kernel: `ember record` runs as an
unprivileged user holding only the capabilities the systemd unit grants
(deploy/systemd/ember-agent.service), and each one missing fails or degrades
exactly as documented (docs/install.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ember.encode.folded import parse_folded
from tests.support import ROOT

pytestmark = pytest.mark.bpf

UNIT_CAPS = ("bpf", "perfmon", "sys_ptrace", "dac_read_search", "syslog")


def unit_capabilities() -> tuple[str, ...]:
    text = (ROOT / "deploy/systemd/ember-agent.service").read_text()
    line = next(x for x in text.splitlines() if x.startswith("AmbientCapabilities="))
    return tuple(c.removeprefix("CAP_").lower() for c in line.split("=", 1)[1].split())


@pytest.fixture
def hidden_workload(fixture_bin: Path) -> Iterator[tuple[int, Path]]:
    """cpu_shares, run by root from a directory only root can enter."""
    hidden = Path(tempfile.mkdtemp(prefix="ember-hidden-"))
    hidden.chmod(0o700)
    exe = hidden / "cpu_shares"
    shutil.copy(fixture_bin / "cpu_shares", exe)
    # (killed below: its own lifetime is a guard; two recordings, each
    # compiling the programs, outlasted 30 s)
    proc = subprocess.Popen([str(exe), "300"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
    try:
        yield proc.pid, hidden
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(hidden)


@pytest.fixture
def container_workload(fixture_bin: Path) -> Iterator[int]:
    """cpu_shares run by root from a tmpfs mounted in a mount namespace of its
    own, as a container's binaries are: its path resolves only through
    /proc/PID/root."""
    mnt = Path(tempfile.mkdtemp(prefix="ember-ns-"))
    mnt.chmod(0o755)
    script = (f"mount -t tmpfs -o mode=755 tmpfs {mnt} && cp {fixture_bin / 'cpu_shares'} "
              f"{mnt}/ && exec {mnt}/cpu_shares 300")   # (killed below, as above)
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        mnt.rmdir()


@pytest.fixture
def kptr_restricted() -> Iterator[None]:
    path = Path("/proc/sys/kernel/kptr_restrict")
    before = path.read_text()
    path.write_text("1")
    try:
        yield
    finally:
        path.write_text(before)


def record_as_nobody(caps: tuple[str, ...], pid: int, mode: str = "cpu"
                     ) -> tuple[subprocess.CompletedProcess[str], dict[str, int]]:
    out_dir = Path(tempfile.mkdtemp(prefix="ember-caps-"))
    out_dir.chmod(0o777)
    out = out_dir / "out.folded"
    spec = ",".join(f"+{c}" for c in caps) or "-all"
    try:
        r = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             f"--inh-caps=-all,{spec}" if caps else "--inh-caps=-all",
             f"--ambient-caps=-all,{spec}" if caps else "--ambient-caps=-all",
             f"--bounding-set=-all,{spec}" if caps else "--bounding-set=-all",
             sys.executable, "-m", "ember.cli", "record", "--mode", mode, "--pid", str(pid),
             "--duration", "2", "--frequency", "499", "-o", str(out)],
            capture_output=True, text=True, timeout=120, cwd="/",
            env={**os.environ, "HOME": "/nonexistent"})
        folded = parse_folded(out.read_text()) if out.exists() else {}
    finally:
        shutil.rmtree(out_dir)
    return r, folded


def names(folded: dict[str, int]) -> set[str]:
    return {f for stack in folded for f in stack.split(";")}


def test_unit_grants_what_this_test_checks() -> None:
    assert unit_capabilities() == UNIT_CAPS


def test_the_unit_capabilities_are_enough(hidden_workload, kptr_restricted) -> None:  # type: ignore[no-untyped-def]
    pid, _ = hidden_workload
    r, folded = record_as_nobody(UNIT_CAPS, pid)
    assert r.returncode == 0, r.stderr
    frames = names(folded)
    assert {"work_a", "work_b", "work_c"} <= frames  # user frames named
    assert "missing capability" not in r.stderr and "without CAP_" not in r.stderr


@pytest.mark.parametrize("missing", ["bpf", "perfmon"])
def test_required_capabilities_fail_clearly(hidden_workload, missing: str) -> None:  # type: ignore[no-untyped-def]
    pid, _ = hidden_workload
    r, _ = record_as_nobody(tuple(c for c in UNIT_CAPS if c != missing), pid)
    assert r.returncode == 2
    assert f"missing capability CAP_{missing.upper()}" in r.stderr
    assert "Traceback" not in r.stderr


def test_without_sys_ptrace_containers_lose_names(container_workload: int) -> None:
    """Binaries of another mount namespace are read through /proc/PID/root,
    which needs CAP_SYS_PTRACE; without it frames are object+offset."""
    r, folded = record_as_nobody(UNIT_CAPS, container_workload)
    assert r.returncode == 0, r.stderr
    assert {"work_a", "work_b"} <= names(folded)
    r, folded = record_as_nobody(tuple(c for c in UNIT_CAPS if c != "sys_ptrace"),
                                 container_workload)
    assert r.returncode == 0, r.stderr
    frames = names(folded)
    assert "work_a" not in frames and any(f.startswith("cpu_shares+0x") for f in frames)
    assert "without CAP_SYS_PTRACE" in r.stderr


def test_without_dac_read_search_unreadable_binaries_lose_names(hidden_workload) -> None:  # type: ignore[no-untyped-def]
    pid, _ = hidden_workload
    r, folded = record_as_nobody(tuple(c for c in UNIT_CAPS if c != "dac_read_search"), pid)
    assert r.returncode == 0, r.stderr
    frames = names(folded)
    assert "work_a" not in frames and any(f.startswith("cpu_shares+0x") for f in frames)
    assert "without CAP_DAC_READ_SEARCH" in r.stderr


def test_without_syslog_kernel_frames_lose_names(start_workload, kptr_restricted) -> None:  # type: ignore[no-untyped-def]
    """Off-CPU stacks always have a kernel part: named with CAP_SYSLOG, only
    [kernel.kallsyms] without it (kernel.kptr_restrict=1)."""
    w = start_workload("offcpu_waits")
    r, folded = record_as_nobody(UNIT_CAPS, w.pid, mode="offcpu")
    assert r.returncode == 0, r.stderr
    assert "do_epoll_wait" in names(folded)
    r, folded = record_as_nobody(tuple(c for c in UNIT_CAPS if c != "syslog"), w.pid,
                                 mode="offcpu")
    assert r.returncode == 0, r.stderr
    frames = names(folded)
    assert "do_epoll_wait" not in frames and "[kernel.kallsyms]" in frames
    assert {"wait_epoll", "wait_sleep"} <= frames  # user frames unaffected
    assert "without CAP_SYSLOG" in r.stderr
