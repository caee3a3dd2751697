"""ember.runtimes.pylayouts: the CPython offsets table is what the headers say
(pylayouts.c recompiled against every header set on the machine) and what the
interpreters built from them actually have in memory (read with ctypes at the
table's offsets in a subprocess of each interpreter)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

from ember.runtimes.pylayouts import (
    FIELDS,
    LAYOUTS,
    Layout,
    LayoutGenerationError,
    generate,
    layout_for,
)
from tests.support.pythons import pyenv_root


class HeaderSet(NamedTuple):
    name: str
    include: Path  # the directory holding Python.h
    version: tuple[int, int]
    python: Path  # the interpreter built from these headers


def header_sets() -> list[HeaderSet]:
    root = pyenv_root() / "versions"
    sets = [HeaderSet("debian-3.11", Path("/usr/include/python3.11"), (3, 11),
                      Path("/usr/bin/python3.11"))]
    for full in ("3.10.13", "3.11.7", "3.12.1", "3.13.0"):
        short = full.rsplit(".", 1)[0]
        major, minor = (int(x) for x in short.split("."))
        sets.append(HeaderSet(f"pyenv-{full}", root / full / "include" / f"python{short}",
                              (major, minor), root / full / "bin" / f"python{short}"))
    return sets


HEADER_SETS = header_sets()


def require_headers(hs: HeaderSet) -> None:
    """Skip only when the header set is truly not on this machine."""
    if not (hs.include / "Python.h").exists():
        pytest.skip(f"{hs.name}: no headers at {hs.include}")


def test_table_covers_310_to_313() -> None:
    assert sorted(LAYOUTS) == [(3, 10), (3, 11), (3, 12), (3, 13)]
    assert layout_for(3, 12) is LAYOUTS[(3, 12)]
    assert layout_for(3, 9) is None
    assert layout_for(3, 14) is None
    assert tuple(f.name for f in dataclasses.fields(Layout)) == FIELDS


@pytest.mark.parametrize("hs", HEADER_SETS, ids=[hs.name for hs in HEADER_SETS])
def test_table_matches_the_headers(hs: HeaderSet) -> None:
    """Both 3.11 header sets (Debian's 3.11.2, pyenv's 3.11.7) are checked
    against the same (3, 11) entry."""
    require_headers(hs)
    got = generate(str(hs.include))
    want = dataclasses.asdict(LAYOUTS[hs.version])
    assert list(got) == list(want), f"{hs.name}: pylayouts.c prints other fields than Layout"
    wrong = [f"{name}: headers say {got[name]}, LAYOUTS[{hs.version}] says {want[name]}"
             for name in FIELDS if got[name] != want[name]]
    assert not wrong, f"{hs.name} ({hs.include}):\n" + "\n".join(wrong)


def test_generate_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(LayoutGenerationError, match=r"no Python\.h"):
        generate(str(tmp_path))
    (tmp_path / "Python.h").write_text("#error not really Python.h\n")
    with pytest.raises(LayoutGenerationError, match=r"(?s)failed.*not really Python\.h"):
        generate(str(tmp_path))
    with pytest.raises(LayoutGenerationError, match="C compiler"):
        generate(str(tmp_path), cc=str(tmp_path / "no-such-cc"))


# Runs inside the interpreter under test (3.10+ syntax only). It reads that
# interpreter's own memory with ctypes at the offsets of argv[1], the way the
# BPF walker will, and prints {check: [read, expected]} as JSON.
PROBE = r'''
import ctypes, dis, json, sys, threading, types

L = json.loads(sys.argv[1])
checks = {}


def check(name, got, want):
    assert name not in checks, name
    checks[name] = [got, want]


def ptr(a):
    return ctypes.c_void_p.from_address(a).value or 0


def ssize(a):
    return ctypes.c_ssize_t.from_address(a).value


def u8(a):
    return ctypes.c_uint8.from_address(a).value


def u32(a):
    return ctypes.c_uint32.from_address(a).value


def i32(a):
    return ctypes.c_int32.from_address(a).value


def u64(a):
    return ctypes.c_uint64.from_address(a).value


def mem(a, n):
    return bytes((ctypes.c_char * n).from_address(a))


def cstr(a):
    return ctypes.c_char_p(a).value


def read_str(a):
    """A compact str read through the unicode layout, as BPF does."""
    n = ssize(a + L["unicode_length"])
    word = u32(a + L["unicode_state"])
    kind = (word >> L["unicode_kind_shift"]) & 7
    assert (word >> L["unicode_compact_bit"]) & 1, hex(word)
    ascii = (word >> L["unicode_ascii_bit"]) & 1
    data = mem(a + (L["ascii_data"] if ascii else L["compact_data"]), n * kind)
    return data.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind])


# objects, bytes, str
obj = (1, 2, 3, 4, 5)
check("object_type", ptr(id(obj) + L["object_type"]), id(tuple))
check("var_size", ssize(id(obj) + L["var_size"]), 5)
b = b"ember\x00bytes"
check("bytes_data", mem(id(b) + L["bytes_data"], len(b)).hex(), b.hex())
for s, kind in (("hello", 1), ("h\xe9llo", 1), ("\u0100\u20ac", 2), ("x\U0001F525", 4)):
    a = id(s)
    word = u32(a + L["unicode_state"])
    check("unicode_length " + ascii(s), ssize(a + L["unicode_length"]), len(s))
    check("unicode_kind_shift " + ascii(s), (word >> L["unicode_kind_shift"]) & 7, kind)
    check("unicode_compact_bit " + ascii(s), (word >> L["unicode_compact_bit"]) & 1, 1)
    check("unicode_ascii_bit " + ascii(s), (word >> L["unicode_ascii_bit"]) & 1,
          int(s.isascii()))
    check("str data " + ascii(s), read_str(a), s)

# types: tp_name, and tp_members walked with the PyMemberDef layout
code_type = types.CodeType
check("type_name", cstr(ptr(id(code_type) + L["type_name"])).decode(), "code")
members = {}
m = ptr(id(code_type) + L["type_members"])
while ptr(m + L["member_name"]):
    members[cstr(ptr(m + L["member_name"])).decode()] = ssize(m + L["member_offset"])
    m += L["member_size"]
check("type_members finds co_firstlineno", "co_firstlineno" in members, True)
for field in ("filename", "name", "qualname", "firstlineno", "linetable", "code"):
    if L["code_" + field] >= 0 and "co_" + field in members:
        check("code_%s (tp_members)" % field, L["code_" + field], members["co_" + field])


# code objects
def never_called():
    return 1


code = never_called.__code__
check("code_firstlineno", i32(id(code) + L["code_firstlineno"]), code.co_firstlineno)
check("code_filename", read_str(ptr(id(code) + L["code_filename"])), code.co_filename)
check("code_name", read_str(ptr(id(code) + L["code_name"])), "never_called")
if L["code_qualname"] >= 0:
    check("code_qualname", ptr(id(code) + L["code_qualname"]), id(code.co_qualname))
check("code_linetable", ptr(id(code) + L["code_linetable"]), id(code.co_linetable))
if L["code_code"] >= 0:
    check("code_code", ptr(id(code) + L["code_code"]), id(code.co_code))
if L["code_adaptive"] >= 0:
    # never run, no inline caches in `return 1`: the adaptive copy is co_code
    check("code_adaptive", mem(id(code) + L["code_adaptive"], len(code.co_code)).hex(),
          code.co_code.hex())
check("code_unit", list(dis.get_instructions(code))[1].offset, L["code_unit"])

# interpreters and threads
api = ctypes.pythonapi
api.PyInterpreterState_Get.restype = ctypes.c_void_p
api.PyThreadState_Get.restype = ctypes.c_void_p
runtime = ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime"))
interp = ptr(runtime + L["runtime_interpreters_head"])
check("runtime_interpreters_head", interp, api.PyInterpreterState_Get())
api.PyInterpreterState_Main.restype = ctypes.c_void_p
check("runtime_interpreters_main", ptr(runtime + L["runtime_interpreters_main"]),
      api.PyInterpreterState_Main())
# with a subinterpreter the head is the newest interpreter, no longer the main one
try:
    import _interpreters as subinterpreters  # 3.13
except ImportError:
    import _xxsubinterpreters as subinterpreters  # 3.10 to 3.12
api.PyInterpreterState_Head.restype = ctypes.c_void_p
sub = subinterpreters.create()
check("runtime_interpreters_head (subinterpreter)",
      [ptr(runtime + L["runtime_interpreters_head"]), True],
      [api.PyInterpreterState_Head(), api.PyInterpreterState_Head() != interp])
check("runtime_interpreters_main (subinterpreter)",
      ptr(runtime + L["runtime_interpreters_main"]), interp)
subinterpreters.destroy(sub)

started, stop = threading.Event(), threading.Event()
other = {}


def other_thread():
    other["ident"] = threading.get_ident()
    other["native"] = threading.get_native_id()
    started.set()
    stop.wait()


t = threading.Thread(target=other_thread, daemon=True)
t.start()
started.wait()
tstates = {}
ts = ptr(interp + L["interp_threads_head"])
for _ in range(100):  # bounded: a wrong offset may make a cycle
    if not ts:
        break
    tstates[u64(ts + L["tstate_thread_id"])] = ts
    ts = ptr(ts + L["tstate_next"])
stop.set()
t.join()
me = api.PyThreadState_Get()
check("interp_threads_head/tstate_next/tstate_thread_id: this thread",
      tstates.get(threading.get_ident()), me)
check("interp_threads_head/tstate_next/tstate_thread_id: other thread",
      other["ident"] in tstates, True)
if L["tstate_native_thread_id"] >= 0:
    check("tstate_native_thread_id", u64(me + L["tstate_native_thread_id"]),
          threading.get_native_id())
    check("tstate_native_thread_id: other thread",
          u64(tstates[other["ident"]] + L["tstate_native_thread_id"]), other["native"])


# frames: walk this thread's stack from its tstate, as BPF does
def walk():
    # inline, not ptr(): a Python helper would be the innermost frame
    f = ctypes.c_void_p.from_address(me + L["tstate_frame"]).value
    if L["cframe_current_frame"] >= 0:
        f = ctypes.c_void_p.from_address(f + L["cframe_current_frame"]).value
    seen = []
    while f and len(seen) < 100:
        owner = u8(f + L["frame_owner"]) if L["frame_owner"] >= 0 else -1
        entry = u8(f + L["frame_is_entry"]) if L["frame_is_entry"] >= 0 else -1
        code_addr = ptr(f + L["frame_code"])
        if owner >= 0 and owner == L["owned_by_cstack"]:
            seen.append(("<cstack>", None, owner, entry))
        else:
            if L["code_code"] >= 0:  # 3.10: f_lasti is an int, in code units
                lasti = i32(f + L["frame_instr"]) * L["code_unit"]
            else:
                lasti = ptr(f + L["frame_instr"]) - (code_addr + L["code_adaptive"])
            name = read_str(ptr(code_addr + L["code_name"]))
            seen.append((name, lasti, owner, entry))
        f = ptr(f + L["frame_previous"])
    want = []
    fr = sys._getframe()
    while fr is not None:
        want.append((fr.f_code.co_name, fr.f_lasti, fr.f_code.co_flags))
        fr = fr.f_back
    return seen, want


def middle():  # a generator: its frame is owned by the generator, 3.11+
    yield walk()


def outer():
    return next(middle())  # resumed from C (next): an entry frame, a C-stack shim


seen, want = outer()
python_frames = [s for s in seen if s[0] != "<cstack>"]
check("frame_code/frame_previous (names)", [s[0] for s in python_frames],
      [w[0] for w in want])
# the innermost frame moved on since it was read; its callers wait in a call
check("frame_instr (callers' lasti)", [s[1] for s in python_frames][1:],
      [w[1] for w in want][1:])
CO_GENERATOR, OWNED_BY_THREAD, OWNED_BY_GENERATOR = 0x20, 0, 1
if L["frame_owner"] >= 0:
    check("frame_owner", [s[2] for s in python_frames],
          [OWNED_BY_GENERATOR if w[2] & CO_GENERATOR else OWNED_BY_THREAD for w in want])
# entered from C: the generator (by next()) and the module (by the runtime)
if L["frame_is_entry"] >= 0:  # 3.11
    check("frame_is_entry", [s[3] for s in seen], [0, 1, 0, 1])
if L["owned_by_cstack"] >= 0:  # 3.12+: a shim below each
    check("owned_by_cstack", [s[0] for s in seen],
          ["walk", "middle", "<cstack>", "outer", "<module>", "<cstack>"])

print(json.dumps(checks))
'''


@pytest.mark.parametrize("hs", HEADER_SETS, ids=[hs.name for hs in HEADER_SETS])
def test_table_matches_the_running_interpreter(hs: HeaderSet, tmp_path: Path) -> None:
    """The offsets are the running interpreter's, not just its headers': read
    its threads, frames, code objects, strings and types through them."""
    require_headers(hs)
    if not hs.python.exists():
        pytest.skip(f"{hs.name}: headers but no interpreter at {hs.python}")
    layout = json.dumps(dataclasses.asdict(LAYOUTS[hs.version]))
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    out = subprocess.run([str(hs.python), "-I", str(probe), layout], capture_output=True,
                         text=True, check=False, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, f"{hs.name}: probe failed:\n{out.stderr}"
    checks: dict[str, list[object]] = json.loads(out.stdout)
    assert len(checks) > 25, checks
    wrong = [f"{name}: read {got!r}, expected {want!r}"
             for name, (got, want) in checks.items() if got != want]
    assert not wrong, f"{hs.name} ({hs.python}):\n" + "\n".join(wrong)
