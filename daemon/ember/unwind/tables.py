"""Unwind tables of whole objects, and their cache on disk by build id.

``build_table`` decodes the object's .eh_frame. When that covers less than
half of .text (an object built without asynchronous unwind tables), the
.debug_frame of the object or of its separate debug file (found the way the
symbolizer finds it, ``debug_file_for``) is added, its FDEs first where
both cover a pc, if that covers more.

``cached_table`` keeps tables across restarts next to the symbol cache,
with its conventions: one file per build id (``BUILD_ID.unw``), a versioned
header and a CRC32, atomic writes with mode 0600, a corrupt file deleted and
rebuilt (never trusted, never fatal), least recently used files deleted past
a size bound. An object without build id is not cached, nor a table that a
debug package installed later could change (a thin .eh_frame and no debug
file found).
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from ..abi import CFA_NONE, CFA_RBP, CFA_RSP
from ..errors import ElfError, UnwindTableError
from ..symbols import DEFAULT_DEBUG_DIRS
from ..symbols.debuginfo import debug_file_for
from ..symbols.diskcache import BuildIdFiles
from ..symbols.elf import ElfSymbols
from .cfa import ROW, Row
from .cfi import DecodedRows, decode
from .sections import read_sections

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnwindTable:
    """The rows of one object (packed ``cfi.ROW``s, sorted by pc) and what
    the metrics and the bench count about them."""
    path: str
    build_id: str                  # hex; "" when the object has none
    source: str                    # ".eh_frame", ".debug_frame[ of DEBUG_FILE][+.eh_frame]"
    rows: bytes = field(repr=False)
    row_count: int
    cfa_counts: tuple[int, ...]    # rows by cfa_type (index: cfi.CFA_*)
    rbp_counts: tuple[int, ...]    # rows by rbp_type (index: cfi.RBP_*)
    fdes: int = 0
    overlaps: int = 0              # FDEs that started inside another one
    covered: int = 0               # bytes of code that FDEs cover
    final: bool = True             # False: a debug package could still change it

    @classmethod
    def of(cls, path: str, build_id: str, source: str, decoded: DecodedRows,
           final: bool = True) -> UnwindTable:
        rows = decoded.rows
        if len(rows) % ROW.size:
            raise UnwindTableError(f"{path}: {len(rows)} bytes of rows: not whole rows")
        cfa, rbp = rows[10::ROW.size], rows[11::ROW.size]
        return cls(path, build_id, source, rows, len(rows) // ROW.size,
                   tuple(cfa.count(t) for t in range(6)), tuple(rbp.count(t) for t in range(3)),
                   decoded.fdes, decoded.overlaps, decoded.covered, final)

    @cached_property
    def pcs(self) -> array[int]:
        """The rows' pcs, for bisecting."""
        return array("I", _pcs(self.rows).tobytes())

    @property
    def coverage(self) -> float:
        """Share of the rows (gap markers left out) the walker can follow:
        CFA from rsp or rbp, return address at CFA-8."""
        real = self.row_count - self.cfa_counts[CFA_NONE]
        return (self.cfa_counts[CFA_RSP] + self.cfa_counts[CFA_RBP]) / real if real else 0.0


def _pcs(rows: bytes) -> npt.NDArray[np.uint32]:
    """The pcs of packed rows: a view, not a copy."""
    return np.frombuffer(rows, dtype="<u4")[::ROW.size // 4]


def lookup(table: UnwindTable, pc: int) -> Row | None:
    """The row in effect at pc (the last one at or below it), None below
    the first row."""
    i = bisect.bisect_right(table.pcs, pc) - 1
    return Row._make(ROW.unpack_from(table.rows, i * ROW.size)) if i >= 0 else None


def _header(path: str) -> ElfSymbols:
    try:
        return ElfSymbols(path, symbols=False)
    except ElfError as exc:
        raise UnwindTableError(str(exc)) from exc


def build_table(path: Path | str, debug_dirs: Sequence[str] = DEFAULT_DEBUG_DIRS,
                elf: ElfSymbols | None = None) -> UnwindTable:
    """The unwind table of the x86-64 object at path (see the module's
    docstring for which section). UnwindTableError when it cannot be read,
    is malformed, or has code past 4 GiB."""
    path = str(path)
    elf = elf or _header(path)
    build_id = elf.build_id or ""
    found = read_sections(path)
    eh = found.eh_frame
    best = decode(eh, path) if eh is not None else None
    if best is not None and best.covered * 2 >= found.text_size:
        return UnwindTable.of(path, build_id, ".eh_frame", best)
    debug_frame, source, final = found.debug_frame, ".debug_frame", True
    try:
        if debug_frame is None:
            debug = debug_file_for(elf, path, debug_dirs)
            final = debug is not None
            if debug is not None:
                debug_frame = read_sections(str(debug)).debug_frame
                source = f".debug_frame of {debug}"
        if debug_frame is not None:
            # the .eh_frame's FDEs too: built without unwind tables, an
            # object still has them for its PLT and the C runtime's start files
            both = decode([debug_frame, eh] if eh is not None else [debug_frame], path)
            if best is None or both.covered > best.covered:
                return UnwindTable.of(path, build_id, source + ("+.eh_frame" if eh else ""),
                                      both, final)
    except UnwindTableError as exc:
        if best is None:
            raise
        log.debug("%s: keeping .eh_frame: %s", path, exc)
        final = False
    if best is None:
        raise UnwindTableError(f"{path}: no .eh_frame or .debug_frame")
    return UnwindTable.of(path, build_id, ".eh_frame", best, final)


_MAGIC = b"EMBERUNW"
_VERSION = 1  # bump when the rows a given object decodes to change
_HEADER = struct.Struct("<8sIIIIQI")  # magic, version, rows, fdes, overlaps, covered, source


class DiskUnwindCache(BuildIdFiles):
    """Tables on disk, one file per build id (see the module's docstring)."""

    suffix = ".unw"
    what = "unwind cache"

    def load(self, build_id: str, path: str) -> UnwindTable | None:
        """The table of build_id, for the object at path; None when absent
        or corrupt (deleted)."""
        where = self._path(build_id)
        if where is None:
            return None
        try:
            with open(where, "rb") as f:
                table = _decode(f, build_id, path)
        except FileNotFoundError:
            self.stats.misses += 1
            return None
        except (ValueError, struct.error, UnicodeDecodeError, UnwindTableError) as exc:
            self._corrupt(where, exc)
            return None
        except OSError as exc:
            self._unreadable(where, exc)
            return None
        self._hit(where)
        return table

    def store(self, table: UnwindTable) -> None:
        where = self._path(table.build_id)
        if where is not None and table.final:
            self._write(where, _encode(table))


def _encode(table: UnwindTable) -> bytes:
    source = table.source.encode()
    body = b"".join([_HEADER.pack(_MAGIC, _VERSION, table.row_count, table.fdes,
                                  table.overlaps, table.covered, len(source)),
                     source, table.rows])
    return body + struct.pack("<I", zlib.crc32(body))


def _decode(f: BinaryIO, build_id: str, path: str) -> UnwindTable:
    """The table in the open cache file f, its rows read straight into their
    bytes (the file is not held in memory as well)."""
    size = os.fstat(f.fileno()).st_size
    head = f.read(_HEADER.size)
    if size < _HEADER.size + 4 or len(head) < _HEADER.size:
        raise ValueError("truncated")
    magic, version, count, fdes, overlaps, covered, source_len = _HEADER.unpack(head)
    if magic != _MAGIC or version != _VERSION:
        raise ValueError(f"not a version {_VERSION} ember unwind file")
    if _HEADER.size + source_len + count * ROW.size + 4 != size:
        raise ValueError("sizes do not add up")
    source, rows, crc = f.read(source_len), f.read(count * ROW.size), f.read(4)
    if len(crc) != 4:
        raise ValueError("truncated")
    if zlib.crc32(rows, zlib.crc32(source, zlib.crc32(head))) != struct.unpack("<I", crc)[0]:
        raise ValueError("checksum mismatch")
    pcs = _pcs(rows)
    if np.any(pcs[1:] <= pcs[:-1]):
        raise ValueError("rows not sorted by pc")
    return UnwindTable.of(path, build_id, source.decode(),
                          DecodedRows(rows, fdes, overlaps, 0, 0, covered))


def cached_table(path: Path | str, cache_dir: Path | str | DiskUnwindCache | None,
                 debug_dirs: Sequence[str] = DEFAULT_DEBUG_DIRS) -> UnwindTable:
    """build_table(path), through the disk cache in cache_dir (a directory,
    or an open DiskUnwindCache whose stats count hits and misses; None: no
    disk cache)."""
    path = str(path)
    elf = _header(path)
    if cache_dir is None:
        return build_table(path, debug_dirs, elf)
    cache = cache_dir if isinstance(cache_dir, DiskUnwindCache) else DiskUnwindCache(cache_dir)
    if elf.build_id:
        table = cache.load(elf.build_id, path)
        if table is not None:
            return table
    table = build_table(path, debug_dirs, elf)
    cache.store(table)
    return table
