"""A bounded on-disk queue of WriteRaw requests, oldest first.

Every request is written here before it is sent and deleted only once the
collector accepted it, so a crash, a restart or an unreachable collector
loses nothing. Files are written atomically (temporary file, fsync,
rename). Past the size limit the oldest requests are dropped, and what was
dropped is counted.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".writeraw"


@dataclass(frozen=True)
class Dropped:
    requests: int
    bytes: int
    profiles: int


class Spool:
    def __init__(self, directory: str | Path, max_bytes: int,
                 count_profiles: Callable[[bytes], int] | None = None):
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.count_profiles = count_profiles or (lambda _data: 1)
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._ready = threading.Condition(self._lock)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in self.dir.glob(f".*{SUFFIX}.tmp"):
            stale.unlink(missing_ok=True)  # a write interrupted by a crash

    def _files(self) -> list[Path]:
        return sorted(self.dir.glob(f"*{SUFFIX}"))

    def put(self, data: bytes) -> Dropped:
        """Store one request; drop the oldest while over the limit."""
        with self._lock:
            name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):06d}{SUFFIX}"
            tmp = self.dir / f".{name}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            tmp.rename(self.dir / name)
            dropped = self._enforce_limit()
            self._ready.notify_all()
            return dropped

    def _enforce_limit(self) -> Dropped:
        files = self._files()
        sizes = {f: f.stat().st_size for f in files}
        total = sum(sizes.values())
        n = b = p = 0
        for f in files[:-1]:  # never drop the request just written
            if total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                p += self.count_profiles(f.read_bytes())
            f.unlink(missing_ok=True)
            total -= sizes[f]
            n, b = n + 1, b + sizes[f]
        if n:
            log.warning("spool over %d bytes: dropped the %d oldest requests", self.max_bytes, n)
        return Dropped(n, b, p)

    def oldest(self, timeout: float | None = None) -> tuple[Path, bytes] | None:
        """The oldest request, waiting up to timeout for one to arrive."""
        with self._lock:
            files = self._files()
            if not files and timeout:
                self._ready.wait(timeout)
                files = self._files()
            for f in files:
                try:
                    return f, f.read_bytes()
                except FileNotFoundError:
                    continue
            return None

    def remove(self, path: Path) -> None:
        with self._lock:
            path.unlink(missing_ok=True)

    def wake(self) -> None:
        with self._lock:
            self._ready.notify_all()

    def stats(self) -> tuple[int, int]:
        """(requests, bytes) waiting."""
        files = self._files()
        total = 0
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                total += f.stat().st_size
        return len(files), total
