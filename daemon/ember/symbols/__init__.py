"""Addresses -> frames: process maps, ELF and DWARF, kallsyms, perf maps,
demangling, and the caches behind them."""
