"""User and kernel frames from a fixture /proc and from a live process."""

from __future__ import annotations

import random
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from ember.model import FrameKind
from ember.symbols.elf import ElfSymbols
from ember.symbols.objects import ObjectCache
from ember.symbols.procmaps import MapEntry, ProcessTable, ProcFS
from ember.symbols.symbolizer import Symbolizer
from tests.support.elf import nm
from tests.support.procfs import write_proc

PIE_BASE = 0x55D0C8A00000
LIB_BASE = 0x7F1E2A000000


def maps_lines(path: Path, base: int) -> list[str]:
    """The lines the kernel would write for an object mapped at base."""
    lines = []
    for seg in ElfSymbols(path).segments:
        start = base + (seg.vaddr & ~0xFFF)
        end = base + ((seg.vaddr + seg.memsz + 0xFFF) & ~0xFFF)
        perms = "r-xp" if seg.executable else "r--p"
        inode = path.stat().st_ino if path.exists() else 77  # as the kernel reports it
        lines.append(f"{start:x}-{end:x} {perms} {seg.offset & ~0xFFF:08x} 08:01 {inode} {path}")
    return lines


def fixture_proc(tmp_path: Path, fixture_bin: Path) -> ProcFS:
    maps = (maps_lines(fixture_bin / "pie_main", PIE_BASE)
            + maps_lines(fixture_bin / "libember_demo.so", LIB_BASE)
            + [f"{0x7FFD00000000:x}-{0x7FFD00002000:x} r-xp 00000000 00:00 0 [vdso]"])
    write_proc(tmp_path, 42, "\n".join(maps) + "\n")
    return ProcFS(tmp_path)


def mixed_proc(tmp_path: Path, fixture_bin: Path) -> ProcFS:
    """fixture_proc's maps and anonymous memory: heap, an anonymous mapping."""
    fixture_proc(tmp_path / "base", fixture_bin)
    maps = (tmp_path / "base/42/maps").read_text()
    write_proc(tmp_path / "mixed", 42, maps + "7f3000000000-7f3000100000 rw-p 00000000 00:00 0 \n"
                                             "55d0d0000000-55d0d0021000 rw-p 00000000 00:00 0 "
                                             "[heap]\n")
    return ProcFS(tmp_path / "mixed")


def spread(maps: Sequence[MapEntry], rng: random.Random, n: int) -> list[int]:
    """Addresses at the edges of every mapping, n inside or around each, and
    the ends of the address space."""
    edges = [a + d for m in maps for a in (m.start, m.end) for d in (-1, 0, 1)]
    return edges + [rng.randrange(m.start - 0x2000, m.end + 0x2000) for m in maps
                    for _ in range(n)] + [0, 2**64 - 1]


def function_points(fixture_bin: Path, rng: random.Random, n: int) -> list[int]:
    """n addresses inside functions of pie_main and libember_demo.so, and
    their first bytes (a return address there is a call in the function
    before)."""
    pool = [base + start + d for name, base in (("pie_main", PIE_BASE),
                                                ("libember_demo.so", LIB_BASE))
            for start in nm(fixture_bin / name).values() for d in (0, 1, 5)]
    return [rng.choice(pool) for _ in range(n)]


def test_name_many_is_find_and_lookup(tmp_path: Path, fixture_bin: Path) -> None:
    sym = Symbolizer(ProcessTable(mixed_proc(tmp_path, fixture_bin)))
    proc = sym.processes.get(42)
    assert proc is not None
    rng = random.Random(1)
    addrs = spread(proc.maps, rng, 300) + function_points(fixture_bin, rng, 2000)
    named = sym.name_many(42, addrs)
    expected = [(e, sym.lookup(42, e, a) if e is not None and e.file_backed else None)
                for a in addrs for e in [proc.find(a)]]
    assert [named[k] for k in range(len(named))] == expected
    assert sum(hit is not None for _, hit in expected) > 1000
    assert sum(e is None for e, _ in expected) > 100
    assert sum(e is not None and not e.file_backed for e, _ in expected) > 300
    assert len(sym.name_many(42, [])) == 0
    assert [sym.name_many(99, [0x10, PIE_BASE])[k] for k in range(2)] == [(None, None)] * 2


def drain(fixture_bin: Path, proc_maps: Sequence[MapEntry], seed: int
          ) -> list[tuple[int, list[int]]]:
    """Stacks of pid 42 as a drain has them, leaf first, and a few of a PID
    that does not exist."""
    rng = random.Random(seed)
    pool = spread(proc_maps, rng, 20) + function_points(fixture_bin, rng, 500)
    stacks = [(42, [rng.choice(pool) for _ in range(rng.randrange(0, 30))])
              for _ in range(400)]
    return [*stacks, (99, [PIE_BASE + 0x1000, 0x10])]


def test_prepare_gives_the_frames_user_frames_builds(tmp_path: Path, fixture_bin: Path) -> None:
    procfs = mixed_proc(tmp_path, fixture_bin)
    maps = ProcessTable(procfs).get(42)
    assert maps is not None
    stacks = drain(fixture_bin, maps.maps, 2)
    plain = Symbolizer(ProcessTable(procfs))
    expected = [plain.user_frames(pid, ips) for pid, ips in stacks]
    sym = Symbolizer(ProcessTable(procfs))
    sym.prepare(stacks)
    assert [sym.user_frames(pid, ips) for pid, ips in stacks] == expected
    assert (sym.stats.frames, sym.stats.unknown_frames) == \
        (plain.stats.frames, plain.stats.unknown_frames)


def test_prepared_frames_are_used_once_per_maps(tmp_path: Path, fixture_bin: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """After prepare, user_frames names every function without lookup() (it
    finds nothing here: what has a function was prepared); prepare again
    with the same maps names nothing, with maps read again all again."""
    procfs = ProcFS(tmp_path)
    fixture_proc(tmp_path, fixture_bin)
    rng = random.Random(3)
    pool = function_points(fixture_bin, rng, 1000)
    stacks = [(42, rng.sample(pool, rng.randrange(1, 30))) for _ in range(200)]
    plain = Symbolizer(ProcessTable(procfs))
    expected = [plain.user_frames(pid, ips) for pid, ips in stacks]
    sym = Symbolizer(ProcessTable(procfs))
    batches: list[object] = []
    real = sym.lookup_many
    monkeypatch.setattr(sym, "lookup_many", lambda *a: batches.append(a) or real(*a))
    monkeypatch.setattr(sym, "lookup", lambda *a: None)
    sym.prepare(stacks)
    assert len(batches) == 2  # pie_main's text, the library's text
    assert [sym.user_frames(pid, ips) for pid, ips in stacks] == expected
    sym.prepare(stacks)
    assert len(batches) == 2
    sym.processes.refresh([42])  # maps read again, unchanged: the same Process
    sym.prepare(stacks)
    assert len(batches) == 2
    maps = tmp_path / "42/maps"  # a library mapped (dlopen): another Process
    maps.write_text(maps.read_text() + "7f3000000000-7f3000001000 r-xp 00000000 08:01 9 /lib/x\n")
    sym.processes.refresh([42])
    sym.prepare(stacks)
    assert len(batches) == 4
    assert [sym.user_frames(pid, ips) for pid, ips in stacks] == expected


def test_an_address_outside_the_maps_keeps_the_frames_built(
        tmp_path: Path, fixture_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An address no mapping covers has the maps read again, once a drain:
    unchanged, they are the same Process, and the frames built from them
    stay valid (before, every drain built them all again)."""
    sym = Symbolizer(ProcessTable(fixture_proc(tmp_path, fixture_bin)))
    stack = [0x10, PIE_BASE + nm(fixture_bin / "pie_main")["main"] + 30]
    first = sym.user_frames(42, stack)
    sym.processes.expire()  # the next drain

    def fail(*_: object) -> None:
        raise AssertionError("looked up again")

    monkeypatch.setattr(sym, "lookup", fail)
    assert sym.user_frames(42, stack) == first
    assert [f.name for f in first] == ["[unknown]", "main"]


def test_prepare_reads_maps_again_as_user_frames_would(
        tmp_path: Path, fixture_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library mapped since the maps were read: prepare reads them again
    for the address outside them, and user_frames then reads nothing."""
    procfs = ProcFS(tmp_path)
    fixture_proc(tmp_path, fixture_bin)
    sym = Symbolizer(ProcessTable(procfs))
    sym.processes.touch([42])
    lib = nm(fixture_bin / "libember_demo.so")
    maps = tmp_path / "42/maps"
    lines = maps.read_text().splitlines()
    maps.write_text("\n".join(line for line in lines if "libember_demo" not in line) + "\n")
    sym.processes.refresh([42])
    maps.write_text("\n".join(lines) + "\n")  # dlopen
    stack = [LIB_BASE + lib["lib_spin"] + 5, PIE_BASE + nm(fixture_bin / "pie_main")["main"] + 30]
    sym.prepare([(42, stack)])
    reads: list[object] = []
    real = sym.processes.refresh
    monkeypatch.setattr(sym.processes, "refresh", lambda pids: reads.append(pids) or real(pids))
    assert [f.name for f in sym.user_frames(42, stack)] == ["lib_spin", "main"]
    assert reads == []


def test_prepare_leaves_lines_to_user_frames(tmp_path: Path, fixture_bin: Path) -> None:
    sym = Symbolizer(ProcessTable(fixture_proc(tmp_path, fixture_bin)), lines=True)
    sym.prepare([(42, function_points(fixture_bin, random.Random(4), 50))])
    assert len(sym._frames) == 0


def test_pie_and_shared_library(tmp_path: Path, fixture_bin: Path) -> None:
    sym = Symbolizer(ProcessTable(fixture_proc(tmp_path, fixture_bin)))
    exe, lib = nm(fixture_bin / "pie_main"), nm(fixture_bin / "libember_demo.so")
    ips = [LIB_BASE + lib["lib_spin"] + 5, LIB_BASE + lib["lib_burn"] + 9,
           PIE_BASE + exe["main"] + 30, 0x7FFD00000010, 0x10]
    frames = sym.user_frames(42, ips)
    assert [f.name for f in frames[:3]] == ["lib_spin", "lib_burn", "main"]
    assert frames[0].mapping is not None and frames[0].mapping.path.endswith("libember_demo.so")
    assert frames[2].mapping is not None and frames[2].mapping.path.endswith("pie_main")
    assert frames[0].mapping.build_id == ElfSymbols(fixture_bin / "libember_demo.so").build_id
    assert frames[3].name == "[vdso]" and frames[4].name == "[unknown]"
    assert all(f.kind == FrameKind.USER for f in frames)
    assert sym.stats.unknown_frames == 2


def test_return_addresses_looked_up_one_byte_earlier(tmp_path: Path, fixture_bin: Path) -> None:
    sym = Symbolizer(ProcessTable(fixture_proc(tmp_path, fixture_bin)))
    exe = nm(fixture_bin / "pie_main")
    # the first address past exe_burn belongs to the next function as a leaf,
    # but as a return address (not the first frame) it is a call in exe_burn.
    after = sorted(a for a in exe.values() if a > exe["exe_burn"])[0]
    leaf, caller = sym.user_frames(42, [PIE_BASE + after, PIE_BASE + after])
    assert caller.name == "exe_burn" and leaf.name != "exe_burn"


def test_unreadable_object_keeps_its_name(tmp_path: Path, fixture_bin: Path) -> None:
    bad = tmp_path / "libbroken.so"
    bad.write_bytes(b"\x7fELF" + b"\xff" * 200)
    write_proc(tmp_path, 7, f"7f0000000000-7f0000010000 r-xp 00002000 08:01 "
                            f"{bad.stat().st_ino} {bad}\n")
    sym = Symbolizer(ProcessTable(ProcFS(tmp_path)), objects=ObjectCache())
    [f] = sym.user_frames(7, [0x7F0000000100])
    assert f.name == "libbroken.so+0x2100"
    assert sym.stats.object_errors == 1
    sym.user_frames(7, [0x7F0000000200])
    assert sym.stats.object_errors == 1  # the failure is cached, not retried


def test_cache_is_bounded(tmp_path: Path, fixture_bin: Path) -> None:
    cache = ObjectCache(max_bytes=1)
    for name in ("pie_main", "libember_demo.so", "cpu_shares"):
        cache.open([fixture_bin / name])
    assert len(cache) == 1


def test_cache_resized_keeps_what_fits(fixture_bin: Path) -> None:
    # the agent sizes it again once its BPF programs are loaded
    cache = ObjectCache()
    names = ("pie_main", "libember_demo.so", "cpu_shares")
    for name in names:
        cache.open([fixture_bin / name])
    assert len(cache) == 3
    cache.resize(1)
    assert len(cache) == 1 and cache.max_bytes == 1 and cache.dwarf.max_bytes == 1
    cache.resize(256 << 20)
    for name in names:
        cache.open([fixture_bin / name])
    assert len(cache) == 3


def test_live_process(fixture_bin: Path) -> None:
    """A real process: maps from the live /proc, addresses from nm plus the
    load base the kernel chose."""
    proc = subprocess.Popen([str(fixture_bin / "pie_main"), "5"], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        table = ProcessTable()
        p = table.get(proc.pid)
        assert p is not None
        base = min(m.start for m in p.maps if m.path.endswith("/pie_main"))
        exe = nm(fixture_bin / "pie_main")
        [f] = Symbolizer(table).user_frames(proc.pid, [base + exe["exe_burn"] + 4])
        assert f.name == "exe_burn"
    finally:
        proc.kill()
        proc.wait()


def test_vdso_named_from_our_own_copy(tmp_path: Path) -> None:
    """Any process's [vdso] addresses are named with this process's vdso image."""
    own = next(line for line in Path("/proc/self/maps").read_text().splitlines()
               if line.endswith("[vdso]"))
    lo, hi = (int(x, 16) for x in own.split()[0].split("-"))
    sym = Symbolizer(ProcessTable())
    vdso = sym._vdso_symbols()
    assert vdso is not None
    start = next(f.start for f in vdso.functions() if f.name == "clock_gettime")
    text = next(s for s in vdso.segments if s.executable)
    offset = start - text.vaddr + text.offset
    base = 0x7FFE00000000  # another process maps it elsewhere
    write_proc(tmp_path, 9, f"{base:x}-{base + hi - lo:x} r-xp 00000000 00:00 0 [vdso]\n")
    [f] = Symbolizer(ProcessTable(ProcFS(tmp_path))).user_frames(9, [base + offset + 2])
    assert f.name == "clock_gettime" and f.mapping is not None and f.mapping.path == "[vdso]"


def test_lines_and_inlined_frames(tmp_path: Path, fixture_bin: Path) -> None:
    """With lines, an address in inlined code is one frame per function,
    innermost first, all at the same address; the function itself keeps its
    symbol-table name and gets its line; without lines, one frame as ever."""
    exe = fixture_bin / "inline_lines"
    write_proc(tmp_path, 42, "\n".join(maps_lines(exe, PIE_BASE)) + "\n")
    table = ProcessTable(ProcFS(tmp_path))
    work = nm(exe)["work"]
    chains = {}
    for off in range(0, 0x60):
        frames = Symbolizer(table, lines=True).user_frames(42, [PIE_BASE + work + off])
        chains[off] = [(f.name, f.line, f.inlined) for f in frames]
        assert {f.address for f in frames} == {PIE_BASE + work + off}
        assert all(f.file.endswith("inline_lines.c") for f in frames)
    deepest = max(chains.values(), key=len)
    assert [(n, i) for n, _, i in deepest] == [("scramble", True), ("mix", True), ("work", False)]
    plain = Symbolizer(table).user_frames(42, [PIE_BASE + work + 0x52])
    assert [(f.name, f.line, f.inlined) for f in plain] == [("work", 0, False)]
    # the memo gives the same frames the second time
    sym = Symbolizer(table, lines=True)
    assert sym.user_frames(42, [PIE_BASE + work + 0x52]) == \
        sym.user_frames(42, [PIE_BASE + work + 0x52])
