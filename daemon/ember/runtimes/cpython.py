"""CPython processes: found, checked, and described to the BPF frame walker.

A process runs CPython when its executable or a mapped ``libpython3.X``
exports ``_PyRuntime`` and ``_PyEval_EvalFrameDefault``. Its version comes
from ``Py_Version`` in its memory (3.11+; 3.10 has none: the object's name,
python3.10 or libpython3.10), the offsets of its structs from
:mod:`.pylayouts` for that version; before BPF gets them they are
cross-checked against the process itself:

- ``PyCode_Type``'s member table (``co_filename``, ``co_name``,
  ``co_qualname``, ``co_firstlineno``, ``co_linetable``: their offsets as the
  interpreter exports them);
- on 3.13+, ``_Py_DebugOffsets`` at the start of ``_PyRuntime``: the
  interpreter's own statement of where its threads, frames and code live.

A process where any of them disagrees gets no Python frames (its stacks stay
native), counted by reason and logged once per reason. 3.10's thread states
name threads only by ``pthread_self()``: BPF compares it with the task's
user fs base, whose offset in ``task_struct`` comes from the kernel's BTF.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import abi
from ..cache import BoundedCache
from ..errors import EmberError
from ..kernel.btf import task_fsbase_offset
from ..symbols.procmaps import MapEntry, Process, ProcFS
from ..unwind.cfi import fde_ranges
from ..unwind.sections import read_sections
from .pylayouts import Layout, layout_for

log = logging.getLogger(__name__)

WALKED = ((3, 10), (3, 11), (3, 12), (3, 13))  # versions whose frames BPF walks
COLD = "_PyEval_EvalFrameDefault.cold"
_WANTED = ("_PyRuntime", "Py_Version", "_PyEval_EvalFrameDefault", COLD, "PyCode_Type")
_LIBPYTHON = re.compile(r"libpython3\.\d+")
_NAMED_VERSION = re.compile(r"python(3)\.(\d+)")
_DEBUG_COOKIE = b"xdebugpy"


class PythonError(EmberError):
    """A CPython process whose frames cannot be walked; ``reason`` is the
    metric label."""

    label = "python"

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class Interpreter:
    """One CPython process, as the frame walker and the namer need it."""

    pid: int
    version: tuple[int, int, int]
    layout: Layout
    runtime: int                           # address of _PyRuntime
    code_type: int                         # address of PyCode_Type
    eval_ranges: tuple[tuple[int, int], ...]  # the interpreter loop (and .cold)
    task_fsbase: int = 0                   # 3.10: offsetof(task_struct, thread.fsbase)

    @property
    def minor(self) -> tuple[int, int]:
        return self.version[0], self.version[1]

    def in_eval(self, ip: int) -> bool:
        return any(lo <= ip < hi for lo, hi in self.eval_ranges)

    def bpf(self) -> abi.PyProc:
        """The ember_py_procs value."""
        lay = self.layout
        v = abi.PyProc()
        # the main interpreter (head is the newest: a subinterpreter, once one exists)
        v.interp_head = self.runtime + lay.runtime_interpreters_main
        for i, (lo, hi) in enumerate(self.eval_ranges[:2]):
            v.eval_start[i], v.eval_end[i] = lo, hi
        v.interp_threads = lay.interp_threads_head
        v.tstate_next = lay.tstate_next
        if lay.tstate_native_thread_id >= 0:
            v.tstate_tid, v.thread_match = lay.tstate_native_thread_id, abi.PY_MATCH_TID
        else:
            v.tstate_tid, v.thread_match = lay.tstate_thread_id, abi.PY_MATCH_FSBASE
            v.task_fsbase = self.task_fsbase
        v.tstate_frame = lay.tstate_frame
        v.cframe_frame = (lay.cframe_current_frame if lay.cframe_current_frame >= 0
                          else abi.PY_NO_CFRAME)
        v.frame_previous = lay.frame_previous
        v.frame_code = lay.frame_code
        v.frame_instr = lay.frame_instr
        if lay.owned_by_cstack >= 0:
            v.entry, v.frame_entry = abi.PY_ENTRY_OWNER, lay.frame_owner
            v.owned_by_cstack = lay.owned_by_cstack
        elif lay.frame_is_entry >= 0:
            v.entry, v.frame_entry = abi.PY_ENTRY_IS_ENTRY, lay.frame_is_entry
        else:
            v.entry, v.frame_entry = abi.PY_ENTRY_ONE, 0
        v.frame_bytes = min(abi.PY_FRAME_BYTES, max(
            v.frame_previous + 8, v.frame_code + 8, v.frame_instr + 8, v.frame_entry + 1))
        v.code_adaptive = max(lay.code_adaptive, 0)
        v.code_firstlineno = lay.code_firstlineno
        v.code_type, v.object_type = self.code_type, lay.object_type
        return v


class Memory:
    """Reads of one process's memory (/proc/PID/mem)."""

    def __init__(self, pid: int, root: Path = Path("/proc")):
        self.pid = pid
        self.path = root / str(pid) / "mem"

    def read(self, addr: int, size: int) -> bytes:
        if not 0 < addr < 1 << 63 or not 0 <= size < 1 << 30:
            raise PythonError("read_failed", f"pid {self.pid}: no memory at {addr:#x}")
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise PythonError("read_failed", f"pid {self.pid}: {e.strerror}") from e
        try:
            data = os.pread(fd, size, addr)
        except OSError as e:
            raise PythonError("read_failed", f"pid {self.pid} at {addr:#x}: {e.strerror}") from e
        finally:
            os.close(fd)
        if len(data) != size:
            raise PythonError("read_failed", f"pid {self.pid} at {addr:#x}: short read")
        return data

    def u64(self, addr: int) -> int:
        return int.from_bytes(self.read(addr, 8), "little")

    def cstring(self, addr: int, limit: int = 256) -> str:
        raw = self.read(addr, limit) if addr else b""
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


@dataclass(frozen=True)
class _Exports:
    """What one object exports that the walker needs (ELF addresses)."""

    symbols: dict[str, tuple[int, int]]  # name -> (value, size)
    vaddr_of_offset: dict[int, int]      # a mapping's file offset -> its ELF address


def _read_exports(path: Path) -> _Exports | None:
    """The wanted symbols of an ELF file; None when its .dynsym does not
    export _PyRuntime (most executables of a host: .symtab, which can be
    large, is only read for an interpreter's .cold part)."""
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            found: dict[str, tuple[int, int]] = {}
            for name in (".dynsym", ".symtab"):
                sec = elf.get_section_by_name(name)
                if sec is None or not hasattr(sec, "iter_symbols"):
                    continue
                for sym in sec.iter_symbols():
                    if sym.name in _WANTED and sym.name not in found and sym["st_value"]:
                        found[sym.name] = (int(sym["st_value"]), int(sym["st_size"]))
                if "_PyRuntime" not in found:
                    return None
            offsets: dict[int, int] = {}
            for seg in elf.iter_segments():
                if seg["p_type"] == "PT_LOAD":  # the first segment of a page wins
                    page = int(seg["p_offset"]) % 4096
                    offsets.setdefault(int(seg["p_offset"]) - page, int(seg["p_vaddr"]) - page)
            hot = found.get("_PyEval_EvalFrameDefault")
            if hot is not None and COLD not in found:
                cold = cold_part(str(path), elf, hot)
                if cold is not None:
                    found[COLD] = cold
            return _Exports(found, offsets)
    except Exception as e:  # a malformed file is no interpreter, whatever pyelftools raised
        log.debug("python: cannot read %s: %s", path, e)
        return None


def cold_part(path: str, elf: Any, hot: tuple[int, int]) -> tuple[int, int] | None:
    """(start, size) of the interpreter loop's .cold part in a stripped
    object (Debian's python3.11: 13 KiB of it, with calls to deallocators,
    so return addresses land there). GCC splits a function's cold paths
    into a part with an FDE of its own that the hot part jumps into: the
    FDE most jumps (jcc or jmp rel32) out of the hot part land in, when at
    least 8 do."""
    start, size = hot
    code = b""
    for seg in elf.iter_segments():
        vaddr, filesz = int(seg["p_vaddr"]), int(seg["p_filesz"])
        if seg["p_type"] == "PT_LOAD" and vaddr <= start and start + size <= vaddr + filesz:
            elf.stream.seek(int(seg["p_offset"]) + start - vaddr)
            code = elf.stream.read(size)
            break
    found = read_sections(path).eh_frame
    if len(code) != size or found is None:
        return None
    ranges = fde_ranges(found, path)
    starts = [r[0] for r in ranges]
    hits: Counter[int] = Counter()
    for i in range(size - 5):
        if code[i] == 0x0F and 0x80 <= code[i + 1] <= 0x8F and i + 6 <= size:
            target = start + i + 6 + struct.unpack_from("<i", code, i + 2)[0]
        elif code[i] == 0xE9:
            target = start + i + 5 + struct.unpack_from("<i", code, i + 1)[0]
        else:
            continue
        k = bisect.bisect_right(starts, target) - 1
        if not start <= target < start + size and k >= 0 and target < ranges[k][1]:
            hits[k] += 1
    if not hits:
        return None
    k, n = hits.most_common(1)[0]
    return (ranges[k][0], ranges[k][1] - ranges[k][0]) if n >= 8 else None


class Interpreters:
    """CPython processes found so far: pid -> Interpreter, and how many were
    found, refused and why (for /metrics)."""

    def __init__(self, procfs: ProcFS | None = None, max_objects: int = 256,
                 task_fsbase: Callable[[], int] = task_fsbase_offset):
        self.procfs = procfs or ProcFS()
        self._task_fsbase = task_fsbase
        self._fsbase: int | None = None
        self._by_pid: dict[int, Interpreter] = {}
        # exited processes: kept until the drain after they went, whose
        # records still hold their frames
        self._retired: dict[int, Interpreter] = {}
        self._exports: BoundedCache[tuple[str, int], _Exports | None] = BoundedCache(
            "python_objects", max_objects)
        # (pid, start time, candidate objects) -> what find() said
        self._verdicts: BoundedCache[tuple[int, int, tuple[tuple[str, int, int], ...]],
                                     Interpreter | None] = BoundedCache(
            "python_processes", 1 << 14, entry_bytes=300)
        self._lock = threading.Lock()
        self.found: Counter[str] = Counter()     # by "3.X"
        self.failures: Counter[str] = Counter()  # by reason
        self._logged: set[str] = set()

    def get(self, pid: int) -> Interpreter | None:
        return self._by_pid.get(pid) or self._retired.get(pid)

    def __len__(self) -> int:
        return len(self._by_pid)

    def versions(self) -> Counter[str]:
        with self._lock:
            return Counter(f"{i.version[0]}.{i.version[1]}" for i in self._by_pid.values())

    def refused(self) -> dict[str, int]:
        """A copy (the loader thread adds to it while /metrics reads)."""
        with self._lock:
            return dict(self.failures)

    def forget(self, pids: Iterable[int]) -> None:
        """Processes that exited: named still until drop_retired()."""
        with self._lock:
            for pid in pids:
                interp = self._by_pid.pop(pid, None)
                if interp is not None:
                    self._retired[pid] = interp

    def retired(self) -> set[int]:
        with self._lock:
            return set(self._retired)

    def drop_retired(self, pids: Iterable[int]) -> None:
        """After a drain: forget for good what had exited before it."""
        with self._lock:
            for pid in pids:
                self._retired.pop(pid, None)

    def find(self, proc: Process) -> Interpreter | None:
        """proc's interpreter, checked, or None (not CPython, or refused:
        counted and logged once per reason). A process is checked once per
        set of candidate objects: its maps change often (every extension
        module loaded), its interpreter does not, unless it execs."""
        key = (proc.pid, proc.start_time,
               tuple((m[0].path, m[0].inode, m[0].start) for m in self._candidates(proc)))
        if key in self._verdicts:
            return self._verdicts.get(key)
        try:
            interp = self._find(proc)
        except PythonError as e:
            with self._lock:
                self.failures[e.reason] += 1
            if e.reason not in self._logged:
                self._logged.add(e.reason)
                log.warning("python frames off for pid %d: %s", proc.pid, e)
            interp = None
            if e.reason == "read_failed":
                return None  # may work next time: not remembered
        self._verdicts.put(key, interp)
        if interp is not None:
            with self._lock:
                if proc.pid not in self._by_pid:
                    self.found[f"{interp.version[0]}.{interp.version[1]}"] += 1
                self._by_pid[proc.pid] = interp
        return interp

    def bpf_value(self, proc: Process) -> abi.PyProc | None:
        """The ember_py_procs value of proc, None when it is no interpreter
        (any more: after an exec, its old one is retired)."""
        interp = self.find(proc)
        if interp is None:
            with self._lock:
                old = self._by_pid.pop(proc.pid, None)
                if old is not None:
                    self._retired[proc.pid] = old
            return None
        return interp.bpf()

    def _candidates(self, proc: Process) -> list[list[MapEntry]]:
        """The mappings of each object that may hold the interpreter: the
        executable, and any libpython3.X."""
        by_path: dict[str, list[MapEntry]] = {}
        for m in proc.maps:
            name = os.path.basename(m.path)
            if m.file_backed and (m.path == proc.exe or _LIBPYTHON.search(name)):
                by_path.setdefault(m.path, []).append(m)
        return list(by_path.values())

    def _exports_of(self, pid: int, entries: list[MapEntry]) -> _Exports | None:
        key = (entries[0].path, entries[0].inode)
        hit = self._exports.get(key)
        if hit is not None or key in self._exports:
            return hit
        exports = None
        for path in self.procfs.object_candidates(pid, entries[0]):
            if path.exists():
                exports = _read_exports(path)
                break
        self._exports.put(key, exports)
        return exports

    def _find(self, proc: Process) -> Interpreter | None:
        for entries in self._candidates(proc):
            exports = self._exports_of(proc.pid, entries)
            if exports is None:
                continue
            bias = None
            for m in entries:
                vaddr = exports.vaddr_of_offset.get(m.offset)
                if vaddr is not None:
                    bias = m.start - vaddr
                    break
            if bias is None:
                raise PythonError("no_mapping", f"{entries[0].path}: no mapping of a load segment")
            return self._check(proc.pid, exports, bias, entries[0].path)
        return None

    def _fsbase_offset(self) -> int:
        """Where task_struct keeps the user fs base (from BTF, read once)."""
        if self._fsbase is None:
            try:
                self._fsbase = self._task_fsbase()
            except EmberError as e:
                raise PythonError("no_btf", f"3.10 needs the kernel's BTF: {e}") from e
        return self._fsbase

    def _check(self, pid: int, exports: _Exports, bias: int, path: str) -> Interpreter:
        sym = exports.symbols
        missing = [n for n in ("_PyEval_EvalFrameDefault", "PyCode_Type") if n not in sym]
        if missing:
            raise PythonError("unsupported_version", f"{path} exports no {', '.join(missing)}")
        mem = Memory(pid, self.procfs.root)
        if "Py_Version" in sym:
            hexversion = int.from_bytes(mem.read(bias + sym["Py_Version"][0], 4), "little")
            version = (hexversion >> 24, (hexversion >> 16) & 0xFF, (hexversion >> 8) & 0xFF)
        else:  # before 3.11: the name says (and the member table must agree)
            named = _NAMED_VERSION.search(os.path.basename(path))
            if named is None:
                raise PythonError("unsupported_version", f"{path}: no Py_Version, no version "
                                  "in its name")
            version = (int(named.group(1)), int(named.group(2)), 0)
        layout = layout_for(version[0], version[1])
        if layout is None or version[:2] not in WALKED:
            raise PythonError("unsupported_version",
                              f"{path}: CPython {version[0]}.{version[1]}.{version[2]}")
        ranges = []
        for name in ("_PyEval_EvalFrameDefault", COLD):
            if name in sym:
                value, size = sym[name]
                ranges.append((bias + value, bias + value + max(size, 1)))
        fsbase = self._fsbase_offset() if layout.tstate_native_thread_id < 0 else 0
        interp = Interpreter(pid, version, layout, bias + sym["_PyRuntime"][0],
                             bias + sym["PyCode_Type"][0], tuple(ranges), fsbase)
        _check_members(mem, interp)
        if version[:2] >= (3, 13):
            _check_debug_offsets(mem, interp)
        return interp


def _check_members(mem: Memory, interp: Interpreter) -> None:
    """PyCode_Type's member table agrees with the layout."""
    lay = interp.layout
    members = mem.u64(interp.code_type + lay.type_members)
    if not members:
        raise PythonError("layout_mismatch", "PyCode_Type has no member table")
    want = {"co_filename": lay.code_filename, "co_name": lay.code_name,
            "co_qualname": lay.code_qualname, "co_firstlineno": lay.code_firstlineno,
            "co_linetable": lay.code_linetable}
    want = {k: v for k, v in want.items() if v >= 0}  # 3.10: no co_qualname
    seen: dict[str, int] = {}
    table = mem.read(members, lay.member_size * 64)
    for i in range(64):
        entry = table[i * lay.member_size:(i + 1) * lay.member_size]
        name_ptr = int.from_bytes(entry[lay.member_name:lay.member_name + 8], "little")
        if not name_ptr:
            break
        name = mem.cstring(name_ptr, 32)
        if name in want:
            seen[name] = int.from_bytes(entry[lay.member_offset:lay.member_offset + 8], "little",
                                        signed=True)
    for name, offset in want.items():
        if seen.get(name) != offset:
            raise PythonError("layout_mismatch", f"PyCode_Type says {name} is at "
                              f"{seen.get(name)}, the layout {offset}")


# _Py_DebugOffsets (3.13), as Include/internal/pycore_runtime.h declares it:
# the cookie, the version, free_threaded, then sections of uint64 fields,
# each starting with its struct's size (tests/runtimes checks this against
# a live 3.13).
_DEBUG_FIELDS = (
    ("runtime_state", ("size", "finalizing", "interpreters_head")),
    ("interpreter_state", ("size", "id", "next", "threads_head", "gc", "imports_modules",
                           "sysdict", "builtins", "ceval_gil", "gil_runtime_state",
                           "gil_runtime_state_enabled", "gil_runtime_state_locked",
                           "gil_runtime_state_holder")),
    ("thread_state", ("size", "prev", "next", "interp", "current_frame", "thread_id",
                      "native_thread_id", "datastack_chunk", "status")),
    ("interpreter_frame", ("size", "previous", "executable", "instr_ptr", "localsplus",
                           "owner")),
    ("code_object", ("size", "filename", "name", "qualname", "linetable", "firstlineno",
                     "argcount", "localsplusnames", "localspluskinds", "co_code_adaptive")),
)


def debug_offsets(raw: bytes) -> dict[str, int]:
    """'section.field' -> value from the start of a 3.13 _PyRuntime."""
    if raw[:8] != _DEBUG_COOKIE:
        raise PythonError("layout_mismatch", "_PyRuntime does not start with _Py_DebugOffsets")
    out = {"version": struct.unpack_from("<Q", raw, 8)[0],
           "free_threaded": struct.unpack_from("<Q", raw, 16)[0]}
    pos = 24
    for section, fields in _DEBUG_FIELDS:
        for field in fields:
            out[f"{section}.{field}"] = struct.unpack_from("<Q", raw, pos)[0]
            pos += 8
    return out


def _check_debug_offsets(mem: Memory, interp: Interpreter) -> None:
    """The interpreter's own _Py_DebugOffsets agree with the layout."""
    lay = interp.layout
    size = 24 + 8 * sum(len(f) for _, f in _DEBUG_FIELDS)
    got = debug_offsets(mem.read(interp.runtime, size))
    if got["free_threaded"]:
        raise PythonError("free_threaded", "a free-threaded build (no GIL): not walked")
    want = {
        "runtime_state.interpreters_head": lay.runtime_interpreters_head,
        "interpreter_state.threads_head": lay.interp_threads_head,
        "thread_state.next": lay.tstate_next,
        "thread_state.current_frame": lay.tstate_frame,
        "thread_state.native_thread_id": lay.tstate_native_thread_id,
        "interpreter_frame.previous": lay.frame_previous,
        "interpreter_frame.executable": lay.frame_code,
        "interpreter_frame.instr_ptr": lay.frame_instr,
        "interpreter_frame.owner": lay.frame_owner,
        "code_object.filename": lay.code_filename,
        "code_object.qualname": lay.code_qualname,
        "code_object.linetable": lay.code_linetable,
        "code_object.firstlineno": lay.code_firstlineno,
        "code_object.co_code_adaptive": lay.code_adaptive,
    }
    for name, offset in want.items():
        if got[name] != offset:
            raise PythonError("layout_mismatch",
                              f"_Py_DebugOffsets says {name} is {got[name]}, the layout {offset}")
