"""Checks that the host can run ember's BPF programs, each failing with a
message that says what to do. Run before bcc is asked to compile anything, so
the user sees one line instead of a compiler backtrace."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..errors import BccMissingError, KernelHeadersError, PrivilegeError, TracefsError

CAP_DAC_READ_SEARCH = 2
CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21
CAP_SYSLOG = 34
CAP_PERFMON = 38
CAP_BPF = 39

log = logging.getLogger(__name__)

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
    if tracefs_root() is not None:
        return
    for p in TRACEFS_PATHS:
        if p.is_dir() and not os.access(p, os.R_OK | os.X_OK):
            raise TracefsError(
                f"cannot read {p} (tracefs is root-only): the run-queue, wakeup and "
                "off-wake profiles need its tracepoint ids; run as root or grant "
                "CAP_DAC_READ_SEARCH")
    raise TracefsError(
        "tracefs is not mounted (needed for the sched_switch tracepoint): "
        "mount -t tracefs nodev /sys/kernel/tracing")


#: Capabilities ember works without, at a loss (bit, name, what is lost).
OPTIONAL_CAPS = (
    (CAP_SYS_PTRACE, "CAP_SYS_PTRACE",
     "frames in other mount namespaces (containers) are named object+offset only "
     "(/proc/PID/root is unreadable)"),
    (CAP_DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH",
     "frames in binaries this user cannot read are named object+offset only"),
    (CAP_SYSLOG, "CAP_SYSLOG",
     "kernel frames stay unnamed (/proc/kallsyms hides addresses: kernel.kptr_restrict=1)"),
)


def capability_warnings(caps: int | None = None, uid: int | None = None,
                        kptr_restrict: Path = Path("/proc/sys/kernel/kptr_restrict")) -> list[str]:
    """What will be missing for lack of an optional capability (none as root)."""
    caps = effective_capabilities() if caps is None else caps
    uid = os.geteuid() if uid is None else uid
    out = []
    for bit, name, loss in OPTIONAL_CAPS:
        if caps & (1 << bit) or caps & (1 << CAP_SYS_ADMIN):
            continue
        if bit == CAP_SYS_PTRACE and uid == 0:
            continue  # root owns most processes; ptrace checks pass by uid
        if bit == CAP_DAC_READ_SEARCH and uid == 0:
            continue
        if bit == CAP_SYSLOG:
            try:
                if int(kptr_restrict.read_text()) == 0:
                    continue
            except (OSError, ValueError):
                pass
        out.append(f"without {name}: {loss}")
    return out


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
    """Fail early with a clear message on what BPF needs; warn about what
    optional capabilities are missing."""
    check_privileges()
    check_bcc()
    check_kernel_headers()
    if tracepoints:
        check_tracefs()
    for warning in capability_warnings():
        log.warning("%s", warning)
