"""CPython processes found and checked, code objects named, from the memory
of live interpreters (children of the test: no root needed)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ember import abi
from ember.kernel.btf import BtfError
from ember.runtimes import cpython
from ember.runtimes.cpython import Interpreter, Interpreters, Memory, PythonError
from ember.runtimes.pycode import PYTHON_MAPPING, PythonNames, read_code
from ember.symbols.procmaps import ProcFS
from tests.support.pythons import DEBIAN_311, pyenv_python

PYTHONS = {"debian-3.11": DEBIAN_311, "pyenv-3.10": pyenv_python("3.10"),
           "pyenv-3.12": pyenv_python("3.12"), "pyenv-3.13": pyenv_python("3.13")}

# The child prints its version and one function's code object, then waits.
CHILD = """
import json, sys
class Box:
    def work(self):
        x = 1
        return x + 1
code = Box.work.__code__
print(json.dumps({"version": list(sys.version_info[:3]), "code": id(code),
                  "first": code.co_firstlineno, "lines": list(code.co_lines()),
                  "file": code.co_filename}), flush=True)
sys.stdin.read()
"""


def _child(exe: Path, script: str = CHILD
           ) -> Iterator[tuple[subprocess.Popen[str], dict[str, object]]]:
    proc = subprocess.Popen([str(exe), "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    info = json.loads(proc.stdout.readline())
    try:
        yield proc, info
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(params=sorted(PYTHONS))
def child(request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[str],
                                                             dict[str, object]]]:
    exe = PYTHONS[request.param]
    if exe is None or not exe.exists():
        pytest.skip(f"{request.param} is not installed")
    yield from _child(exe)


def _find(pid: int) -> tuple[Interpreters, Interpreter | None]:
    fs = ProcFS()
    interps = Interpreters(fs)
    proc = fs.read(pid)
    assert proc is not None
    return interps, interps.find(proc)


def test_found_checked_and_described(child) -> None:  # type: ignore[no-untyped-def]
    proc, info = child
    interps, interp = _find(proc.pid)
    assert interp is not None, interps.failures
    version = info["version"]
    assert isinstance(version, list)
    if interp.version[:2] == (3, 10):  # no Py_Version: the micro version is not known
        version = [*version[:2], 0]
    assert list(interp.version) == version
    assert interps.versions() == {f"{interp.version[0]}.{interp.version[1]}": 1}
    v = interp.bpf()
    assert v.interp_head == interp.runtime + interp.layout.runtime_interpreters_main
    assert v.eval_start[0] < v.eval_end[0] and interp.in_eval(v.eval_start[0])
    minor = interp.version[:2]
    expect = (abi.PY_ENTRY_OWNER if minor >= (3, 12) else
              abi.PY_ENTRY_IS_ENTRY if minor == (3, 11) else abi.PY_ENTRY_ONE)
    assert v.entry == expect
    assert v.thread_match == (abi.PY_MATCH_FSBASE if minor == (3, 10) else abi.PY_MATCH_TID)
    # the interpreter's own thread states name the process's main thread: by
    # its TID, or (3.10) by pthread_self(), which glibc keeps at the thread
    # pointer's own address (tcbhead_t.self at %fs:0x10)
    mem = Memory(proc.pid)
    interp_state = mem.u64(v.interp_head)
    tstate = mem.u64(interp_state + v.interp_threads)
    ids = set()
    while tstate:
        ids.add(mem.u64(tstate + v.tstate_tid))
        tstate = mem.u64(tstate + v.tstate_next)
    if v.thread_match == abi.PY_MATCH_TID:
        assert proc.pid in ids
    else:
        assert v.task_fsbase > 0 and any(mem.u64(i + 0x10) == i for i in ids), ids


def test_a_code_object_named_with_its_lines(child) -> None:  # type: ignore[no-untyped-def]
    proc, info = child
    interps, interp = _find(proc.pid)
    assert interp is not None
    code, first = int(info["code"]), int(info["first"])
    got = read_code(Memory(proc.pid), interp, code, first)
    qualname = "work" if interp.version[:2] == (3, 10) else "Box.work"  # no co_qualname
    assert got.qualname == qualname and got.firstlineno == first
    assert got.filename == info["file"]
    assert [list(r) for r in got.ranges] == info["lines"]
    names = PythonNames(interps)
    # the instruction at the last range with a line: "return x + 1"
    start, _, line = [r for r in got.ranges if r[2] is not None][-1]
    frame = names.frame(proc.pid, abi.PY_CODE | code,
                        abi.PY_INSTR | first << 32 | start // 2)
    assert frame.name == f"{qualname} (<string>:{line})" and frame.line == line
    assert frame.mapping == PYTHON_MAPPING and frame.system_name == qualname


def test_a_code_object_freed_and_reused_is_not_misnamed(child) -> None:  # type: ignore[no-untyped-def]
    proc, info = child
    interps, interp = _find(proc.pid)
    assert interp is not None
    code, first = int(info["code"]), int(info["first"])
    with pytest.raises(PythonError) as e:  # another first line: another code object
        read_code(Memory(proc.pid), interp, code, first + 1)
    assert e.value.reason == "code_freed"
    names = PythonNames(interps)
    frame = names.frame(proc.pid, abi.PY_CODE | (code + 8), abi.PY_INSTR | first << 32)
    assert frame.name == "[python code freed]" and names.failures == {"code_freed": 1}


def test_a_layout_the_process_disagrees_with_is_refused(  # type: ignore[no-untyped-def]
        child, monkeypatch: pytest.MonkeyPatch) -> None:
    proc, _ = child
    _, interp = _find(proc.pid)
    assert interp is not None
    wrong = dataclasses.replace(interp.layout, code_firstlineno=interp.layout.code_firstlineno + 4)
    monkeypatch.setattr(cpython, "layout_for", lambda major, minor: wrong)
    interps2, refused = _find(proc.pid)
    assert refused is None and interps2.failures == {"layout_mismatch": 1}
    assert len(interps2) == 0


def test_3_9_is_refused_with_its_reason() -> None:
    exe = pyenv_python("3.9")
    if exe is None:
        pytest.skip("pyenv's 3.9 is not installed")
    for proc, _ in _child(exe, "import sys; print('{}', flush=True); sys.stdin.read()"):
        interps, interp = _find(proc.pid)
        assert interp is None and interps.failures == {"unsupported_version": 1}
        found = ProcFS().read(proc.pid)
        assert found is not None and interps.find(found) is None
        assert interps.failures == {"unsupported_version": 1}  # a process, counted once


def test_3_10_without_btf_is_refused_with_its_reason() -> None:
    exe = pyenv_python("3.10")
    if exe is None:
        pytest.skip("pyenv's 3.10 is not installed")

    def no_btf() -> int:
        raise BtfError("cannot read /sys/kernel/btf/vmlinux: No such file or directory")

    for proc, _ in _child(exe):
        interps = Interpreters(ProcFS(), task_fsbase=no_btf)
        found = ProcFS().read(proc.pid)
        assert found is not None and interps.find(found) is None
        assert interps.failures == {"no_btf": 1}


def test_not_python_is_not_found() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        interps, interp = _find(proc.pid)
        assert interp is None and not interps.failures
    finally:
        proc.kill()
        proc.wait()


def test_debug_offsets_need_their_cookie() -> None:
    with pytest.raises(PythonError) as e:
        cpython.debug_offsets(b"\0" * 512)
    assert e.value.reason == "layout_mismatch"


def test_exited_processes_are_named_until_the_next_drain(child) -> None:  # type: ignore[no-untyped-def]
    proc, _ = child
    interps, interp = _find(proc.pid)
    assert interp is not None
    interps.forget([proc.pid])
    assert interps.get(proc.pid) is interp and len(interps) == 0
    interps.drop_retired(interps.retired())
    assert interps.get(proc.pid) is None


def test_the_cold_part_of_a_stripped_interpreter_is_found() -> None:
    """Debian's python3.11 is stripped: no symbol names the loop's .cold
    part. The part found must lie outside the hot part and begin inside a
    frame (its first row's CFA is not rsp+8, a function's entry), and the
    hot part's own .cold symbol must win where there is one."""
    from elftools.elf.elffile import ELFFile

    from ember.unwind.cfa import CFA_RSP
    from ember.unwind.tables import build_table, lookup

    if not DEBIAN_311.exists():
        pytest.skip("Debian's python3.11 is not installed")
    exports = cpython._read_exports(DEBIAN_311)
    assert exports is not None
    hot, size = exports.symbols["_PyEval_EvalFrameDefault"]
    cold, cold_size = exports.symbols[cpython.COLD]
    assert not hot <= cold < hot + size and cold_size > 1024
    row = lookup(build_table(DEBIAN_311), cold)
    assert row is not None and row.pc == cold
    assert (row.cfa_type, row.cfa_offset) != (CFA_RSP, 8), row
    with open(DEBIAN_311, "rb") as f:
        assert cpython.cold_part(str(DEBIAN_311), ELFFile(f), (hot, size)) == (cold, cold_size)
    lib = pyenv_python("3.12")
    if lib is not None:
        shared = next(lib.parent.parent.glob("lib/libpython3.12.so.1.0"))
        with_symbols = cpython._read_exports(shared)
        assert with_symbols is not None and with_symbols.symbols[cpython.COLD][1] < 64
