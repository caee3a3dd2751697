"""The table loader against in-memory maps: what each process's entry says,
objects shared, eviction when full (never of tables in use), processes that
went away."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember import abi
from ember.symbols.elf import ElfSymbols
from ember.symbols.procmaps import MapEntry, Process, ProcFS
from ember.unwind.loader import RowAllocator, TableLoader
from ember.unwind.tables import build_table

BASE = 0x5555_0000_0000
ROW = 12


class FakeTarget:
    def __init__(self, rows: int, processes: int = 16):
        self.row_capacity = rows
        self.process_capacity = processes
        self.rows = bytearray(rows * ROW)
        self.procs: dict[int, abi.UnwindProc] = {}

    def write_rows(self, start: int, rows: bytes) -> None:
        assert start * ROW + len(rows) <= len(self.rows)
        self.rows[start * ROW:start * ROW + len(rows)] = rows

    def set_process(self, pid: int, proc: abi.UnwindProc) -> None:
        self.procs[pid] = proc

    def forget_process(self, pid: int) -> None:
        del self.procs[pid]


class FakeProcFS(ProcFS):
    """Objects are opened at their own path; start times are set by the test."""

    def __init__(self) -> None:
        super().__init__(Path("/nonexistent"))
        self.started: dict[int, int] = {}

    def object_candidates(self, pid: int, entry: MapEntry) -> list[Path]:
        return [Path(entry.path)]

    def start_time(self, pid: int) -> int | None:
        return self.started.get(pid)


def process(pid: int, *objects: Path, start_time: int = 1) -> Process:
    maps = [MapEntry(BASE, BASE + 0x1000, "r-xp", 0, "00:00", 0, "[anon:jit]")]
    for i, path in enumerate(objects):
        seg = ElfSymbols(path, symbols=False).text_segment
        assert seg is not None
        start = BASE + (i + 1) * (1 << 32) + (seg.vaddr & ~0xFFF)
        maps.append(MapEntry(start, start + seg.memsz + 0x1000, "r-xp", seg.offset & ~0xFFF,
                             "08:01", path.stat().st_ino, str(path)))
    return Process.build(pid, start_time, False, str(objects[0]) if objects else None, maps)


@pytest.fixture
def objects(fixture_bin: Path) -> tuple[Path, Path]:
    return fixture_bin / "nofp_chain", fixture_bin / "libc_waits"


def loader(rows: int) -> tuple[TableLoader, FakeTarget, FakeProcFS]:
    target, fs = FakeTarget(rows), FakeProcFS()
    return TableLoader([target], procfs=fs), target, fs


def test_a_process_entry_points_at_its_objects_rows(objects: tuple[Path, Path]) -> None:
    chain, _ = objects
    table = build_table(chain)
    ld, target, _ = loader(4096)
    proc = process(10, chain)
    ld.load(proc)
    entry = target.procs[10]
    assert entry.count == 2
    jit, obj = entry.maps[0], entry.maps[1]
    assert (jit.start, jit.row_count) == (BASE, 0)  # no table: frame pointers there
    assert obj.start == proc.maps[1].start and obj.row_count == table.row_count
    # ip - bias = the object's own address (its rows' pcs)
    vaddr = ElfSymbols(chain, symbols=False).vaddr_of_offset(proc.maps[1].offset)
    assert vaddr is not None and obj.bias == obj.start - vaddr
    at = obj.row_start * ROW
    assert bytes(target.rows[at:at + len(table.rows)]) == table.rows
    assert ld.stats.tables_loaded == 1 and ld.stats.processes == 1


def test_processes_share_an_objects_rows(objects: tuple[Path, Path]) -> None:
    chain, _ = objects
    ld, target, _ = loader(4096)
    ld.load(process(10, chain))
    ld.load(process(11, chain))
    assert ld.stats.tables_loaded == 1
    assert target.procs[10].maps[1].row_start == target.procs[11].maps[1].row_start


def test_full_evicts_only_unused_tables_then_falls_back(objects: tuple[Path, Path]) -> None:
    chain, waits = objects
    big = max(build_table(chain).row_count, build_table(waits).row_count)
    ld, target, fs = loader(big + 1)  # room for one object at a time
    ld.load(process(10, chain))
    ld.load(process(11, waits))
    # the first object is in use: never evicted; the second gets no rows
    assert target.procs[10].maps[1].row_count > 0
    assert target.procs[11].maps[1].row_count == 0
    assert ld.stats.tables_failed == {"full": 1} and ld.stats.tables_evicted == 0
    # the first process goes away: its table makes room for the second's
    fs.started = {11: 1}
    ld.sweep()
    assert 10 not in target.procs
    ld.load(process(11, waits))
    assert target.procs[11].maps[1].row_count > 0
    assert ld.stats.tables_evicted == 1


def test_sweep_forgets_reused_pids(objects: tuple[Path, Path]) -> None:
    chain, _ = objects
    ld, target, fs = loader(4096)
    ld.load(process(10, chain, start_time=5))
    fs.started = {10: 5}
    ld.sweep()
    assert 10 in target.procs
    fs.started = {10: 6}  # another process got the PID
    ld.sweep()
    assert 10 not in target.procs and ld.stats.processes == 0


def test_unreadable_objects_are_counted_not_fatal(tmp_path: Path) -> None:
    bad = tmp_path / "libbad.so"
    bad.write_bytes(b"\x7fELF" + b"\0" * 60)
    ld, target, _ = loader(4096)
    start = BASE + (1 << 32)
    ld.load(Process.build(10, 1, False, None, [
        MapEntry(BASE, BASE + 0x1000, "r-xp", 0, "00:00", 0, "[anon:jit]"),
        MapEntry(start, start + 0x1000, "r-xp", 0, "08:01", 7, str(bad))]))
    assert target.procs[10].maps[1].row_count == 0
    assert sum(ld.stats.tables_failed.values()) == 1


def test_row_allocator_reuses_and_merges_free_ranges() -> None:
    a = RowAllocator(100)
    x, y, z = a.take(30), a.take(30), a.take(30)
    assert (x, y, z) == (0, 30, 60) and a.take(20) is None
    a.give(30, 30)
    a.give(0, 30)
    assert a.take(60) == 0  # the two freed ranges merged


def test_the_host_wide_scan_loads_every_process_but_the_excluded(
        objects: tuple[Path, Path]) -> None:
    chain, waits = objects
    procs = {10: process(10, chain), 11: process(11, waits), 12: process(12, chain)}
    target, fs = FakeTarget(4096), FakeProcFS()
    fs.pids = lambda: list(procs)  # type: ignore[method-assign]
    fs.read = procs.get  # type: ignore[method-assign]
    ld = TableLoader([target], procfs=fs)
    ld.start()
    try:
        ld.submit_all(exclude=[12])
        assert ld.wait_idle(10)
    finally:
        ld.stop()
    assert set(target.procs) == {10, 11}
