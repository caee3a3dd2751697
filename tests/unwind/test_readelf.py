"""Unwind tables of real libraries, checked row by row against binutils'
``readelf -wF`` (its own CFI interpreter): at every LOC readelf prints, the
row ember looks up must say the same about the CFA, rbp and the return
address, in the compact form the BPF walker reads."""

from __future__ import annotations

import bisect
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

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
)
from ember.unwind.tables import build_table, lookup

LIBRARIES = [
    Path("/usr/lib/x86_64-linux-gnu/libc.so.6"),
    Path("/usr/bin/python3.11"),  # Debian links libpython statically
    Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"),
    Path("/usr/lib/x86_64-linux-gnu/libcrypto.so.3"),
]
_FDE = re.compile(r"^[0-9a-f]+ [0-9a-f]+ [0-9a-f]+ FDE cie=([0-9a-f]+) "
                  r"pc=([0-9a-f]+)\.\.([0-9a-f]+)")
_CIE = re.compile(r'^([0-9a-f]+) [0-9a-f]+ [0-9a-f]+ CIE "([^"]*)"')
_REG_RULE = re.compile(r"(r\d+) \((\w+)\)")  # readelf writes a register rule as "r9 (r9)"


@dataclass(frozen=True)
class ReadelfRow:
    loc: int
    fde: tuple[int, int]
    signal: bool            # the CIE's augmentation has S
    rules: dict[str, str]   # column -> rule: "CFA", "rbp", "rsp", "ra"


def readelf_rows(path: Path) -> tuple[list[ReadelfRow], list[tuple[int, int]]]:
    """Every row of `readelf -wF`'s interpreted .eh_frame in the FDEs, and
    every FDE's range (an FDE without instructions has no rows)."""
    out = subprocess.run(["readelf", "--debug-dump=frames-interp,no-follow-links", str(path)],
                         check=True, capture_output=True, text=True).stdout
    rows: list[ReadelfRow] = []
    fdes: list[tuple[int, int]] = []
    augmentation: dict[int, str] = {}
    fde: tuple[int, int] | None = None
    signal = False
    columns: list[str] = []
    for line in out.splitlines():
        if m := _CIE.match(line):
            augmentation[int(m.group(1), 16)] = m.group(2)
            fde = None
        elif m := _FDE.match(line):
            fde = (int(m.group(2), 16), int(m.group(3), 16))
            fdes.append(fde)
            signal = "S" in augmentation[int(m.group(1), 16)]
        elif line.startswith("   LOC"):
            columns = line.split()
        elif fde is not None and re.match(r"^[0-9a-f]{16} ", line):
            values = _REG_RULE.sub(r"\1(\2)", line).split()
            assert len(values) == len(columns), line
            loc = int(values[0], 16)
            if fde[0] <= loc < fde[1]:
                rows.append(ReadelfRow(loc, fde, signal, dict(zip(columns[1:], values[1:],
                                                                  strict=True))))
    return rows, fdes


def plt_ranges(path: Path) -> list[tuple[int, int]]:
    """(start, end) of the .plt* sections, per `readelf -SW`."""
    out = subprocess.run(["readelf", "-SW", str(path)], check=True, capture_output=True,
                         text=True).stdout
    ranges = []
    for m in re.finditer(r"\] (\.plt\S*)\s+\S+\s+([0-9a-f]+) [0-9a-f]+ ([0-9a-f]+)", out):
        start = int(m.group(2), 16)
        ranges.append((start, start + int(m.group(3), 16)))
    return ranges


def expected(row: ReadelfRow, plts: list[tuple[int, int]]) -> tuple[int, int, int, int]:
    """(cfa_type, cfa_offset, rbp_type, rbp_offset) that readelf's row
    means; offsets 0 where the type carries none."""
    r = row.rules
    if r.get("ra") == "u":
        return CFA_END, 0, RBP_SAME, 0
    if row.signal or r.get("ra") != "c-8" or r.get("rsp", "u") not in ("u", "s"):
        return CFA_UNSUPPORTED, 0, RBP_SAME, 0
    cfa = r["CFA"]
    if m := re.fullmatch(r"(rsp|rbp)\+(-?\d+)", cfa):
        cfa_type, cfa_offset = (CFA_RSP if m.group(1) == "rsp" else CFA_RBP), int(m.group(2))
    elif cfa == "exp" and any(a <= row.loc < b for a, b in plts):
        cfa_type, cfa_offset = CFA_PLT, -1  # the threshold: readelf does not show it
    else:
        return CFA_UNSUPPORTED, 0, RBP_SAME, 0
    rbp = r.get("rbp", "u")
    if rbp in ("u", "s"):
        return cfa_type, cfa_offset, RBP_SAME, 0
    if m := re.fullmatch(r"c([+-]\d+)", rbp):
        if not -(1 << 15) <= int(m.group(1)) < (1 << 15):
            return CFA_UNSUPPORTED, 0, RBP_SAME, 0
        return cfa_type, cfa_offset, RBP_SAVED, int(m.group(1))
    return cfa_type, cfa_offset, RBP_UNKNOWN, 0


@pytest.mark.parametrize("path", LIBRARIES, ids=lambda p: p.name)
def test_every_readelf_row(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} does not exist on this machine")
    table = build_table(path)
    assert table.source == ".eh_frame" and table.overlaps == 0
    truth, fdes = readelf_rows(path)
    plts = plt_ranges(path)
    assert len(truth) > 10_000
    mismatches = []
    for row in truth:
        got = lookup(table, row.loc)
        assert got is not None, hex(row.loc)
        want = expected(row, plts)
        have = (got.cfa_type, got.cfa_offset, got.rbp_type, got.rbp_offset)
        if want[0] == CFA_PLT:
            have = (got.cfa_type, -1 if got.cfa_offset in (10, 11) else got.cfa_offset,
                    *have[2:])
        if have != want:
            mismatches.append(f"{row.loc:#x}: readelf {row.rules} -> {want}, ember {have}")
    assert not mismatches, "\n".join(mismatches[:20])
    supported = sum(expected(r, plts)[0] in (CFA_RSP, CFA_RBP) for r in truth)
    assert supported / len(truth) > 0.98  # libcrypto: 98.9% (perlasm CFAs in rax, r11...)
    # every FDE is in the table, and a gap after one is a CFA_NONE row
    ranges = sorted((a, b) for a, b in fdes if b > a)
    starts = [a for a, _ in ranges]
    for start, end in ranges:
        row = lookup(table, start)
        assert row is not None and row.cfa_type != CFA_NONE, hex(start)
        i = bisect.bisect_right(starts, end) - 1
        if ranges[i][1] <= end:  # no FDE holds the pc at end
            assert lookup(table, end) == (end, 0, 0, CFA_NONE, RBP_SAME), hex(end)
