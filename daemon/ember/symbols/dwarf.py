"""Source lines and inlined functions from DWARF (.debug_line, .debug_info).

One ``DwarfLines`` per object file that carries DWARF: the object itself, or
its separate debug file. Opening it reads the section headers and the
address -> compile-unit index (``.debug_aranges``, else the compile units'
own ranges); a compile unit is parsed on the first address that falls in it:

- its line program becomes sorted arrays (address -> file, line);
- its DIE tree becomes one tree per concrete function: the function's
  ranges and, nested, every ``DW_TAG_inlined_subroutine`` with the inlined
  function's name and the file and line of the call it replaced.

``lookup(vaddr)`` returns the chain innermost first, as pprof's
``Location.line`` wants it: the innermost function at the line of the
address, then each caller it was inlined into at the line of that call.
The outermost entry is the concrete function (the one the ELF symbol
names).

pyelftools decodes everything; it raises a mixture of exception types on
malformed input, which become ``DwarfError`` for the object (the object keeps
its symbols, it just has no lines).
"""

from __future__ import annotations

import bisect
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cache import BoundedCache
from ..errors import DwarfError

log = logging.getLogger(__name__)

_MAX_DEPTH = 64          # inlining and lexical-block nesting we follow
_MAX_ORIGIN_HOPS = 4     # abstract_origin / specification links followed for a name


@dataclass(frozen=True, slots=True)
class SourceLine:
    function: str        # raw name: the linkage (mangled) name when DWARF has one
    file: str
    line: int


@dataclass(slots=True)
class _Scope:
    """A concrete function or an inlined call inside one."""

    ranges: list[tuple[int, int]]
    name: str
    call_file: str = ""
    call_line: int = 0
    children: list[_Scope] = field(default_factory=list)

    def covers(self, vaddr: int) -> bool:
        return any(lo <= vaddr < hi for lo, hi in self.ranges)


@dataclass(slots=True)
class _Unit:
    """One parsed compile unit."""

    row_addrs: list[int]
    row_lines: list[tuple[str, int]]        # (file, line); line 0 = no line
    fn_starts: list[int]
    fn_spans: list[tuple[int, int, _Scope]]  # (lo, hi, function), sorted by lo
    size: int                               # approximate bytes

    def line_at(self, vaddr: int) -> tuple[str, int]:
        i = bisect.bisect_right(self.row_addrs, vaddr) - 1
        return self.row_lines[i] if i >= 0 else ("", 0)

    def scopes_at(self, vaddr: int) -> list[_Scope]:
        """The function containing vaddr and the inlined calls down to the
        innermost one, outermost first."""
        i = bisect.bisect_right(self.fn_starts, vaddr) - 1
        # functions do not overlap, but a range list can be split around
        # another function's range: look back a few entries
        for j in range(i, max(i - 8, -1), -1):
            lo, hi, fn = self.fn_spans[j]
            if lo <= vaddr < hi:
                chain = [fn]
                while len(chain) < _MAX_DEPTH:
                    inner = next((c for c in chain[-1].children if c.covers(vaddr)), None)
                    if inner is None:
                        break
                    chain.append(inner)
                return chain
        return []


class DwarfLines:
    """Address -> source lines of one object's DWARF, parsed per compile unit."""

    def __init__(self, path: Path | str, max_units: int = 256):
        self.path = str(path)
        try:
            from elftools.elf.elffile import ELFFile

            with open(path, "rb") as f:
                elf = ELFFile(f)
                info = (elf.get_section_by_name(".debug_info")
                        or elf.get_section_by_name(".zdebug_info"))
                if info is None or info["sh_type"] == "SHT_NOBITS":
                    raise DwarfError(f"{path}: no DWARF")
                # the debug sections are read (and decompressed) into memory
                self._dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False)
                # held decompressed: their decompressed size, not sh_size
                self._section_bytes = sum(
                    s.data_size for s in elf.iter_sections() if s.name.startswith(".debug_"))
            # parsed units: part of this object's weight in ObjectCache.dwarf
            self._units: BoundedCache[int, _Unit | None] = BoundedCache(
                "dwarf_units", max_units, register=False)
            self._index_starts: list[int] = []
            self._index: list[tuple[int, int, int]] = []  # (lo, hi, cu offset)
            self._build_index()
        except DwarfError:
            raise
        except OSError as exc:
            raise DwarfError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        except Exception as exc:  # pyelftools: ELFError, DWARFError, struct/construct errors
            raise DwarfError(f"{path}: malformed DWARF: {exc!r}") from exc

    def _build_index(self) -> None:
        spans: list[tuple[int, int, int]] = []
        aranges = self._dwarf.get_aranges()
        covered: set[int] = set()
        if aranges is not None:
            for e in aranges.entries:
                if e.length:
                    spans.append((e.begin_addr, e.begin_addr + e.length, e.info_offset))
                    covered.add(e.info_offset)
        # units missing from .debug_aranges (some toolchains leave them out)
        for cu in self._dwarf.iter_CUs():
            if cu.cu_offset in covered:
                continue
            top = cu.get_top_DIE()
            for lo, hi in self._ranges(top, cu):
                spans.append((lo, hi, cu.cu_offset))
        spans.sort()
        self._index = spans
        self._index_starts = [s[0] for s in spans]

    def _cu_offset(self, vaddr: int) -> int | None:
        i = bisect.bisect_right(self._index_starts, vaddr) - 1
        for j in range(i, max(i - 4, -1), -1):
            lo, hi, off = self._index[j]
            if lo <= vaddr < hi:
                return off
        return None

    def lookup(self, vaddr: int) -> list[SourceLine]:
        """Innermost first; [] when the address has no line information."""
        off = self._cu_offset(vaddr)
        if off is None:
            return []
        unit = self._unit(off)
        if unit is None:
            return []
        file, line = unit.line_at(vaddr)
        scopes = unit.scopes_at(vaddr)
        if not scopes:
            return [SourceLine("", file, line)] if line else []
        out = []
        for scope in reversed(scopes):  # innermost first
            out.append(SourceLine(scope.name, file, line))
            file, line = scope.call_file, scope.call_line
        return out

    def memory_size(self) -> int:
        return self._section_bytes + 48 * len(self._index) + sum(
            u.size for u in self._units.values() if u is not None)

    # --- parsing one compile unit ---------------------------------------------------

    def _unit(self, offset: int) -> _Unit | None:
        if offset in self._units:
            return self._units.get(offset)
        try:
            unit: _Unit | None = self._parse_unit(offset)
        except Exception as exc:  # a malformed unit: its addresses get no lines
            log.debug("%s: compile unit at %#x: %r", self.path, offset, exc)
            unit = None
        return self._units.put(offset, unit)

    def _parse_unit(self, offset: int) -> _Unit:
        cu = self._dwarf.get_CU_at(offset)
        top = cu.get_top_DIE()
        prog = self._dwarf.line_program_for_CU(cu)
        files = self._file_names(prog, top) if prog is not None else {}
        rows: list[tuple[int, bool, str, int]] = []
        if prog is not None:
            for entry in prog.get_entries():
                st = entry.state
                if st is None:
                    continue
                if st.end_sequence:
                    rows.append((st.address, False, "", 0))
                else:
                    rows.append((st.address, True, files.get(st.file, ""), st.line))
        # an end of sequence sorts before a row starting at the same address;
        # among rows at one address the last one emitted wins (stable sort)
        rows.sort(key=lambda r: (r[0], r[1]))
        row_addrs = [r[0] for r in rows]
        row_lines = [(r[2], r[3]) for r in rows]

        spans: list[tuple[int, int, _Scope]] = []

        # a DIE is at least a byte: more visits than the unit has bytes means
        # its sibling links go round in a circle (a corrupt file), so stop
        budget = [int(getattr(cu, "size", 0) or 1 << 24)]

        def walk(die: Any, parent: _Scope | None, depth: int) -> None:
            for child in die.iter_children():
                budget[0] -= 1
                if budget[0] < 0:
                    return
                tag = child.tag
                if tag == "DW_TAG_subprogram" and parent is None:
                    ranges = self._ranges(child, cu)
                    if not ranges:
                        continue  # a declaration or an abstract instance
                    fn = _Scope(ranges, self._name(child))
                    spans.extend((lo, hi, fn) for lo, hi in ranges)
                    if depth < _MAX_DEPTH:
                        walk(child, fn, depth + 1)
                elif tag == "DW_TAG_inlined_subroutine" and parent is not None:
                    ranges = self._ranges(child, cu)
                    attrs = child.attributes
                    call_file = attrs.get("DW_AT_call_file")
                    call_line = attrs.get("DW_AT_call_line")
                    scope = _Scope(ranges, self._name(child),
                                   files.get(call_file.value, "") if call_file else "",
                                   call_line.value if call_line else 0)
                    if ranges:
                        parent.children.append(scope)
                    if depth < _MAX_DEPTH:
                        walk(child, scope if ranges else parent, depth + 1)
                elif tag in ("DW_TAG_lexical_block", "DW_TAG_namespace", "DW_TAG_class_type",
                             "DW_TAG_structure_type") and depth < _MAX_DEPTH:
                    # C++ member functions can be defined inside their class
                    walk(child, parent, depth + 1)

        walk(top, None, 0)
        self._release(cu)
        spans.sort(key=lambda s: s[0])
        names = sum(len(s[2].name) for s in spans)
        return _Unit(row_addrs, row_lines, [s[0] for s in spans], spans,
                     size=120 * len(rows) + 200 * len(spans) + names)

    def _release(self, cu: Any) -> None:
        """Let go of what pyelftools keeps of a parsed unit: every DIE (in
        the CompileUnit, which DWARFInfo caches for good) and the decoded
        line program. The _Unit summary is what lookups need; without this
        an agent with lines on grew by hundreds of MB per drain, outside
        every bound (a unit parsed again later is decoded afresh)."""
        for attr in ("_dielist", "_diemap"):
            held = getattr(cu, attr, None)
            if isinstance(held, list):
                held.clear()
        programs = getattr(self._dwarf, "_linetable_cache", None)
        if isinstance(programs, dict):
            programs.clear()

    def _file_names(self, prog: Any, top: Any) -> dict[int, str]:
        """File index of the line program -> path (relative to the unit's
        compilation directory when DWARF says nothing more)."""
        comp_dir = _text(top.attributes["DW_AT_comp_dir"].value) \
            if "DW_AT_comp_dir" in top.attributes else ""
        dirs = [_text(d) for d in prog["include_directory"]]
        v5 = prog.header.version >= 5
        out = {}
        for i, entry in enumerate(prog["file_entry"]):
            name = _text(entry.name)
            d = entry.dir_index
            if v5:
                directory = dirs[d] if d < len(dirs) else ""
            else:  # DWARF 4: directory 0 is the compilation directory
                directory = comp_dir if d == 0 else (dirs[d - 1] if d - 1 < len(dirs) else "")
            if directory and not os.path.isabs(name):
                if not os.path.isabs(directory) and comp_dir:
                    directory = os.path.join(comp_dir, directory)
                name = os.path.join(directory, name)
            out[i if v5 else i + 1] = os.path.normpath(name) if name else ""
        return out

    def _ranges(self, die: Any, cu: Any) -> list[tuple[int, int]]:
        attrs = die.attributes
        if "DW_AT_low_pc" in attrs and "DW_AT_high_pc" in attrs:
            lo = attrs["DW_AT_low_pc"].value
            high = attrs["DW_AT_high_pc"]
            # DWARF 4+: a constant-class high_pc is a length
            hi = high.value if high.form == "DW_FORM_addr" else lo + high.value
            return [(lo, hi)] if hi > lo else []
        if "DW_AT_ranges" not in attrs:
            return []
        from elftools.dwarf.ranges import BaseAddressEntry  # only with lines (15 ms)

        lists = self._dwarf.range_lists()
        if lists is None:
            return []
        top = cu.get_top_DIE()
        base = top.attributes["DW_AT_low_pc"].value if "DW_AT_low_pc" in top.attributes else 0
        out = []
        for entry in lists.get_range_list_at_offset(attrs["DW_AT_ranges"].value, cu=cu):
            if isinstance(entry, BaseAddressEntry):
                base = entry.base_address
                continue
            lo, hi = entry.begin_offset, entry.end_offset
            if not entry.is_absolute:
                lo, hi = lo + base, hi + base
            if hi > lo:
                out.append((lo, hi))
        return out

    def _name(self, die: Any) -> str:
        for _ in range(_MAX_ORIGIN_HOPS):
            attrs = die.attributes
            for key in ("DW_AT_linkage_name", "DW_AT_MIPS_linkage_name", "DW_AT_name"):
                if key in attrs:
                    return _text(attrs[key].value)
            for key in ("DW_AT_abstract_origin", "DW_AT_specification"):
                if key in attrs:
                    die = die.get_DIE_from_attribute(key)
                    break
            else:
                return ""
        return ""


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
