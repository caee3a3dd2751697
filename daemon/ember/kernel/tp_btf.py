"""Loading BTF tracepoint (tp_btf) and iterator programs that bcc compiled.

A tp_btf program gets the tracepoint's raw arguments with their kernel types,
so it can hand ``struct task_struct *`` to helpers such as task storage and
bpf_get_task_stack. bcc 0.26 compiles such a function but cannot load it (its
loader drops the attach type when it looks up the BTF id), so ember loads the
instructions bcc produced, already relocated against bcc's maps, with
BPF_PROG_LOAD as BPF_PROG_TYPE_TRACING / BPF_TRACE_RAW_TP. Attaching is
BPF_RAW_TRACEPOINT_OPEN (syscalls.raw_tracepoint_open): no trampoline, so this
works where fentry/fexit are refused. Runs where bcc is loaded (the build
child, benchmarks).
"""

from __future__ import annotations

import ctypes as ct
from typing import Any

from ..errors import BpfError
from . import syscalls

_LOG_SIZE = 1 << 20


def load_tp_btf(bpf: Any, fn_name: str, tracepoint: str) -> int:
    """Load bcc-compiled function fn_name for tp_btf/tracepoint; the prog fd."""
    return _load_tracing(bpf, fn_name, tracepoint, syscalls.TRACE_RAW_TP, f"tp_btf/{tracepoint}")


def load_iter(bpf: Any, fn_name: str, target: str) -> int:
    """Load bcc-compiled function fn_name as a BPF iterator over target
    ("task": bpf_iter_task); the prog fd. bcc 0.26 has no loader for it."""
    return _load_tracing(bpf, fn_name, target, syscalls.TRACE_ITER, f"iter/{target}")


def _load_tracing(bpf: Any, fn_name: str, target: str, attach_type: int, where: str) -> int:
    from bcc import lib

    name = fn_name.encode()
    start = lib.bpf_function_start(bpf.module, name)
    size = lib.bpf_function_size(bpf.module, name)
    if not start or not size:
        raise BpfError(f"BPF function {fn_name} not compiled")
    find = lib.libbpf_find_vmlinux_btf_id
    find.argtypes = [ct.c_char_p, ct.c_int]
    find.restype = ct.c_int
    btf_id = find(target.encode(), attach_type)
    if btf_id <= 0:
        raise BpfError(f"{where} not in the kernel's BTF (needs CONFIG_DEBUG_INFO_BTF)")
    insns = ct.cast(start, ct.c_void_p).value or 0
    try:
        return syscalls.prog_load_tracing(insns, size, name, btf_id, attach_type=attach_type)
    except OSError:
        pass
    log = ct.create_string_buffer(_LOG_SIZE)  # again, for the verifier's reasons
    try:
        return syscalls.prog_load_tracing(insns, size, name, btf_id, log, attach_type)
    except OSError as exc:
        tail = log.value.decode(errors="replace").strip().splitlines()[-12:]
        raise BpfError(f"loading {fn_name} for {where} failed: "
                       f"{exc.strerror}\n" + "\n".join(tail)) from None
