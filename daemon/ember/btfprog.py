"""BTF tracepoints (tp_btf) for programs compiled by bcc.

A tp_btf program gets the tracepoint's raw arguments with their kernel types,
so it can hand ``struct task_struct *`` to helpers such as task storage and
bpf_get_task_stack. bcc 0.26 compiles such a function but cannot load it (its
loader drops the attach type when it looks up the BTF id), so this module
loads the instructions bcc produced, already relocated against bcc's maps,
with BPF_PROG_LOAD as BPF_PROG_TYPE_TRACING / BPF_TRACE_RAW_TP, and attaches
them with BPF_RAW_TRACEPOINT_OPEN. No trampoline is involved: this works
where fentry/fexit are refused.
"""

from __future__ import annotations

import ctypes as ct
import os
import struct
from typing import Any

from .errors import BpfError

_SYS_BPF = 321  # x86_64
_BPF_PROG_LOAD = 5
_BPF_RAW_TRACEPOINT_OPEN = 17
_BPF_PROG_TYPE_TRACING = 26
_BPF_TRACE_RAW_TP = 23
# union bpf_attr, BPF_PROG_LOAD, up to attach_btf_id (include/uapi/linux/bpf.h)
_PROG_LOAD = struct.Struct("=IIQQIIQII16sIIIIQIIQII")
_ATTR_SIZE = 128
_LOG_SIZE = 1 << 20

_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long


def _bpf(cmd: int, attr: ct.Array[ct.c_char]) -> int:
    return int(_libc.syscall(_SYS_BPF, cmd, attr, _ATTR_SIZE))


class BtfTracepoint:
    """One bcc-compiled function attached to a BTF tracepoint."""

    def __init__(self, bpf: Any, fn_name: str, tracepoint: str):
        from bcc import lib

        name = fn_name.encode()
        start = lib.bpf_function_start(bpf.module, name)
        size = lib.bpf_function_size(bpf.module, name)
        if not start or not size:
            raise BpfError(f"BPF function {fn_name} not compiled")
        find = lib.libbpf_find_vmlinux_btf_id
        find.argtypes = [ct.c_char_p, ct.c_int]
        find.restype = ct.c_int
        btf_id = find(tracepoint.encode(), _BPF_TRACE_RAW_TP)
        if btf_id <= 0:
            raise BpfError(f"tracepoint {tracepoint} not in the kernel's BTF "
                           "(needs CONFIG_DEBUG_INFO_BTF)")
        log = ct.create_string_buffer(_LOG_SIZE)
        license_ = ct.c_char_p(b"GPL")
        attr = ct.create_string_buffer(_ATTR_SIZE)
        _PROG_LOAD.pack_into(
            attr, 0, _BPF_PROG_TYPE_TRACING, size // 8,
            ct.cast(start, ct.c_void_p).value or 0,
            ct.cast(license_, ct.c_void_p).value or 0,
            1, _LOG_SIZE, ct.addressof(log), 0, 0, name[:15], 0, _BPF_TRACE_RAW_TP,
            0, 0, 0, 0, 0, 0, 0, btf_id)
        self.prog_fd = _bpf(_BPF_PROG_LOAD, attr)
        if self.prog_fd < 0:
            err = ct.get_errno()
            tail = log.value.decode(errors="replace").strip().splitlines()[-12:]
            raise BpfError(f"loading {fn_name} for tp_btf/{tracepoint} failed: "
                           f"{os.strerror(err)}\n" + "\n".join(tail))
        self.fn_name = fn_name
        self.tracepoint = tracepoint
        self.link_fd = -1

    def attach(self) -> None:
        if self.link_fd >= 0:
            return
        attr = ct.create_string_buffer(_ATTR_SIZE)
        struct.pack_into("=QI", attr, 0, 0, self.prog_fd)
        fd = _bpf(_BPF_RAW_TRACEPOINT_OPEN, attr)
        if fd < 0:
            raise BpfError(f"attaching tp_btf/{self.tracepoint} failed: "
                           f"{os.strerror(ct.get_errno())}")
        self.link_fd = fd

    def detach(self) -> None:
        if self.link_fd >= 0:
            os.close(self.link_fd)
            self.link_fd = -1

    def close(self) -> None:
        self.detach()
        if self.prog_fd >= 0:
            os.close(self.prog_fd)
            self.prog_fd = -1
