"""Bad input: one clear line on stderr and exit status 2, before any BPF."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EMBER = [sys.executable, "-m", "ember.cli"]


def run(*args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [*EMBER, *args]
    if user:
        cmd = ["setpriv", f"--reuid={user}", "--regid=65534", "--clear-groups",
               "--inh-caps=-all", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


@pytest.mark.parametrize(("args", "message"), [
    (["--frequency", "0"], "--frequency must be between 1 and"),
    (["--frequency", "abc"], "not an integer: 'abc'"),
    (["--pid", "999999999"], "no process with PID 999999999"),
    (["--pid", "-3"], "no process with PID -3"),
    (["--duration", "-1"], "--duration must be positive"),
    (["--mode", "gpu"], "invalid choice: 'gpu'"),
    (["--output", "/nonexistent-dir/out.folded"], "directory /nonexistent-dir does not exist"),
    (["--output", "/"], "it is a directory"),
    (["--mode", "offcpu", "--min-block-us", "100", "--max-block-us", "10"],
     "--max-block-us 10 is below --min-block-us 100"),
    (["--state", "4096"], "--state must be a mask"),
    (["--no-kernel-stacks", "--no-user-stacks"], "at least one of user and kernel stacks"),
])
def test_bad_input(args: list[str], message: str) -> None:
    r = run("record", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == ""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root to drop to an unprivileged user")
def test_missing_privilege_names_the_capability() -> None:
    r = run("record", "--duration", "1", user="nobody")
    assert r.returncode == 2, r.stderr
    assert "CAP_BPF and CAP_PERFMON" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to an unprivileged user")
def test_unreadable_output_directory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    r = run("record", "--output", str(locked / "sub" / "x"), user="nobody")
    assert r.returncode == 2 and "cannot write" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_help_lists_record() -> None:
    r = run("--help")
    assert r.returncode == 0 and "record" in r.stdout
