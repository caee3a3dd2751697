"""Struct member offsets of the running kernel, from its BTF.

The kernel headers on this machine are another version's: an offset taken
from them reads the wrong field, silently. /sys/kernel/btf/vmlinux
describes the running kernel's own types; this module reads just enough of
it (the type section's structs and unions) to answer "where is member m of
struct s", through anonymous members too.

Format: Documentation/bpf/btf.rst (a header, then the type and string
sections; each type a 12-byte header and kind-specific data after it).
"""

from __future__ import annotations

import struct
from pathlib import Path

from ..errors import EnvironmentProblem

VMLINUX = Path("/sys/kernel/btf/vmlinux")
_MAGIC = 0xEB9F
_STRUCT, _UNION = 4, 5
# bytes of kind-specific data after the 12-byte header: fixed, or per member
_FIXED = {1: 4, 3: 12, 14: 4, 17: 4}
_PER_ITEM = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}


class BtfError(EnvironmentProblem):
    label = "btf"


class Btf:
    """The structs and unions of one BTF blob, by type id."""

    def __init__(self, data: bytes):
        if len(data) < 24:
            raise BtfError("BTF: too short for a header")
        magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
        if magic != _MAGIC:
            raise BtfError(f"BTF: bad magic {magic:#x}")
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
        types = data[hdr_len + type_off:hdr_len + type_off + type_len]
        self._strings = data[hdr_len + str_off:hdr_len + str_off + str_len]
        # id -> (kind, name, size, members [(name, type id, bit offset)])
        self.types: dict[int, tuple[int, str, int, list[tuple[str, int, int]]]] = {}
        self.by_name: dict[tuple[int, str], int] = {}
        pos, tid = 0, 1
        while pos + 12 <= len(types):
            name_off, info, size = struct.unpack_from("<III", types, pos)
            kind, vlen, kflag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
            pos += 12
            if kind in (_STRUCT, _UNION):
                members = []
                for i in range(vlen):
                    m_name, m_type, m_off = struct.unpack_from("<III", types, pos + 12 * i)
                    bits = m_off & 0xFFFFFF if kflag else m_off
                    members.append((self._str(m_name), m_type, bits))
                name = self._str(name_off)
                self.types[tid] = (kind, name, size, members)
                if name:
                    self.by_name.setdefault((kind, name), tid)
            if kind in _PER_ITEM:
                pos += _PER_ITEM[kind] * vlen
            else:
                pos += _FIXED.get(kind, 0)
            tid += 1

    def _str(self, off: int) -> str:
        end = self._strings.find(b"\0", off)
        return self._strings[off:end if end >= 0 else None].decode("ascii", "replace")

    def offset(self, struct_name: str, member: str) -> int:
        """Byte offset of member in struct struct_name (anonymous structs and
        unions inside it searched too)."""
        tid = self.by_name.get((_STRUCT, struct_name))
        if tid is None:
            raise BtfError(f"BTF: no struct {struct_name}")
        found = self._find(tid, member, 0)
        if found is None:
            raise BtfError(f"BTF: struct {struct_name} has no member {member}")
        if found % 8:
            raise BtfError(f"BTF: {struct_name}.{member} is a bitfield")
        return found // 8

    def _find(self, tid: int, member: str, base: int) -> int | None:
        entry = self.types.get(tid)
        if entry is None:
            return None
        for name, m_type, bits in entry[3]:
            if name == member:
                return base + bits
            if not name and m_type in self.types:  # anonymous struct or union
                inner = self._find(m_type, member, base + bits)
                if inner is not None:
                    return inner
        return None


def task_fsbase_offset(path: Path = VMLINUX) -> int:
    """Where a task_struct keeps the user fs base (x86-64: the thread's TLS
    block, which glibc's pthread_self() returns)."""
    btf = _read(path)
    return btf.offset("task_struct", "thread") + btf.offset("thread_struct", "fsbase")


def _read(path: Path) -> Btf:
    try:
        return Btf(path.read_bytes())
    except OSError as e:
        raise BtfError(f"cannot read {path}: {e.strerror}") from e


def task_offsets(path: Path = VMLINUX) -> dict[str, int]:
    """The task_struct fields a thread census reads (bpf/census.h), as the
    -D flags it is compiled with."""
    btf = _read(path)
    off = btf.offset
    return {
        "EMBER_TASK_PID": off("task_struct", "pid"),
        "EMBER_TASK_TGID": off("task_struct", "tgid"),
        "EMBER_TASK_STATE": off("task_struct", "__state"),
        "EMBER_TASK_ON_CPU": off("task_struct", "on_cpu"),
        "EMBER_TASK_FLAGS": off("task_struct", "flags"),
        "EMBER_TASK_COMM": off("task_struct", "comm"),
        "EMBER_TASK_EXEC_START": off("task_struct", "se") + off("sched_entity", "exec_start"),
        "EMBER_TASK_CPU": off("task_struct", "thread_info") + off("thread_info", "cpu"),
        **_sched_clock_offsets(btf),
    }


def _sched_clock_offsets(btf: Btf) -> dict[str, int]:
    """Where a task's last switch-out is on the runqueue clock, and where
    the reader's runqueue keeps that clock now (bpf/census.h). Empty when the
    kernel lacks them (no CONFIG_SCHED_INFO or CONFIG_FAIR_GROUP_SCHED): the
    census then times blocks by se.exec_start alone (kernel/census.py)."""
    off = btf.offset
    try:
        se = off("task_struct", "se")
        return {
            "EMBER_TASK_LAST_ARRIVAL": off("task_struct", "sched_info")
            + off("sched_info", "last_arrival"),
            "EMBER_TASK_SUM_EXEC": se + off("sched_entity", "sum_exec_runtime"),
            "EMBER_TASK_PREV_SUM_EXEC": se + off("sched_entity", "prev_sum_exec_runtime"),
            "EMBER_TASK_POLICY": off("task_struct", "policy"),
            "EMBER_TASK_CFS_RQ": se + off("sched_entity", "cfs_rq"),
            "EMBER_CFS_RQ_RQ": off("cfs_rq", "rq"),
            "EMBER_RQ_CLOCK": off("rq", "clock"),
        }
    except BtfError:
        return {}
