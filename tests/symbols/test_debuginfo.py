"""Stripped objects named through separate debug information: a debuglink
(with its CRC checked), a build-id-only debug file, and Debian's libc6-dbg."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ember.symbols.debuginfo import debug_file_for
from ember.symbols.elf import ElfSymbols
from ember.symbols.objects import ObjectCache
from tests.support import LIBC, libc_debug_file
from tests.support.elf import nm


def split_debug(src: Path, out: Path, link: bool) -> tuple[Path, Path]:
    """(stripped object, debug file) as distributions build them."""
    debug = out / f"{src.name}.debug"
    stripped = out / src.name
    subprocess.run(["objcopy", "--only-keep-debug", str(src), str(debug)], check=True)
    subprocess.run(["strip", "--strip-all", "-o", str(stripped), str(src)], check=True)
    if link:
        subprocess.run(["objcopy", f"--add-gnu-debuglink={debug.name}", stripped.name],
                       check=True, cwd=out)
    return stripped, debug


def named(cache: ObjectCache, path: Path, vaddr: int) -> str | None:
    _, obj = cache.open([path])
    assert obj is not None
    hit = obj.lookup(vaddr)
    return hit[0] if hit else None


def test_debuglink_with_crc(tmp_path: Path, fixture_bin: Path) -> None:
    stripped, debug = split_debug(fixture_bin / "pie_main", tmp_path, link=True)
    exe_burn = nm(fixture_bin / "pie_main")["exe_burn"]
    obj = ElfSymbols(stripped)
    assert obj.symbol_source != ".symtab" and obj.lookup(exe_burn) is None
    assert obj.debuglink == debug.name and obj.debuglink_crc is not None
    assert debug_file_for(obj, str(stripped), debug_dirs=()) == debug
    cache = ObjectCache(debug_dirs=())
    assert named(cache, stripped, exe_burn + 3) == "exe_burn"
    assert cache.stats.debug_files == 1
    # a debug file of another build (its CRC differs) is not used
    with open(debug, "ab") as f:
        f.write(b"\0")
    assert debug_file_for(ElfSymbols(stripped), str(stripped), debug_dirs=()) is None
    assert named(ObjectCache(debug_dirs=()), stripped, exe_burn + 3) is None


def test_build_id_only(tmp_path: Path, fixture_bin: Path) -> None:
    stripped, debug = split_debug(fixture_bin / "pie_main", tmp_path, link=False)
    build_id = ElfSymbols(stripped).build_id
    assert build_id and ElfSymbols(stripped).debuglink is None
    store = tmp_path / "debug" / ".build-id" / build_id[:2]
    store.mkdir(parents=True)
    shutil.move(str(debug), store / f"{build_id[2:]}.debug")
    exe_burn = nm(fixture_bin / "pie_main")["exe_burn"]  # a local symbol: not in .dynsym
    assert named(ObjectCache(debug_dirs=()), stripped, exe_burn) is None
    cache = ObjectCache(debug_dirs=(str(tmp_path / "debug"),))
    _, obj = cache.open([stripped])
    assert obj is not None and obj.symbol_source.startswith(".symtab of ")
    assert named(cache, stripped, exe_burn) == "exe_burn"


@pytest.mark.skipif(libc_debug_file() is None,
                    reason="no libc6-dbg file for this libc (host-setup.sh --dev installs it)")
def test_libc6_dbg_names_local_functions() -> None:
    obj = ElfSymbols(LIBC)
    debug = debug_file_for(obj, str(LIBC))
    assert debug == libc_debug_file()  # found by ember as by build id
    assert debug is not None
    start = nm(debug)["__libc_start_call_main"]
    assert obj.lookup(start) is None  # not in .dynsym
    assert named(ObjectCache(), LIBC, start + 1) == "__libc_start_call_main"


def test_ember_symbolize_cli(fixture_bin: Path) -> None:
    proc = subprocess.Popen([str(fixture_bin / "pie_main"), "10"], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        maps = Path(f"/proc/{proc.pid}/maps").read_text().splitlines()
        base = min(int(line.split("-")[0], 16) for line in maps if line.endswith("/pie_main"))
        addr = base + nm(fixture_bin / "pie_main")["exe_burn"] + 4
        r = subprocess.run([sys.executable, "-m", "ember.cli", "symbolize", "--pid",
                            str(proc.pid)], input=f"{addr:x}\n7f0000000000\n",
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == f"{addr:#x} exe_burn+0x4 {fixture_bin / 'pie_main'}"
        assert lines[1] == "0x7f0000000000 [unknown] [unmapped]"
        r = subprocess.run([sys.executable, "-m", "ember.cli", "symbolize", "--pid",
                            str(proc.pid), "zz"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "not a hex address" in r.stderr
    finally:
        proc.kill()
        proc.wait()
