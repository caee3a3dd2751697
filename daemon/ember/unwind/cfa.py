"""The row model shared with BPF, and the interpreter of CFA programs
(the DW_CFA instructions of CIEs and FDEs) that produces it.

Why not pyelftools' CFI decoder: it builds a Python object per instruction
and per row (seconds for libc) and raises on DW_CFA_GNU_args_size. Here a
program runs with its state in local variables, and only the rules the
walker can use are kept: the CFA, rbp (DWARF r6), rsp (r7) and the return
address column (r16). Other registers' rules are skipped: the walker never
restores them.

A row (``struct ember_unwind_row`` in bpf/ember.h, 12 bytes, ``ROW``) says
for the pcs from its own up to the next row's how to find the caller:

- ``cfa_type``: ``CFA_RSP``/``CFA_RBP`` (CFA = rsp/rbp + cfa_offset),
  ``CFA_PLT`` (the PLT stub expression; cfa_offset holds its threshold),
  ``CFA_END`` (return address undefined: the outermost frame), ``CFA_NONE``
  (no FDE covers these pcs) or ``CFA_UNSUPPORTED`` (any other rule, a
  return address not at CFA-8, a signal frame, an instruction not known);
- ``rbp_type``: ``RBP_SAME``, ``RBP_SAVED`` (at CFA + rbp_offset) or
  ``RBP_UNKNOWN`` (another rule; the walk goes on while no CFA needs rbp).

The return address is always read at CFA-8.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

# the row types are the kernel's (bpf/ember.h EMBER_CFA_*, EMBER_RBP_*)
from ..abi import (
    CFA_END,
    CFA_NONE,
    CFA_PLT,
    CFA_RBP,
    CFA_RSP,
    CFA_UNSUPPORTED,
    RBP_SAME,
    RBP_SAVED,
    RBP_UNKNOWN,
)

ROW = struct.Struct("<IihBB")  # pc, cfa_offset, rbp_offset, cfa_type, rbp_type

CFA_TYPES = ("unsupported", "rsp", "rbp", "plt", "end", "none")
RBP_TYPES = ("same", "saved", "unknown")

RBP, RSP, RA = 6, 7, 16  # DWARF register numbers on x86-64
MAX_PC = 0xFFFF_FFFF

# register rules as tracked here
_SAME, _OFFSET, _UNDEF, _OTHER, _VAL = range(5)
# State: (cfa_reg, cfa_off, cfa_x, rbp_k, rbp_o, ra_k, ra_o, sp_bad, bad); cfa_x is
# 0 for register + offset, the threshold of the PLT expression, or -1 for another
# expression; bad is 1 for signal frames (or an RA column other than 16) and 2
# once an instruction was not understood.
State = tuple[int, int, int, int, int, int, int, int, int]
INITIAL: State = (-1, 0, 0, _SAME, 0, _SAME, 0, 0, 0)
_U32 = struct.Struct("<I")
_FORMATS = {0x00: struct.Struct("<Q"), 0x02: struct.Struct("<H"), 0x03: _U32,
            0x04: struct.Struct("<Q"), 0x0A: struct.Struct("<h"), 0x0B: struct.Struct("<i"),
            0x0C: struct.Struct("<q")}
_MASK64 = (1 << 64) - 1
_UNSUPPORTED_ROW = (0, 0, CFA_UNSUPPORTED, RBP_SAME)
_END_ROW = (0, 0, CFA_END, RBP_SAME)
NONE_ROW = (0, 0, CFA_NONE, RBP_SAME)


class Row(NamedTuple):
    """One decoded row, in ROW's field order."""
    pc: int
    cfa_offset: int
    rbp_offset: int
    cfa_type: int
    rbp_type: int


@dataclass(frozen=True)
class CfiSection:
    """A CFI section's bytes and the addresses its pointers are relative to."""
    name: str             # ".eh_frame" or ".debug_frame"
    data: bytes
    addr: int = 0         # its virtual address: the DW_EH_PE_pcrel base
    text_addr: int = 0    # DW_EH_PE_textrel base (.text)
    data_addr: int = 0    # DW_EH_PE_datarel base (.got)


class Cie(NamedTuple):
    """What FDEs take from their CIE."""
    caf: int              # code alignment factor
    daf: int              # data alignment factor
    ra_col: int
    enc: int              # FDE pointer encoding
    has_z: bool           # FDEs carry augmentation data (with its length)
    init: State


class Malformed(Exception):
    """Malformed CFI; decode() adds where it was found."""


def uleb(d: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = d[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7


def sleb(d: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = d[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return (result - (1 << shift) if b & 0x40 else result), i


def pointer(d: bytes, i: int, enc: int, sec: CfiSection) -> tuple[int, int]:
    """A DW_EH_PE-encoded pointer at d[i]: (value, next index). The indirect
    flag is left to the caller (only the personality, skipped, uses it)."""
    if enc == 0xFF:
        raise Malformed("an omitted (DW_EH_PE_omit) pointer where one is required")
    fmt, app, field = enc & 0x0F, enc & 0x70, i
    if app == 0x50:  # aligned: to the address size, in memory
        i = ((sec.addr + i + 7) & ~7) - sec.addr
    if fmt == 0x01:
        v, i = uleb(d, i)
    elif fmt == 0x09:
        v, i = sleb(d, i)
    else:
        s = _FORMATS.get(fmt)
        if s is None:
            raise Malformed(f"pointer encoding {enc:#04x} not known")
        v = s.unpack_from(d, i)[0]
        i += s.size
    if app == 0x10:
        v += sec.addr + field
    elif app == 0x20:
        v += sec.text_addr
    elif app == 0x30:
        v += sec.data_addr
    elif app not in (0x00, 0x50):
        raise Malformed(f"pointer encoding {enc:#04x}: application {app:#04x} not supported")
    return v & _MASK64, i


def _expr_ops(expr: bytes) -> list[tuple[int, int]] | None:
    """The operations of a DWARF expression made of lits, bregs, and, ge,
    shl and plus (all the PLT expression uses); None if it has others."""
    ops, i = [], 0
    while i < len(expr):
        op = expr[i]
        i += 1
        if 0x70 <= op <= 0x8F:  # DW_OP_breg0..31 (sleb offset)
            arg, i = sleb(expr, i)
        elif 0x30 <= op <= 0x4F or op in (0x1A, 0x2A, 0x24, 0x22):  # litN and, ge, shl, plus
            arg = 0
        else:
            return None
        ops.append((op, arg))
    return ops


def plt_threshold(expr: bytes) -> int | None:
    """N of the PLT stub's CFA expression, which binutils writes as
    ``breg7 (rsp) 8; breg16 (rip) 0; lit15; and; litN; ge; lit3; shl; plus``
    (CFA = rsp + 8, + 8 more once (rip & 15) >= N: after the stub's push);
    None for any other expression."""
    try:
        ops = _expr_ops(expr)
    except IndexError:
        return None
    if ops is None or len(ops) != 9:
        return None
    n = ops[4][0] - 0x30
    shape = [(0x77, 8), (0x80, 0), (0x3F, 0), (0x1A, 0), (0x30 + n, 0), (0x2A, 0),
             (0x33, 0), (0x24, 0), (0x22, 0)]
    return n if ops == shape and 0 < n < 16 else None


def classify(s: State) -> tuple[int, int, int, int]:
    """(cfa_offset, rbp_offset, cfa_type, rbp_type) of a state."""
    cfa_reg, cfa_off, cfa_x, rbp_k, rbp_o, ra_k, ra_o, sp_bad, bad = s
    if ra_k == _UNDEF:
        return _END_ROW
    if bad or sp_bad or ra_k != _OFFSET or ra_o != -8 or cfa_x < 0:
        return _UNSUPPORTED_ROW
    if cfa_x:
        cfa_type, cfa_off = CFA_PLT, cfa_x
    elif cfa_reg == RSP:
        cfa_type = CFA_RSP
    elif cfa_reg == RBP:
        cfa_type = CFA_RBP
    else:
        return _UNSUPPORTED_ROW
    if not -(1 << 31) <= cfa_off < (1 << 31):
        return _UNSUPPORTED_ROW
    if rbp_k == _SAME:
        return (cfa_off, 0, cfa_type, RBP_SAME)
    if rbp_k == _OFFSET:
        if not -(1 << 15) <= rbp_o < (1 << 15):
            return _UNSUPPORTED_ROW
        return (cfa_off, rbp_o, cfa_type, RBP_SAVED)
    return (cfa_off, 0, cfa_type, RBP_UNKNOWN)


def run(d: bytes, i: int, end: int, st: State, init: State, cie: Cie,
        sec: CfiSection, loc: int, pcs: list[int] | None, states: list[State] | None
        ) -> tuple[State, int]:
    """Run the CFA program d[i:end] from state st (init: the state that
    DW_CFA_restore goes back to): (final state, index where decoding
    stopped). With pcs/states, each row is appended there (a row whose
    state equals the last is left out)."""
    cfa_reg, cfa_off, cfa_x, rbp_k, rbp_o, ra_k, ra_o, sp_bad, bad = st
    caf, daf, ra_col, enc = cie.caf, cie.daf, cie.ra_col, cie.enc
    stack: list[State] = []
    while i < end:
        op = d[i]
        i += 1
        hi = op & 0xC0
        if hi == 0x80:  # DW_CFA_offset
            reg = op & 0x3F
            v = d[i]
            i += 1
            if v >= 0x80:
                v, i = uleb(d, i - 1)
            if reg == RBP:
                rbp_k, rbp_o = _OFFSET, v * daf
            elif reg == ra_col:
                ra_k, ra_o = _OFFSET, v * daf
            elif reg == RSP:
                sp_bad = 1
            continue
        if hi == 0x40:  # DW_CFA_advance_loc
            nloc = loc + (op & 0x3F) * caf
        elif hi == 0xC0 or op == 0x06:  # DW_CFA_restore, DW_CFA_restore_extended
            if hi:
                reg = op & 0x3F
            else:
                reg, i = uleb(d, i)
            if reg == RBP:
                rbp_k, rbp_o = init[3], init[4]
            elif reg == ra_col:
                ra_k, ra_o = init[5], init[6]
            elif reg == RSP:
                sp_bad = init[7]
            continue
        elif op == 0x0E:  # DW_CFA_def_cfa_offset
            cfa_off = d[i]
            i += 1
            if cfa_off >= 0x80:
                cfa_off, i = uleb(d, i - 1)
            continue
        elif op == 0x02:  # DW_CFA_advance_loc1
            nloc = loc + d[i] * caf
            i += 1
        elif op == 0x03:  # DW_CFA_advance_loc2
            nloc = loc + (d[i] | d[i + 1] << 8) * caf
            i += 2
        elif op == 0x04:  # DW_CFA_advance_loc4
            nloc = loc + _U32.unpack_from(d, i)[0] * caf
            i += 4
        elif op == 0x01:  # DW_CFA_set_loc
            nloc, i = pointer(d, i, enc, sec)
        elif op == 0x00 or op == 0x2E:  # DW_CFA_nop, DW_CFA_GNU_args_size
            if op:
                _, i = uleb(d, i)
            continue
        elif op == 0x0A:  # DW_CFA_remember_state
            stack.append((cfa_reg, cfa_off, cfa_x, rbp_k, rbp_o, ra_k, ra_o, sp_bad, bad))
            continue
        elif op == 0x0B:  # DW_CFA_restore_state
            if stack:
                cfa_reg, cfa_off, cfa_x, rbp_k, rbp_o, ra_k, ra_o, sp_bad, bad = stack.pop()
            else:
                bad = 2
            continue
        elif op == 0x0C or op == 0x12:  # DW_CFA_def_cfa, DW_CFA_def_cfa_sf
            cfa_reg, i = uleb(d, i)
            if op == 0x0C:
                cfa_off, i = uleb(d, i)
            else:
                cfa_off, i = sleb(d, i)
                cfa_off *= daf
            cfa_x = 0
            continue
        elif op == 0x0D:  # DW_CFA_def_cfa_register
            cfa_reg, i = uleb(d, i)
            cfa_x = 0
            continue
        elif op == 0x13:  # DW_CFA_def_cfa_offset_sf
            cfa_off, i = sleb(d, i)
            cfa_off *= daf
            continue
        elif op == 0x0F:  # DW_CFA_def_cfa_expression
            n, i = uleb(d, i)
            cfa_x = plt_threshold(d[i:i + n]) or -1
            i += n
            continue
        elif op in (0x05, 0x11, 0x2F, 0x14, 0x15, 0x07, 0x08, 0x09, 0x10, 0x16):
            reg, i = uleb(d, i)
            off = 0
            if op == 0x05 or op == 0x14:  # offset_extended, val_offset
                off, i = uleb(d, i)
                off *= daf
            elif op == 0x11 or op == 0x15:  # offset_extended_sf, val_offset_sf
                off, i = sleb(d, i)
                off *= daf
            elif op == 0x2F:  # GNU_negative_offset_extended
                off, i = uleb(d, i)
                off *= -daf
            elif op == 0x09:  # register
                _, i = uleb(d, i)
            elif op == 0x10 or op == 0x16:  # expression, val_expression
                n, i = uleb(d, i)
                i += n
            kind = (_OFFSET if op in (0x05, 0x11, 0x2F) else _VAL if op in (0x14, 0x15)
                    else _UNDEF if op == 0x07 else _SAME if op == 0x08 else _OTHER)
            if reg == RBP:
                rbp_k, rbp_o = kind, off
            elif reg == ra_col:
                ra_k, ra_o = kind, off
            elif reg == RSP:  # the walker takes the caller's rsp to be the CFA
                sp_bad = 0 if kind == _SAME or (kind == _VAL and off == 0) else 1
            continue
        else:  # not known: the rest of this program cannot be decoded
            bad = 2
            i = end
            break
        # an advance: the row so far ends at nloc
        if states is not None and pcs is not None:
            s = (cfa_reg, cfa_off, cfa_x, rbp_k, rbp_o, ra_k, ra_o, sp_bad, bad)
            if pcs and pcs[-1] == loc:
                states[-1] = s
            elif not states or states[-1] != s:
                pcs.append(loc)
                states.append(s)
        loc = nloc
    s = (cfa_reg, cfa_off, cfa_x, rbp_k, rbp_o, ra_k, ra_o, sp_bad, bad)
    if states is not None and pcs is not None:
        if pcs and pcs[-1] == loc:
            states[-1] = s
        elif not states or states[-1] != s:
            pcs.append(loc)
            states.append(s)
    return s, i
