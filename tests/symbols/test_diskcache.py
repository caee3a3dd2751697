"""The on-disk symbol index cache: round trip, what it refuses to keep,
corruption and its size bound."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ember.symbols.diskcache import CachedSymbols, DiskSymbolCache
from ember.symbols.elf import ElfSymbols
from ember.symbols.objects import ObjectCache


def test_round_trip_gives_the_same_lookups(tmp_path: Path, fixture_bin: Path) -> None:
    exe = fixture_bin / "cpp_names"
    disk = DiskSymbolCache(tmp_path / "c")
    first = ObjectCache(disk=disk)
    _, obj = first.open([exe])
    assert obj is not None and obj.build_id and disk.stats.stored == 1
    assert oct((tmp_path / "c" / f"{obj.build_id}.sym").stat().st_mode & 0o777) == "0o600"
    again = ObjectCache(disk=DiskSymbolCache(tmp_path / "c"))
    _, cached = again.open([exe])
    assert cached is not None and again.disk is not None and again.disk.stats.hits == 1
    assert cached.functions() == obj.functions()
    assert (cached.segments, cached.build_id, cached.symbol_source, cached.dwarf_path) == \
        (obj.segments, obj.build_id, obj.symbol_source, obj.dwarf_path)
    for f in obj.functions()[::7]:
        assert cached.lookup(f.start + f.size // 2) == obj.lookup(f.start + f.size // 2)


def test_dynsym_only_objects_are_not_stored(tmp_path: Path, fixture_bin: Path) -> None:
    """Without its .symtab an object's answer can change (a debug package
    installed later); only full symbol tables are cached."""
    stripped = tmp_path / "stripped.so"
    subprocess.run(["strip", "-o", str(stripped), str(fixture_bin / "libember_demo.so")],
                   check=True)
    disk = DiskSymbolCache(tmp_path / "c")
    _, obj = ObjectCache(disk=disk, debug_dirs=()).open([stripped])
    assert obj is not None and obj.symbol_source == ".dynsym"
    assert disk.stats.stored == 0 and not list((tmp_path / "c").iterdir())


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty"])
def test_corrupt_files_are_deleted_and_counted(tmp_path: Path, fixture_bin: Path,
                                               damage: str) -> None:
    exe = fixture_bin / "pie_main"
    disk = DiskSymbolCache(tmp_path / "c")
    _, obj = ObjectCache(disk=disk).open([exe])
    assert obj is not None and obj.build_id
    path = tmp_path / "c" / f"{obj.build_id}.sym"
    blob = bytearray(path.read_bytes())
    if damage == "flip":
        blob[len(blob) // 2] ^= 0xFF
    elif damage == "truncate":
        blob = blob[: len(blob) - 9]
    elif damage == "garbage":
        blob = bytearray(os.urandom(len(blob)))
    else:
        blob = bytearray()
    path.write_bytes(bytes(blob))
    disk2 = DiskSymbolCache(tmp_path / "c")
    _, again = ObjectCache(disk=disk2).open([exe])
    assert again is not None and again.functions() == obj.functions()
    assert disk2.stats.errors == 1 and disk2.stats.hits == 0
    assert disk2.stats.stored == 1  # re-indexed and written back


def test_consistent_checksum_but_inconsistent_arrays_refused(tmp_path: Path,
                                                             fixture_bin: Path) -> None:
    """A well-formed file whose arrays make no sense (unsorted starts) is
    refused too: the checksum is not the only check."""
    from ember.symbols.elf import SymbolIndex

    obj = ElfSymbols(fixture_bin / "pie_main")
    starts, ends, names, strtab = obj.index.arrays()
    with pytest.raises(ValueError):
        SymbolIndex.from_arrays(starts[::-1], ends, names, strtab)
    with pytest.raises(ValueError):
        SymbolIndex.from_arrays(starts, ends, names, strtab[:1])


def test_bounded_least_recently_used_first(tmp_path: Path, fixture_bin: Path) -> None:
    objs = [ElfSymbols(fixture_bin / n) for n in ("pie_main", "cpp_names", "cpu_shares")]
    size = 0
    probe = DiskSymbolCache(tmp_path / "probe")
    for o in objs:
        assert o.build_id
        probe.store(o.build_id, CachedSymbols(o.index, o.symbol_source, None))
        size = max(size, (tmp_path / "probe" / f"{o.build_id}.sym").stat().st_size)
    shutil.rmtree(tmp_path / "probe")
    disk = DiskSymbolCache(tmp_path / "c", max_bytes=2 * size + 1)
    for i, o in enumerate(objs[:2]):
        assert o.build_id
        disk.store(o.build_id, CachedSymbols(o.index, o.symbol_source, None))
        os.utime(tmp_path / "c" / f"{o.build_id}.sym", ns=(i * 10**9, i * 10**9))
    assert objs[0].build_id and disk.load(objs[0].build_id) is not None  # now most recent
    assert objs[2].build_id
    disk.store(objs[2].build_id, CachedSymbols(objs[2].index, objs[2].symbol_source, None))
    kept = {p.stem for p in (tmp_path / "c").glob("*.sym")}
    assert kept == {objs[0].build_id, objs[2].build_id} and disk.stats.evicted == 1


def test_unusable_directory_is_a_config_error(tmp_path: Path) -> None:
    from ember.agent.controller import _disk_cache
    from ember.config import AgentConfig
    from ember.errors import ConfigError

    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="symbol_cache_dir"):
        _disk_cache(AgentConfig(symbol_cache_dir=str(tmp_path / "file" / "sub")))


def test_copies_of_one_build_share_one_index(tmp_path: Path, fixture_bin: Path) -> None:
    """The same library seen through two containers' roots (two files, one
    build id) is indexed once."""
    a, b = tmp_path / "a.so", tmp_path / "b.so"
    shutil.copy(fixture_bin / "libember_demo.so", a)
    shutil.copy(fixture_bin / "libember_demo.so", b)
    cache = ObjectCache()
    _, first = cache.open([a])
    _, second = cache.open([b])
    assert first is not None and second is not None and first is not second
    assert second.index is first.index and cache.stats.shared_indexes == 1
    assert second.functions() == ElfSymbols(b).functions()
