"""The bpf(2) and perf_event_open(2) system calls, without libbcc.

The daemon drains maps, attaches programs and reads their statistics through
file descriptors alone: bcc (and the LLVM inside it) lives only in the short
child process that compiles the programs (build.py). Each function here is
one system call; failures raise OSError with the errno.

Layouts are the kernel's UAPI (include/uapi/linux/bpf.h, perf_event.h),
x86-64.
"""

from __future__ import annotations

import ctypes as ct
import os
import struct
from pathlib import Path

_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long

SYS_BPF = 321
SYS_PERF_EVENT_OPEN = 298
SYS_PIDFD_OPEN = 434
PIDFD_THREAD = os.O_EXCL  # a pidfd for one thread (kernel >= 6.9)

BPF_NOEXIST = 1  # map update flag: only if the key is not there

# bpf commands
MAP_LOOKUP_ELEM = 1
MAP_UPDATE_ELEM = 2
MAP_DELETE_ELEM = 3
MAP_GET_NEXT_KEY = 4
PROG_LOAD = 5
RAW_TRACEPOINT_OPEN = 17
LINK_CREATE = 28
ITER_CREATE = 33
MAP_LOOKUP_BATCH = 24
MAP_DELETE_BATCH = 27

PROG_TYPE_TRACING = 26
TRACE_RAW_TP = 23
TRACE_ITER = 28

_ATTR_SIZE = 128
_ELEM = struct.Struct("=I4xQQQ")                 # map_fd, key, value/next_key, flags
_BATCH = struct.Struct("=QQQQIIQQ")              # in/out batch, keys, values, count, fd, ...
_PROG_LOAD = struct.Struct("=IIQQIIQII16sIIIIQIIQII")  # up to attach_btf_id

# perf_event_open
PERF_TYPE_SOFTWARE = 1
PERF_TYPE_TRACEPOINT = 2
PERF_COUNT_SW_CPU_CLOCK = 0
_PERF_FLAG_FD_CLOEXEC = 1 << 3
_PERF_ATTR = struct.Struct("=IIQQQQQII")         # type, size, config, period/freq, ...
_PERF_ATTR_SIZE = 64                             # PERF_ATTR_SIZE_VER0
_ATTR_DISABLED = 1 << 0
_ATTR_FREQ = 1 << 10
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_SET_BPF = 0x40042408


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ct.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def bpf(cmd: int, attr: ct.Array[ct.c_char], what: str) -> int:
    return _check(int(_libc.syscall(SYS_BPF, cmd, attr, _ATTR_SIZE)), what)


def _attr(layout: struct.Struct, *values: object) -> ct.Array[ct.c_char]:
    buf = ct.create_string_buffer(_ATTR_SIZE)
    layout.pack_into(buf, 0, *values)
    return buf


def _addr(obj: object | None) -> int:
    return 0 if obj is None else ct.addressof(obj)  # type: ignore[arg-type]


# --- maps ----------------------------------------------------------------------

def map_lookup(fd: int, key: object, value: object) -> None:
    bpf(MAP_LOOKUP_ELEM, _attr(_ELEM, fd, _addr(key), _addr(value), 0), "map lookup")


def map_update(fd: int, key: object, value: object, flags: int = 0) -> None:
    bpf(MAP_UPDATE_ELEM, _attr(_ELEM, fd, _addr(key), _addr(value), flags), "map update")


def map_delete(fd: int, key: object) -> None:
    bpf(MAP_DELETE_ELEM, _attr(_ELEM, fd, _addr(key), 0, 0), "map delete")


def map_next_key(fd: int, key: object | None, next_key: object) -> None:
    bpf(MAP_GET_NEXT_KEY, _attr(_ELEM, fd, _addr(key), _addr(next_key), 0), "map next key")


def map_lookup_batch(fd: int, in_batch: object | None, out_batch: object, keys: int,
                     values: int, count: int) -> tuple[int, int]:
    """One BPF_MAP_LOOKUP_BATCH call; keys and values are buffer addresses.
    Returns (0 or -errno, elements copied): the count is valid on ENOENT too."""
    attr = _attr(_BATCH, _addr(in_batch), _addr(out_batch), keys, values, count, fd, 0, 0)
    rc = int(_libc.syscall(SYS_BPF, MAP_LOOKUP_BATCH, attr, _ATTR_SIZE))
    err = ct.get_errno() if rc < 0 else 0
    return -err, _BATCH.unpack_from(attr, 0)[4]


def map_delete_batch(fd: int, keys: int, count: int) -> tuple[int, int]:
    """One BPF_MAP_DELETE_BATCH call: (0 or -errno, elements deleted)."""
    attr = _attr(_BATCH, 0, 0, keys, 0, count, fd, 0, 0)
    rc = int(_libc.syscall(SYS_BPF, MAP_DELETE_BATCH, attr, _ATTR_SIZE))
    err = ct.get_errno() if rc < 0 else 0
    return -err, _BATCH.unpack_from(attr, 0)[4]


def pidfd_open(pid: int, thread: bool = False) -> int:
    """A pidfd for a process (or, with thread, one thread): the key of task
    storage maps from user space."""
    return _check(int(_libc.syscall(SYS_PIDFD_OPEN, pid, PIDFD_THREAD if thread else 0)),
                  "pidfd_open")


# --- programs ------------------------------------------------------------------

def prog_load_tracing(insns: int, insn_bytes: int, name: bytes, btf_id: int,
                      log: ct.Array[ct.c_char] | None = None,
                      attach_type: int = TRACE_RAW_TP) -> int:
    """BPF_PROG_LOAD of a BTF tracepoint program (tp_btf), or of a BPF
    iterator (attach_type TRACE_ITER); raises OSError.
    With ``log``, the verifier's log is left there: it logs every instruction
    it walks, which makes a big program's load several times slower, so
    load without it and ask again for the log only when the load fails."""
    license_ = ct.c_char_p(b"GPL")
    attr = _attr(_PROG_LOAD, PROG_TYPE_TRACING, insn_bytes // 8, insns,
                 ct.cast(license_, ct.c_void_p).value or 0, 1 if log is not None else 0,
                 len(log) if log is not None else 0,
                 ct.addressof(log) if log is not None else 0,
                 0, 0, name[:15], 0, attach_type, 0, 0, 0, 0, 0, 0, 0, btf_id)
    return bpf(PROG_LOAD, attr, "prog load")


def iter_link(prog_fd: int) -> int:
    """BPF_LINK_CREATE of a loaded iterator program; the link fd."""
    return bpf(LINK_CREATE, _attr(struct.Struct("=IIIIQI"), prog_fd, 0, TRACE_ITER, 0, 0, 0),
               "iterator link")


def iter_read(link_fd: int) -> bytes:
    """Run an iterator once (BPF_ITER_CREATE, then read to the end)."""
    fd = bpf(ITER_CREATE, _attr(struct.Struct("=II"), link_fd, 0), "iterator create")
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def raw_tracepoint_open(prog_fd: int) -> int:
    """Attach a tp_btf program (its BTF id names the tracepoint); the link fd."""
    return bpf(RAW_TRACEPOINT_OPEN, _attr(struct.Struct("=QI"), 0, prog_fd),
               "raw tracepoint open")


def prog_stats(fd: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of a program fd (kernel.bpf_stats_enabled=1)."""
    t = n = 0
    try:
        text = Path(f"/proc/self/fdinfo/{fd}").read_text()
    except OSError:
        return 0, 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "run_time_ns":
            t = int(value)
        elif key == "run_cnt":
            n = int(value)
    return t, n


def map_memory(fd: int) -> int:
    """Kernel memory charged to a map (fdinfo memlock), 0 if unknown."""
    try:
        for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
            if line.startswith("memlock:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


# --- perf events ---------------------------------------------------------------

def perf_event_open(type_: int, config: int, cpu: int, *, freq: int = 0,
                    period: int = 0) -> int:
    """A disabled perf event on one CPU (all processes)."""
    flags = _ATTR_DISABLED | (_ATTR_FREQ if freq else 0)
    attr = ct.create_string_buffer(_PERF_ATTR_SIZE)
    _PERF_ATTR.pack_into(attr, 0, type_, _PERF_ATTR_SIZE, config, freq or period, 0, 0, flags,
                         1, 0)
    return _check(int(_libc.syscall(SYS_PERF_EVENT_OPEN, attr, -1, cpu, -1,
                                    _PERF_FLAG_FD_CLOEXEC)), "perf_event_open")


def perf_attach_bpf(event_fd: int, prog_fd: int) -> None:
    _check(_libc.ioctl(event_fd, PERF_EVENT_IOC_SET_BPF, prog_fd), "PERF_EVENT_IOC_SET_BPF")
    _check(_libc.ioctl(event_fd, PERF_EVENT_IOC_ENABLE, 0), "PERF_EVENT_IOC_ENABLE")


def _cpu_list(path: str) -> list[int]:
    cpus: list[int] = []
    for part in Path(path).read_text().strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def online_cpus() -> list[int]:
    return _cpu_list("/sys/devices/system/cpu/online")


def possible_cpus() -> int:
    """Number of possible CPUs: the stride of per-CPU map values."""
    return len(_cpu_list("/sys/devices/system/cpu/possible"))


def tracepoint_id(category: str, name: str) -> int:
    for root in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        path = Path(root) / "events" / category / name / "id"
        if path.is_file():
            return int(path.read_text())
    raise FileNotFoundError(f"tracepoint {category}:{name} not found under tracefs "
                            "(mount -t tracefs nodev /sys/kernel/tracing)")
