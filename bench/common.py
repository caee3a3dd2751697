"""Helpers shared by the benchmark scripts (run them as root from the repo)."""

from __future__ import annotations

import os
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EMBER = [str(ROOT / ".venv/bin/ember")]


def start_ember(*args: str, timeout: float = 60) -> subprocess.Popen[str]:
    """Start `ember record -v ...` and return once its programs are attached."""
    proc = subprocess.Popen([*EMBER, "-v", "record", *args], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([proc.stderr], [], [], 1)
        if ready:
            line = proc.stderr.readline()
            if line.startswith("recording"):
                return proc
            if not line and proc.poll() is not None:
                break
    proc.kill()
    raise RuntimeError("ember did not start")


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return err


def summary(xs: list[float]) -> str:
    return (f"median {statistics.median(xs):.4g}  min {min(xs):.4g}  max {max(xs):.4g}  "
            f"(n={len(xs)})")


def need_root() -> None:
    if os.geteuid() != 0:
        sys.exit("run as root (BPF)")
