"""Kernel symbols from /proc/kallsyms (text symbols only).

A kernel has 100k+ text symbols; as Python ints and strs they took 27 MB of
the agent's memory. They are kept packed instead: addresses in an
array('Q'), names in one bytes blob with an array('I') of offsets, about
4 MB; a name becomes a str only when a frame needs it.
"""

from __future__ import annotations

import array
import bisect
from pathlib import Path

from ..errors import SymbolizationError

_TEXT_TYPES = frozenset("tTwW")


class KernelSymbols:
    def __init__(self, path: Path = Path("/proc/kallsyms")):
        self.path = path
        entries: list[tuple[int, str]] = []
        try:
            text = path.read_text()
        except OSError as exc:
            raise SymbolizationError(f"cannot read {path}: {exc.strerror}") from exc
        for line in text.splitlines():
            parts = line.split(None, 3)
            if len(parts) < 3 or parts[1] not in _TEXT_TYPES:
                continue
            try:
                addr = int(parts[0], 16)
            except ValueError:
                continue
            name = parts[2]
            if len(parts) == 4:
                name = f"{name} {parts[3].strip()}"  # "ext4_read [ext4]"
            entries.append((addr, name))
        if entries and all(a == 0 for a, _ in entries):
            raise SymbolizationError(
                f"{path} shows no addresses (kernel.kptr_restrict, or not root): "
                "kernel frames will be unnamed")
        entries.sort()
        self._addrs = array.array("Q", (a for a, _ in entries))
        blob = bytearray()
        self._offsets = array.array("I")
        for _, name in entries:
            self._offsets.append(len(blob))
            blob += name.encode()
        self._offsets.append(len(blob))
        self._blob = bytes(blob)

    def __len__(self) -> int:
        return len(self._addrs)

    def memory_size(self) -> int:
        return (self._addrs.itemsize * len(self._addrs)
                + self._offsets.itemsize * len(self._offsets) + len(self._blob))

    def lookup(self, address: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self._addrs, address) - 1
        if i < 0:
            return None
        name = self._blob[self._offsets[i]:self._offsets[i + 1]].decode()
        return name, address - self._addrs[i]
