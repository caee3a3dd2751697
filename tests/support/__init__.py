"""Helpers shared by the tests: paths, fakes, fixtures' writers, running
agents and collectors. Tests import from here, never from each other."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
BIN = FIXTURES / "bin"
SRC = FIXTURES / "src"
GOLDEN = TESTS / "golden"

LIBC = Path("/usr/lib/x86_64-linux-gnu/libc.so.6")


def libc_debug_file() -> Path | None:
    """libc6-dbg's debug file for this libc, found the way gdb does (build
    id under /usr/lib/debug/.build-id) with binutils' readelf, not with
    ember: tests skip on what the machine lacks, never on ember's result."""
    import re
    import subprocess

    if not LIBC.exists():
        return None
    notes = subprocess.run(["readelf", "-n", str(LIBC)], capture_output=True, text=True,
                           check=True).stdout
    m = re.search(r"Build ID: ([0-9a-f]+)", notes)
    if m is None:
        return None
    path = Path(f"/usr/lib/debug/.build-id/{m.group(1)[:2]}/{m.group(1)[2:]}.debug")
    return path if path.exists() else None
