"""Tables of whole objects: a program compiled without frame pointers is
covered function by function; .debug_frame (in the object or a separate
debug file) stands in for a thin .eh_frame; the disk cache round-trips,
rebuilds what is corrupt and keeps nothing it cannot name by build id."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from ember.errors import UnwindTableError
from ember.unwind.cfa import CFA_END, CFA_PLT, CFA_RBP, CFA_RSP, RBP_SAME, ROW
from ember.unwind.tables import DiskUnwindCache, UnwindTable, build_table, cached_table, lookup
from tests.support.elf import nm_sized

PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) long leaf(long x) { return x * 3 + 1; }

__attribute__((noinline)) long with_vla(int n) {  /* a VLA: CFA from rbp */
    volatile char buf[n];
    memset((char *)buf, n, n);
    return buf[n / 2] + leaf(n);
}

__attribute__((noinline)) long recurse(long n) {
    return n <= 1 ? leaf(n) : recurse(n - 1) + recurse(n - 2) + 1;
}

__attribute__((noinline)) long many_saved(long a, long b, long c) {
    long x = leaf(a), y = leaf(b), z = leaf(c), w = leaf(x + y);
    return x * y + z * w + leaf(x ^ z) + a * b * c;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10;
    printf("%ld\n", with_vla((int)n + 16) + recurse(n) + many_saved(n, n + 1, n + 2));
    return 0;
}
"""
FUNCTIONS = ("leaf", "with_vla", "recurse", "many_saved", "main")


def compile_program(out: Path, *flags: str) -> Path:
    src = out / "program.c"
    src.write_text(PROGRAM)
    exe = out / ("program" + "".join(flags).replace("-", "_").replace("=", "_"))
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", *flags, "-o", str(exe), str(src)],
                   check=True)
    return exe


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_program(tmp_path_factory.mktemp("unwind"))


def assert_covers_every_function(table: UnwindTable, exe: Path) -> None:
    symbols = nm_sized(exe)
    for name in FUNCTIONS:
        start, size = symbols[name]
        assert size > 0, name
        entry = lookup(table, start)
        assert entry is not None and (entry.cfa_type, entry.cfa_offset, entry.rbp_type) == (
            CFA_RSP, 8, RBP_SAME), name
        for pc in range(start, start + size):
            row = lookup(table, pc)
            assert row is not None and row.cfa_type in (CFA_RSP, CFA_RBP), (name, hex(pc), row)
    row = lookup(table, symbols["_start"][0])
    assert row is not None and row.cfa_type == CFA_END  # the outermost frame
    assert table.cfa_counts[CFA_PLT] >= 1  # printf's PLT stub
    assert table.cfa_counts[CFA_RBP] >= 1  # with_vla


def test_a_program_without_frame_pointers(program: Path) -> None:
    table = build_table(program)
    assert table.source == ".eh_frame" and table.build_id and table.coverage > 0.9
    assert_covers_every_function(table, program)


def test_debug_frame_stands_in_for_a_thin_eh_frame(tmp_path: Path) -> None:
    exe = compile_program(tmp_path, "-g", "-fno-asynchronous-unwind-tables")
    table = build_table(exe, debug_dirs=())
    assert table.source == ".debug_frame+.eh_frame"
    assert_covers_every_function(table, exe)


def test_debug_frame_of_a_separate_debug_file(tmp_path: Path) -> None:
    """Found by build id, its .debug_frame compressed (as Debian ships them)."""
    exe = compile_program(tmp_path, "-g", "-fno-asynchronous-unwind-tables")
    build_id = build_table(exe, debug_dirs=()).build_id
    store = tmp_path / "debug" / ".build-id" / build_id[:2]
    store.mkdir(parents=True)
    debug = store / f"{build_id[2:]}.debug"
    subprocess.run(["objcopy", "--only-keep-debug", "--compress-debug-sections=zlib",
                    str(exe), str(debug)], check=True)
    assert "C" in subprocess.run(["readelf", "-SW", str(debug)], capture_output=True,
                                 text=True, check=True).stdout.split(".debug_frame")[1]
    subprocess.run(["strip", "--strip-debug", str(exe)], check=True)
    table = build_table(exe, debug_dirs=(str(tmp_path / "debug"),))
    assert table.source == f".debug_frame of {debug}+.eh_frame" and table.final
    assert_covers_every_function(table, exe)
    # without the debug file: the thin .eh_frame, and a table not to cache
    alone = build_table(exe, debug_dirs=())
    assert alone.source == ".eh_frame" and not alone.final
    disk = DiskUnwindCache(tmp_path / "cache")
    cached_table(exe, disk, debug_dirs=())
    assert disk.stats.stored == 0 and not list((tmp_path / "cache").iterdir())


def test_unreadable_objects(tmp_path: Path, program: Path) -> None:
    text = tmp_path / "text"
    text.write_text("not an object\n")
    with pytest.raises(UnwindTableError, match="text"):
        build_table(text)
    with pytest.raises(UnwindTableError, match="cannot read"):
        build_table(tmp_path / "missing")
    bare = tmp_path / "bare"
    subprocess.run(["objcopy", "--remove-section=.eh_frame", "--remove-section=.eh_frame_hdr",
                    str(program), str(bare)], check=True)
    with pytest.raises(UnwindTableError, match=r"bare: no \.eh_frame or \.debug_frame"):
        build_table(bare, debug_dirs=())


def test_disk_cache_round_trip(tmp_path: Path, program: Path) -> None:
    disk = DiskUnwindCache(tmp_path / "c")
    built = cached_table(program, disk)
    assert disk.stats.stored == 1 and disk.stats.misses == 1
    path = tmp_path / "c" / f"{built.build_id}.unw"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again = DiskUnwindCache(tmp_path / "c")
    copy = program.with_name("copy")
    shutil.copy(program, copy)
    cached = cached_table(copy, again)
    assert again.stats.hits == 1 and again.stats.stored == 0
    assert cached.path == str(copy)
    assert (cached.rows, cached.cfa_counts, cached.rbp_counts, cached.source, cached.fdes,
            cached.covered, cached.build_id) == (built.rows, built.cfa_counts,
                                                 built.rbp_counts, built.source, built.fdes,
                                                 built.covered, built.build_id)
    for pc in range(0, 0x2000, 7):
        assert lookup(cached, pc) == lookup(built, pc)
    assert list(cached.pcs) == [pc for pc, *_ in ROW.iter_unpack(cached.rows)]
    assert cached_table(program, None) == built  # no cache at all


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty", "version",
                                    "unsorted", "longer"])
def test_corrupt_cache_files_are_rebuilt(tmp_path: Path, program: Path, damage: str) -> None:
    built = cached_table(program, tmp_path)
    path = tmp_path / f"{built.build_id}.unw"
    blob = bytearray(path.read_bytes())
    if damage == "flip":
        blob[len(blob) // 2] ^= 0xFF
    elif damage == "truncate":
        blob = blob[:len(blob) - 13]
    elif damage == "garbage":
        blob = bytearray(b"\x00" * 50)
    elif damage == "empty":
        blob = bytearray()
    elif damage in ("unsorted", "longer"):  # with a checksum that matches
        body = blob[:-4]
        if damage == "unsorted":
            rows = len(body) - built.row_count * ROW.size
            body[rows:rows + 24] = body[rows + 12:rows + 24] + body[rows:rows + 12]
        else:
            body += b"\0"
        blob = body + struct.pack("<I", zlib.crc32(body))
    else:
        blob[8] += 1  # another format version
    path.write_bytes(bytes(blob))
    disk = DiskUnwindCache(tmp_path)
    rebuilt = cached_table(program, disk)
    assert disk.stats.errors == 1 and disk.stats.hits == 0 and disk.stats.stored == 1
    assert rebuilt.rows == built.rows
    assert cached_table(program, DiskUnwindCache(tmp_path)).rows == built.rows


def test_objects_without_build_id_are_not_cached(tmp_path: Path) -> None:
    exe = compile_program(tmp_path, "-Wl,--build-id=none")
    disk = DiskUnwindCache(tmp_path / "c")
    table = cached_table(exe, disk)
    assert table.build_id == "" and table.row_count > 0
    assert disk.stats.stored == 0 and not list((tmp_path / "c").iterdir())


def test_the_cache_is_bounded(tmp_path: Path, program: Path) -> None:
    other = compile_program(tmp_path, "-fno-omit-frame-pointer")  # another build id
    sizes = []
    for exe, where in ((other, tmp_path / "scratch"), (program, tmp_path / "c")):
        table = cached_table(exe, where)
        sizes.append((where / f"{table.build_id}.unw").stat().st_size)
    disk = DiskUnwindCache(tmp_path / "c", max_bytes=max(sizes) + 10)
    kept = cached_table(other, disk)
    assert disk.stats.evicted == 1
    assert [p.name for p in (tmp_path / "c").glob("*.unw")] == [f"{kept.build_id}.unw"]
