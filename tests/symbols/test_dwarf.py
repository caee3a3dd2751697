"""DWARF source lines and inlined functions, checked against binutils'
addr2line (-f -i) on every instruction of a compiled fixture and on random
addresses of Debian's libc debug file (DWARF 5, compressed sections, range
lists); malformed DWARF gives a DwarfError or no lines, never a crash."""

from __future__ import annotations

import os
import random
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.errors import DwarfError
from ember.symbols.debuginfo import debug_file_for
from ember.symbols.dwarf import DwarfLines, SourceLine
from ember.symbols.elf import ElfSymbols
from tests.support import BIN, LIBC, SRC, libc_debug_file

SOURCE = SRC / "inline_lines.c"


def addr2line(path: Path | str, addrs: list[int]) -> dict[int, list[tuple[str, str, int]]]:
    """binutils' answer: address -> [(function, file, line)] innermost first."""
    out = subprocess.run(["addr2line", "-a", "-f", "-i", "-e", str(path)]
                         + [f"{a:#x}" for a in addrs],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    result: dict[int, list[tuple[str, str, int]]] = {}
    chain: list[tuple[str, str, int]] = []
    i = 0
    while i < len(out):
        if out[i].startswith("0x"):
            chain = result.setdefault(int(out[i], 16), [])
            i += 1
            continue
        func, where = out[i], out[i + 1]
        where = re.sub(r" \(discriminator \d+\)$", "", where)
        file, _, line = where.rpartition(":")
        chain.append((func, os.path.normpath(file) if file != "??" else file,
                      int(line) if line.isdigit() else 0))
        i += 2
    return result


def ours(lines: list[SourceLine]) -> list[tuple[str, str, int]]:
    return [(s.function or "??", s.file or "??", s.line) for s in lines]


def instructions(path: Path, functions: set[str] | None = None) -> list[int]:
    """Every instruction address (objdump) of the given functions, or all."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], check=True,
                         capture_output=True, text=True).stdout
    addrs, current = [], ""
    for line in out.splitlines():
        if m := re.match(r"^[0-9a-f]+ <(.+)>:$", line):
            current = m.group(1)
        elif (m := re.match(r"^\s+([0-9a-f]+):\s", line)) and (
                functions is None or current in functions):
            addrs.append(int(m.group(1), 16))
    return addrs


def marked_line(marker: str) -> int:
    for n, text in enumerate(SOURCE.read_text().splitlines(), start=1):
        if f"/* {marker} */" in text:
            return n
    raise AssertionError(marker)


def test_inlined_chain_of_the_hot_loop(fixture_bin: Path) -> None:
    """The multiply in scramble's loop: scramble at its line, inlined into
    mix at the call, inlined into work at the call."""
    exe = fixture_bin / "inline_lines"
    lines = DwarfLines(exe)
    elf = ElfSymbols(exe)
    start = next(f.start for f in elf.functions() if f.name == "work")
    chains = [lines.lookup(a) for a in instructions(exe, {"work"})]
    want = [("scramble", marked_line("SCRAMBLE_MUL")), ("mix", marked_line("MIX_CALL")),
            ("work", marked_line("WORK_CALL"))]
    assert any([(s.function, s.line) for s in c] == want for c in chains), chains
    assert all(c and c[-1].function == "work" for c in chains)
    assert all(s.file == str(SOURCE.resolve()) for c in chains for s in c)
    assert lines.lookup(start - 0x100000) == []


def test_every_instruction_agrees_with_addr2line(fixture_bin: Path) -> None:
    for name in ("inline_lines", "pie_main", "cpp_names"):
        exe = fixture_bin / name
        addrs = instructions(exe)
        truth = addr2line(exe, addrs)
        dwarf = DwarfLines(exe)
        with_lines = [a for a in addrs if any(line for _, _, line in truth[a])]
        differ = [(hex(a), ours(dwarf.lookup(a)), truth[a]) for a in with_lines
                  if ours(dwarf.lookup(a)) != truth[a]]
        # no line there (crt code, PLT): addr2line falls back to the symbol
        assert all(not any(s.line for s in dwarf.lookup(a)) for a in addrs
                   if a not in with_lines)
        assert len(with_lines) > 20
        assert not differ, (name, len(differ), len(addrs), differ[:5])


def llvm_symbolizer(path: Path | str, addrs: list[int]
                    ) -> dict[int, list[tuple[str, str, int]]]:
    """LLVM's answer, in addr2line's shape."""
    out = subprocess.run(["llvm-symbolizer", f"--obj={path}", "--inlining",
                          "--functions=linkage", "--output-style=LLVM"]
                         + [f"{a:#x}" for a in addrs],
                         check=True, capture_output=True, text=True).stdout
    result = {}
    for a, block in zip(addrs, out.strip("\n").split("\n\n"), strict=True):
        lines = block.splitlines()
        chain = []
        for func, where in zip(lines[::2], lines[1::2], strict=True):
            file, line, _col = where.rsplit(":", 2)
            chain.append((func, os.path.normpath(file) if file != "??" else file, int(line)))
        result[a] = chain
    return result


@pytest.mark.skipif(libc_debug_file() is None,
                    reason="no libc6-dbg file for this libc (host-setup.sh --dev installs it)")
def test_libc_debug_file_agrees_with_llvm_symbolizer() -> None:
    """Random addresses in libc's functions, through its libc6-dbg file
    (DWARF 5, compressed sections, range lists, deep inlining). The reference
    is llvm-symbolizer: binutils 2.40's addr2line names the compile unit's
    main file instead of the included one (strfrom-skeleton.c, gmp.h) for
    some of them. Outermost names may differ by alias (.cold parts are named
    by their ELF symbol there), so those compare by file and line."""
    obj = ElfSymbols(LIBC)
    debug = debug_file_for(obj, str(LIBC))
    assert debug == libc_debug_file()  # found by ember as by build id
    assert debug is not None
    syms = ElfSymbols(debug)
    rng = random.Random(4)
    spans = [(f.start, f.start + f.size) for f in syms.functions() if f.size > 4]
    addrs = sorted({s + rng.randrange(e - s) for s, e in rng.sample(spans, 400)})
    truth = llvm_symbolizer(debug, addrs)
    dwarf = DwarfLines(debug)
    compared = inlined = 0
    differ = []
    for a in addrs:
        if not truth[a] or truth[a][0][2] == 0:  # no line there either
            continue
        compared += 1
        inlined += len(truth[a]) > 1
        mine = ours(dwarf.lookup(a))
        if ([m[1:] for m in mine] != [t[1:] for t in truth[a]]
                or [m[0] for m in mine[:-1]] != [t[0] for t in truth[a][:-1]]):
            differ.append((hex(a), mine, truth[a]))
    assert compared > 300 and inlined > 30, (compared, inlined)
    assert not differ, (len(differ), compared, differ[:4])


def test_no_dwarf(fixture_bin: Path, tmp_path: Path) -> None:
    stripped = tmp_path / "stripped"
    subprocess.run(["strip", "-g", "-o", str(stripped), str(fixture_bin / "inline_lines")],
                   check=True)
    with pytest.raises(DwarfError, match="no DWARF"):
        DwarfLines(stripped)
    assert ElfSymbols(stripped).dwarf_path is None
    assert ElfSymbols(fixture_bin / "inline_lines").dwarf_path is not None


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_mutated_dwarf(tmp_path_factory: pytest.TempPathFactory,
                            data: st.DataObject) -> None:
    """Mutations inside the DWARF sections: a DwarfError, or lookups that
    return lines or nothing; never another exception."""
    exe = BIN / "inline_lines"
    blob = bytearray(exe.read_bytes())
    out = subprocess.run(["readelf", "-SW", str(exe)], check=True, capture_output=True,
                         text=True).stdout
    spans = [(int(m.group(2), 16), int(m.group(3), 16))
             for m in re.finditer(r"\] (\.debug_\w+)\s+\w+\s+[0-9a-f]+ ([0-9a-f]+) ([0-9a-f]+)",
                                  out)]
    for _ in range(data.draw(st.integers(1, 12))):
        off, size = data.draw(st.sampled_from(spans))
        pos = off + data.draw(st.integers(0, size - 1))
        blob[pos] = data.draw(st.integers(0, 255))
    p = tmp_path_factory.mktemp("fuzz") / "obj"
    p.write_bytes(bytes(blob))
    try:
        dwarf = DwarfLines(p)
    except DwarfError:
        return
    for a in instructions(exe, {"work", "main"}):
        for s in dwarf.lookup(a):
            assert isinstance(s.function, str) and isinstance(s.line, int)
