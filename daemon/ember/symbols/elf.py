"""Function symbols of one ELF object, for address -> name lookups.

pyelftools reads the headers, sections and notes; the symbol tables of 64-bit
little-endian objects are then read as one NumPy structured array
(pyelftools builds a Python object per symbol, ~50 times slower), filtered,
sorted and deduplicated with vectorized operations into a ``SymbolIndex``:
sorted arrays of starts, ends and name offsets, names decoded on lookup.

Addresses are ELF virtual addresses: callers convert a runtime address with
the mapping (``file offset = addr - map.start + map.offset``) and
``ElfSymbols.vaddr_of_offset``, which uses the PT_LOAD program headers, so PIE,
non-PIE and shared objects are handled alike.
"""

from __future__ import annotations

import bisect
import mmap
import struct
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from ..errors import ElfError

STT_FUNC = 2
STT_GNU_IFUNC = 10
STB_LOCAL = 0
SHN_UNDEF = 0
PT_LOAD = 1
PF_X = 1
_SYM64 = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                   ("value", "<u8"), ("size", "<u8")])
_ELF_TYPES = {"ET_REL": 1, "ET_EXEC": 2, "ET_DYN": 3, "ET_CORE": 4}


@dataclass(frozen=True, slots=True)
class Segment:
    offset: int
    vaddr: int
    filesz: int
    memsz: int
    executable: bool


@dataclass(frozen=True, slots=True)
class Symbol:
    name: str
    start: int
    size: int


class ElfSymbols:
    """Symbols (.symtab, else .dynsym), load segments and build-id of one object."""

    def __init__(self, path: Path | str, fileobj: BinaryIO | None = None,
                 symbols: bool = True):
        """symbols=False reads only the headers (segments, build id, links)
        of a 64-bit little-endian object; load_symbols() reads the symbol
        tables later, if the caller finds no index to share."""
        self.path = str(path)
        self.shared: object = None  # keeps a by-build-id index shared with other copies alive
        # symbol tables not read yet: [(name, symbol table header, string table header)]
        self._deferred: list[tuple[str, tuple[int, ...], tuple[int, ...]]] | None = None
        self._guard(self._open_and_load, fileobj, symbols)

    def _guard(self, fn: Callable[..., None], *args: Any) -> None:
        """Run a reading step; every failure becomes an ElfError."""
        path = self.path
        try:
            fn(*args)
        except ElfError:
            raise
        except OSError as exc:
            raise ElfError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        except Exception as exc:  # pyelftools raises ELFError, struct.error, ValueError...
            raise ElfError(f"{path}: malformed ELF: {exc}") from exc

    def _open_and_load(self, fileobj: BinaryIO | None, symbols: bool) -> None:
        if fileobj is not None:
            self._load(fileobj, symbols)
            return
        with open(self.path, "rb") as f:
            self._load(f, symbols)

    def _load(self, f: BinaryIO, symbols: bool) -> None:
        ident = f.read(6)
        f.seek(0)
        if (ident[:4] == b"\x7fELF" and ident[4:6] == b"\x02\x01"
                and _load_elf64le(self, f, symbols)):
            return
        self._load_pyelftools(f)

    def load_symbols(self) -> None:
        """Read the symbol tables left out by symbols=False."""
        if self._deferred is not None:
            self._guard(self._load_deferred)

    def _load_deferred(self) -> None:
        tables, self._deferred = self._deferred or [], None
        with open(self.path, "rb") as f:
            _index_symtabs(self, reader(f, self.path), tables)

    def _load_pyelftools(self, f: BinaryIO) -> None:
        """Any ELF class and byte order; slow (a Python object per header)."""
        from elftools.elf.elffile import ELFFile

        elf = ELFFile(f)
        self.elf_type: int = _ELF_TYPES.get(elf.header["e_type"], 0)
        self.segments: tuple[Segment, ...] = tuple(
            Segment(s["p_offset"], s["p_vaddr"], s["p_filesz"], s["p_memsz"],
                    bool(s["p_flags"] & PF_X))
            for s in elf.iter_segments() if s["p_type"] == "PT_LOAD")
        self.build_id = _build_id(elf)
        section = elf.get_section_by_name(".gnu_debuglink")
        self.debuglink, self.debuglink_crc = _debuglink(
            section.data() if section is not None else None, elf.little_endian)
        # where this object's DWARF is: itself, or (set by the cache) its debug file
        info = elf.get_section_by_name(".debug_info") or elf.get_section_by_name(".zdebug_info")
        self.dwarf_path: str | None = (
            self.path if info is not None and info["sh_type"] != "SHT_NOBITS" else None)
        self.symbol_source = ""
        index: SymbolIndex | None = None
        for name in (".symtab", ".dynsym"):
            sec = elf.get_section_by_name(name)
            if sec is None or sec["sh_type"] == "SHT_NOBITS":
                continue
            index = _read_symbols(elf, sec)
            if len(index):
                self.symbol_source = name
                break
        self.index = index if index is not None else SymbolIndex.empty()

    def __len__(self) -> int:
        return len(self.index)

    def adopt_symbols(self, debug: ElfSymbols) -> None:
        """Use a separate debug file's symbols (same virtual addresses)."""
        self.index = debug.index
        self.symbol_source = f"{debug.symbol_source} of {debug.path}"

    @property
    def text_segment(self) -> Segment | None:
        return next((s for s in self.segments if s.executable), None)

    def vaddr_of_offset(self, offset: int) -> int | None:
        """ELF virtual address of a file offset, through the PT_LOAD headers."""
        for seg in self.segments:
            if seg.offset <= offset < seg.offset + max(seg.filesz, 1):
                return offset - seg.offset + seg.vaddr
        return None

    def vaddr_of_mapping(self, offset: int, executable: bool) -> int | None:
        """ELF address where a mapping of the file from ``offset`` (page
        aligned, as in /proc/PID/maps) starts. LLD packs segments: .text at
        file offset 0x15220 shares its first page with the read-only segment
        before it, so the first segment covering 0x15000 is a page off; the
        mapping being executable (unwind tables cover code) picks the one."""
        page = mmap.PAGESIZE
        for seg in self.segments:
            if seg.executable == executable and \
                    seg.offset & -page <= offset < seg.offset + max(seg.filesz, 1):
                return offset - seg.offset + seg.vaddr
        return self.vaddr_of_offset(offset)

    def vaddrs_of_offsets(self, offsets: npt.NDArray[np.uint64]
                          ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_]]:
        """vaddr_of_offset of many file offsets at once: (virtual addresses,
        which of them a PT_LOAD header covers); the first header covering
        an offset wins, as there."""
        vaddrs = np.zeros(len(offsets), dtype=np.uint64)
        found = np.zeros(len(offsets), dtype=bool)
        for seg in self.segments:
            inside = ~found & (offsets >= np.uint64(seg.offset)) & (
                offsets < np.uint64(seg.offset + max(seg.filesz, 1)))
            vaddrs[inside] = offsets[inside] - np.uint64(seg.offset) + np.uint64(seg.vaddr)
            found |= inside
        return vaddrs, found

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        """(symbol name, offset into it) for an ELF virtual address."""
        return self.index.lookup(vaddr)

    def lookup_many(self, vaddrs: Sequence[int]) -> list[tuple[str, int] | None]:
        return self.index.lookup_many(vaddrs)

    def functions(self) -> list[Symbol]:
        """Every indexed function: (name, start, size), by address."""
        return self.index.functions()

    def memory_size(self) -> int:
        """Approximate bytes held, for the cache's budget."""
        return 512 + self.index.memory_size()


class SymbolIndex:
    """Function symbols as three sorted arrays (start, end, name offset into
    a string table kept as bytes). Names are decoded when looked up, so
    indexing a symbol table is a few vectorized NumPy operations however
    large it is; single lookups bisect a compact array('Q'), batches go
    through numpy.searchsorted.

    One entry per address: the largest symbol there, then the shortest name
    (aliases such as __GI_memcpy/memcpy). A zero-sized symbol covers up to
    the next one.
    """

    __slots__ = ("_ends", "_names", "_np_ends", "_np_starts", "_starts", "_strtab")

    def __init__(self, starts: npt.NDArray[np.uint64], ends: npt.NDArray[np.uint64],
                 name_offsets: npt.NDArray[np.uint32], strtab: bytes):
        self._starts = array("Q", starts.astype(np.uint64).tobytes())
        self._ends = array("Q", ends.astype(np.uint64).tobytes())
        self._names = array("I", name_offsets.astype(np.uint32).tobytes())
        self._strtab = strtab
        self._np_starts = np.frombuffer(self._starts, dtype=np.uint64)
        self._np_ends = np.frombuffer(self._ends, dtype=np.uint64)

    @classmethod
    def empty(cls) -> SymbolIndex:
        z = np.zeros(0, dtype=np.uint64)
        return cls(z, z, np.zeros(0, dtype=np.uint32), b"")

    @classmethod
    def build(cls, values: npt.NDArray[np.uint64], sizes: npt.NDArray[np.uint64],
              name_offsets: npt.NDArray[np.uint32], strtab: bytes) -> SymbolIndex:
        """From unsorted symbols whose names are NUL-terminated in strtab."""
        if not len(values):
            return cls.empty()
        tab = np.frombuffer(strtab, dtype=np.uint8)
        nuls = np.flatnonzero(tab == 0)
        if len(nuls):
            at = np.searchsorted(nuls, name_offsets)
            ends_of_names = np.where(at < len(nuls), nuls[np.minimum(at, len(nuls) - 1)],
                                     len(tab))
        else:
            ends_of_names = np.full(len(name_offsets), len(tab))
        lengths = ends_of_names.astype(np.int64) - name_offsets.astype(np.int64)
        keep = lengths > 0
        values, sizes, name_offsets, lengths = (values[keep], sizes[keep], name_offsets[keep],
                                                lengths[keep])
        order = np.lexsort((lengths, -sizes.astype(np.int64), values))  # last key first
        values, sizes, name_offsets = values[order], sizes[order], name_offsets[order]
        first = np.ones(len(values), dtype=bool)
        first[1:] = values[1:] != values[:-1]
        starts, sizes, name_offsets = values[first], sizes[first], name_offsets[first]
        ends = starts + sizes
        nxt = np.empty_like(starts)
        nxt[:-1] = starts[1:]
        if len(starts):
            nxt[-1] = starts[-1] + 1
        ends = np.where(sizes == 0, nxt, ends)
        return cls(starts, ends, name_offsets, strtab)

    @classmethod
    def from_symbols(cls, symbols: list[Symbol]) -> SymbolIndex:
        blob = bytearray(b"\0")
        offsets = []
        for sym in symbols:
            offsets.append(len(blob))
            blob += sym.name.encode("utf-8", "replace") + b"\0"
        return cls.build(np.array([s.start for s in symbols], dtype=np.uint64),
                         np.array([s.size for s in symbols], dtype=np.uint64),
                         np.array(offsets, dtype=np.uint32), bytes(blob))

    def __len__(self) -> int:
        return len(self._starts)

    def name(self, i: int) -> str:
        off = self._names[i]
        end = self._strtab.find(b"\0", off)
        return self._strtab[off:end if end >= 0 else None].decode("utf-8", "replace")

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        if vaddr < 0 or vaddr > 0xFFFFFFFFFFFFFFFF:
            return None
        i = bisect.bisect_right(self._starts, vaddr) - 1
        if i < 0 or vaddr >= self._ends[i]:
            return None
        return self.name(i), vaddr - self._starts[i]

    def search(self, vaddrs: npt.NDArray[np.uint64]
               ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64]]:
        """lookup() of many addresses as arrays, in one vectorized search:
        (the symbol of each, -1 where none; the offset into it, 0 where
        none). Names are left to the caller (name(i)), once per symbol."""
        if not len(self._starts):
            return (np.full(len(vaddrs), -1, dtype=np.int64),
                    np.zeros(len(vaddrs), dtype=np.uint64))
        idx = np.searchsorted(self._np_starts, vaddrs, side="right").astype(np.int64) - 1
        safe = np.maximum(idx, 0)
        hit = (idx >= 0) & (vaddrs < self._np_ends[safe])
        return (np.where(hit, idx, -1),
                np.where(hit, vaddrs - self._np_starts[safe], np.uint64(0)))

    def lookup_many(self, vaddrs: Sequence[int]) -> list[tuple[str, int] | None]:
        """lookup() of many addresses, in one vectorized search."""
        idx, offsets = self.search(np.array(vaddrs, dtype=np.uint64))
        names: dict[int, str] = {}
        out: list[tuple[str, int] | None] = []
        for i, off in zip(idx.tolist(), offsets.tolist(), strict=True):
            if i < 0:
                out.append(None)
                continue
            name = names.get(i)
            if name is None:
                name = names[i] = self.name(i)
            out.append((name, off))
        return out

    def functions(self) -> list[Symbol]:
        return [Symbol(self.name(i), self._starts[i], self._ends[i] - self._starts[i])
                for i in range(len(self._starts))]

    def arrays(self) -> tuple[bytes, bytes, bytes, bytes]:
        """starts, ends, name offsets and string table, for the disk cache."""
        return (self._starts.tobytes(), self._ends.tobytes(), self._names.tobytes(),
                self._strtab)

    @classmethod
    def from_arrays(cls, starts: bytes, ends: bytes, names: bytes, strtab: bytes
                    ) -> SymbolIndex:
        s = np.frombuffer(starts, dtype=np.uint64)
        e = np.frombuffer(ends, dtype=np.uint64)
        n = np.frombuffer(names, dtype=np.uint32)
        if not (len(s) == len(e) == len(n)) or (len(s) and (
                bool(np.any(s[1:] <= s[:-1])) or bool(np.any(e <= s))
                or int(n.max()) >= len(strtab))):
            raise ValueError("inconsistent symbol index")
        return cls(s, e, n, strtab)

    def memory_size(self) -> int:
        return 20 * len(self._starts) + len(self._strtab)


_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_NHDR = struct.Struct("<III")
SHT_SYMTAB, SHT_NOTE, SHT_NOBITS, SHT_DYNSYM = 2, 7, 8, 11
SHF_COMPRESSED = 0x800
NT_GNU_BUILD_ID = 3


def reader(f: BinaryIO, path: str) -> Callable[[int, int], bytes]:
    """read(offset, length) of f, refusing ranges past its end (ElfError)."""
    f.seek(0, 2)
    size = f.tell()

    def read(offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > size:
            raise ElfError(f"{path}: malformed ELF: {length} bytes at {offset:#x} "
                           f"past the end ({size:#x})")
        f.seek(offset)
        return f.read(length)

    return read


def _load_elf64le(obj: ElfSymbols, f: BinaryIO, symbols: bool = True) -> bool:
    """The headers, notes and symbol tables of a 64-bit little-endian ELF
    (every object on x86-64 and arm64) read with struct and NumPy directly:
    pyelftools spends ~20 ms on libc's headers alone. False for what this
    reader leaves to pyelftools (extended section numbering, a compressed
    symbol table)."""
    read = reader(f, obj.path)

    (_ident, e_type, _machine, _version, _entry, phoff, shoff, _flags, _ehsize, phentsize,
     phnum, shentsize, shnum, shstrndx) = _EHDR.unpack(read(0, _EHDR.size))
    if (phnum and phentsize != _PHDR.size) or (shnum and shentsize != _SHDR.size):
        raise ElfError(f"{obj.path}: malformed ELF: header entry sizes {phentsize}/{shentsize}")
    if shoff and shnum == 0:
        return False  # extended numbering: more than 0xff00 sections
    obj.elf_type = e_type if e_type in (1, 2, 3, 4) else 0
    table = read(phoff, phnum * _PHDR.size) if phnum else b""
    obj.segments = tuple(
        Segment(p_offset, p_vaddr, p_filesz, p_memsz, bool(p_flags & PF_X))
        for p_type, p_flags, p_offset, p_vaddr, _pa, p_filesz, p_memsz, _al
        in _PHDR.iter_unpack(table) if p_type == PT_LOAD)
    headers = list(_SHDR.iter_unpack(read(shoff, shnum * _SHDR.size))) if shnum else []
    names = b""
    if headers:
        if shstrndx >= len(headers):
            raise ElfError(f"{obj.path}: malformed ELF: section name table {shstrndx}")
        str_hdr = headers[shstrndx]
        names = read(str_hdr[4], str_hdr[5]) if str_hdr[1] != SHT_NOBITS else b""

    def name_of(h: tuple[int, ...]) -> str:
        end = names.find(b"\0", h[0])
        return names[h[0]:end if end >= 0 else None].decode("utf-8", "replace")

    def data(h: tuple[int, ...]) -> bytes:
        return b"" if h[1] == SHT_NOBITS else read(h[4], h[5])

    by_name: dict[str, tuple[int, ...]] = {}
    obj.build_id = None
    for h in headers:
        by_name.setdefault(name_of(h), h)
        if h[1] == SHT_NOTE and obj.build_id is None:
            obj.build_id = _note_build_id(data(h))
    link_hdr = by_name.get(".gnu_debuglink")
    obj.debuglink, obj.debuglink_crc = _debuglink(
        data(link_hdr) if link_hdr is not None else None, True)
    info = by_name.get(".debug_info") or by_name.get(".zdebug_info")
    obj.dwarf_path = obj.path if info is not None and info[1] != SHT_NOBITS else None
    obj.symbol_source = ""
    obj.index = SymbolIndex.empty()
    tables: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
    for name, kind in ((".symtab", SHT_SYMTAB), (".dynsym", SHT_DYNSYM)):
        sym_hdr = by_name.get(name)
        if sym_hdr is None or sym_hdr[1] != kind:
            continue
        strtab_at = sym_hdr[6]
        if strtab_at >= len(headers) or (sym_hdr[2] | headers[strtab_at][2]) & SHF_COMPRESSED:
            return False
        if sym_hdr[9] != _SYM64.itemsize:
            raise ElfError(f"{obj.path}: malformed ELF: {name} entry size {sym_hdr[9]}")
        tables.append((name, sym_hdr, headers[strtab_at]))
    if symbols:
        _index_symtabs(obj, read, tables)
    else:
        obj._deferred = tables
    return True


def _index_symtabs(obj: ElfSymbols, read: Callable[[int, int], bytes],
                   tables: list[tuple[str, tuple[int, ...], tuple[int, ...]]]) -> None:
    """The first of .symtab and .dynsym with functions becomes the index."""
    for name, h, strtab in tables:
        index = _index_symbols(read(h[4], h[5]), read(strtab[4], strtab[5])
                               if strtab[1] != SHT_NOBITS else b"")
        if len(index):
            obj.index = index
            obj.symbol_source = name
            return


def _debuglink(blob: bytes | None, little_endian: bool) -> tuple[str | None, int | None]:
    """(file name, CRC32) of a .gnu_debuglink section."""
    if blob is None:
        return None, None
    link, _, _ = blob.partition(b"\0")
    crc_at = (len(link) + 1 + 3) & ~3  # the name is NUL-padded to 4 bytes
    crc = (int.from_bytes(blob[crc_at:crc_at + 4], "little" if little_endian else "big")
           if len(blob) >= crc_at + 4 else None)
    return link.decode("utf-8", "replace") or None, crc


def _note_build_id(blob: bytes) -> str | None:
    at = 0
    while at + _NHDR.size <= len(blob):
        namesz, descsz, kind = _NHDR.unpack_from(blob, at)
        name_at = at + _NHDR.size
        desc_at = name_at + ((namesz + 3) & ~3)
        end = desc_at + ((descsz + 3) & ~3)
        if end > len(blob) + 3:
            return None
        if kind == NT_GNU_BUILD_ID and blob[name_at:name_at + namesz] == b"GNU\0":
            return blob[desc_at:desc_at + descsz].hex() or None
        at = end
    return None


def _build_id(elf: Any) -> str | None:
    for sec in elf.iter_sections():
        if sec["sh_type"] != "SHT_NOTE":
            continue
        for note in sec.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID":
                return str(note["n_desc"])
    return None


def _index_symbols(data: bytes, strtab: bytes) -> SymbolIndex:
    """An ELF64 little-endian symbol table, as one structured array."""
    syms = np.frombuffer(data, dtype=_SYM64, count=len(data) // _SYM64.itemsize)
    kind = syms["info"] & 0xF
    pick = (((kind == STT_FUNC) | (kind == STT_GNU_IFUNC)) & (syms["shndx"] != SHN_UNDEF)
            & (syms["value"] != 0) & (syms["name"] != 0) & (syms["name"] < len(strtab)))
    syms = syms[pick]
    return SymbolIndex.build(syms["value"].astype(np.uint64), syms["size"].astype(np.uint64),
                             syms["name"].astype(np.uint32), bytes(strtab))


def _read_symbols(elf: Any, sec: Any) -> SymbolIndex:
    strtab = elf.get_section(sec["sh_link"]).data()
    if elf.elfclass == 64 and elf.little_endian and sec["sh_entsize"] == _SYM64.itemsize:
        return _index_symbols(sec.data(), strtab)
    out: list[Symbol] = []
    for sym in sec.iter_symbols():
        if (sym["st_info"]["type"] not in ("STT_FUNC", "STT_GNU_IFUNC")
                or sym["st_shndx"] == "SHN_UNDEF" or not sym["st_value"] or not sym.name):
            continue
        out.append(Symbol(sym.name, sym["st_value"], sym["st_size"]))
    return SymbolIndex.from_symbols(out)
