"""Addresses of one live process as lines a person reads (``ember
symbolize``): ``ADDR FUNCTION+OFFSET OBJECT``, optionally followed by the
source lines of the address, innermost inlined function first.

It answers with the same machinery a profile is symbolized with (process
maps, ELF and DWARF through ``Symbolizer``, kallsyms), through its public
methods only, so what it prints is what a profile would show."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import UsageError
from ..model import KERNEL_MAPPING
from . import DEFAULT_DEBUG_DIRS
from .demangle import demangle
from .kallsyms import KernelSymbols
from .objects import ObjectCache
from .procmaps import MapEntry, ProcessTable, ProcFS
from .symbolizer import Symbolizer

KALLSYMS = Path("/proc/kallsyms")


def describe(pid: int, addresses: Iterable[int],
             debug_dirs: Sequence[str] = DEFAULT_DEBUG_DIRS, lines: bool = False, *,
             procfs: ProcFS | None = None, kallsyms: Path = KALLSYMS) -> list[str]:
    """One line per address (kernel addresses named from kallsyms, read only
    when one is asked for); with lines, an indented ``FUNCTION FILE:LINE``
    line after each named user address for it and each function inlined
    there, innermost first.

    Raises UsageError when the process (or its maps) cannot be read, and
    SymbolizationError when a kernel address is asked for and kallsyms
    cannot be read or shows no addresses."""
    table = ProcessTable(procfs)
    proc = table.get(pid)
    if proc is None:
        raise UsageError(f"no process with PID {pid} (or its maps are not readable)")
    sym = Symbolizer(table, objects=ObjectCache(debug_dirs=debug_dirs))
    kernel: KernelSymbols | None = None
    out: list[str] = []
    for addr in addresses:
        if addr >= KERNEL_MAPPING.start:
            if kernel is None:
                kernel = KernelSymbols(kallsyms)
            out.append(_kernel_line(kernel, addr))
        else:
            out += _user_lines(sym, pid, proc.find(addr), addr, lines)
    return out


def _kernel_line(kernel: KernelSymbols, addr: int) -> str:
    hit = kernel.lookup(addr)
    name = f"{hit[0]}+{hit[1]:#x}" if hit else "[unknown]"
    return f"{addr:#x} {name} {KERNEL_MAPPING.path}"


def _user_lines(sym: Symbolizer, pid: int, entry: MapEntry | None, addr: int,
                lines: bool) -> list[str]:
    """The address's line, then (with lines) its source lines."""
    if entry is None:
        return [f"{addr:#x} [unknown] [unmapped]"]
    named = sym.lookup(pid, entry, addr) if entry.file_backed else None
    if named is None:  # anonymous memory (JIT perf maps, vdso) or no symbol
        frame = sym.user_frames(pid, [addr])[0]
        return [f"{addr:#x} {frame.name} {entry.path or '[anon]'}"]
    out = [f"{addr:#x} {named[0]}+{named[2]:#x} {entry.path}"]
    if lines:
        out += _source_lines(sym, pid, entry, addr, fallback=named[0])
    return out


def _source_lines(sym: Symbolizer, pid: int, entry: MapEntry, addr: int,
                  fallback: str) -> list[str]:
    """``  FUNCTION FILE:LINE`` innermost first, every one but the last
    marked ``(inlined)``; a line DWARF gives no function for is named after
    the symbol (fallback)."""
    chain = sym.source_lines(pid, entry, addr)
    out = []
    for i, sl in enumerate(chain):
        name = demangle(sl.function) if sl.function else fallback
        inlined = " (inlined)" if i < len(chain) - 1 else ""
        out.append(f"  {name} {sl.file or '??'}:{sl.line}{inlined}")
    return out
