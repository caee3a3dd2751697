"""Addresses -> frames: process maps, ELF and DWARF, kallsyms, perf maps,
demangling, and the caches behind them."""

#: Where separate debug files are looked up by default (Debian's -dbg packages).
DEFAULT_DEBUG_DIRS: tuple[str, ...] = ("/usr/lib/debug",)
