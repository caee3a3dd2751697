"""JIT code named through perf maps: /tmp/perf-PID.map, as written by
``node --perf-basic-prof``, Java's perf-map-agent and CPython 3.12+'s
``-X perf``. One line per function: ``START SIZE NAME`` (hex, hex, text).

The file is read through /proc/PID/root (so a container's /tmp is the one
read) and named with the PID as the process sees it in its own PID
namespace (the last NSpid). It grows while the JIT compiles: it is re-read
when its size changes. Malformed lines are skipped, never fatal.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path


def parse_perf_map(text: str) -> tuple[list[int], list[int], list[str]]:
    """(starts, ends, names) sorted by start; bad lines skipped."""
    entries = []
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) != 3:
            continue
        try:
            start, size = int(parts[0], 16), int(parts[1], 16)
        except ValueError:
            continue
        if size <= 0 or start < 0 or start + size > 1 << 64:
            continue
        entries.append((start, start + size, parts[2].strip()))
    entries.sort()
    return [e[0] for e in entries], [e[1] for e in entries], [e[2] for e in entries]


def ns_pid(pid: int, proc: Path = Path("/proc")) -> int:
    """The PID as the process sees it (innermost PID namespace)."""
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return pid


class PerfMap:
    def __init__(self, pid: int, proc: Path = Path("/proc")):
        self.path = proc / str(pid) / "root" / "tmp" / f"perf-{ns_pid(pid, proc)}.map"
        self._size = -1
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._names: list[str] = []

    def _refresh(self) -> None:
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return  # gone with its process: keep what was read
        if size == self._size:
            return
        try:
            text = self.path.read_text(errors="replace")
        except OSError:
            return
        self._size = size
        self._starts, self._ends, self._names = parse_perf_map(text)

    def memory_size(self) -> int:
        return 100 * len(self._starts) + sum(len(n) for n in self._names)

    def lookup(self, address: int) -> str | None:
        self._refresh()
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address < self._ends[i]:
            return self._names[i]
        return None
