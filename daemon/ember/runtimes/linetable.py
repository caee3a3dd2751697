"""Decode CPython line tables without the interpreter that owns them.

ember reads a Python frame's code object as raw bytes out of another process's
memory, so the code object's own ``co_lines()`` / ``PyCode_Addr2Line`` are not
available: the table has to be decoded here, in the format of the *target's*
Python version (not the one running ember).

Two formats exist:

* 3.10, the PEP 626 ``co_linetable`` (``Objects/lnotab_notes.txt``): pairs of
  (unsigned byte-offset delta, signed line delta); a line delta of -128 means
  "no line" and leaves the running line alone; zero-length pairs only carry a
  line delta.
* 3.11 to 3.13, the PEP 657 location table (``Objects/locations.md``): entries
  whose first byte has bit 7 set, code in bits 3-6 and a length of 1 to 8 code
  units (2 bytes each) in bits 0-2, followed by bytes with bit 7 clear. Codes
  0-9 (short form) and 10-12 (one-line form, line delta ``code - 10``) carry
  columns only; 13 (no columns) and 14 (long form) start with an svarint line
  delta; 15 means "no location".

``co_lines()`` itself changed in 3.12: up to 3.11 it yields one range per
non-empty table entry (so a line spread over several entries comes out as
several adjacent ranges with the same line) and every negative line reads as None;
from 3.12 on it merges adjacent entries whose line is the same, and only -1
reads as None (so a computed line of -1 also merges with "no location"
entries). The decoders follow ``Objects/codeobject.c`` of each version step for
step, quirks included. Tables the C code could only walk by reading past an
entry or past the table (an odd length, a trailing run of zero-length pairs, a
varint cut short, a first byte that does not start an entry) raise ValueError,
as do numbers that overflow a C int; nothing else is raised, and every loop
consumes input, so garbage read from a wrong address ends quickly.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from operator import itemgetter
from typing import Final

LineRange = tuple[int, int, int | None]
"""(start byte offset, end byte offset, line or None), as ``co_lines()`` yields."""

SUPPORTED_VERSIONS: Final = ((3, 10), (3, 11), (3, 12), (3, 13))

_INT_MIN: Final = -(2**31)
_INT_MAX: Final = 2**31 - 1
_CODE_UNIT: Final = 2  # sizeof(_Py_CODEUNIT)

# PEP 657 location entry kinds (_PyCodeLocationInfoKind in pycore_code.h)
_ONE_LINE0: Final = 10
_ONE_LINE2: Final = 12
_NO_COLUMNS: Final = 13
_LONG: Final = 14
_NONE: Final = 15

_START = itemgetter(0)


def line_ranges(version: tuple[int, int], linetable: bytes,
                firstlineno: int) -> list[LineRange]:
    """What ``code.co_lines()`` yields in Python ``version`` for a code object
    whose ``co_linetable`` is ``linetable`` and ``co_firstlineno`` is
    ``firstlineno``. Raises ValueError for an unsupported version or a table
    CPython could not walk (see the module docstring)."""
    if not _INT_MIN <= firstlineno <= _INT_MAX:
        raise ValueError(f"co_firstlineno {firstlineno} does not fit a C int")
    if version == (3, 10):
        return _pep626_ranges(linetable, firstlineno)
    if version == (3, 11):
        return [(start, end, line if line >= 0 else None)
                for start, end, line in _pep657_entries(linetable, firstlineno)]
    if version in SUPPORTED_VERSIONS:
        return _merge_312(_pep657_entries(linetable, firstlineno))
    raise ValueError(f"unsupported Python version {version!r}: line tables are decoded "
                     f"for {', '.join(f'{a}.{b}' for a, b in SUPPORTED_VERSIONS)}")


def find_line(ranges: Sequence[LineRange], offset: int) -> int | None:
    """The line of the range in ``ranges`` (from :func:`line_ranges`) that
    holds byte ``offset``, or None when the range has no line or no range
    holds ``offset`` (a negative one included: :func:`line_at` answers
    ``firstlineno`` there, as CPython does). Bisects, so callers can cache
    ``ranges`` per code object."""
    i = bisect_right(ranges, offset, key=_START) - 1
    if i < 0:
        return None
    start, end, line = ranges[i]
    return line if start <= offset < end else None


def line_at(version: tuple[int, int], linetable: bytes, firstlineno: int,
            offset: int) -> int | None:
    """The line of the instruction at byte ``offset``, as
    ``PyCode_Addr2Line(code, offset)`` gives it: a negative offset (a frame
    that has not run its first instruction) is ``firstlineno``, like CPython
    answers; otherwise the line of the range holding ``offset``, or None when
    no range holds it or the range has no line. (One divergence, for
    hand-made tables only: up to 3.11 a negative line other than -1 is None
    here, as ``co_lines()`` shows it, where ``PyCode_Addr2Line`` returns it.)"""
    ranges = line_ranges(version, linetable, firstlineno)
    if offset < 0:
        return firstlineno
    return find_line(ranges, offset)


def _check_line(line: int, where: int) -> int:
    if not _INT_MIN <= line <= _INT_MAX:
        raise ValueError(f"line number {line} reached at table byte {where} does not fit a C int")
    return line


def _pep626_ranges(table: bytes, firstlineno: int) -> list[LineRange]:
    """3.10: ``PyLineTable_NextAddressRange`` and ``lineiter_next``."""
    n = len(table)
    if n % 2:
        raise ValueError(f"3.10 line table has odd length {n}: its last "
                         f"(offset delta, line delta) pair is cut short")
    ranges: list[LineRange] = []
    computed = firstlineno
    end = 0
    pos = 0
    while pos < n:
        start = end
        while True:  # skip zero-length pairs, which only move the line
            if pos >= n:
                raise ValueError(f"3.10 line table ends with zero-length pairs "
                                 f"(from byte offset {start}): no range follows them")
            delta = table[pos]
            ldelta = table[pos + 1]
            where = pos
            pos += 2
            if ldelta == 0x80:  # -128: no line
                ar_line = -1
            else:
                computed = _check_line(computed + (ldelta - 256 if ldelta > 127 else ldelta),
                                       where)
                ar_line = computed
            if delta:
                break
        end = start + delta
        ranges.append((start, end, ar_line if ar_line >= 0 else None))
    return ranges


def _read_varint(table: bytes, pos: int, stop: int, entry: int) -> int:
    """``read_varint`` at ``pos``: 6-bit groups, least significant first, bit
    6 set on all but the last. The varint must end before ``stop``, the start
    of the next entry (or the table's end)."""
    value = 0
    shift = 0
    while True:
        if pos >= stop:
            what = "the table's end" if stop == len(table) else f"the next entry (byte {stop})"
            raise ValueError(f"location entry at table byte {entry}: its line delta varint "
                             f"runs into {what}")
        byte = table[pos]
        pos += 1
        value |= (byte & 63) << shift
        if not byte & 64:
            break
        shift += 6
        if shift >= 32:
            raise ValueError(f"location entry at table byte {entry}: its line delta varint "
                             f"is longer than an unsigned int holds")
    if value > 0xFFFFFFFF:
        raise ValueError(f"location entry at table byte {entry}: its line delta varint "
                         f"{value} overflows an unsigned int")
    return value


def _pep657_entries(table: bytes, firstlineno: int) -> list[tuple[int, int, int]]:
    """3.11-3.13 ``advance``: one (start, end, ar_line) per entry, ar_line -1
    for "no location"."""
    n = len(table)
    if n and not table[0] & 0x80:
        raise ValueError(f"location table starts with byte 0x{table[0]:02x}, which does not "
                         f"start an entry (bit 7 clear)")
    entries: list[tuple[int, int, int]] = []
    computed = firstlineno
    addr = 0
    pos = 0
    while pos < n:
        first = table[pos]
        nxt = pos + 1
        while nxt < n and not table[nxt] & 0x80:
            nxt += 1
        code = (first >> 3) & 15
        if code == _NONE:
            ar_line = -1
        else:
            if code in (_NO_COLUMNS, _LONG):
                raw = _read_varint(table, pos + 1, nxt, pos)
                computed = _check_line(computed + (-(raw >> 1) if raw & 1 else raw >> 1), pos)
            elif _ONE_LINE0 <= code <= _ONE_LINE2:
                computed = _check_line(computed + code - _ONE_LINE0, pos)
            ar_line = computed
        end = addr + ((first & 7) + 1) * _CODE_UNIT
        entries.append((addr, end, ar_line))
        addr = end
        pos = nxt
    return entries


def _merge_312(entries: list[tuple[int, int, int]]) -> list[LineRange]:
    """3.12+ ``lineiter_next``: adjacent entries with equal ``ar_line`` (-1
    included, whether "no location" or computed) make one range; -1 is None."""
    merged: list[LineRange] = []
    i = 0
    n = len(entries)
    while i < n:
        start, end, line = entries[i]
        i += 1
        while i < n and entries[i][2] == line:
            end = entries[i][1]
            i += 1
        merged.append((start, end, None if line == -1 else line))
    return merged
