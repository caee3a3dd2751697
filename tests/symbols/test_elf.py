"""ELF symbol tables of the compiled fixtures, checked against binutils' nm,
and malformed input: a precise ElfError, never a crash."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.errors import ElfError
from ember.symbols.elf import ElfSymbols, Segment, SymbolIndex
from tests.support import BIN
from tests.support.elf import nm, nm_sized


@pytest.mark.parametrize("name", ["cpu_shares", "pie_main", "libember_demo.so", "cpp_names"])
def test_every_function_found_at_its_address(fixture_bin: Path, name: str) -> None:
    path = fixture_bin / name
    elf = ElfSymbols(path)
    assert elf.symbol_source == ".symtab"
    truth = nm_sized(path)
    checked = 0
    for sym, (addr, size) in truth.items():
        hit = elf.lookup(addr)
        assert hit is not None, sym
        assert hit[1] == 0
        if hit[0] == sym:
            checked += 1
        if size > 1:
            assert elf.lookup(addr + size // 2) == (hit[0], size // 2), sym
    assert checked >= len(truth) * 0.9  # aliases resolve to one of their names


def test_build_id_and_segments(fixture_bin: Path) -> None:
    elf = ElfSymbols(fixture_bin / "pie_main")
    readelf = subprocess.run(["readelf", "-n", str(fixture_bin / "pie_main")], check=True,
                             capture_output=True, text=True).stdout
    assert elf.build_id and elf.build_id in readelf
    assert any(s.executable for s in elf.segments)
    text = next(s for s in elf.segments if s.executable)
    assert elf.vaddr_of_offset(text.offset + 0x10) == text.vaddr + 0x10


def test_a_mapping_of_a_packed_segment_starts_a_page_below_it(fixture_bin: Path) -> None:
    """LLD's layout (a Rust binary's program headers): the executable
    segment begins inside the read-only segment's last page, so its
    mapping's offset, 0x15000, is covered by both; only the executable one
    gives the address the mapping starts at."""
    elf = ElfSymbols(fixture_bin / "pie_main", symbols=False)
    elf.segments = (Segment(0, 0, 0x1521C, 0x1521C, False),
                    Segment(0x15220, 0x16220, 0x40A80, 0x40A80, True),
                    Segment(0x55CA0, 0x57CA0, 0x2BA8, 0x3360, False))
    assert elf.vaddr_of_offset(0x15000) == 0x15000          # a page off
    assert elf.vaddr_of_mapping(0x15000, executable=True) == 0x16000
    assert elf.vaddr_of_mapping(0, executable=False) == 0
    assert elf.vaddr_of_mapping(0x55000, executable=False) == 0x57000
    # GNU ld's executable segment starts on a page: read as before
    gnu = ElfSymbols(fixture_bin / "pie_main", symbols=False)
    text = next(seg for seg in gnu.segments if seg.executable)
    start = text.offset & -4096
    assert gnu.vaddr_of_mapping(start, True) == text.vaddr - (text.offset - start)


def test_dynsym_fallback(tmp_path: Path, fixture_bin: Path) -> None:
    stripped = tmp_path / "lib.so"
    subprocess.run(["strip", "-o", str(stripped), str(fixture_bin / "libember_demo.so")],
                   check=True)
    elf = ElfSymbols(stripped)
    assert elf.symbol_source == ".dynsym"
    assert elf.lookup(nm(fixture_bin / "libember_demo.so")["lib_burn"]) == ("lib_burn", 0)


def test_missing_file() -> None:
    with pytest.raises(ElfError, match="cannot read"):
        ElfSymbols("/nonexistent/libfoo.so")


def test_truncated_and_random(tmp_path: Path, fixture_bin: Path) -> None:
    data = (fixture_bin / "pie_main").read_bytes()
    for i, blob in enumerate([data[:64], data[:1000], b"\x7fELF" + b"\0" * 60,
                              random.Random(1).randbytes(4096), b""]):
        p = tmp_path / f"bad{i}"
        p.write_bytes(blob)
        with pytest.raises(ElfError, match="malformed ELF"):
            ElfSymbols(p)


def test_corrupted_section_headers(tmp_path: Path, fixture_bin: Path) -> None:
    data = bytearray((fixture_bin / "pie_main").read_bytes())
    data[0x28:0x30] = (len(data) + 4096).to_bytes(8, "little")  # e_shoff past the end
    p = tmp_path / "bad"
    p.write_bytes(bytes(data))
    with pytest.raises(ElfError):
        ElfSymbols(p)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_mutated_elf(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    """Any mutation of a real object gives symbols or an ElfError, nothing else."""
    blob = bytearray((BIN / "libember_demo.so")
                     .read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(blob) - 1))
        blob[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    p = tmp_path_factory.mktemp("fuzz") / "obj"
    p.write_bytes(bytes(blob))
    try:
        elf = ElfSymbols(p)
    except ElfError:
        return
    elf.lookup(0x1000)
    elf.vaddr_of_offset(0x1000)


def _system_objects(n: int) -> list[Path]:
    libs = sorted(p for p in Path("/usr/lib/x86_64-linux-gnu").glob("*.so*")
                  if p.is_file() and not p.is_symlink())
    return libs[:: max(1, len(libs) // n)][:n]


def test_fast_reader_matches_pyelftools(fixture_bin: Path) -> None:
    """The struct/NumPy reader of 64-bit little-endian objects gives what the
    pyelftools path gives: segments, build id, debuglink, DWARF, symbols."""
    from ember.symbols.elf import _load_elf64le

    paths = [fixture_bin / n for n in ("cpu_shares", "pie_main", "libember_demo.so",
                                       "cpp_names", "inline_lines")] + _system_objects(40)
    for path in paths:
        fast = ElfSymbols(path)
        slow = ElfSymbols.__new__(ElfSymbols)
        slow.path = str(path)
        with open(path, "rb") as f:
            slow._load_pyelftools(f)
        for attr in ("elf_type", "segments", "build_id", "debuglink", "debuglink_crc",
                     "dwarf_path", "symbol_source"):
            assert getattr(fast, attr) == getattr(slow, attr), (path, attr)
        assert fast.functions() == slow.functions(), path
        with open(path, "rb") as f:
            probe = ElfSymbols.__new__(ElfSymbols)
            probe.path = str(path)
            assert _load_elf64le(probe, f), path


def test_batch_lookup_matches_single(fixture_bin: Path) -> None:
    elf = ElfSymbols(fixture_bin / "cpp_names")
    rng = random.Random(3)
    hi = max(f.start + f.size for f in elf.functions()) + 64
    addrs = [rng.randrange(0, hi) for _ in range(5000)] + [0, 2**64 - 1]
    assert elf.lookup_many(addrs) == [elf.lookup(a) for a in addrs]
    assert sum(hit is not None for hit in elf.lookup_many(addrs)) > 100


@pytest.mark.parametrize("name", ["cpu_shares", "pie_main", "libember_demo.so"])
def test_batch_vaddrs_and_search_match_single(fixture_bin: Path, name: str) -> None:
    """vaddrs_of_offsets and SymbolIndex.search are vaddr_of_offset and
    lookup for many at once, at the segments' and functions' edges too."""
    elf = ElfSymbols(fixture_bin / name)
    rng = random.Random(4)
    edges = [a + d for s in elf.segments for a in (s.offset, s.offset + s.filesz)
             for d in (-1, 0, 1)]
    offsets = [o for o in edges if o >= 0] + [rng.randrange(0, 1 << 16) for _ in range(3000)]
    vaddrs, mapped = elf.vaddrs_of_offsets(np.array(offsets, dtype=np.uint64))
    assert [v if ok else None for v, ok in zip(vaddrs.tolist(), mapped.tolist(), strict=True)] \
        == [elf.vaddr_of_offset(o) for o in offsets]
    assert not mapped.all() and mapped.any()
    funcs = elf.functions()
    addrs = [a + d for f in funcs for a in (f.start, f.start + f.size) for d in (-1, 0, 1)]
    addrs += [rng.randrange(0, funcs[-1].start + 4096) for _ in range(3000)] + [0, 2**64 - 1]
    found, into = elf.index.search(np.array(addrs, dtype=np.uint64))
    got = [(elf.index.name(i), off) if i >= 0 else None
           for i, off in zip(found.tolist(), into.tolist(), strict=True)]
    assert got == [elf.lookup(a) for a in addrs]
    found, _ = SymbolIndex.empty().search(np.array(addrs[:5], dtype=np.uint64))
    assert found.tolist() == [-1] * 5
