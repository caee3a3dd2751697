"""Small real filesystems for tests of full disks (tmpfs; mounting needs root)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tiny_filesystem(where: Path, size: str = "64k") -> Iterator[Path]:
    """A real filesystem of a few pages (tmpfs; mounting needs root)."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                   check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path) -> Path:
    """Fill a filesystem to the last byte; returns the filler file."""
    filler = where / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
            f.flush()
    return filler
