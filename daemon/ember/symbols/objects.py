"""ELF objects by identity: their symbol tables and DWARF line tables, read
once and kept in bounded caches.

An object is known by (device, inode, size, mtime), so a binary replaced on
disk is read again while the same library mapped by many processes is read
once. Objects of the same build id share one symbol index in memory (the
same library seen through several containers' roots), and with a disk
cache (agent.symbol_cache_dir) across restarts. A stripped object takes
the symbols of its separate debug file. Unreadable objects are remembered
too, so a bad file is not re-parsed for every address.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..cache import BoundedCache
from ..errors import DwarfError, ElfError
from . import DEFAULT_DEBUG_DIRS
from .debuginfo import debug_file_for
from .diskcache import CachedSymbols, DiskSymbolCache
from .dwarf import DwarfLines
from .elf import ElfSymbols

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
    """Symbol tables by object identity and DWARF line tables by path, in
    one byte budget: the symbol tables' cache is bounded by ``max_bytes``,
    the DWARF tables (the largest, and only serving lines) get what the
    symbol tables leave, least recently used first out of both."""

    def __init__(self, max_bytes: int = 256 << 20,
                 debug_dirs: Sequence[str] = DEFAULT_DEBUG_DIRS,
                 disk: DiskSymbolCache | None = None):
        self.debug_dirs = tuple(debug_dirs)
        self.disk = disk
        self.tables: BoundedCache[ObjectKey, ElfSymbols | None] = BoundedCache(
            "symbol_tables", max_bytes=max_bytes, weigh=_table_bytes, lru=True, keep=1)
        self.dwarf: BoundedCache[str, DwarfLines | None] = BoundedCache(
            "dwarf_lines", max_bytes=max_bytes, weigh=_dwarf_bytes, lru=True)
        # full symbol indexes by build id, alive while an object holds them:
        # an index, not a cache (it keeps nothing alive by itself)
        self._shared: weakref.WeakValueDictionary[str, CachedSymbols] = \
            weakref.WeakValueDictionary()
        self.stats = SymbolizerStats()

    @property
    def max_bytes(self) -> int:
        return self.tables.max_bytes

    def resize(self, max_bytes: int) -> None:
        """A new byte budget (evicting what no longer fits)."""
        self.tables.resize(max_bytes=max_bytes)
        self.dwarf.resize(max_bytes=max_bytes)

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
            if key in self.tables:
                self.stats.cache_hits += 1
                return key, self.tables.get(key)
            self.stats.cache_misses += 1
            obj = self.tables.put(key, self._read(path))
            self._fit_dwarf()
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
        file), opened on first use."""
        path = obj.dwarf_path
        if path is None:
            return None
        if path in self.dwarf:
            return self.dwarf.get(path)
        try:
            lines: DwarfLines | None = DwarfLines(path)
        except DwarfError as exc:
            log.debug("%s", exc)
            self.stats.dwarf_errors += 1
            lines = None
        self._fit_dwarf()
        return self.dwarf.put(path, lines)

    def _fit_dwarf(self) -> None:
        """DWARF tables get the budget the symbol tables leave."""
        self.dwarf.resize(max_bytes=max(1, self.tables.max_bytes - self.tables.size_bytes()))

    def __len__(self) -> int:
        return len(self.tables)


def _table_bytes(obj: ElfSymbols | None) -> int:
    return obj.memory_size() if obj is not None else 64


def _dwarf_bytes(lines: DwarfLines | None) -> int:
    return lines.memory_size() if lines is not None else 64
