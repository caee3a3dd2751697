"""Symbol indexes on disk, by build id, so a restarted agent does not index
its hosts' objects again (``agent.symbol_cache_dir``).

Only full symbol tables (``.symtab``, of the object or of its separate debug
file) are stored: for one build id that table is the same everywhere, while
a ``.dynsym``-only answer could change when a debug package is installed.

One file per build id: a header, the three arrays of the ``SymbolIndex``,
its string table and a CRC32 of everything before it. Files are written
atomically (temporary file, then rename) with mode 0600; a file that does not
check out is deleted and counted, never trusted. The directory is bounded: past
``max_bytes`` the least recently used files (by mtime, refreshed on every
hit) are deleted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from .elf import SymbolIndex

log = logging.getLogger(__name__)

_MAGIC = b"EMBERSYM"
_VERSION = 1
_HEADER = struct.Struct("<8sIIQII")  # magic, version, count, strtab bytes, source, dwarf path
_BUILD_ID = re.compile(r"^[0-9a-f]{8,128}$")


@dataclass
class DiskCacheStats:
    hits: int = 0
    misses: int = 0
    stored: int = 0
    errors: int = 0      # unreadable or corrupt files (deleted), failed writes
    evicted: int = 0


@dataclass(frozen=True)
class CachedSymbols:
    index: SymbolIndex
    source: str          # ".symtab" or ".symtab of /usr/lib/debug/..."
    dwarf_path: str | None


class BuildIdFiles:
    """A bounded directory of files named by build id: the writing,
    bounding and bookkeeping that the symbol and unwind caches share. A
    subclass names its suffix and encodes and decodes its own files."""

    suffix = ""
    what = ""  # for the log: "symbol cache"

    def __init__(self, directory: Path | str, max_bytes: int = 256 << 20):
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.stats = DiskCacheStats()
        self._total: int | None = None  # bytes in the directory, once scanned
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _path(self, build_id: str) -> Path | None:
        return self.dir / f"{build_id}{self.suffix}" if _BUILD_ID.match(build_id) else None

    def _hit(self, path: Path) -> None:
        self.stats.hits += 1
        with contextlib.suppress(OSError):
            os.utime(path)  # least recently used goes first

    def _corrupt(self, path: Path, exc: Exception) -> None:
        log.warning("%s: %s is corrupt (%s); deleting it", self.what, path, exc)
        self.stats.errors += 1
        path.unlink(missing_ok=True)

    def _unreadable(self, path: Path, exc: OSError) -> None:
        log.debug("%s %s: %s", self.what, path, exc)
        self.stats.errors += 1

    def _write(self, path: Path, blob: bytes) -> None:
        """Atomically (temporary file, then rename), mode 0600, then bound
        the directory."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            replaced = path.stat().st_size if path.exists() else 0
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("%s: cannot write %s: %s", self.what, path, exc)
            self.stats.errors += 1
            tmp.unlink(missing_ok=True)
            return
        self.stats.stored += 1
        # the directory is scanned once, then its size is kept up to date
        # here; deletions elsewhere only make it an overestimate, which
        # costs a rescan in _bound
        if self._total is None:
            self._bound()
        else:
            self._total += len(blob) - replaced
            if self._total > self.max_bytes:
                self._bound()

    def _bound(self) -> None:
        """Delete least recently used files down to max_bytes; learn the
        directory's size."""
        files = []
        for p in self.dir.glob(f"*{self.suffix}"):
            try:
                st = p.stat()
            except OSError:
                continue
            files.append((st.st_mtime_ns, st.st_size, p))
        total = sum(size for _, size, _ in files)
        for _, size, p in sorted(files):
            if total <= self.max_bytes:
                break
            p.unlink(missing_ok=True)
            total -= size
            self.stats.evicted += 1
        self._total = total


class DiskSymbolCache(BuildIdFiles):
    suffix = ".sym"
    what = "symbol cache"

    def load(self, build_id: str) -> CachedSymbols | None:
        path = self._path(build_id)
        if path is None:
            return None
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            self.stats.misses += 1
            return None
        except OSError as exc:
            self._unreadable(path, exc)
            return None
        try:
            cached = _decode(blob)
        except (ValueError, struct.error, UnicodeDecodeError) as exc:
            self._corrupt(path, exc)
            return None
        self._hit(path)
        if cached.dwarf_path and not os.path.exists(cached.dwarf_path):
            cached = CachedSymbols(cached.index, cached.source, None)
        return cached

    def store(self, build_id: str, cached: CachedSymbols) -> None:
        path = self._path(build_id)
        if path is not None:
            self._write(path, _encode(cached))


def _encode(cached: CachedSymbols) -> bytes:
    starts, ends, names, strtab = cached.index.arrays()
    source = cached.source.encode()
    dwarf = (cached.dwarf_path or "").encode()
    body = b"".join([_HEADER.pack(_MAGIC, _VERSION, len(cached.index), len(strtab),
                                  len(source), len(dwarf)),
                     source, dwarf, starts, ends, names, strtab])
    return body + struct.pack("<I", zlib.crc32(body))


def _decode(blob: bytes) -> CachedSymbols:
    if len(blob) < _HEADER.size + 4:
        raise ValueError("truncated")
    body, crc = blob[:-4], struct.unpack("<I", blob[-4:])[0]
    if zlib.crc32(body) != crc:
        raise ValueError("checksum mismatch")
    magic, version, n, strtab_len, source_len, dwarf_len = _HEADER.unpack_from(body)
    if magic != _MAGIC or version != _VERSION:
        raise ValueError(f"not a version {_VERSION} ember symbol file")
    at = _HEADER.size
    sizes = (source_len, dwarf_len, 8 * n, 8 * n, 4 * n, strtab_len)
    if at + sum(sizes) != len(body):
        raise ValueError("sizes do not add up")
    parts = []
    for size in sizes:
        parts.append(body[at:at + size])
        at += size
    source, dwarf, starts, ends, names, strtab = parts
    index = SymbolIndex.from_arrays(starts, ends, names, strtab)
    return CachedSymbols(index, source.decode(), dwarf.decode() or None)
