"""symbols.describe, what ``ember symbolize`` prints: user addresses of live
child processes (no root needed), the inlined chain of a hot loop checked
against binutils' addr2line, kernel addresses from a kallsyms file."""

from __future__ import annotations

import os
import random
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ember.errors import SymbolizationError, UsageError
from ember.model import KERNEL_MAPPING
from ember.symbols.describe import describe
from ember.symbols.elf import ElfSymbols
from ember.symbols.procmaps import MapEntry, ProcFS
from tests.support import SRC
from tests.support.elf import nm

KALLSYMS = ("ffffffff81000000 T _stext\n"
            "ffffffff81000100 t do_thing\n"
            "ffffffff81000200 d some_data\n"
            "ffffffff81000300 t ext4_read\t[ext4]\n")


@pytest.fixture
def child(fixture_bin: Path) -> Iterator[tuple[int, Path, int]]:
    """(pid, executable, load base) of a running inline_lines."""
    exe = fixture_bin / "inline_lines"
    proc = subprocess.Popen([str(exe), "30"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        maps = Path(f"/proc/{proc.pid}/maps").read_text().splitlines()
        base = min(int(line.split("-")[0], 16) for line in maps if line.endswith(str(exe)))
        yield proc.pid, exe, base
    finally:
        proc.kill()
        proc.wait()


def instructions(path: Path, function: str) -> list[int]:
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--disassemble={function}",
                          str(path)], check=True, capture_output=True, text=True).stdout
    return [int(m.group(1), 16) for m in re.finditer(r"^\s+([0-9a-f]+):\s", out, re.M)]


def addr2line(path: Path, addr: int) -> list[tuple[str, int]]:
    """(function, line) innermost first, as binutils sees them."""
    out = subprocess.run(["addr2line", "-f", "-i", "-e", str(path), f"{addr:#x}"],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    return [(func, int(where.rsplit(":", 1)[1].split()[0]))
            for func, where in zip(out[::2], out[1::2], strict=True)]


def test_user_address_named_with_offset(child: tuple[int, Path, int]) -> None:
    pid, exe, base = child
    work = nm(exe)["work"]
    addr = base + work + 3
    assert describe(pid, [addr]) == [f"{addr:#x} work+0x3 {exe}"]
    assert describe(pid, iter([addr, 0x10])) == [f"{addr:#x} work+0x3 {exe}",
                                                 "0x10 [unknown] [unmapped]"]


def test_lines_give_the_inlined_chain(child: tuple[int, Path, int]) -> None:
    pid, exe, base = child
    work = nm(exe)["work"]
    chains = {a: addr2line(exe, a) for a in instructions(exe, "work")}
    vaddr = next(a for a, c in chains.items() if [f for f, _ in c] == ["scramble", "mix", "work"])
    addr = base + vaddr
    source = str((SRC / "inline_lines.c").resolve())
    [s_line, m_line, w_line] = [line for _, line in chains[vaddr]]
    assert describe(pid, [addr], lines=True) == [
        f"{addr:#x} work+{vaddr - work:#x} {exe}",
        f"  scramble {source}:{s_line} (inlined)",
        f"  mix {source}:{m_line} (inlined)",
        f"  work {source}:{w_line}",
    ]
    assert describe(pid, [addr]) == [f"{addr:#x} work+{vaddr - work:#x} {exe}"]


def test_anonymous_memory_is_named_anon() -> None:
    maps = Path("/proc/self/maps").read_text().splitlines()
    start = next(int(line.split("-")[0], 16) for line in maps if len(line.split()) == 5)
    [line] = describe(os.getpid(), [start + 8])
    assert line.startswith(f"{start + 8:#x} ") and line.endswith(" [anon]")


def test_kernel_addresses_from_kallsyms(tmp_path: Path) -> None:
    kallsyms = tmp_path / "kallsyms"
    kallsyms.write_text(KALLSYMS)
    got = describe(os.getpid(), [0xFFFFFFFF81000110, 0xFFFFFFFF81000310, 0xFFFF800000000010],
                   kallsyms=kallsyms)
    assert got == ["0xffffffff81000110 do_thing+0x10 [kernel.kallsyms]",
                   "0xffffffff81000310 ext4_read [ext4]+0x10 [kernel.kallsyms]",
                   "0xffff800000000010 [unknown] [kernel.kallsyms]"]


def test_kallsyms_read_only_for_kernel_addresses(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert describe(os.getpid(), [0x10], kallsyms=missing) == ["0x10 [unknown] [unmapped]"]
    with pytest.raises(SymbolizationError, match="cannot read"):
        describe(os.getpid(), [0xFFFFFFFF81000110], kallsyms=missing)
    hidden = tmp_path / "kallsyms"  # what an unprivileged reader sees
    hidden.write_text(re.sub(r"^ffffffff8100\d{4}", "0" * 16, KALLSYMS, flags=re.M))
    with pytest.raises(SymbolizationError, match="shows no addresses"):
        describe(os.getpid(), [0xFFFFFFFF81000110], kallsyms=hidden)


def test_kallsyms_errors_come_in_the_order_of_the_addresses(tmp_path: Path) -> None:
    """A kernel address is named from kallsyms as it is read: its error comes
    before that of an address read after it, however many are named at once."""
    def addresses() -> Iterator[int]:
        yield 0x10
        yield 0xFFFFFFFF81000110
        raise UsageError("not a hex address: 'zz'")

    for batch in (1, 2, 3, 1 << 16):
        with pytest.raises(SymbolizationError, match="cannot read"):
            describe(os.getpid(), addresses(), kallsyms=tmp_path / "missing", batch=batch)
        with pytest.raises(UsageError, match="not a hex"):
            describe(os.getpid(), (a for a in addresses() if a < KERNEL_MAPPING.start),
                     kallsyms=tmp_path / "missing", batch=batch)


def test_no_such_process(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no process with PID 42 "):
        describe(42, [0x10], procfs=ProcFS(tmp_path))
    consumed = []

    def addresses() -> Iterator[int]:
        consumed.append(True)
        yield 0x10

    with pytest.raises(UsageError):
        describe(999999999, addresses())
    assert not consumed  # the addresses are not read when there is no process


def function_addresses(maps: tuple[MapEntry, ...], rng: random.Random, n: int) -> list[int]:
    """n random points inside random functions of the executable mappings."""
    pool = []
    for m in maps:
        if not (m.executable and m.file_backed):
            continue
        elf = ElfSymbols(m.path)
        text = elf.text_segment
        assert text is not None
        for f in elf.functions():
            off = f.start - text.vaddr + text.offset
            if m.offset <= off < m.offset + m.end - m.start:
                pool.append((m.start + off - m.offset, max(f.size, 1)))
    return [base + rng.randrange(size) for base, size in (rng.choice(pool) for _ in range(n))]


def everywhere(maps: tuple[MapEntry, ...], rng: random.Random) -> list[int]:
    """The edges of every mapping and of the address space's halves, points
    in and around every mapping (anonymous memory, vdso, gaps), kernel
    addresses, and what the command line lets through (negative, > 64 bits)."""
    edges = [a + d for m in maps for a in (m.start, m.end) for d in (-1, 0, 1)]
    around = [rng.randrange(m.start - 0x10000, m.end + 0x10000) for m in maps for _ in range(40)]
    vdso = [a for m in maps if m.path == "[vdso]" for a in range(m.start, m.end, 16)]
    kernel = [KERNEL_MAPPING.start - 1, KERNEL_MAPPING.start, 0xFFFFFFFF81000000 - 1,
              *range(0xFFFFFFFF81000000, 0xFFFFFFFF81000400, 0x3F), 2**64 - 1, 2**64 + 5]
    return edges + around + vdso + kernel + [0, 1, -16]


def test_batches_name_as_one_at_a_time(fixture_bin: Path, tmp_path: Path) -> None:
    """What ember symbolize prints of many addresses of a live C++ process
    is the same named in batches (of any size) as named one by one:
    functions of the executable and its libraries, data, anonymous memory,
    the vdso, nothing mapped, the kernel."""
    kallsyms = tmp_path / "kallsyms"
    kallsyms.write_text(KALLSYMS)
    proc = subprocess.Popen([str(fixture_bin / "cpp_names"), "30"], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        maps = ProcFS().read(proc.pid)
        assert maps is not None
        rng = random.Random(11)
        addrs = function_addresses(maps.maps, rng, 20000) + everywhere(maps.maps, rng)
        rng.shuffle(addrs)
        one = describe(proc.pid, addrs, kallsyms=kallsyms, batch=1)
        assert describe(proc.pid, iter(addrs), kallsyms=kallsyms) == one
        assert describe(proc.pid, addrs, kallsyms=kallsyms, batch=97) == one
    finally:
        proc.kill()
        proc.wait()
    assert len(one) == len(addrs)
    ends = {line.rsplit(" ", 1)[1] for line in one}
    assert {"[unmapped]", "[vdso]", "[heap]", "[stack]", "[anon]", "[kernel.kallsyms]",
            str(fixture_bin / "cpp_names")} <= ends
    assert any("ember_test::Accumulator<unsigned long>::operator()" in line for line in one)
    assert any(re.search(r" do_thing\+0x\w+ \[kernel", line) for line in one)
    assert any(re.search(r" clock_gettime \[vdso\]$", line) for line in one)
    assert any(re.search(r" libc\.so\.6\+0x\w+ /", line) for line in one)  # no function there
    assert sum(bool(re.search(r"\+0x\w+ /", line)) for line in one) > 19000


def test_batches_name_lines_as_one_at_a_time(child: tuple[int, Path, int]) -> None:
    pid, exe, base = child
    maps = ProcFS().read(pid)
    assert maps is not None
    rng = random.Random(12)
    work = instructions(exe, "work")
    addrs = [base + a for a in range(work[0] - 64, work[-1] + 64)] + [
        a for a in everywhere(maps.maps, rng) if a < KERNEL_MAPPING.start
        and ((m := maps.find(a)) is None or not m.file_backed)]  # libc's DWARF: slow
    one = describe(pid, addrs, lines=True, batch=1)
    assert describe(pid, addrs, lines=True) == one
    assert sum(line.endswith("(inlined)") for line in one) > 10
