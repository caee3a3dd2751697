"""The CFI sections of an x86-64 ELF file, read from its section headers.

Only the headers and the few sections the decoder needs are read (with
seeks, not the whole file): .eh_frame, .debug_frame (decompressed when
SHF_COMPRESSED with zlib, as Debian's debug files ship it), and the
addresses of .text and .got that DW_EH_PE_textrel and datarel pointers are
relative to. Build ids and debug files are the symbols stage's business
(``ElfSymbols``, ``debug_file_for``); this module only finds bytes.
"""

from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import ElfError, UnwindTableError
from ..symbols.elf import reader
from .cfa import CfiSection

log = logging.getLogger(__name__)

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")  # name, type, flags, addr, offset, size, link, info, ...
_CHDR = struct.Struct("<IIQQ")        # ch_type, reserved, ch_size, ch_addralign
EM_X86_64 = 62
SHT_NOBITS = 8
SHF_COMPRESSED = 0x800
ELFCOMPRESS_ZLIB = 1
_MAX_SECTION = 1 << 30


@dataclass(frozen=True)
class CfiSections:
    eh_frame: CfiSection | None
    debug_frame: CfiSection | None
    text_size: int        # bytes of .text: how much code a table should cover


def read_sections(path: str) -> CfiSections:
    """The CFI sections of the ELF file at path; UnwindTableError when it
    cannot be read or is not a 64-bit little-endian x86-64 object."""
    try:
        with open(path, "rb") as f:
            return _read(f, path)
    except OSError as exc:
        raise UnwindTableError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except ElfError as exc:
        raise UnwindTableError(str(exc)) from exc
    except (struct.error, zlib.error, ValueError) as exc:
        raise UnwindTableError(f"{path}: malformed ELF: {exc}") from exc


def _read(f: BinaryIO, path: str) -> CfiSections:
    read = reader(f, path)

    ident, _type, machine, *_rest = _EHDR.unpack(read(0, _EHDR.size))
    shoff, shentsize, shnum, shstrndx = _rest[3], _rest[8], _rest[9], _rest[10]
    if ident[:4] != b"\x7fELF" or ident[4:6] != b"\x02\x01" or machine != EM_X86_64:
        raise UnwindTableError(f"{path}: not an x86-64 ELF64 little-endian object")
    if shnum == 0 or shentsize != _SHDR.size or shstrndx >= shnum:
        return CfiSections(None, None, 0)  # no (usable) section headers
    headers = list(_SHDR.iter_unpack(read(shoff, shnum * _SHDR.size)))
    names_hdr = headers[shstrndx]
    names = read(names_hdr[4], names_hdr[5]) if names_hdr[1] != SHT_NOBITS else b""
    by_name: dict[bytes, tuple[int, ...]] = {}
    for h in headers:
        end = names.find(b"\0", h[0])
        by_name.setdefault(names[h[0]:end if end >= 0 else None], h)

    def addr(name: bytes) -> int:
        h = by_name.get(name)
        return h[3] if h is not None else 0

    def section(name: bytes) -> CfiSection | None:
        h = by_name.get(name)
        if h is None or h[1] == SHT_NOBITS or h[5] == 0:
            return None
        if h[5] > _MAX_SECTION:
            raise UnwindTableError(f"{path}: {name.decode()} of {h[5]} bytes is too large")
        data = read(h[4], h[5])
        if h[2] & SHF_COMPRESSED:
            kind, _, full, _ = _CHDR.unpack_from(data)
            if kind != ELFCOMPRESS_ZLIB or full > _MAX_SECTION:
                log.debug("%s: %s compressed with %d: not read", path, name.decode(), kind)
                return None
            data = zlib.decompress(memoryview(data)[_CHDR.size:], bufsize=full)
        return CfiSection(name.decode(), data, h[3], addr(b".text"), addr(b".got"))

    text = by_name.get(b".text")
    return CfiSections(section(b".eh_frame"), section(b".debug_frame"),
                       text[5] if text is not None else 0)
