"""The CFI decoder on small hand-built .eh_frame and .debug_frame sections:
each opcode class, the row classes the BPF walker reads, and malformed
input (a precise UnwindTableError, never IndexError or struct.error)."""

from __future__ import annotations

import random
import struct
import tracemalloc

import pytest

from ember.errors import UnwindTableError
from ember.unwind.cfa import (
    CFA_END,
    CFA_NONE,
    CFA_PLT,
    CFA_RBP,
    CFA_RSP,
    CFA_UNSUPPORTED,
    RBP_SAME,
    RBP_SAVED,
    RBP_UNKNOWN,
    ROW,
    CfiSection,
    Row,
    plt_threshold,
)
from ember.unwind.cfi import DecodedRows, decode
from ember.unwind.tables import UnwindTable, lookup

ADDR = 0x2000          # where the .eh_frame section is
PCREL_SDATA4 = 0x1B    # what GCC and ld use
CIE_INIT = bytes([0x0C, 7, 8, 0x90, 1])  # def_cfa rsp+8; r16 (ra) at cfa-8
PLT_EXPR = bytes([0x77, 8, 0x80, 0, 0x3F, 0x1A, 0x3B, 0x2A, 0x33, 0x24, 0x22])


def uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def sleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        done = (n == 0 and not b & 0x40) or (n == -1 and b & 0x40)
        out.append(b | (0 if done else 0x80))
        if done:
            return bytes(out)


def pad(body: bytes) -> bytes:
    return body + b"\0" * (-(len(body) + 4) % 8)  # DW_CFA_nop up to 8-byte records


def eh_frame(fdes: list[tuple[int, int, bytes]], aug: bytes = b"zR",
             aug_data: bytes = bytes([PCREL_SDATA4]), init: bytes = CIE_INIT,
             ra: int = 16) -> bytes:
    """A CIE then one FDE per (pc, length, instructions), pcrel sdata4."""
    cie = pad(struct.pack("<IB", 0, 1) + aug + b"\0" + uleb(1) + sleb(-8) + bytes([ra])
              + (uleb(len(aug_data)) + aug_data if aug.startswith(b"z") else b"") + init)
    out = bytearray(struct.pack("<I", len(cie)) + cie)
    for pc, length, insns in fdes:
        at = len(out)
        field = at + 8  # the initial location, after length and CIE pointer
        body = struct.pack("<Iii", at + 4, pc - (ADDR + field), length)
        body += (uleb(0) if aug.startswith(b"z") else b"") + insns
        body = pad(body)
        out += struct.pack("<I", len(body)) + body
    return bytes(out + b"\0\0\0\0")


def rows_of(data: bytes, name: str = ".eh_frame", **addrs: int) -> UnwindTable:
    decoded = decode(CfiSection(name, data, addrs.pop("addr", ADDR), **addrs), "test.so")
    return UnwindTable.of("test.so", "", name, decoded)


def table(*fdes: tuple[int, int, bytes], **kw: bytes | int) -> UnwindTable:
    return rows_of(eh_frame(list(fdes), **kw))  # type: ignore[arg-type]


def at(t: UnwindTable, pc: int) -> tuple[int, int, int, int]:
    row = lookup(t, pc)
    assert row is not None
    return row.cfa_type, row.cfa_offset, row.rbp_type, row.rbp_offset


def all_rows(t: UnwindTable) -> list[Row]:
    return [Row._make(r) for r in ROW.iter_unpack(t.rows)]


def test_push_rbp_then_rbp_based_cfa() -> None:
    # push %rbp; mov %rsp,%rbp; ... leave; ret
    t = table((0x1000, 0x40, bytes([0x41, 0x0E, 16, 0x86, 2, 0x43, 0x0D, 6,
                                    0x02, 0x30, 0x0C, 7, 8])))
    assert at(t, 0x1000) == (CFA_RSP, 8, RBP_SAME, 0)
    assert at(t, 0x1001) == (CFA_RSP, 16, RBP_SAVED, -16)
    assert at(t, 0x1004) == (CFA_RBP, 16, RBP_SAVED, -16)
    assert at(t, 0x1033) == (CFA_RBP, 16, RBP_SAVED, -16)
    assert at(t, 0x1034) == (CFA_RSP, 8, RBP_SAVED, -16)
    assert at(t, 0x1040) == (CFA_NONE, 0, RBP_SAME, 0)
    assert lookup(t, 0xFFF) is None
    assert [r.pc for r in all_rows(t)] == [0x1000, 0x1001, 0x1004, 0x1034, 0x1040]
    assert t.cfa_counts == (0, 3, 1, 0, 0, 1) and t.rbp_counts == (2, 3, 0)


def test_advances_of_every_width_and_set_loc() -> None:
    insns = (bytes([0x02, 0x10, 0x0E, 16, 0x03]) + struct.pack("<H", 0x100)
             + bytes([0x0E, 24, 0x04]) + struct.pack("<I", 0x1000) + bytes([0x0E, 32]))
    t = table((0x10000, 0x2000, insns))
    assert [(r.pc, r.cfa_offset) for r in all_rows(t)][:4] == [
        (0x10000, 8), (0x10010, 16), (0x10110, 24), (0x11110, 32)]
    # DW_CFA_set_loc takes the FDE's pointer encoding (pcrel: from the operand's place)
    data = bytearray(eh_frame([(0x10000, 0x100, bytes([0x01, 0, 0, 0, 0, 0x0E, 16]))]))
    operand = data.index(bytes([0x01, 0, 0, 0, 0])) + 1
    struct.pack_into("<i", data, operand, 0x10020 - (ADDR + operand))
    assert [(r.pc, r.cfa_offset) for r in all_rows(rows_of(bytes(data)))][:2] == [
        (0x10000, 8), (0x10020, 16)]


def test_register_rules_for_rbp() -> None:
    cases = {
        bytes([0x05, 6, 3]): (RBP_SAVED, -24),                   # offset_extended
        bytes([0x11, 6]) + sleb(2): (RBP_SAVED, -16),            # offset_extended_sf
        bytes([0x2F, 6, 4]): (RBP_SAVED, 32),                    # GNU_negative_offset_extended
        bytes([0x14, 6, 1]): (RBP_UNKNOWN, 0),                   # val_offset
        bytes([0x15, 6]) + sleb(1): (RBP_UNKNOWN, 0),            # val_offset_sf
        bytes([0x09, 6, 3]): (RBP_UNKNOWN, 0),                   # register
        bytes([0x10, 6, 2, 0x76, 0]): (RBP_UNKNOWN, 0),          # expression
        bytes([0x16, 6, 2, 0x76, 0]): (RBP_UNKNOWN, 0),          # val_expression
        bytes([0x07, 6]): (RBP_UNKNOWN, 0),                      # undefined
        bytes([0x86, 2, 0x08, 6]): (RBP_SAME, 0),                # same_value
        bytes([0x86, 2, 0xC6]): (RBP_SAME, 0),                   # restore (to the CIE's)
        bytes([0x86, 2, 0x06, 6]): (RBP_SAME, 0),                # restore_extended
        bytes([0x86, 0x81, 0x20]): None,                         # at cfa-32776: not s16
    }
    for insns, want in cases.items():
        t = table((0x1000, 0x10, bytes([0x41]) + insns))
        if want is None:
            assert at(t, 0x1001)[0] == CFA_UNSUPPORTED, insns.hex()
        else:
            assert at(t, 0x1001) == (CFA_RSP, 8, *want), insns.hex()
        assert at(t, 0x1000) == (CFA_RSP, 8, RBP_SAME, 0)


def test_cfa_rules() -> None:
    cases = {
        bytes([0x12, 7]) + sleb(-3): (CFA_RSP, 24),        # def_cfa_sf (factored by -8)
        bytes([0x13]) + sleb(-5): (CFA_RSP, 40),           # def_cfa_offset_sf
        bytes([0x0C, 6, 16]): (CFA_RBP, 16),               # def_cfa rbp
        bytes([0x0E, 0x80, 0x02]): (CFA_RSP, 256),          # def_cfa_offset, 2-byte uleb
        bytes([0x0C, 12, 8]): (CFA_UNSUPPORTED, 0),         # another register
        bytes([0x0F, 2, 0x77, 8]): (CFA_UNSUPPORTED, 0),    # an expression, not the PLT's
        bytes([0x0F, 2, 0x77, 8, 0x0D, 7]): (CFA_RSP, 8),   # ... then a register again
        bytes([0x90, 2]): (CFA_UNSUPPORTED, 0),             # return address at cfa-16
        bytes([0x07, 16]): (CFA_END, 0),                    # return address undefined
        bytes([0x87, 1]): (CFA_UNSUPPORTED, 0),             # rsp saved: not the CFA
        bytes([0x2E, 0x10, 0x00, 0x00]): (CFA_RSP, 8),      # GNU_args_size, nops
    }
    for insns, want in cases.items():
        t = table((0x1000, 0x10, bytes([0x41]) + insns))
        assert at(t, 0x1001)[:2] == want, insns.hex()


def test_remember_and_restore_state() -> None:
    # an epilogue in the middle of a function: the state is remembered,
    # the CFA goes back to rsp+8 for the ret, then the state comes back
    insns = bytes([0x41, 0x0E, 16, 0x86, 2, 0x43, 0x0D, 6, 0x0A, 0x44, 0x0C, 7, 8, 0xC6,
                   0x41, 0x0B, 0x48, 0x0B])
    t = table((0x1000, 0x40, insns))
    assert at(t, 0x1004) == (CFA_RBP, 16, RBP_SAVED, -16)
    assert at(t, 0x1008) == (CFA_RSP, 8, RBP_SAME, 0)
    assert at(t, 0x1009) == (CFA_RBP, 16, RBP_SAVED, -16)
    # a restore_state with nothing remembered: unsupported from there on
    assert at(t, 0x1011) == (CFA_UNSUPPORTED, 0, RBP_SAME, 0)
    assert decode(CfiSection(".eh_frame", eh_frame([(0x1000, 0x40, insns)]), ADDR),
                  "t").not_understood == 1


def test_the_plt_expression() -> None:
    assert plt_threshold(PLT_EXPR) == 11
    assert plt_threshold(PLT_EXPR.replace(b"\x3b", b"\x3a")) == 10
    assert plt_threshold(PLT_EXPR[:-1]) is None
    assert plt_threshold(PLT_EXPR.replace(b"\x1a", b"\x1b")) is None
    assert plt_threshold(b"\x77") is None  # truncated operand
    t = table((0x1000, 0x20, bytes([0x0E, 16, 0x4A, 0x0F, len(PLT_EXPR)]) + PLT_EXPR))
    assert at(t, 0x1000) == (CFA_RSP, 16, RBP_SAME, 0)
    assert at(t, 0x1010) == (CFA_PLT, 11, RBP_SAME, 0)


def test_signal_frames_and_other_ra_columns_are_unsupported() -> None:
    t = table((0x1000, 0x10, b""), aug=b"zRS")
    assert at(t, 0x1000)[0] == CFA_UNSUPPORTED
    t = table((0x1000, 0x10, b""), ra=15, init=bytes([0x0C, 7, 8, 0x8F, 1]))
    assert at(t, 0x1000)[0] == CFA_UNSUPPORTED


def test_augmentations() -> None:
    # zPLR: a personality (indirect pcrel sdata4) and an LSDA encoding to skip
    personality = bytes([0x9B]) + struct.pack("<i", 0x100)
    t = table((0x1000, 0x10, bytes([0x41, 0x0E, 16])), aug=b"zPLR",
              aug_data=personality + bytes([0x1B, PCREL_SDATA4]))
    assert at(t, 0x1001) == (CFA_RSP, 16, RBP_SAME, 0)
    # no augmentation at all: absolute 8-byte addresses
    t = rows_of(absolute_frame(0x5000, 0x10, b"\x41\x0e\x10"))
    assert at(t, 0x5001) == (CFA_RSP, 16, RBP_SAME, 0) and at(t, 0x5010)[0] == CFA_NONE
    # an augmentation not known: its FDEs are skipped, not guessed at
    decoded = decode(CfiSection(".eh_frame", eh_frame([(0x1000, 0x10, b"")], aug=b"zX"),
                                ADDR), "t")
    assert decoded.skipped == 1 and decoded.rows == b""


@pytest.mark.parametrize(("enc", "operand", "bases", "want"), [
    (0x03, struct.pack("<I", 0x7000), {}, 0x7000),                         # udata4
    (0x04, struct.pack("<Q", 0x7000), {}, 0x7000),                         # udata8
    (0x0C, struct.pack("<q", 0x7000), {}, 0x7000),                         # sdata8
    (0x01, uleb(0x7000), {}, 0x7000),                                      # uleb128
    (0x09, sleb(0x7000), {}, 0x7000),                                      # sleb128
    (0x2B, struct.pack("<i", -0x1000), {"text_addr": 0x8000}, 0x7000),     # textrel sdata4
    (0x33, struct.pack("<I", 0x1000), {"data_addr": 0x6000}, 0x7000),      # datarel udata4
])
def test_pointer_encodings(enc: int, operand: bytes, bases: dict[str, int], want: int) -> None:
    cie = pad(struct.pack("<IB", 0, 1) + b"zR\0" + uleb(1) + sleb(-8) + b"\x10"
              + uleb(1) + bytes([enc]) + CIE_INIT)
    length = (uleb if enc & 0x0F == 1 else sleb)(0x10) if enc & 0x0F in (1, 9) else (
        struct.pack("<" + {3: "I", 4: "Q", 0xC: "q", 0xB: "i"}[enc & 0x0F], 0x10))
    fde = pad(struct.pack("<I", len(cie) + 8) + operand + length + uleb(0) + b"\x41\x0e\x10")
    data = struct.pack("<I", len(cie)) + cie + struct.pack("<I", len(fde)) + fde
    t = rows_of(data, **bases)
    assert at(t, want) == (CFA_RSP, 8, RBP_SAME, 0)
    assert at(t, want + 1) == (CFA_RSP, 16, RBP_SAME, 0) and at(t, want + 0x10)[0] == CFA_NONE


def test_debug_frame() -> None:
    """.debug_frame: CIE id 0xffffffff, CIE pointers from the section's
    start, absolute addresses (version 4: address and segment sizes)."""
    for version, extra in ((1, b""), (3, b""), (4, b"\x08\x00")):
        cie = pad(struct.pack("<IB", 0xFFFF_FFFF, version) + b"\0" + extra + uleb(1)
                  + sleb(-8) + b"\x10" + CIE_INIT)
        fdes = b""
        for pc in (0x3000, 0x3100):
            body = pad(struct.pack("<IQQ", 0, pc, 0x20) + b"\x41\x0e\x10\x86\x02")
            fdes += struct.pack("<I", len(body)) + body
        data = fdes + struct.pack("<I", len(cie)) + cie  # the CIE after its FDEs
        cie_at = len(fdes)
        data = bytearray(data)
        for at_ in (0, len(data[:cie_at]) // 2):
            struct.pack_into("<I", data, at_ + 4, cie_at)
        t = rows_of(bytes(data), ".debug_frame", addr=0)
        assert at(t, 0x3001) == (CFA_RSP, 16, RBP_SAVED, -16), version
        assert at(t, 0x3020)[0] == CFA_NONE and at(t, 0x3101)[0] == CFA_RSP


def test_gaps_merges_and_overlaps() -> None:
    same = bytes([0x41, 0x0E, 16, 0x41, 0x0E, 8])
    t = table((0x1000, 0x10, same), (0x1010, 0x10, same), (0x1030, 0x10, same))
    assert [(r.pc, r.cfa_type, r.cfa_offset) for r in all_rows(t)] == [
        (0x1000, CFA_RSP, 8), (0x1001, CFA_RSP, 16), (0x1002, CFA_RSP, 8),
        (0x1011, CFA_RSP, 16), (0x1012, CFA_RSP, 8), (0x1020, CFA_NONE, 0),
        (0x1030, CFA_RSP, 8), (0x1031, CFA_RSP, 16), (0x1032, CFA_RSP, 8),
        (0x1040, CFA_NONE, 0)]
    # an FDE starting inside another: the first keeps its range, the other is clipped
    t = table((0x1000, 0x10, bytes([0x0E, 16])), (0x1008, 0x10, bytes([0x0E, 24])))
    assert t.overlaps == 1
    assert at(t, 0x100F)[:2] == (CFA_RSP, 16) and at(t, 0x1010)[:2] == (CFA_RSP, 24)
    assert at(t, 0x1018)[0] == CFA_NONE
    # the same FDE twice: one copy dropped, counted
    t = table((0x1000, 0x10, b""), (0x1000, 0x10, b""))
    assert t.overlaps == 1 and t.fdes == 1
    # empty ranges and pc 0 (code the linker discarded) are skipped
    decoded = decode(CfiSection(".eh_frame", eh_frame([(0, 0x10, b""), (0x1000, 0, b"")]),
                                ADDR), "t")
    assert decoded.skipped == 2 and decoded.rows == b""


def test_an_unknown_opcode_makes_the_rest_unsupported() -> None:
    t = table((0x1000, 0x10, bytes([0x41, 0x0E, 16, 0x41, 0x3F, 0x0E, 8])))
    assert at(t, 0x1001) == (CFA_RSP, 16, RBP_SAME, 0)
    assert at(t, 0x1002)[0] == CFA_UNSUPPORTED


def absolute_frame(pc: int, length: int, insns: bytes) -> bytes:
    """An .eh_frame whose CIE has no augmentation: 8-byte absolute addresses."""
    cie = pad(struct.pack("<IB", 0, 1) + b"\0" + uleb(1) + sleb(-8) + b"\x10" + CIE_INIT)
    fde = pad(struct.pack("<IQQ", len(cie) + 8, pc, length) + insns)
    return struct.pack("<I", len(cie)) + cie + struct.pack("<I", len(fde)) + fde


def test_code_past_4gib_is_refused() -> None:
    assert at(rows_of(absolute_frame(0xFFFF_FFF0, 0xF, b"")), 0xFFFF_FFFE)[0] == CFA_RSP
    with pytest.raises(UnwindTableError, match=r"at 0x18: code at 0xfffffff0\.\.0x100000010 "
                                               r"is past 4 GiB"):
        rows_of(absolute_frame(0xFFFF_FFF0, 0x20, b""))


@pytest.mark.parametrize(("damage", "message"), [
    (lambda d: d[:-12], r"\.eh_frame at 0x18: .*runs past the end of the section"),
    (lambda d: d[:30], r"\.eh_frame at 0x18: .*runs past the end of the section"),
    (lambda d: d[:0x1C] + struct.pack("<I", 0x400) + d[0x20:], r"outside the section"),
    (lambda d: d[:0x1C] + struct.pack("<I", 4) + d[0x20:], r"at 0x18: .*0x18, which is not a CIE"),
    (lambda d: d[:0x10] + b"\x0d" + d[0x11:], r"at 0x18: pointer encoding 0x0d not known"),
    (lambda d: d[:0x2D] + b"\x0e\x80\x80" + d[0x30:], r"at 0x18: FDE instructions run past"),
])
def test_malformed_sections_raise_precisely(damage: object, message: str) -> None:
    good = eh_frame([(0x1000, 0x10, bytes([0x41, 0x0E, 16, 0x41, 0x0E, 8]))])
    assert good[0x10] == PCREL_SDATA4 and good[0x2D:0x30] == b"\x0e\x08\x00"
    bad = damage(good)  # type: ignore[operator]
    with pytest.raises(UnwindTableError, match=message):
        decode(CfiSection(".eh_frame", bad, ADDR), "broken.so")


def test_random_damage_never_crashes() -> None:
    good = eh_frame([(0x1000 + 0x40 * i, 0x40, bytes([0x41, 0x0E, 16, 0x86, 2, 0x0A, 0x41,
                                                       0x0F, len(PLT_EXPR)]) + PLT_EXPR
                      + bytes([0x0B, 0x2E, 8, 0x41, 0x0D, 6])) for i in range(4)])
    rng = random.Random(7)
    for n in range(len(good)):
        _decode_or_raise(good[:n])
    for _ in range(3000):
        bad = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        _decode_or_raise(bytes(bad))


def _decode_or_raise(data: bytes) -> DecodedRows | None:
    try:
        decoded = decode(CfiSection(".eh_frame", data, ADDR), "fuzz.so")
    except UnwindTableError as exc:
        assert str(exc).startswith("fuzz.so: .eh_frame at 0x")
        return None
    pcs = [pc for pc, *_ in ROW.iter_unpack(decoded.rows)]
    assert pcs == sorted(set(pcs))
    return decoded


def test_fdes_in_any_order_and_overlapping_by_length() -> None:
    # equal starts: the shorter FDE keeps its range, the longer is clipped
    t = table((0x1000, 0x20, bytes([0x0E, 24])), (0x1000, 0x10, bytes([0x0E, 16])))
    assert t.overlaps == 1 and t.covered == 0x20
    assert [(r.pc, r.cfa_type, r.cfa_offset) for r in all_rows(t)] == [
        (0x1000, CFA_RSP, 16), (0x1010, CFA_RSP, 24), (0x1020, CFA_NONE, 0)]
    fdes = [(0x10000 + 0x40 * i, 0x20 + i % 3 * 0x10, bytes([0x41, 0x0E, 8 + i % 5 * 8]))
            for i in range(500)]
    shuffled = fdes[:]
    random.Random(3).shuffle(shuffled)
    assert table(*shuffled).rows == table(*fdes).rows


def test_decoding_memory_is_a_small_multiple_of_the_rows() -> None:
    # no Python object per FDE or per row is kept while decoding
    insns = bytes([0x41, 0x0E, 16, 0x86, 2, 0x41, 0x0E, 24, 0x42, 0x0E, 32, 0x41, 0x0E, 8])
    fdes = [(0x10000 + 0x40 * i, 0x30, insns) for i in range(20000)]
    random.Random(5).shuffle(fdes)
    section = CfiSection(".eh_frame", eh_frame(fdes), ADDR)
    del fdes
    tracemalloc.start()
    try:
        decoded = decode(section, "big.so")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(decoded.rows) == 20000 * 6 * ROW.size and decoded.fdes == 20000
    assert peak < 3 * len(decoded.rows) + (1 << 20), peak  # was 29 times the rows
