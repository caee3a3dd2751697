"""Walking the user stack of a thread that is not running, from user space.

A thread blocked in the kernel cannot run the BPF table walker (it walks the
current thread's stack, reading current's memory). The census gives the
registers the thread entered the kernel with (ip, sp, bp); this walks on from
them with the same tables and the same rules as bpf/unwind_dwarf.h, reading
the process's memory through /proc/PID/mem: CFA from rsp or rbp, the return
address at CFA-8, rbp restored where the table saved it, frame pointers where
no table covers the code. It stops where the BPF walker would, and says why
(Stack.cut). CPython's frames are put in as the BPF walker puts them
(bpf/unwind_python.h, the same two slots per frame after each interpreter-
loop frame) when the process is an interpreter ember knows (``python``:
pid -> its ember_py_procs value) of 3.11 or later (3.10 names its threads
by their fs base, which only the kernel knows).
"""

from __future__ import annotations

import logging
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

from .. import abi
from ..abi import CFA_END, CFA_NONE, CFA_PLT, CFA_RBP, CFA_RSP, RBP_SAME, RBP_SAVED
from ..errors import EmberError
from ..kernel.drain import CUT_REASONS, Stack
from ..symbols.elf import ElfSymbols
from ..symbols.procmaps import Process, ProcFS
from .tables import UnwindTable, cached_table, lookup

log = logging.getLogger(__name__)

_U64 = struct.Struct("<Q")
MAPS_TTL_S = 1.0
_PAIR = struct.Struct("<QQ")


class RemoteUnwinder:
    """User stacks of stopped threads; object tables kept by (path, offset)."""

    def __init__(self, procfs: ProcFS | None = None, cache_dir: Path | None = None,
                 python: Callable[[Process], abi.PyProc | None] | None = None):
        self.procfs = procfs or ProcFS()
        self.cache_dir = cache_dir
        self.python = python
        self._objects: dict[tuple[str, int, int], tuple[UnwindTable, int] | None] = {}
        # a process's maps, read once a second at most: a process with
        # thousands of threads has thousands of stack mappings to parse
        self._procs: dict[int, tuple[float, Process | None]] = {}

    def _process(self, pid: int) -> Process | None:
        now = time.monotonic()
        hit = self._procs.get(pid)
        if hit is not None and now - hit[0] < MAPS_TTL_S:
            return hit[1]
        if len(self._procs) > 4096:
            self._procs = {p: v for p, v in self._procs.items() if now - v[0] < MAPS_TTL_S}
        proc = self.procfs.read(pid)
        self._procs[pid] = (now, proc)
        return proc

    def _table(self, pid: int, proc: Process, ip: int) -> tuple[UnwindTable, int] | None:
        """The table covering ip and the bias from ip to the object's
        addresses; None: no table (frame pointers)."""
        entry = proc.find(ip)
        if entry is None or not entry.file_backed or entry.deleted:
            return None
        key = (entry.path, entry.start, entry.offset)
        if key not in self._objects:
            found = None
            for path in self.procfs.object_candidates(pid, entry):
                try:
                    elf = ElfSymbols(path, symbols=False)
                    vaddr = elf.vaddr_of_mapping(entry.offset, entry.executable)
                    if vaddr is not None:
                        found = (cached_table(path, self.cache_dir), entry.start - vaddr)
                    break
                except (EmberError, OSError) as exc:
                    if isinstance(exc.__cause__, FileNotFoundError) or \
                            isinstance(exc, FileNotFoundError):
                        continue
                    log.debug("no unwind table for %s: %s", entry.path, exc)
                    break
            self._objects[key] = found
        return self._objects[key]

    def walk(self, pid: int, ip: int, sp: int, bp: int, tid: int = 0) -> Stack:
        """The user stack leaf first, from the registers a blocked thread
        (tid, for its Python frames) entered the kernel with."""
        if not ip:
            return Stack(problem="unavailable")
        proc = self._process(pid)
        if proc is None:
            return Stack(problem="missing")
        try:
            mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        except OSError:
            return Stack((ip,), cut=CUT_REASONS[abi.UnwindEnd.READ_FAILED])
        try:
            py = self.python(proc) if self.python is not None and tid else None
            if py is not None and py.thread_match != abi.PY_MATCH_TID:
                py = None
            return self._walk(mem, pid, proc, ip, sp, bp, py, tid)
        finally:
            os.close(mem)

    def _walk(self, mem: int, pid: int, proc: Process, ip: int, sp: int, bp: int,
              py: abi.PyProc | None, tid: int) -> Stack:
        ips: list[int] = []

        def read(fmt: struct.Struct, addr: int) -> tuple[int, ...] | None:
            try:
                data = os.pread(mem, fmt.size, addr)
            except OSError:
                return None
            return fmt.unpack(data) if len(data) == fmt.size else None

        py_frame = _py_current_frame(read, py, tid) if py is not None else 0

        def end(reason: int) -> Stack:
            return Stack(tuple(ips), cut=CUT_REASONS.get(reason))

        while True:
            if len(ips) >= abi.MAX_STACK_DEPTH:
                return end(abi.UnwindEnd.TRUNCATED)
            ips.append(ip)
            if proc.find(ip) is None:
                return end(abi.UnwindEnd.NO_MAPPING)
            cfa_type, rbp_type, cfa_offset, rbp_offset = CFA_NONE, RBP_SAME, 0, 0
            found = self._table(pid, proc, ip)
            if found is not None:
                table, bias = found
                row = lookup(table, ip - bias - (1 if len(ips) > 1 else 0))
                if row is not None:
                    cfa_type, rbp_type = row.cfa_type, row.rbp_type
                    cfa_offset, rbp_offset = row.cfa_offset, row.rbp_offset
            if cfa_type == CFA_RSP:
                cfa = sp + cfa_offset
            elif cfa_type == CFA_RBP:
                if not bp:
                    return end(abi.UnwindEnd.UNSUPPORTED)
                cfa = bp + cfa_offset
            elif cfa_type == CFA_PLT:
                cfa = sp + 8 + (8 if (ip & 15) >= cfa_offset else 0)
            elif cfa_type == CFA_END:
                return Stack(tuple(ips))
            elif cfa_type == CFA_NONE:
                if not bp:
                    return Stack(tuple(ips))
                cfa, rbp_type, rbp_offset = bp + 16, RBP_SAVED, -16
            else:
                return end(abi.UnwindEnd.UNSUPPORTED)
            if cfa <= sp:
                return end(abi.UnwindEnd.BAD_FRAME)
            got = read(_U64, cfa - 8)
            if got is None:
                return end(abi.UnwindEnd.READ_FAILED)
            ra = got[0]
            if rbp_type == RBP_SAVED:
                saved = read(_U64, cfa + rbp_offset)
                if saved is None:
                    return end(abi.UnwindEnd.READ_FAILED)
                bp = saved[0]
            elif rbp_type != RBP_SAME:
                bp = 0
            if not ra:
                return Stack(tuple(ips))
            if py is not None and py_frame and _in_eval(py, ip):
                py_frame = _py_frames(read, py, py_frame, ips)
            ip, sp = ra, cfa


Reader = Callable[[struct.Struct, int], "tuple[int, ...] | None"]


def _ptr(read: Reader, addr: int) -> int:
    got = read(_U64, addr) if addr else None
    return got[0] if got else 0


def _py_current_frame(read: Reader, py: abi.PyProc, tid: int) -> int:
    """Thread tid's innermost Python frame (0: it has no thread state)."""
    interp = _ptr(read, py.interp_head)
    ts = _ptr(read, interp + py.interp_threads) if interp else 0
    for _ in range(abi.PY_THREAD_STEPS * 32):
        if not ts or _ptr(read, ts + py.tstate_tid) == tid:
            break
        ts = _ptr(read, ts + py.tstate_next)
    if not ts:
        return 0
    frame = _ptr(read, ts + py.tstate_frame)
    if frame and py.cframe_frame != abi.PY_NO_CFRAME:
        frame = _ptr(read, frame + py.cframe_frame)
    return frame


def _in_eval(py: abi.PyProc, ip: int) -> bool:
    return any(py.eval_start[i] <= ip < py.eval_end[i] for i in range(2))


_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")


def _py_frames(read: Reader, py: abi.PyProc, frame: int, ips: list[int]) -> int:
    """Append the Python frames of one interpreter-loop call (two slots
    each, as bpf/unwind_python.h does); the frame the next call starts at."""
    while frame and len(ips) + 2 <= abi.MAX_STACK_DEPTH:
        previous = _ptr(read, frame + py.frame_previous)
        code = _ptr(read, frame + py.frame_code)
        instr = _ptr(read, frame + py.frame_instr)
        got = read(_U8, frame + py.frame_entry)
        if not code or got is None:
            return 0
        entry = got[0]
        if py.entry == abi.PY_ENTRY_OWNER and entry == py.owned_by_cstack:
            return previous  # the shim below the call's first frame
        first = read(_U32, code + py.code_firstlineno)
        base = code + py.code_adaptive
        index = (instr - base) >> 1 if instr >= base else 0
        ips.append(abi.PY_CODE | (code & ~abi.PY_TAG & 0xFFFF_FFFF_FFFF_FFFF))
        ips.append(abi.PY_INSTR | ((first[0] if first else 0) & 0x3FFF_FFFF) << 32
                   | (index & 0xFFFF_FFFF))
        frame = previous
        if py.entry == abi.PY_ENTRY_IS_ENTRY and entry:
            return frame  # the call's first frame
    return frame
