"""Call-frame information sections (.eh_frame, .debug_frame) of x86-64
objects, decoded straight from their bytes into the compact rows of
``cfa`` (``struct.unpack_from`` over the records, no object per entry).

The two formats differ in their CIE ids (0 in .eh_frame, 0xffffffff in
.debug_frame), CIE pointers (relative to the field, or an offset in the
section) and address encodings (DW_EH_PE_* from the augmentation, or
absolute). CIEs are parsed once, when an FDE first uses one. FDEs are then
sorted by pc and evaluated; consecutive rows that differ only in pc are
merged, a gap between FDEs becomes a ``CFA_NONE`` row, and when FDEs
overlap the one starting first (then the shorter, then the first section's)
keeps its range and the other is clipped to what is left.
"""

from __future__ import annotations

import io
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import UnwindTableError
from .cfa import (
    INITIAL,
    MAX_PC,
    NONE_ROW,
    RA,
    CfiSection,
    Cie,
    Malformed,
    State,
    classify,
    pointer,
    run,
    sleb,
    uleb,
)

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class DecodedRows:
    rows: bytes           # packed ROWs, sorted by pc, unique pcs
    fdes: int             # FDEs whose rows were kept
    overlaps: int         # FDEs starting inside an earlier one: clipped or dropped
    skipped: int          # FDEs left out: empty range, pc 0 (discarded code), CIE not known
    not_understood: int   # FDEs with an instruction not understood: unsupported from there
    covered: int          # bytes of code covered by the kept FDEs


def _record(d: bytes, at: int, eh: bool) -> tuple[int, int, int, bool]:
    """(body start, record end, CIE id/pointer, 64-bit DWARF) of the record
    at d[at]; the body starts after the id field."""
    length = _U32.unpack_from(d, at)[0]
    wide = length == 0xFFFF_FFFF
    if wide:
        length = _U64.unpack_from(d, at + 4)[0]
    body = at + (12 if wide else 4)
    end = body + length
    if end > len(d):
        raise Malformed(f"a record of {length} bytes runs past the end of the section "
                        f"({len(d):#x} bytes)")
    cid = (_U64 if wide else _U32).unpack_from(d, body)[0]
    return body + (8 if wide else 4), end, cid, wide


def _parse_cie(d: bytes, at: int, sec: CfiSection, eh: bool) -> Cie | None:
    """The CIE at d[at]; None when its version or augmentation is not known
    (its FDEs are then skipped)."""
    i, end, cid, wide = _record(d, at, eh)
    if cid != (0 if eh else (_MASK64 if wide else 0xFFFF_FFFF)):
        raise Malformed(f"an FDE points to {at:#x}, which is not a CIE")
    version = d[i]
    aug_end = d.find(b"\0", i + 1, end)
    if aug_end < 0:
        raise Malformed("CIE augmentation string not terminated")
    aug = d[i + 1:aug_end]
    i = aug_end + 1
    if version not in (1, 3, 4):
        return None
    if aug.startswith(b"eh"):  # GCC < 3: the address of an exception table
        i += 8
        aug = aug[2:]
    if version == 4:
        if d[i] != 8 or d[i + 1] != 0:
            return None  # not 64-bit addresses, or segmented
        i += 2
    caf, i = uleb(d, i)
    daf, i = sleb(d, i)
    if version == 1:
        ra_col = d[i]
        i += 1
    else:
        ra_col, i = uleb(d, i)
    enc, signal = 0x00, False
    if aug.startswith(b"z"):
        n, i = uleb(d, i)
        data_end = i + n
        for ch in aug[1:]:
            if ch == ord("R"):
                enc = d[i]
                i += 1
            elif ch == ord("L"):
                i += 1
            elif ch == ord("P"):
                penc = d[i]
                _, i = pointer(d, i + 1, penc & 0x7F, sec)
            elif ch == ord("S"):
                signal = True
            else:
                return None
        i = data_end
    elif aug:
        return None
    if i > end:
        raise Malformed("CIE augmentation data runs past the end of the CIE")
    cie = Cie(caf, daf, ra_col, enc, aug.startswith(b"z"), INITIAL)
    start = (*INITIAL[:8], 1 if signal or ra_col != RA else 0)
    init, stop = run(d, i, end, start, INITIAL, cie, sec, 0, None, None)
    if stop > end:
        raise Malformed("CIE instructions run past the end of the CIE")
    return cie._replace(init=init)


# an FDE to evaluate, as _FIELDS consecutive uint64s in an array (no Python
# object per FDE): the sort key (start, length, section's order, offset) -- by
# length is by end, as the starts are equal -- then the CIE's offset, the
# first instruction and the end of the record
_FIELDS = 7
_ROW_TAIL = struct.Struct("<ihBB")  # a ROW after its pc
_NONE_TAIL = _ROW_TAIL.pack(*NONE_ROW)


def decode(sections: CfiSection | Sequence[CfiSection], where: str) -> DecodedRows:
    """Every FDE of the section(s), evaluated into sorted, merged rows (an
    FDE overlapping one of an earlier section, or starting earlier, is
    clipped). Raises UnwindTableError, naming where and the record's
    offset, when a section is malformed; pcs past 4 GiB raise too."""
    if isinstance(sections, CfiSection):
        sections = [sections]
    fdes = array("Q")
    cies: list[dict[int, Cie | None]] = []
    skipped = 0
    for order, sec in enumerate(sections):
        cies.append({})
        skipped += _fdes(sec, where, order, fdes, cies[-1])
    table = np.frombuffer(fdes, dtype=np.uint64).reshape(-1, _FIELDS)
    by_pc = array("I", np.lexsort((table[:, 3], table[:, 2], table[:, 1], table[:, 0]))
                  .astype(np.uint32).tobytes())
    del table
    return _rows(where, sections, cies, fdes, by_pc, skipped)


def fde_ranges(sec: CfiSection, where: str) -> list[tuple[int, int]]:
    """(start, end) of each FDE of the section, sorted: where the object's
    functions (and their split-off parts, such as GCC's .cold) are, by
    their CFI, in a stripped object too."""
    fdes = array("Q")
    _fdes(sec, where, 0, fdes, {})
    table = np.frombuffer(fdes, dtype=np.uint64).reshape(-1, _FIELDS)
    return sorted((int(s), int(s) + int(n)) for s, n in zip(table[:, 0], table[:, 1],
                                                              strict=True) if n)


def _fdes(sec: CfiSection, where: str, order: int, fdes: array[int],
          cies: dict[int, Cie | None]) -> int:
    """Append the section's FDEs to fdes (_FIELDS each), the CIEs they use to
    cies (by offset); the number skipped (CIE not known)."""
    d, eh = sec.data, sec.name == ".eh_frame"
    skipped = 0
    at = rec = 0
    extend = fdes.extend
    try:
        while at < len(d):
            rec = fde_at = at
            if len(d) - at < 4 or _U32.unpack_from(d, at)[0] == 0:
                at += 4  # a terminator (or padding)
                continue
            i, end, cid, wide = _record(d, at, eh)
            at = end
            if cid == (0 if eh else (_MASK64 if wide else 0xFFFF_FFFF)):
                continue  # a CIE: parsed when an FDE uses it
            cie_at = (i - (8 if wide else 4)) - cid if eh else cid
            if cie_at not in cies:
                if not 0 <= cie_at < len(d):
                    raise Malformed(f"CIE pointer {cid:#x} is outside the section")
                rec = cie_at
                cies[cie_at] = _parse_cie(d, cie_at, sec, eh)
                rec = fde_at
            cie = cies[cie_at]
            if cie is None:
                skipped += 1
                continue
            if cie.enc & 0x80:
                raise Malformed("FDE initial location is indirect")
            start, i = pointer(d, i, cie.enc, sec)
            length, i = pointer(d, i, cie.enc & 0x0F, sec)
            if cie.has_z:
                n, i = uleb(d, i)
                i += n
            if i > end:
                raise Malformed("FDE header runs past the end of the FDE")
            extend((start, length, order, fde_at, cie_at, i, end))
    except Malformed as exc:
        raise UnwindTableError(f"{where}: {sec.name} at {rec:#x}: {exc}") from None
    except (IndexError, struct.error):
        raise UnwindTableError(f"{where}: {sec.name} at {rec:#x}: truncated: the record "
                               f"runs past the end of the section") from None
    return skipped


def _rows(where: str, sections: Sequence[CfiSection], cies: list[dict[int, Cie | None]],
          fdes: array[int], by_pc: array[int], skipped: int) -> DecodedRows:
    """Evaluate the FDEs in by_pc's order, packing their rows straight into
    one buffer (a row equal to the last one is left out; one at the last
    row's pc replaces it)."""
    out = io.BytesIO()
    write, seek = out.write, out.seek
    pack_pc = _U32.pack
    known: dict[State, bytes] = {}   # states' rows, packed without their pc
    last_pc, last_row = -1, b""
    covered, kept, overlaps, not_understood, covered_bytes = -1, 0, 0, 0, 0

    def emit(pc: int, row: bytes) -> None:
        nonlocal last_pc, last_row
        if pc <= last_pc:
            if pc == last_pc:
                seek(-_ROW_TAIL.size, io.SEEK_END)
                write(row)
                last_row = row
            return
        if row != last_row:
            write(pack_pc(pc) + row)
            last_pc, last_row = pc, row

    def row_of(s: State) -> bytes:
        row = known[s] = _ROW_TAIL.pack(*classify(s))
        return row

    for k in by_pc:
        start, length, order, rec, cie_at, i, end = fdes[k * _FIELDS:(k + 1) * _FIELDS]
        stop, sec = start + length, sections[order]
        if stop <= start or start == 0:
            skipped += 1
            continue
        if stop > MAX_PC:  # the gap row at stop must fit too
            raise UnwindTableError(
                f"{where}: {sec.name} at {rec:#x}: code at {start:#x}..{stop:#x} is past "
                f"4 GiB; unwind rows hold 32-bit pcs")
        lo = start
        if start < covered:
            overlaps += 1
            if stop <= covered:
                continue
            lo = covered
        elif covered >= 0 and start > covered:
            emit(covered, _NONE_TAIL)
        cie = cies[order][cie_at]
        assert cie is not None  # FDEs of unknown CIEs were not kept
        pcs: list[int] = []
        states: list[State] = []
        try:
            final, stopped = run(sec.data, i, end, cie.init, cie.init, cie, sec, start, pcs,
                                 states)
        except Malformed as exc:
            raise UnwindTableError(f"{where}: {sec.name} at {rec:#x}: {exc}") from None
        except (IndexError, struct.error):
            stopped = end + 1
        if stopped > end:
            raise UnwindTableError(f"{where}: {sec.name} at {rec:#x}: FDE instructions run "
                                   f"past the end of the FDE")
        not_understood += final[8] == 2
        carry: State | None = None
        for pc, s in zip(pcs, states, strict=True):
            if pc >= stop:
                break
            if pc <= lo:
                carry = s
                continue
            if carry is not None:
                emit(lo, known.get(carry) or row_of(carry))
                carry = None
            row = known.get(s) or row_of(s)
            if pc > last_pc:  # emit(pc, row), inlined: most rows go this way
                if row != last_row:
                    write(pack_pc(pc) + row)
                    last_pc, last_row = pc, row
            else:
                emit(pc, row)
        if carry is not None:
            emit(lo, known.get(carry) or row_of(carry))
        covered_bytes += stop - lo
        covered = stop
        kept += 1
    if covered >= 0:
        emit(covered, _NONE_TAIL)
    packed = out.getvalue()  # the buffer itself, not a copy
    return DecodedRows(packed, kept, overlaps, skipped, not_understood, covered_bytes)
