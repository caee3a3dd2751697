"""Addresses of one live process as lines a person reads (``ember
symbolize``): ``ADDR FUNCTION+OFFSET OBJECT``, optionally followed by the
source lines of the address, innermost inlined function first.

It answers with the same machinery a profile is symbolized with (process
maps, ELF and DWARF through ``Symbolizer``, kallsyms), through its public
methods only, so what it prints is what a profile would show. Many
addresses (a whole profile's, piped in) are named in batches, grouped by
mapping with one vectorized search per object: the same lines as one at a
time, several times faster than naming them one by one."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from pathlib import Path

from ..errors import UsageError
from ..model import KERNEL_MAPPING
from . import DEFAULT_DEBUG_DIRS
from .demangle import demangle
from .kallsyms import KernelSymbols
from .objects import ObjectCache
from .procmaps import MapEntry, Process, ProcessTable, ProcFS
from .symbolizer import Named, NamedAddresses, Symbolizer

KALLSYMS = Path("/proc/kallsyms")
#: User addresses named together (Symbolizer.name_many): a batch's arrays
#: take ~0.1 KB an address, besides the lines
BATCH = 1 << 16


def describe(pid: int, addresses: Iterable[int],
             debug_dirs: Sequence[str] = DEFAULT_DEBUG_DIRS, lines: bool = False, *,
             procfs: ProcFS | None = None, kallsyms: Path = KALLSYMS,
             batch: int = BATCH) -> list[str]:
    """One line per address (kernel addresses named from kallsyms, read only
    when one is asked for); with lines, an indented ``FUNCTION FILE:LINE``
    line after each named user address for it and each function inlined
    there, innermost first.

    User addresses are named up to ``batch`` at a time by
    Symbolizer.name_many (grouped by mapping, one vectorized search per
    object); batch=1 names each on its own through Symbolizer.lookup, the
    reference the batches are tested against. The lines are the same.

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
    more, batch = iter(addresses), max(batch, 1)
    while True:
        chunk: list[int] = []
        try:
            chunk.extend(islice(more, batch))  # keeps what was read if reading fails
        finally:
            # kallsyms is read for the first kernel address, and its errors
            # come before those of the addresses after it
            if kernel is None and chunk and max(chunk) >= KERNEL_MAPPING.start:
                kernel = KernelSymbols(kallsyms)
        out += _chunk_lines(sym, proc, chunk, kernel, lines, batch > 1)
        if len(chunk) < batch:
            return out


def _chunk_lines(sym: Symbolizer, proc: Process, chunk: list[int],
                 kernel: KernelSymbols | None, lines: bool, batched: bool) -> list[str]:
    """The lines of the addresses of chunk, in order."""
    if not batched:
        return [line for addr in chunk for line in _lines(sym, proc, kernel, addr, lines)]
    user = [a for a in chunk if 0 <= a < KERNEL_MAPPING.start]
    named = sym.name_many(proc.pid, user)
    firsts = [None] * len(user) if lines else _named_lines(named, user)
    if len(user) == len(chunk) and None not in firsts:
        return firsts  # type: ignore[return-value]  # every one a str
    out: list[str] = []
    at = iter(enumerate(firsts))
    for addr in chunk:
        if not 0 <= addr < KERNEL_MAPPING.start:
            out += _lines(sym, proc, kernel, addr, lines)
            continue
        k, line = next(at)
        if line is not None:
            out.append(line)
        else:
            entry, hit = named[k]
            out += _user_lines(sym, proc.pid, entry, addr, lines, hit)
    return out


def _named_lines(named: NamedAddresses, addresses: list[int]) -> list[str | None]:
    """The line of each address name_many found a function for (None for
    the others), formatted from the batch's arrays."""
    names, paths = named.names, [m.path for m in named.maps]
    return [f"{hex(a)} {names[s]}+{hex(o)} {paths[w]}" if s >= 0 else None
            for a, w, s, o in zip(addresses, named.where.tolist(), named.symbol.tolist(),
                                  named.offset.tolist(), strict=True)]


def _lines(sym: Symbolizer, proc: Process, kernel: KernelSymbols | None, addr: int,
           lines: bool) -> list[str]:
    """The lines of one address, named on its own."""
    if addr >= KERNEL_MAPPING.start:
        assert kernel is not None  # read as the address was
        return [_kernel_line(kernel, addr)]
    entry = proc.find(addr)
    hit = sym.lookup(proc.pid, entry, addr) if entry is not None and entry.file_backed else None
    return _user_lines(sym, proc.pid, entry, addr, lines, hit)


def _kernel_line(kernel: KernelSymbols, addr: int) -> str:
    hit = kernel.lookup(addr)
    name = f"{hit[0]}+{hit[1]:#x}" if hit else "[unknown]"
    return f"{addr:#x} {name} {KERNEL_MAPPING.path}"


def _user_lines(sym: Symbolizer, pid: int, entry: MapEntry | None, addr: int,
                lines: bool, named: Named | None) -> list[str]:
    """The address's line, then (with lines) its source lines; named is
    what Symbolizer.lookup gave for it."""
    if entry is None:
        return [f"{addr:#x} [unknown] [unmapped]"]
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
