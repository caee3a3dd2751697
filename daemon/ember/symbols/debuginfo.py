"""Separate debug information: finding the file that holds the symbols a
stripped object lacks, the way gdb does.

1. by build id: DEBUG_DIR/.build-id/xx/yyyyyy.debug (Debian's -dbg packages,
   e.g. libc6-dbg, install there);
2. by .gnu_debuglink: NAME next to the object, in its .debug/ directory, and
   in DEBUG_DIR followed by the object's directory; the link's CRC32 must
   match the file, so a debug file of another build is never used.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from pathlib import Path

from . import DEFAULT_DEBUG_DIRS
from .elf import ElfSymbols

log = logging.getLogger(__name__)



def crc32_of(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def debug_file_for(obj: ElfSymbols, object_path: str,
                   debug_dirs: Sequence[str] = DEFAULT_DEBUG_DIRS) -> Path | None:
    """The debug file for obj (whose file is at object_path), or None."""
    if obj.build_id and len(obj.build_id) > 2:
        for d in debug_dirs:
            p = Path(d) / ".build-id" / obj.build_id[:2] / f"{obj.build_id[2:]}.debug"
            if p.is_file():
                return p
    if obj.debuglink:
        where = Path(object_path).parent
        candidates = [where / obj.debuglink, where / ".debug" / obj.debuglink]
        candidates += [Path(d) / str(where).lstrip("/") / obj.debuglink for d in debug_dirs]
        for p in candidates:
            try:
                if not p.is_file() or p.resolve() == Path(object_path).resolve():
                    continue
                if obj.debuglink_crc is not None and crc32_of(p) != obj.debuglink_crc:
                    log.debug("%s: CRC does not match the debuglink of %s", p, object_path)
                    continue
            except OSError:
                continue
            return p
    return None
