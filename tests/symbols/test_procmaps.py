from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from ember.symbols.procmaps import PF_KTHREAD, ProcessTable, ProcFS, parse_maps, parse_stat
from tests.support.procfs import write_proc

MAPS = """\
55d0c8a00000-55d0c8a01000 r--p 00000000 08:01 1234                       /usr/bin/app
55d0c8a01000-55d0c8a02000 r-xp 00001000 08:01 1234                       /usr/bin/app
7f1e2a000000-7f1e2a1d5000 r-xp 00026000 08:01 99                         /lib/libc.so.6 (deleted)
7ffd1c5e0000-7ffd1c601000 rw-p 00000000 00:00 0                          [stack]
garbage line
7ffd1c7f2000-7ffd1c7f4000 r-xp 00000000 00:00 0                          [vdso]
"""


def test_parse_maps() -> None:
    entries = parse_maps(MAPS)
    assert len(entries) == 5
    text = entries[1]
    assert (text.start, text.end, text.offset, text.inode) == (0x55D0C8A01000, 0x55D0C8A02000,
                                                              0x1000, 1234)
    assert text.executable and text.file_backed and not text.deleted
    assert entries[2].deleted and entries[2].file_backed
    assert not entries[3].file_backed and entries[4].path == "[vdso]"


def test_parse_stat_comm_with_parens_and_spaces() -> None:
    fields = ["R", "1", "1", "1", "0", "-1", str(PF_KTHREAD)] + ["0"] * 12 + ["777"] + ["0"] * 5
    flags, start = parse_stat("12 (we ird) (x) " + " ".join(fields))
    assert flags == PF_KTHREAD and start == 777


def test_procfs_fixture_and_find(tmp_path: Path) -> None:
    write_proc(tmp_path, 10, MAPS)
    write_proc(tmp_path, 2, "", comm="kworker/0:1", flags=PF_KTHREAD)
    fs = ProcFS(tmp_path)
    p = fs.read(10)
    assert p is not None and not p.kernel_thread and p.start_time == 4242
    m = p.find(0x55D0C8A01800)
    assert m is not None and m.path == "/usr/bin/app"
    assert p.find(0x1000) is None and p.find(0x55D0C8A02000) is None
    k = fs.read(2)
    assert k is not None and k.kernel_thread and k.maps == ()
    assert fs.read(99) is None
    write_proc(tmp_path, 3, "")  # a zombie: stat but no maps
    assert fs.read(3) is None
    cands = fs.object_candidates(10, p.maps[2])
    assert cands[0] == tmp_path / "10/root/lib/libc.so.6"
    assert cands[1] == tmp_path / "10/map_files/7f1e2a000000-7f1e2a1d5000"


def test_find_many_is_find(tmp_path: Path) -> None:
    """The vectorized search gives the mapping find() gives, at every edge."""
    write_proc(tmp_path, 10, MAPS)
    write_proc(tmp_path, 2, "", comm="kworker/0:1", flags=PF_KTHREAD)
    fs = ProcFS(tmp_path)
    p, k = fs.read(10), fs.read(2)
    assert p is not None and k is not None
    rng = random.Random(5)
    edges = [a + d for m in p.maps for a in (m.start, m.end) for d in (-1, 0, 1)]
    addrs = edges + [rng.randrange(m.start - 4096, m.end + 4096) for m in p.maps
                     for _ in range(200)] + [0, 2**64 - 1]
    where = p.find_many(np.array(addrs, dtype=np.uint64)).tolist()
    assert [p.maps[i] if i >= 0 else None for i in where] == [p.find(a) for a in addrs]
    assert -1 in where and {i for i in where if i >= 0} == set(range(len(p.maps)))
    assert k.find_many(np.array(addrs, dtype=np.uint64)).tolist() == [-1] * len(addrs)
    assert p.find_many(np.array([], dtype=np.uint64)).tolist() == []


def test_table_remembers_exited_processes(tmp_path: Path) -> None:
    write_proc(tmp_path, 10, MAPS)
    table = ProcessTable(ProcFS(tmp_path), keep_rounds=2)
    table.refresh([10])
    (tmp_path / "10" / "maps").unlink()  # the process exits
    table.refresh([10])
    assert table.get(10) is not None
    for _ in range(3):
        table.expire()
    assert len(table) == 0
    assert table.get(10) is None


def test_maps_read_again_unchanged_are_the_same_process(tmp_path: Path) -> None:
    """What was built from a process's maps (frames) stays valid when they
    are read again unchanged; changed maps are a new Process."""
    write_proc(tmp_path, 10, MAPS)
    table = ProcessTable(ProcFS(tmp_path))
    first = table.get(10)
    assert first is not None
    table.refresh([10])
    assert table.get(10) is first
    (tmp_path / "10/maps").write_text(MAPS + "7f0000000000-7f0000001000 rw-p 00000000 00:00 0\n")
    table.refresh([10])
    again = table.get(10)
    assert again is not first and again is not None and len(again.maps) == len(first.maps) + 1
