"""Python frames named: code objects read out of the process's memory.

BPF records, per Python frame, the code object's address, its
``co_firstlineno`` as it was when sampled and the instruction's index (see
bpf/ember.h, EMBER_PY_CODE). Here the code object is read (/proc/PID/mem):
its type must be ``PyCode_Type`` and its ``co_firstlineno`` the sampled one,
else it was freed and its memory reused since the sample: the frame becomes
``[python code freed]`` rather than someone else's name. Its qualified
name, file and line table give ``Pipeline.stage_parse (app.py:17)``, the line
the instruction belongs to.

One bounded cache holds what was read per (pid, code address, first line),
with the decoded line ranges, so a hot function costs one dict look-up.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from .. import abi
from ..cache import BoundedCache
from ..model import Frame, FrameKind, Mapping
from .cpython import Interpreter, Interpreters, Memory, PythonError
from .linetable import LineRange, find_line, line_ranges

#: The mapping of every Python frame: no object file holds Python code.
PYTHON_MAPPING = Mapping(0, 0, 0, "[python]")
_MAX_STRING = 1024
_MAX_LINETABLE = 1 << 20


def is_python(slot: int) -> bool:
    return slot & abi.PY_TAG == abi.PY_CODE


@dataclass(frozen=True, slots=True)
class CodeInfo:
    qualname: str
    filename: str
    firstlineno: int
    ranges: tuple[LineRange, ...]

    def weight(self) -> int:
        """Bytes, roughly: the strings and each line range's tuple."""
        return 200 + len(self.qualname) + len(self.filename) + 120 * len(self.ranges)


class PythonNames:
    """Frames for the Python slots of walked stacks."""

    def __init__(self, interpreters: Interpreters, max_entries: int = 65536,
                 max_bytes: int = 32 << 20):
        self.interpreters = interpreters
        self.codes: BoundedCache[tuple[int, int, int], CodeInfo] = BoundedCache(
            "python_code", max_entries, max_bytes=max_bytes, weigh=CodeInfo.weight, lru=True)
        # (pid, code slot, instruction slot) -> the frame built (a 1-tuple:
        # None is a frame dropped): a hot line costs one look-up
        self.memo: BoundedCache[tuple[int, int, int], tuple[Frame | None]] = BoundedCache(
            "python_frames", max_entries, entry_bytes=300, lru=True)
        # whole stacks with Python frames, as stacks.py built them (pid, slots)
        # -> (the process's maps then, frames): a stack seen before costs a look-up
        self.stacks: BoundedCache[tuple[int, tuple[int, ...]], tuple[object, tuple[Frame, ...]]]
        self.stacks = BoundedCache("python_stacks", 1 << 14, entry_bytes=2000, lru=True)
        self.frames = 0
        self.failures: Counter[str] = Counter()

    def frame(self, pid: int, code_slot: int, instr_slot: int) -> Frame | None:
        """The frame of one Python slot pair; None for the interpreter's own
        shim frames (3.13's __init__ cleanup after a specialized class call:
        a code object the interpreter made, filed as "__init__")."""
        self.frames += 1
        hit = self.memo.get((pid, code_slot, instr_slot))
        if hit is not None:
            return hit[0]
        built = self._build(pid, code_slot, instr_slot)
        if built is None or built.line or not built.name.startswith("["):
            self.memo.put((pid, code_slot, instr_slot), (built,))  # failures: tried again
        return built

    def _build(self, pid: int, code_slot: int, instr_slot: int) -> Frame | None:
        code = code_slot & ~abi.PY_TAG
        first = (instr_slot >> 32) & 0x3FFFFFFF
        index = instr_slot & 0xFFFFFFFF
        interp = self.interpreters.get(pid)
        if interp is None:
            return self._failed("not_python", code)
        key = (pid, code, first)
        info = self.codes.get(key)
        if info is None:
            try:
                info = read_code(Memory(pid, self.interpreters.procfs.root), interp, code, first)
            except PythonError as e:
                return self._failed(e.reason, code)
            self.codes.put(key, info)
        if info.filename == "__init__" and info.qualname == "__init__":
            return None
        line = find_line(info.ranges, index * interp.layout.code_unit)
        where = os.path.basename(info.filename)
        name = f"{info.qualname} ({where}:{line})" if line else f"{info.qualname} ({where})"
        return Frame(name, FrameKind.USER, PYTHON_MAPPING, code, system_name=info.qualname,
                     file=info.filename, line=line or 0)

    def _failed(self, reason: str, code: int) -> Frame:
        self.failures[reason] += 1
        label = "python code freed" if reason == "code_freed" else f"python frame: {reason}"
        return Frame(f"[{label}]", FrameKind.USER, PYTHON_MAPPING, code)

    def processes(self) -> Counter[str]:
        """Python processes now, by version."""
        return self.interpreters.versions()

    def refused(self) -> dict[str, int]:
        return self.interpreters.refused()

    def failed(self) -> dict[str, int]:
        """A copy of failures (the drain thread adds to it while /metrics reads)."""
        return dict(self.failures)

    def forget(self, pids: set[int]) -> None:
        for key, _ in self.codes.items():
            if key[0] in pids:
                self.codes.pop(key)
        for fkey, _ in self.memo.items():
            if fkey[0] in pids:
                self.memo.pop(fkey)
        for skey, _ in self.stacks.items():
            if skey[0] in pids:
                self.stacks.pop(skey)


def read_code(mem: Memory, interp: Interpreter, code: int, first: int) -> CodeInfo:
    """One code object's names and line ranges; PythonError("code_freed")
    when the memory holds no code object with that first line any more."""
    lay = interp.layout
    head = mem.read(code, max(lay.code_linetable, lay.code_firstlineno, lay.code_qualname,
                              lay.code_name, lay.code_filename) + 8)

    def ptr(off: int) -> int:
        return int.from_bytes(head[off:off + 8], "little")

    firstlineno = int.from_bytes(head[lay.code_firstlineno:lay.code_firstlineno + 4], "little",
                                 signed=True)
    if ptr(lay.object_type) != interp.code_type or firstlineno & 0x3FFFFFFF != first:
        raise PythonError("code_freed", f"no code object at {code:#x} any more")
    # 3.10 has no co_qualname: the bare name
    qualname = read_str(mem, interp, ptr(lay.code_qualname if lay.code_qualname >= 0
                                         else lay.code_name))
    filename = read_str(mem, interp, ptr(lay.code_filename))
    table = read_bytes(mem, interp, ptr(lay.code_linetable))
    try:
        ranges = tuple(line_ranges(interp.minor, table, firstlineno))
    except ValueError as e:
        raise PythonError("bad_linetable", f"{qualname}: {e}") from e
    return CodeInfo(qualname, filename, firstlineno, ranges)


def read_str(mem: Memory, interp: Interpreter, addr: int) -> str:
    """A compact str object (every name and file name the compiler makes)."""
    lay = interp.layout
    if not addr:
        raise PythonError("bad_string", "NULL string")
    head = mem.read(addr, lay.compact_data)
    length = int.from_bytes(head[lay.unicode_length:lay.unicode_length + 8], "little")
    state = int.from_bytes(head[lay.unicode_state:lay.unicode_state + 4], "little")
    kind = (state >> lay.unicode_kind_shift) & 7
    if not state >> lay.unicode_compact_bit & 1 or kind not in (1, 2, 4):
        raise PythonError("bad_string", f"not a compact str at {addr:#x}")
    length = min(length, _MAX_STRING)
    ascii_ = state >> lay.unicode_ascii_bit & 1
    data = mem.read(addr + (lay.ascii_data if ascii_ else lay.compact_data), length * kind)
    codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
    return data.decode(codec, "replace")


def read_bytes(mem: Memory, interp: Interpreter, addr: int) -> bytes:
    lay = interp.layout
    if not addr:
        raise PythonError("bad_linetable", "NULL co_linetable")
    size = int.from_bytes(mem.read(addr + lay.var_size, 8), "little", signed=True)
    if not 0 <= size <= _MAX_LINETABLE:
        raise PythonError("bad_linetable", f"co_linetable of {size} bytes")
    return mem.read(addr + lay.bytes_data, size) if size else b""
