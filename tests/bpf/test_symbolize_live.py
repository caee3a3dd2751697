"""Symbolizing live processes whose binaries are not where their maps say:
deleted, replaced while running, or in another mount namespace. Root is
needed to read other processes' /proc entries, hence the bpf marker."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ember.symbols.elf import ElfSymbols
from ember.symbols.procmaps import ProcessTable, ProcFS
from ember.symbols.symbolizer import Symbolizer

pytestmark = pytest.mark.bpf


def symbol_address(binary: Path, name: str) -> int:
    """Runtime address of a function in the non-PIE cpu_shares (= its vaddr)."""
    syms = ElfSymbols(binary)
    vaddr = next(f.start for f in syms.functions() if f.name == name)
    return vaddr + 4  # inside the function, past its first instruction


@pytest.fixture
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="ember-sym-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start(cmd: list[str], **kw: object) -> subprocess.Popen[str]:
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]
    assert p.stdout is not None and p.stdout.readline().startswith("ready")
    return p  # type: ignore[no-any-return]


def names(pid: int, addrs: list[int]) -> list[str]:
    """The names of a stack, the same one frame at a time and prepared in a
    batch; the leaf's the same from name_many."""
    sym = Symbolizer(ProcessTable(ProcFS()))
    one = [f.name for f in sym.user_frames(pid, addrs)]
    assert batch_names(pid, addrs) == one
    return one


def batch_names(pid: int, addrs: list[int]) -> list[str]:
    sym = Symbolizer(ProcessTable(ProcFS()))
    sym.prepare([(pid, addrs)])
    leaf = sym.name_many(pid, addrs[:1])[0][1]
    prepared = [f.name for f in sym.user_frames(pid, addrs)]
    assert leaf is not None and leaf[0] == prepared[0]
    return prepared


def test_deleted_binary(fixture_bin: Path, workdir: Path) -> None:
    exe = workdir / "app"
    shutil.copy(fixture_bin / "cpu_shares", exe)
    addr = symbol_address(exe, "work_b")
    p = start([str(exe), "20"])
    try:
        exe.unlink()
        assert "(deleted)" in Path(f"/proc/{p.pid}/maps").read_text()
        assert names(p.pid, [addr]) == ["work_b"]  # through /proc/PID/map_files
    finally:
        p.kill()
        p.wait()


def test_binary_replaced_while_running(fixture_bin: Path, workdir: Path) -> None:
    """An upgrade renames a new binary over the old path: that path now names
    another file, whose symbols must not be used for the running process."""
    exe = workdir / "app"
    shutil.copy(fixture_bin / "cpu_shares", exe)
    addr = symbol_address(exe, "work_b")
    p = start([str(exe), "20"])
    try:
        new = workdir / "app.new"
        shutil.copy(fixture_bin / "many_stacks", new)  # another program at the same path
        os.rename(new, exe)
        sym = Symbolizer(ProcessTable(ProcFS()))
        assert [f.name for f in sym.user_frames(p.pid, [addr])] == ["work_b"]
        assert sym.stats.replaced_objects >= 1
        assert batch_names(p.pid, [addr]) == ["work_b"]
    finally:
        p.kill()
        p.wait()


def test_binary_in_another_mount_namespace(fixture_bin: Path, workdir: Path) -> None:
    """A container-like process: its binary is on a tmpfs mounted in its own
    mount namespace, invisible at that path from ember's."""
    mnt = workdir / "mnt"
    mnt.mkdir()
    addr = symbol_address(fixture_bin / "cpu_shares", "work_c")
    script = (f"mount -t tmpfs tmpfs {mnt} && cp {fixture_bin / 'cpu_shares'} {mnt}/app "
              f"&& exec {mnt}/app 20")
    p = start(["unshare", "-m", "--propagation", "private", "sh", "-c", script])
    try:
        assert not (mnt / "app").exists()  # not in our namespace
        assert names(p.pid, [addr]) == ["work_c"]  # through /proc/PID/root
    finally:
        p.kill()
        p.wait()
