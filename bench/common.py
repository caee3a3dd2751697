"""Helpers shared by the benchmark scripts (run them as root from the repo)."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EMBER = [str(ROOT / ".venv/bin/ember")]


def start_ember(*args: str, timeout: float = 60, cpu: int | None = None
                ) -> subprocess.Popen[str]:
    """Start `ember record -v ...` (on that CPU only, with cpu) and return
    once its programs are attached."""
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    proc = subprocess.Popen([*pin, *EMBER, "-v", "record", *args], stderr=subprocess.PIPE,
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


def spread(xs: list[float], fmt: str = ".3f") -> str:
    """median (min-max) of a figure over the rounds."""
    if not xs:
        return "-"
    return (f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})")


def summary(xs: list[float]) -> str:
    return (f"median {statistics.median(xs):.4g}  min {min(xs):.4g}  max {max(xs):.4g}  "
            f"(n={len(xs)})")


def need_root() -> None:
    if os.geteuid() != 0:
        sys.exit("run as root (BPF)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_kb(pid: int, key: str) -> int:
    """A field of /proc/PID/status in kB (VmRSS, VmHWM, ...)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def pss_kb(pid: int) -> int:
    """A process's proportional set size in kB (/proc/PID/smaps_rollup):
    its RSS with each page shared with other processes (libraries, a
    forkserver's children's inherited pages) divided among them, so the
    sum over a family of processes counts each page once."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def fdinfo(pid: int) -> list[dict[str, str]]:
    """The fdinfo fields of every open fd of a process (BPF maps and programs
    show map_type / prog_type, memlock, run_time_ns, run_cnt)."""
    out = []
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            text = info.read_text()
        except OSError:
            continue
        out.append(dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line))
    return out


def prog_stats(pid: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the BPF programs process pid holds
    (needs kernel.bpf_stats_enabled=1)."""
    t = n = 0
    for fields in fdinfo(pid):
        if "run_cnt" in fields and "prog_type" in fields:
            t += int(fields["run_time_ns"])
            n += int(fields["run_cnt"])
    return t, n


def map_memory(pid: int) -> int:
    """Kernel memory (memlock) of the BPF maps process pid holds."""
    return sum(int(f["memlock"]) for f in fdinfo(pid) if "map_type" in f and "memlock" in f)


def symbolize_passes(pid: int) -> dict[str, Callable[[list[int]], None]]:
    """One pass of ember's symbolizer and one of bcc's BPF.sym over the same
    addresses of a live process, one address per call (leaf-first: no
    return-address adjustment). Each keeps its own caches across passes."""
    from bcc import BPF

    from ember.symbols.procmaps import ProcessTable
    from ember.symbols.symbolizer import Symbolizer

    sym = Symbolizer(ProcessTable())

    def ember_pass(a: list[int]) -> None:
        for x in a:
            sym.user_frames(pid, [x])

    def bcc_pass(a: list[int]) -> None:
        for x in a:
            BPF.sym(x, pid, show_module=True)

    return {"ember": ember_pass, "bcc": bcc_pass}


def pipe_us(loops: int) -> float:
    """Microseconds per pipe round trip (two context switches) on CPU 0."""
    out = subprocess.run(["taskset", "-c", "0", "perf", "bench", "sched", "pipe", "-l",
                          str(loops)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"([\d.]+)\s+usecs/op", out)
    if not m:
        raise RuntimeError(out)
    return float(m.group(1))


STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


class BpfStats:
    """kernel.bpf_stats_enabled on for the duration, restored after."""

    def __enter__(self) -> None:
        self.before = STATS.read_text().strip()
        STATS.write_text("1")

    def __exit__(self, *exc: object) -> None:
        STATS.write_text(self.before)


def ns_per_sample(work: subprocess.Popen[bytes], seconds: float, *record_args: str) -> float:
    """BPF ns per on-CPU sample of the running workload: `ember record`
    at 999 Hz on it, pinned to CPU 1, the kernel's own run time over
    `seconds`; the workload is killed after."""
    try:
        time.sleep(0.5)
        rec = start_ember("--pid", str(work.pid), "--frequency", "999", "--no-kernel-stacks",
                          *record_args, "-o", "/dev/null", cpu=1)
        try:
            with BpfStats():
                t0, n0 = prog_stats(rec.pid)
                time.sleep(seconds)
                t1, n1 = prog_stats(rec.pid)
        finally:
            stop(rec)
    finally:
        work.kill()
        work.wait()
    return (t1 - t0) / max(1, n1 - n0)


def fetch(url: str, timeout: float = 300) -> float:
    """Seconds to GET ``url`` and read all of its answer."""
    import urllib.request
    began = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        r.read()
    return time.perf_counter() - began


def wait_healthy(port: int, proc: subprocess.Popen[bytes], what: str = "collector") -> None:
    """Once the ember process ``proc`` answers /healthz on ``port``;
    RuntimeError if it exits first."""
    while True:
        try:
            fetch(f"http://127.0.0.1:{port}/healthz")
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{what}: exited ({proc.returncode})") from None
            time.sleep(0.2)


def metric(port: int, name: str) -> int:
    """The sum of a Prometheus metric's samples on an ember HTTP port."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
        text = r.read().decode()
    return sum(int(float(line.split()[-1])) for line in text.splitlines()
               if line.startswith(f"{name} "))


def render(title: str, head: list[str], rows: list[list[str]]) -> str:
    """A markdown table under a heading."""
    out = [f"### {title}", "", "| " + " | ".join(head) + " |",
           "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"
