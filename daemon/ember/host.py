"""Checks that the host can run ember's BPF programs, each failing with a
message that says what to do. Run before bcc is asked to compile anything, so
the user sees one line instead of a compiler backtrace."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import BccMissingError, KernelHeadersError, PrivilegeError, TracefsError

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39

TRACEFS_PATHS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


def effective_capabilities(status_path: Path = Path("/proc/self/status")) -> int:
    for line in status_path.read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_privileges(caps: int | None = None) -> None:
    """BPF programs need CAP_BPF (load programs, create maps) and CAP_PERFMON
    (perf events, stack walking, tracepoints); CAP_SYS_ADMIN implies both."""
    caps = effective_capabilities() if caps is None else caps
    if caps & (1 << CAP_SYS_ADMIN):
        return
    missing = [name for bit, name in ((CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON"))
               if not caps & (1 << bit)]
    if missing:
        raise PrivilegeError(
            f"missing capability {' and '.join(missing)}: ember loads BPF programs and "
            "opens perf events; run as root or grant CAP_BPF and CAP_PERFMON")


def check_kernel_headers(release: str | None = None, modules: Path = Path("/lib/modules"),
                         kheaders: Path = Path("/sys/kernel/kheaders.tar.xz")) -> None:
    release = release or os.uname().release
    if os.environ.get("BCC_KERNEL_SOURCE"):
        src = Path(os.environ["BCC_KERNEL_SOURCE"])
        if not src.is_dir():
            raise KernelHeadersError(f"BCC_KERNEL_SOURCE={src} is not a directory")
        return
    build = modules / release / "build"
    if (build / "include").is_dir() or kheaders.exists():
        return
    raise KernelHeadersError(
        f"no kernel headers for {release} at {build}: install linux-headers-{release}, or run "
        "deploy/host-setup.sh, which links the nearest Debian headers there")


def tracefs_root() -> Path | None:
    for p in TRACEFS_PATHS:
        if (p / "events").is_dir():
            return p
    return None


def check_tracefs() -> None:
    if tracefs_root() is None:
        raise TracefsError(
            "tracefs is not mounted (needed for the sched_switch tracepoint): "
            "mount -t tracefs nodev /sys/kernel/tracing")


def check_bcc() -> None:
    """bcc is importable (found, not imported: only the build child loads it)."""
    import importlib.util

    spec = importlib.util.find_spec("bcc")
    if spec is None or not spec.origin or not os.path.exists(
            os.path.join(os.path.dirname(spec.origin), "libbcc.py")):
        raise BccMissingError(
            "cannot import bcc: install Debian's python3-bpfcc and use the venv made "
            "by deploy/host-setup.sh (the PyPI package named bcc is unrelated)")


def preflight(tracepoints: bool) -> None:
    check_privileges()
    check_bcc()
    check_kernel_headers()
    if tracepoints:
        check_tracefs()
