"""Instruction pointers -> frames: process maps, ELF symbols, kallsyms.

Every address becomes a frame. What cannot be named keeps what is known: the
object and the address inside it (``libfoo.so+0x1a2b``), or ``[unknown]`` when
no mapping covers it. Objects come from objects.py; what is built from them
(frames per process and address, symbol lookups, the object of each
mapping, perf maps) is memoized in bounded caches, since stacks share most
of their addresses.

Many addresses never seen before are named in batches instead of one at a
time: grouped by mapping, each group one NumPy search of its object's
symbols, each name decoded and demangled once (name_many for ember
symbolize; prepare for the stacks of a drain's new processes, whose frames
it memoizes for user_frames).
"""

from __future__ import annotations

import io
import logging
import os
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..cache import BoundedCache
from ..errors import ElfError
from ..model import KERNEL_MAPPING, Frame, FrameKind, Mapping
from .demangle import demangle
from .dwarf import SourceLine
from .elf import ElfSymbols
from .kallsyms import KernelSymbols
from .objects import ObjectCache, ObjectKey
from .perfmap import PerfMap
from .procmaps import MapEntry, Process, ProcessTable

log = logging.getLogger(__name__)

#: What lookup() gives: (demangled name, raw name, offset into the function).
Named = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class NamedAddresses:
    """Many addresses of one process as name_many found them, in arrays
    (one Python object per function, not per address): address k is inside
    maps[where[k]] (where[k] < 0: no mapping covers it) and, where
    symbol[k] >= 0, in the function names[symbol[k]] (raw[symbol[k]] as
    the symbol table has it) at offset[k] into it."""

    maps: tuple[MapEntry, ...]
    where: npt.NDArray[np.int64]
    symbol: npt.NDArray[np.int64]
    offset: npt.NDArray[np.uint64]
    names: list[str]
    raw: list[str]

    def __len__(self) -> int:
        return len(self.where)

    def __getitem__(self, k: int) -> tuple[MapEntry | None, Named | None]:
        """Address k as Process.find and Symbolizer.lookup give it."""
        at, s = int(self.where[k]), int(self.symbol[k])
        return (self.maps[at] if at >= 0 else None,
                (self.names[s], self.raw[s], int(self.offset[k])) if s >= 0 else None)


#: A user frame memo: the process it was built for, its frames, how many unnamed.
_Built = tuple[Process | None, tuple[Frame, ...], int]

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
        # (object, vaddr) -> (demangled name, raw name, offset)
        self._lookups: BoundedCache[tuple[ObjectKey, int], tuple[str, str, int] | None] = \
            BoundedCache("symbol_lookups", memo_size)
        # (pid, mapping) -> its object's key and Mapping, so an address costs
        # no stat() call (the object itself stays the symbol table cache's)
        self._objects_of: BoundedCache[tuple[int, MapEntry],
                                       tuple[ObjectKey | None, Mapping]] = \
            BoundedCache("mapping_objects", memo_size)
        # (pid, address, is a return address) -> frames, for the maps they were built from
        self._frames: BoundedCache[tuple[int, int, bool], _Built] = BoundedCache(
            "frames", memo_size, entry_bytes=350)  # with its Frames (tracemalloc)
        self._kframes: BoundedCache[tuple[int, bool], Frame] = BoundedCache(
            "kernel_frames", memo_size)
        self._perf_maps: BoundedCache[int, PerfMap] = BoundedCache(
            "perf_maps", 4096, max_bytes=64 << 20, weigh=PerfMap.memory_size)
        # pid -> the round its maps were last re-read on a miss
        self._reread: BoundedCache[int, int] = BoundedCache("maps_rereads", 1 << 16,
                                                           entry_bytes=100)
        # pid -> its maps when prepare() last named its stacks (not kept alive)
        self._prepared: BoundedCache[int, weakref.ref[Process]] = BoundedCache(
            "prepared_processes", 1 << 16, entry_bytes=100)
        self._vdso: ElfSymbols | None = None
        self._vdso_read = False

    def user_frames(self, pid: int, ips: Sequence[int], leaf: bool = True) -> list[Frame]:
        """Frames for a user stack, in the order given (leaf first). Addresses
        after the first (all of them when ``leaf`` is false: a part of a stack
        above which other frames stand) are return addresses: looked up one
        byte earlier so a call that ends a function is attributed to its
        caller correctly.
        With lines, an address inside inlined code gives several frames: the
        innermost inlined function first, the function it is in last."""
        proc = self.processes.get(pid)
        memo = self._frames.get
        frames: list[Frame] = []
        unknown = self.stats.unknown_frames
        for i, ip in enumerate(ips):
            ret = i > 0 or not leaf
            self.stats.frames += 1
            hit = memo((pid, ip, ret))
            if hit is not None and hit[0] is proc:  # built from these maps
                frames.extend(hit[1])
                unknown += hit[2]
                continue
            entry = proc.find(ip) if proc else None
            if entry is None and proc is not None:
                fresh = self._maps_again(pid, proc)
                if fresh is not proc:
                    proc = fresh
                    entry = proc.find(ip)
            if entry is None:
                unknown += 1
                frames.append(Frame("[unknown]", FrameKind.USER, None, ip))
                continue
            before = self.stats.unknown_frames
            frame = self._user_frame(pid, entry, ip, ip - 1 if ret else ip)
            built = self._with_lines(pid, entry, frame, ip - 1 if ret else ip) \
                if self.lines and entry.file_backed else (frame,)
            missed = self.stats.unknown_frames - before
            self.stats.unknown_frames = before
            unknown += missed
            frames.extend(built)
            if entry.file_backed:  # JIT maps change under the same address
                self._frames.put((pid, ip, ret), (proc, built, missed))
        self.stats.unknown_frames = unknown
        return frames

    def _maps_again(self, pid: int, proc: Process) -> Process:
        """The process as its maps are now, after an address missed them:
        maps change without an exec (dlopen, JIT), so they are read again,
        once per drain and process. proc itself when not read again or not
        changed."""
        if self._reread.get(pid) == self.processes.round:
            return proc
        self._reread.put(pid, self.processes.round)
        self.processes.refresh([pid])
        return self.processes.get(pid) or proc

    def prepare(self, stacks: Iterable[tuple[int, Sequence[int]]]) -> None:
        """Before a drain's user_frames calls: the user stacks (pid, leaf
        first) of processes not prepared yet with their current maps (new
        processes, changed maps) named in one batch per process, their
        frames memoized as user_frames would build them. A process prepared
        before costs one look-up per drain, so a warm drain pays nothing."""
        if self.lines:
            return  # inlined frames come from DWARF one address at a time
        by_pid: dict[int, list[Sequence[int]]] = {}
        for pid, ips in stacks:
            by_pid.setdefault(pid, []).append(ips)
        for pid, group in by_pid.items():
            proc = self.processes.get(pid)
            seen = self._prepared.get(pid)
            if proc is not None and (seen is None or seen() is not proc):
                self._prepare(pid, proc, group)

    def _prepare(self, pid: int, proc: Process, stacks: list[Sequence[int]]) -> None:
        """The frames of the distinct addresses of stacks that a file-backed
        mapping and a function name, put in the frames memo in the order
        the stacks have them (the others are left to user_frames). An
        address outside the maps has them read again first, as user_frames
        would."""
        keys = list(dict.fromkeys((ip, i > 0) for ips in stacks for i, ip in enumerate(ips)))
        keys = keys[:self._frames.max_entries // 2]  # would evict each other
        ips = np.array([ip for ip, _ in keys], dtype=np.uint64)
        where = proc.find_many(ips)
        if bool((where < 0).any()) and (fresh := self._maps_again(pid, proc)) is not proc:
            proc, where = fresh, fresh.find_many(ips)
        self._prepared.put(pid, weakref.ref(proc))
        self._memoize(pid, proc, keys, ips, where)

    def _memoize(self, pid: int, proc: Process, keys: list[tuple[int, bool]],
                 ips: npt.NDArray[np.uint64], where: npt.NDArray[np.int64]) -> None:
        """Frames of keys (address, is a return address) found in the
        mappings where says, named in one batch per mapping."""
        looked = ips - np.array([ret for _, ret in keys], dtype=np.uint64)
        symbol = np.full(len(keys), -1, dtype=np.int64)
        named: list[tuple[str, str, Mapping]] = []
        for i, positions in _groups(where):
            entry = proc.maps[i]
            if entry.file_backed:
                positions = positions[looked[positions] >= np.uint64(entry.start)]
                found, _, functions = self.lookup_many(pid, entry, looked[positions])
                hit = found >= 0
                symbol[positions[hit]] = found[hit] + len(named)
                mapping = self._mapping(pid, entry)
                named += [(demangle(f), f, mapping) for f in functions]
        put = self._frames.put
        for (ip, ret), s in zip(keys, symbol.tolist(), strict=True):
            if s >= 0:
                name, raw, mapping = named[s]
                put((pid, ip, ret), (proc, (Frame(name, FrameKind.USER, mapping, ip,
                                                  raw if raw != name else ""),), 0))

    def _object(self, pid: int, entry: MapEntry) -> tuple[ObjectKey | None, ElfSymbols | None]:
        hit = self._object_and_mapping(pid, entry)
        return hit[0], hit[1]

    def _mapping(self, pid: int, entry: MapEntry) -> Mapping:
        """The model's Mapping of a file-backed entry, built once."""
        return self._object_and_mapping(pid, entry)[2]

    def _object_and_mapping(self, pid: int, entry: MapEntry
                            ) -> tuple[ObjectKey | None, ElfSymbols | None, Mapping]:
        """The object behind a mapping, and the model's Mapping of it. The memo
        keeps the object's key and the Mapping, never the object: the symbol
        table cache alone decides which tables stay in memory (one it evicted
        is read again here when an address needs it)."""
        k = (pid, entry)
        hit = self._objects_of.get(k)
        if hit is not None:
            key, mapping = hit
            if key is None or key in self.objects.tables:
                self.stats.cache_hits += 1
                return key, self.objects.tables.get(key) if key else None, mapping
        key, obj = self.objects.open(
            self.processes.procfs.object_candidates(pid, entry), entry.inode)
        if hit is not None:
            return key, obj, hit[1]
        text = obj.text_segment if obj is not None else None
        mapping = Mapping(entry.start, entry.end, entry.offset, entry.path,
                          (obj.build_id or "") if obj is not None else "",
                          has_functions=obj is not None,
                          elf_type=obj.elf_type if obj is not None else 0,
                          load_offset=text.offset if text else 0,
                          load_vaddr=text.vaddr if text else 0)
        self._objects_of.put(k, (key, mapping))
        return key, obj, mapping

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
        if mk in self._lookups:
            return self._lookups.get(mk)
        hit = obj.lookup(vaddr)
        return self._lookups.put(mk, (demangle(hit[0]), hit[0], hit[1]) if hit else None)

    def lookup_many(self, pid: int, entry: MapEntry, addresses: npt.NDArray[np.uint64]
                    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64], list[str]]:
        """lookup() of many runtime addresses inside entry, as arrays: for
        address k, its function is names[symbol[k]] (the raw names;
        symbol[k] < 0: none) at offset[k] into it. Virtual addresses and
        symbols are found with one vectorized search each, names decoded
        once per function."""
        key, obj = self._object(pid, entry)
        if obj is None or key is None:
            return (np.full(len(addresses), -1, dtype=np.int64),
                    np.zeros(len(addresses), dtype=np.uint64), [])
        offsets = addresses - np.uint64(entry.start) + np.uint64(entry.offset)
        vaddrs, mapped = obj.vaddrs_of_offsets(offsets)
        found, into = obj.index.search(vaddrs)
        found[~mapped] = -1
        hit = found >= 0
        functions, symbol = np.unique(found[hit], return_inverse=True)
        found[hit] = symbol
        return found, into, [obj.index.name(i) for i in functions.tolist()]

    def name_many(self, pid: int, addresses: Sequence[int]) -> NamedAddresses:
        """find() and lookup() of many addresses of pid (0 to 2**64 - 1,
        taken as they are: no return-address adjustment), as arrays: grouped
        by mapping with one vectorized search of the maps, each group named
        by lookup_many, each name demangled once. The maps are not re-read
        and no frame is memoized: this is for many distinct addresses at
        once (ember symbolize)."""
        proc = self.processes.get(pid)
        q = np.array(addresses, dtype=np.uint64)
        where = proc.find_many(q) if proc is not None else np.full(len(q), -1, dtype=np.int64)
        symbol = np.full(len(q), -1, dtype=np.int64)
        offset = np.zeros(len(q), dtype=np.uint64)
        raw: list[str] = []
        maps = proc.maps if proc is not None else ()
        for i, positions in _groups(where):
            if maps[i].file_backed:
                found, into, names = self.lookup_many(pid, maps[i], q[positions])
                hit = found >= 0
                symbol[positions[hit]] = found[hit] + len(raw)
                offset[positions[hit]] = into[hit]
                raw += names
        return NamedAddresses(maps, where, symbol, offset, [demangle(n) for n in raw], raw)

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
            pm = self._perf_maps.put(pid, PerfMap(pid, self.processes.procfs.root))
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
        memo = self._kframes.get
        for i, ip in enumerate(ips):
            self.stats.frames += 1
            frame = memo((ip, i > 0))
            if frame is None:
                hit = self.kernel.lookup(ip - 1 if i else ip) if self.kernel else None
                name = hit[0] if hit is not None else "[kernel.kallsyms]"
                frame = self._kframes.put((ip, i > 0),
                                          Frame(name, FrameKind.KERNEL, KERNEL_MAPPING, ip))
            if frame.name == "[kernel.kallsyms]":
                self.stats.unknown_frames += 1
            frames.append(frame)
        return frames


def _groups(where: npt.NDArray[np.int64]) -> list[tuple[int, npt.NDArray[np.intp]]]:
    """(value, the positions holding it, in order) for each value >= 0 in where."""
    if not len(where):
        return []
    order = np.argsort(where, kind="stable")
    ordered = where[order]
    cuts = (np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist()
    return [(int(ordered[a]), order[a:b])
            for a, b in zip([0, *cuts], [*cuts, len(order)], strict=True) if ordered[a] >= 0]
