"""What binutils says an object holds: the truth ember's ELF reader is
checked against."""

from __future__ import annotations

import subprocess
from pathlib import Path


def nm_sized(path: Path) -> dict[str, tuple[int, int]]:
    """Function symbols as binutils sees them: name -> (address, size)."""
    out = subprocess.run(["nm", "-S", "--defined-only", str(path)], check=True,
                         capture_output=True, text=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tT":
            syms[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
        elif len(parts) == 3 and parts[1] in "tT":
            syms[parts[2]] = (int(parts[0], 16), 0)
    return syms


def nm(path: Path) -> dict[str, int]:
    return {name: addr for name, (addr, _) in nm_sized(path).items()}
