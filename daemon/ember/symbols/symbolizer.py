"""Instruction pointers -> frames: process maps, ELF symbols, kallsyms.

Every address becomes a frame. What cannot be named keeps what is known: the
object and the address inside it (``libfoo.so+0x1a2b``), or ``[unknown]`` when
no mapping covers it. ELF symbol tables are parsed once per object (identity:
device, inode, size, mtime) and kept in an LRU bounded by approximate bytes.
"""

from __future__ import annotations

import io
import logging
import os
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import DwarfError, ElfError
from ..model import KERNEL_MAPPING, Frame, FrameKind, Mapping
from .debuginfo import DEFAULT_DEBUG_DIRS, debug_file_for
from .demangle import demangle
from .diskcache import CachedSymbols, DiskSymbolCache
from .dwarf import DwarfLines, SourceLine
from .elf import ElfSymbols
from .kallsyms import KernelSymbols
from .perfmap import PerfMap
from .procmaps import MapEntry, Process, ProcessTable

log = logging.getLogger(__name__)

ObjectKey = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


@dataclass
class SymbolizerStats:
    frames: int = 0
    unknown_frames: int = 0      # no symbol: named by object+offset or [unknown]
    cache_hits: int = 0
    cache_misses: int = 0
    object_errors: int = 0
    debug_files: int = 0         # stripped objects named through a separate debug file
    replaced_objects: int = 0    # paths that now name another file than the mapped one
    dwarf_errors: int = 0        # objects whose DWARF could not be read (no lines for them)
    shared_indexes: int = 0      # objects that reused an index of the same build id


class ObjectCache:
    """ELF symbol tables by object identity, least recently used evicted first
    once their approximate size passes ``max_bytes``. Unreadable objects are
    remembered too, so a bad file is not re-parsed for every address."""

    def __init__(self, max_bytes: int = 256 << 20,
                 debug_dirs: Sequence[str] = DEFAULT_DEBUG_DIRS,
                 disk: DiskSymbolCache | None = None):
        self.max_bytes = max_bytes
        self.debug_dirs = tuple(debug_dirs)
        self.disk = disk
        self._lru: OrderedDict[ObjectKey, ElfSymbols | None] = OrderedDict()
        self._dwarf: OrderedDict[str, DwarfLines | None] = OrderedDict()
        # full symbol indexes by build id, alive while an object holds them
        self._shared: weakref.WeakValueDictionary[str, CachedSymbols] = \
            weakref.WeakValueDictionary()
        self._bytes = 0
        self.stats = SymbolizerStats()

    def open(self, candidates: Sequence[Path], inode: int = 0
             ) -> tuple[ObjectKey | None, ElfSymbols | None]:
        """The first candidate that opens. With the mapping's inode, a path
        now naming another file (a binary replaced while running: the new
        file at the old path) is skipped; /proc/PID/map_files is the mapped
        file itself and always trusted."""
        for path in candidates:
            try:
                st = os.stat(path)
            except OSError:
                continue
            if inode and st.st_ino != inode and "map_files" not in path.parts:
                self.stats.replaced_objects += 1
                continue
            key: ObjectKey = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if key in self._lru:
                self._lru.move_to_end(key)
                self.stats.cache_hits += 1
                return key, self._lru[key]
            self.stats.cache_misses += 1
            obj = self._read(path)
            self._insert(key, obj)
            return key, obj
        return None, None

    def _read(self, path: Path) -> ElfSymbols | None:
        """An object's symbols, by build id: an index already in memory for
        another file with the same build id (the same library seen through
        several containers' roots), else the disk cache, else its own symbol
        table or its debug file's (then shared and stored on disk)."""
        try:
            head = ElfSymbols(path, symbols=False)
            cached = self._shared.get(head.build_id) if head.build_id else None
            if cached is None and self.disk is not None and head.build_id:
                cached = self.disk.load(head.build_id)
            if cached is not None and head.build_id:
                self._shared[head.build_id] = cached
                head.index, head.symbol_source = cached.index, cached.source
                head.dwarf_path = head.dwarf_path or cached.dwarf_path
                head.shared = cached
                self.stats.shared_indexes += 1
                return head
            head.load_symbols()
            obj = head
        except ElfError as exc:
            log.debug("%s", exc)
            self.stats.object_errors += 1
            return None
        if obj.symbol_source != ".symtab" or obj.dwarf_path is None:
            self._add_debug_symbols(obj, path)
        if obj.build_id and obj.symbol_source.startswith(".symtab"):
            # a full symbol table is the same for every copy of this build
            cached = CachedSymbols(obj.index, obj.symbol_source, obj.dwarf_path)
            obj.shared = cached
            self._shared[obj.build_id] = cached
            if self.disk is not None:
                self.disk.store(obj.build_id, cached)
        return obj

    def _add_debug_symbols(self, obj: ElfSymbols, path: Path) -> None:
        """A stripped object: take the symbols of its separate debug file."""
        debug = debug_file_for(obj, str(path), self.debug_dirs)
        if debug is None:
            return
        try:
            syms = ElfSymbols(debug)
        except ElfError as exc:
            log.debug("%s", exc)
            self.stats.object_errors += 1
            return
        if len(syms) > len(obj):
            obj.adopt_symbols(syms)
            self.stats.debug_files += 1
        if obj.dwarf_path is None:
            obj.dwarf_path = syms.dwarf_path

    def lines(self, obj: ElfSymbols) -> DwarfLines | None:
        """The DWARF line and inline tables of an object (or of its debug
        file), opened on first use and kept in the same byte budget."""
        path = obj.dwarf_path
        if path is None:
            return None
        if path in self._dwarf:
            self._dwarf.move_to_end(path)
            return self._dwarf[path]
        try:
            lines: DwarfLines | None = DwarfLines(path)
        except DwarfError as exc:
            log.debug("%s", exc)
            self.stats.dwarf_errors += 1
            lines = None
        self._dwarf[path] = lines
        self._evict()
        return lines

    # memory.Shrinkable
    name = "symbol_tables"

    def size_bytes(self) -> int:
        return self._bytes + self._dwarf_bytes()

    def _dwarf_bytes(self) -> int:
        return sum(d.memory_size() if d else 64 for d in self._dwarf.values())

    def shrink(self, fraction: float) -> int:
        """Evict the least recently used tables down to (1 - fraction) of the
        current size, and keep the limit there: a cache that refilled at once
        would only thrash."""
        before = self.size_bytes()
        self.max_bytes = max(1 << 20, int(before * (1 - fraction)))
        self._evict()
        return before - self.size_bytes()

    def _evict(self) -> None:
        # DWARF tables first: they are the largest and only serve lines
        if self._dwarf:
            dwarf = self._dwarf_bytes()
            while self._dwarf and self._bytes + dwarf > self.max_bytes:
                _, d = self._dwarf.popitem(last=False)
                dwarf -= d.memory_size() if d else 64
        while self._bytes > self.max_bytes and len(self._lru) > 1:
            _, old = self._lru.popitem(last=False)
            self._bytes -= old.memory_size() if old is not None else 64

    def _insert(self, key: ObjectKey, obj: ElfSymbols | None) -> None:
        self._lru[key] = obj
        self._bytes += obj.memory_size() if obj is not None else 64
        self._evict()

    def __len__(self) -> int:
        return len(self._lru)


class Symbolizer:
    def __init__(self, processes: ProcessTable, kernel: KernelSymbols | None = None,
                 objects: ObjectCache | None = None, memo_size: int = 1 << 18,
                 lines: bool = False):
        self.processes = processes
        # DWARF source lines and inlined functions (ember record --lines)
        self.lines = lines
        self.kernel = kernel
        self.objects = objects or ObjectCache()
        self.stats = self.objects.stats
        self._memo: dict[tuple[ObjectKey, int], tuple[str, str, int] | None] = {}
        self._memo_size = memo_size
        # (pid, mapping) -> its object, so an address costs no stat() call.
        self._objects_of: dict[tuple[int, MapEntry],
                               tuple[ObjectKey | None, ElfSymbols | None, Mapping]] = {}
        self._perf_maps: dict[int, PerfMap] = {}
        self._frames: dict[int, tuple[Process | None, dict[tuple[int, bool],
                                                          tuple[tuple[Frame, ...], int]]]] = {}
        self._kframes: dict[tuple[int, bool], Frame] = {}
        self._reread: dict[int, int] = {}  # pid -> round its maps were last re-read on a miss
        self._vdso: ElfSymbols | None = None
        self._vdso_read = False

    def memos(self) -> MemoCaches:
        return MemoCaches(self)

    def user_frames(self, pid: int, ips: Sequence[int]) -> list[Frame]:
        """Frames for a user stack, in the order given (leaf first). Addresses
        after the first are return addresses: looked up one byte earlier so a
        call that ends a function is attributed to its caller correctly.
        With lines, an address inside inlined code gives several frames: the
        innermost inlined function first, the function it is in last."""
        proc = self.processes.get(pid)
        memo = self._frame_memo(pid, proc)
        frames: list[Frame] = []
        unknown = self.stats.unknown_frames
        for i, ip in enumerate(ips):
            self.stats.frames += 1
            hit = memo.get((ip, i > 0))
            if hit is not None:
                frames.extend(hit[0])
                unknown += hit[1]
                continue
            entry = proc.find(ip) if proc else None
            if entry is None and proc is not None and self._reread.get(pid) != self.processes.round:
                # maps change without an exec (dlopen, JIT): read them again,
                # once per drain and process
                if len(self._reread) > 65536:
                    self._reread.clear()
                self._reread[pid] = self.processes.round
                self.processes.refresh([pid])
                fresh = self.processes.get(pid)
                if fresh is not None and fresh is not proc:
                    proc, memo = fresh, self._frame_memo(pid, fresh)
                    entry = proc.find(ip)
            if entry is None:
                unknown += 1
                frames.append(Frame("[unknown]", FrameKind.USER, None, ip))
                continue
            before = self.stats.unknown_frames
            frame = self._user_frame(pid, entry, ip, ip - 1 if i else ip)
            built = self._with_lines(pid, entry, frame, ip - 1 if i else ip) \
                if self.lines and entry.file_backed else (frame,)
            missed = self.stats.unknown_frames - before
            self.stats.unknown_frames = before
            unknown += missed
            frames.extend(built)
            if entry.file_backed:  # JIT maps change under the same address
                memo[(ip, i > 0)] = (built, missed)
        self.stats.unknown_frames = unknown
        return frames

    def _frame_memo(self, pid: int, proc: Process | None
                    ) -> dict[tuple[int, bool], tuple[tuple[Frame, ...], int]]:
        """Frames already built for this process's current maps: stacks share
        most of their addresses, so each is symbolized once."""
        held = self._frames.get(pid)
        if held is None or held[0] is not proc or len(held[1]) > self._memo_size // 4:
            if len(self._frames) > 4096:
                self._frames.clear()
            held = self._frames[pid] = (proc, {})
        return held[1]

    def _object(self, pid: int, entry: MapEntry) -> tuple[ObjectKey | None, ElfSymbols | None]:
        hit = self._object_and_mapping(pid, entry)
        return hit[0], hit[1]

    def _mapping(self, pid: int, entry: MapEntry) -> Mapping:
        """The model's Mapping of a file-backed entry, built once."""
        return self._object_and_mapping(pid, entry)[2]

    def _object_and_mapping(self, pid: int, entry: MapEntry
                            ) -> tuple[ObjectKey | None, ElfSymbols | None, Mapping]:
        k = (pid, entry)
        hit = self._objects_of.get(k)
        if hit is None:
            if len(self._objects_of) >= self._memo_size:
                self._objects_of.clear()
            key, obj = self.objects.open(
                self.processes.procfs.object_candidates(pid, entry), entry.inode)
            text = obj.text_segment if obj is not None else None
            mapping = Mapping(entry.start, entry.end, entry.offset, entry.path,
                              (obj.build_id or "") if obj is not None else "",
                              has_functions=obj is not None,
                              elf_type=obj.elf_type if obj is not None else 0,
                              load_offset=text.offset if text else 0,
                              load_vaddr=text.vaddr if text else 0)
            hit = self._objects_of[k] = (key, obj, mapping)
        else:
            self.stats.cache_hits += 1
        return hit

    def lookup(self, pid: int, entry: MapEntry, address: int) -> tuple[str, str, int] | None:
        """(demangled name, raw name, offset into the function) of a runtime
        address inside entry, or None."""
        key, obj = self._object(pid, entry)
        if obj is None or key is None:
            return None
        vaddr = obj.vaddr_of_offset(address - entry.start + entry.offset)
        if vaddr is None:
            return None
        mk = (key, vaddr)
        if mk in self._memo:
            return self._memo[mk]
        hit = obj.lookup(vaddr)
        sym = (demangle(hit[0]), hit[0], hit[1]) if hit else None
        if len(self._memo) >= self._memo_size:
            self._memo.clear()
        self._memo[mk] = sym
        return sym

    def source_lines(self, pid: int, entry: MapEntry, address: int) -> list[SourceLine]:
        """DWARF lines of a runtime address inside entry, innermost first."""
        _, obj = self._object(pid, entry)
        if obj is None:
            return []
        vaddr = obj.vaddr_of_offset(address - entry.start + entry.offset)
        dwarf = self.objects.lines(obj) if vaddr is not None else None
        if dwarf is None or vaddr is None:
            return []
        return dwarf.lookup(vaddr)

    def _with_lines(self, pid: int, entry: MapEntry, frame: Frame, lookup_ip: int
                    ) -> tuple[Frame, ...]:
        """frame with its source line, preceded by the functions inlined
        into it at that address (innermost first)."""
        if frame.mapping is None or not frame.mapping.has_functions:
            return (frame,)
        chain = self.source_lines(pid, entry, lookup_ip)
        if not chain:
            return (frame,)
        outer = chain[-1]
        out = []
        for sl in chain[:-1]:
            name = demangle(sl.function) if sl.function else "[inlined]"
            raw = sl.function if sl.function != name else ""
            out.append(Frame(name, FrameKind.USER, frame.mapping, frame.address, raw,
                             sl.file, sl.line, inlined=True))
        # the function itself keeps the symbol table's name: flame graphs
        # with and without lines then merge the same frames
        out.append(Frame(frame.name, frame.kind, frame.mapping, frame.address,
                         frame.system_name, outer.file, outer.line))
        return tuple(out)

    def _perf_map(self, pid: int) -> PerfMap:
        pm = self._perf_maps.get(pid)
        if pm is None:
            if len(self._perf_maps) > 4096:
                self._perf_maps.clear()
            pm = self._perf_maps[pid] = PerfMap(pid, self.processes.procfs.root)
        return pm

    def _vdso_symbols(self) -> ElfSymbols | None:
        """The vdso's symbols, from this process's own copy: the kernel maps
        the same image into every process, only at different addresses."""
        if not self._vdso_read:
            self._vdso_read = True
            try:
                for line in Path("/proc/self/maps").read_text().splitlines():
                    if line.endswith("[vdso]"):
                        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                        with open("/proc/self/mem", "rb") as mem:
                            mem.seek(lo)
                            image = mem.read(hi - lo)
                        self._vdso = ElfSymbols("[vdso]", io.BytesIO(image))
                        break
            except (OSError, ElfError) as exc:
                log.debug("vdso: %s", exc)
        return self._vdso

    def _user_frame(self, pid: int, entry: MapEntry, ip: int, lookup_ip: int) -> Frame:
        if entry.path == "[vdso]" and (vdso := self._vdso_symbols()) is not None:
            vaddr = vdso.vaddr_of_offset(lookup_ip - entry.start)
            hit = vdso.lookup(vaddr) if vaddr is not None else None
            if hit is not None:
                return Frame(hit[0], FrameKind.USER, Mapping(entry.start, entry.end, 0,
                                                             "[vdso]"), ip)
        if not entry.file_backed:
            jit = self._perf_map(pid).lookup(lookup_ip)
            if jit is not None:
                return Frame(jit, FrameKind.USER, Mapping(entry.start, entry.end, 0,
                                                          "[perf-map]"), ip)
            self.stats.unknown_frames += 1
            name = entry.path or "[anon]"
            return Frame(name, FrameKind.USER, Mapping(entry.start, entry.end, entry.offset, name,
                                                       has_functions=False), ip)
        mapping = self._mapping(pid, entry)
        sym = self.lookup(pid, entry, lookup_ip)
        if sym is None:
            self.stats.unknown_frames += 1
            base = os.path.basename(entry.path.removesuffix(" (deleted)"))
            file_offset = lookup_ip - entry.start + entry.offset
            _, obj = self._object(pid, entry)
            vaddr = obj.vaddr_of_offset(file_offset) if obj is not None else None
            where = vaddr if vaddr is not None else file_offset
            return Frame(f"{base}+{where:#x}", FrameKind.USER, mapping, ip)
        name, raw, _ = sym
        return Frame(name, FrameKind.USER, mapping, ip, raw if raw != name else "")

    def kernel_frames(self, ips: Sequence[int]) -> list[Frame]:
        frames = []
        memo = self._kframes
        if len(memo) > self._memo_size:
            memo.clear()
        for i, ip in enumerate(ips):
            self.stats.frames += 1
            frame = memo.get((ip, i > 0))
            if frame is None:
                hit = self.kernel.lookup(ip - 1 if i else ip) if self.kernel else None
                name = hit[0] if hit is not None else "[kernel.kallsyms]"
                frame = memo[(ip, i > 0)] = Frame(name, FrameKind.KERNEL, KERNEL_MAPPING, ip)
            if frame.name == "[kernel.kallsyms]":
                self.stats.unknown_frames += 1
            frames.append(frame)
        return frames


class MemoCaches:
    """The symbolizer's memos (frames, symbol lookups, objects of mappings,
    perf maps) as one memory.Shrinkable: they are rebuilt from the symbol
    tables on demand, so shrinking clears them."""

    name = "symbol_memos"
    _ENTRY_BYTES = 200  # a dict slot, a tuple key and a shared Frame, roughly

    def __init__(self, symbolizer: Symbolizer):
        self.s = symbolizer

    def size_bytes(self) -> int:
        s = self.s
        frames = sum(len(memo) for _, memo in s._frames.values()) + len(s._kframes)
        return self._ENTRY_BYTES * (frames + len(s._memo) + len(s._objects_of)) + sum(
            pm.memory_size() for pm in s._perf_maps.values())

    def shrink(self, fraction: float) -> int:
        before = self.size_bytes()
        s = self.s
        s._frames.clear()
        s._kframes.clear()
        s._memo.clear()
        s._objects_of.clear()
        s._perf_maps.clear()
        return before
