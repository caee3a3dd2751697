"""symbols.describe, what ``ember symbolize`` prints: user addresses of live
child processes (no root needed), the inlined chain of a hot loop checked
against binutils' addr2line, kernel addresses from a kallsyms file."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ember.errors import SymbolizationError, UsageError
from ember.symbols.describe import describe
from ember.symbols.procmaps import ProcFS
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
