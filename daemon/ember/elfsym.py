"""Function symbols of one ELF object, for address -> name lookups.

pyelftools reads the headers, sections and notes; the symbol tables of 64-bit
little-endian objects are then unpacked in bulk with ``struct.iter_unpack``
(pyelftools builds a Python object per symbol, ~50 times slower). Symbols go
into sorted arrays searched with bisect.

Addresses are ELF virtual addresses: callers convert a runtime address with
the mapping (``file offset = addr - map.start + map.offset``) and
``ElfSymbols.vaddr_of_offset``, which uses the PT_LOAD program headers, so PIE,
non-PIE and shared objects are handled alike.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from .errors import ElfError

STT_FUNC = 2
STT_GNU_IFUNC = 10
STB_LOCAL = 0
SHN_UNDEF = 0
PT_LOAD = 1
PF_X = 1
_SYM64 = struct.Struct("<IBBHQQ")
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

    def __init__(self, path: Path | str, fileobj: BinaryIO | None = None):
        self.path = str(path)
        try:
            if fileobj is None:
                with open(path, "rb") as f:
                    self._load(f)
            else:
                self._load(fileobj)
        except ElfError:
            raise
        except OSError as exc:
            raise ElfError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        except Exception as exc:  # pyelftools raises ELFError, struct.error, ValueError...
            raise ElfError(f"{path}: malformed ELF: {exc}") from exc

    def _load(self, f: BinaryIO) -> None:
        from elftools.elf.elffile import ELFFile

        elf = ELFFile(f)
        self.elf_type: int = _ELF_TYPES.get(elf.header["e_type"], 0)
        self.segments: tuple[Segment, ...] = tuple(
            Segment(s["p_offset"], s["p_vaddr"], s["p_filesz"], s["p_memsz"],
                    bool(s["p_flags"] & PF_X))
            for s in elf.iter_segments() if s["p_type"] == "PT_LOAD")
        self.build_id = _build_id(elf)
        self.debuglink: str | None = None
        self.debuglink_crc: int | None = None
        section = elf.get_section_by_name(".gnu_debuglink")
        if section is not None:
            data = section.data()
            link, _, _ = data.partition(b"\0")
            self.debuglink = link.decode("utf-8", "replace") or None
            crc_at = (len(link) + 1 + 3) & ~3  # the name is NUL-padded to 4 bytes
            if len(data) >= crc_at + 4:
                self.debuglink_crc = int.from_bytes(data[crc_at:crc_at + 4],
                                                    "little" if elf.little_endian else "big")
        # where this object's DWARF is: itself, or (set by the cache) its debug file
        info = elf.get_section_by_name(".debug_info") or elf.get_section_by_name(".zdebug_info")
        self.dwarf_path: str | None = (
            self.path if info is not None and info["sh_type"] != "SHT_NOBITS" else None)
        symbols: list[Symbol] = []
        self.symbol_source = ""
        for name in (".symtab", ".dynsym"):
            sec = elf.get_section_by_name(name)
            if sec is None or sec["sh_type"] == "SHT_NOBITS":
                continue
            symbols = _read_symbols(elf, sec)
            if symbols:
                self.symbol_source = name
                break
        self._index(symbols)

    def _index(self, symbols: list[Symbol]) -> None:
        # One symbol per address: the largest, then the shortest name (aliases).
        symbols.sort(key=lambda s: (s.start, -s.size, len(s.name)))
        starts: list[int] = []
        ends: list[int] = []
        names: list[str] = []
        for s in symbols:
            if starts and starts[-1] == s.start:
                continue
            starts.append(s.start)
            ends.append(s.start + s.size)
            names.append(s.name)
        # A zero-sized symbol covers up to the next one.
        for i, end in enumerate(ends):
            if end == starts[i]:
                ends[i] = starts[i + 1] if i + 1 < len(starts) else starts[i] + 1
        self._starts, self._ends, self._names = starts, ends, names

    def __len__(self) -> int:
        return len(self._starts)

    def adopt_symbols(self, debug: ElfSymbols) -> None:
        """Use a separate debug file's symbols (same virtual addresses)."""
        self._starts, self._ends, self._names = debug._starts, debug._ends, debug._names
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

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        """(symbol name, offset into it) for an ELF virtual address."""
        i = bisect.bisect_right(self._starts, vaddr) - 1
        if i < 0 or vaddr >= self._ends[i]:
            return None
        return self._names[i], vaddr - self._starts[i]

    def lookup_many(self, vaddrs: list[int]) -> list[tuple[str, int] | None]:
        return [self.lookup(v) for v in vaddrs]

    def memory_size(self) -> int:
        """Approximate bytes held, for the cache's budget."""
        return 64 * len(self._starts) + sum(len(n) for n in self._names)


def _build_id(elf: Any) -> str | None:
    for sec in elf.iter_sections():
        if sec["sh_type"] != "SHT_NOTE":
            continue
        for note in sec.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID":
                return str(note["n_desc"])
    return None


def _read_symbols(elf: Any, sec: Any) -> list[Symbol]:
    strtab = elf.get_section(sec["sh_link"]).data()
    out: list[Symbol] = []
    if elf.elfclass == 64 and elf.little_endian and sec["sh_entsize"] == _SYM64.size:
        data = sec.data()
        usable = len(data) - len(data) % _SYM64.size
        for st_name, st_info, _other, shndx, value, size in _SYM64.iter_unpack(data[:usable]):
            if (st_info & 0xF) not in (STT_FUNC, STT_GNU_IFUNC) or shndx == SHN_UNDEF or not value:
                continue
            end = strtab.find(b"\0", st_name)
            name = strtab[st_name:end if end >= 0 else None].decode("utf-8", "replace")
            if name:
                out.append(Symbol(name, value, size))
        return out
    for sym in sec.iter_symbols():
        if (sym["st_info"]["type"] not in ("STT_FUNC", "STT_GNU_IFUNC")
                or sym["st_shndx"] == "SHN_UNDEF" or not sym["st_value"] or not sym.name):
            continue
        out.append(Symbol(sym.name, sym["st_value"], sym["st_size"]))
    return out
