"""CPython struct layouts, per minor version, for walking Python frames from BPF.

A BPF program cannot include CPython's headers or ask the interpreter where a
field is: it reads raw memory at fixed offsets, and those offsets change with
every minor version (3.11 replaced frame objects by ``_PyInterpreterFrame``,
3.12 moved fields around, 3.13 dropped ``_PyCFrame``). So the offsets are
handed to it per version, from the table here.

The numbers are never written by hand: ``pylayouts.c`` (next to this file)
prints them with ``offsetof``/``sizeof`` on the real structs, compiled against
each version's headers (internal ones included, with ``Py_BUILD_CORE``), and
:func:`generate` does that compile-and-run. tests/runtimes/test_pylayouts.py
recompiles it against every header set on the machine and compares with
:data:`LAYOUTS` field by field, and reads live interpreters' memory at these
offsets, so the table cannot drift from the headers or from the binaries.

A field a version does not have is -1.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("pylayouts.c")


class LayoutGenerationError(RuntimeError):
    """pylayouts.c could not be compiled or run against an include directory."""


@dataclass(frozen=True)
class Layout:
    """Offsets (bytes) into CPython's structs for one minor version; -1 = absent."""

    # _PyRuntime -> interpreters -> threads
    runtime_interpreters_head: int  # _PyRuntimeState.interpreters.head (the newest)
    runtime_interpreters_main: int  # _PyRuntimeState.interpreters.main
    interp_threads_head: int  # PyInterpreterState.tstate_head (3.10) / threads.head
    tstate_next: int  # PyThreadState.next
    tstate_thread_id: int  # PyThreadState.thread_id (pthread_self())
    tstate_native_thread_id: int  # PyThreadState.native_thread_id (the TID), 3.11+
    # thread -> innermost frame
    tstate_frame: int  # .frame (3.10), .cframe (3.11, 3.12), .current_frame (3.13)
    cframe_current_frame: int  # _PyCFrame.current_frame (3.11, 3.12)
    # frames: PyFrameObject (3.10), _PyInterpreterFrame (3.11+)
    frame_previous: int  # f_back (3.10) / previous
    frame_code: int  # f_code / f_executable (3.13)
    frame_instr: int  # f_lasti (int, in code units; 3.10) / prev_instr / instr_ptr (3.13)
    frame_is_entry: int  # is_entry (char, 3.11)
    frame_owner: int  # owner (char, 3.11+)
    owned_by_cstack: int  # value of FRAME_OWNED_BY_CSTACK (3.12+): a shim frame, skip it
    # PyCodeObject
    code_filename: int
    code_name: int
    code_qualname: int  # 3.11+
    code_firstlineno: int  # int
    code_linetable: int  # bytes
    code_adaptive: int  # co_code_adaptive: the instructions, inline (3.11+)
    code_code: int  # co_code: a bytes object (3.10)
    # objects and types
    object_type: int  # PyObject.ob_type
    var_size: int  # PyVarObject.ob_size
    type_members: int  # PyTypeObject.tp_members
    type_name: int  # PyTypeObject.tp_name (char *)
    member_size: int  # sizeof(PyMemberDef)
    member_name: int  # PyMemberDef.name
    member_offset: int  # PyMemberDef.offset
    bytes_data: int  # PyBytesObject.ob_sval
    # str: PyASCIIObject / PyCompactUnicodeObject
    unicode_length: int
    unicode_state: int  # the 32-bit bitfield word
    ascii_data: int  # sizeof(PyASCIIObject): where compact ASCII data starts
    compact_data: int  # sizeof(PyCompactUnicodeObject): where other compact data starts
    unicode_kind_shift: int  # bit index of state.kind (3 bits: 1, 2 or 4 bytes a char)
    unicode_compact_bit: int  # bit index of state.compact
    unicode_ascii_bit: int  # bit index of state.ascii
    code_unit: int  # sizeof(_Py_CODEUNIT)


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Layout))

# Generated, not edited by hand (x86_64, gcc 12). For each pyenv build
# X.Y.Z in 3.10.13, 3.11.7, 3.12.1, 3.13.0, with INC=$(pyenv root)/versions/X.Y.Z/include/pythonX.Y:
#   gcc -DPy_BUILD_CORE -I$INC -I$INC/internal daemon/ember/runtimes/pylayouts.c -o pylayouts
#   ./pylayouts
# or equivalently `python -m ember.runtimes.pylayouts $INC...`, which prints these entries.
# Debian's /usr/include/python3.11 (3.11.2) gives the same numbers as 3.11.7.
LAYOUTS: dict[tuple[int, int], Layout] = {
    (3, 10): Layout(
        runtime_interpreters_head=32, runtime_interpreters_main=40, interp_threads_head=8,
        tstate_next=8, tstate_thread_id=176, tstate_native_thread_id=-1, tstate_frame=24,
        cframe_current_frame=-1, frame_previous=24, frame_code=32, frame_instr=96,
        frame_is_entry=-1, frame_owner=-1, owned_by_cstack=-1, code_filename=104, code_name=112,
        code_qualname=-1, code_firstlineno=40, code_linetable=120, code_adaptive=-1, code_code=48,
        object_type=8, var_size=16, type_members=240, type_name=24, member_size=40, member_name=0,
        member_offset=16, bytes_data=32, unicode_length=16, unicode_state=32, ascii_data=48,
        compact_data=72, unicode_kind_shift=2, unicode_compact_bit=5, unicode_ascii_bit=6,
        code_unit=2,
    ),
    (3, 11): Layout(
        runtime_interpreters_head=40, runtime_interpreters_main=48, interp_threads_head=16,
        tstate_next=8, tstate_thread_id=152, tstate_native_thread_id=160, tstate_frame=56,
        cframe_current_frame=8, frame_previous=48, frame_code=32, frame_instr=56,
        frame_is_entry=68, frame_owner=69, owned_by_cstack=-1, code_filename=112, code_name=120,
        code_qualname=128, code_firstlineno=72, code_linetable=136, code_adaptive=184,
        code_code=-1, object_type=8, var_size=16, type_members=240, type_name=24, member_size=40,
        member_name=0, member_offset=16, bytes_data=32, unicode_length=16, unicode_state=32,
        ascii_data=48, compact_data=72, unicode_kind_shift=2, unicode_compact_bit=5,
        unicode_ascii_bit=6, code_unit=2,
    ),
    (3, 12): Layout(
        runtime_interpreters_head=40, runtime_interpreters_main=48, interp_threads_head=72,
        tstate_next=8, tstate_thread_id=136, tstate_native_thread_id=144, tstate_frame=56,
        cframe_current_frame=0, frame_previous=8, frame_code=0, frame_instr=56, frame_is_entry=-1,
        frame_owner=70, owned_by_cstack=3, code_filename=112, code_name=120, code_qualname=128,
        code_firstlineno=68, code_linetable=136, code_adaptive=192, code_code=-1, object_type=8,
        var_size=16, type_members=240, type_name=24, member_size=40, member_name=0,
        member_offset=16, bytes_data=32, unicode_length=16, unicode_state=32, ascii_data=40,
        compact_data=56, unicode_kind_shift=2, unicode_compact_bit=5, unicode_ascii_bit=6,
        code_unit=2,
    ),
    (3, 13): Layout(
        runtime_interpreters_head=632, runtime_interpreters_main=640, interp_threads_head=7344,
        tstate_next=8, tstate_thread_id=152, tstate_native_thread_id=160, tstate_frame=72,
        cframe_current_frame=-1, frame_previous=8, frame_code=0, frame_instr=56, frame_is_entry=-1,
        frame_owner=70, owned_by_cstack=3, code_filename=112, code_name=120, code_qualname=128,
        code_firstlineno=68, code_linetable=136, code_adaptive=200, code_code=-1, object_type=8,
        var_size=16, type_members=240, type_name=24, member_size=40, member_name=0,
        member_offset=16, bytes_data=32, unicode_length=16, unicode_state=32, ascii_data=40,
        compact_data=56, unicode_kind_shift=2, unicode_compact_bit=5, unicode_ascii_bit=6,
        code_unit=2,
    ),
}


def layout_for(major: int, minor: int) -> Layout | None:
    """The layout of CPython ``major.minor``, or None for a version not in the table."""
    return LAYOUTS.get((major, minor))


def generate(include_dir: str, cc: str = "gcc") -> dict[str, int]:
    """Compile pylayouts.c against the CPython headers in ``include_dir`` (the
    directory holding Python.h, e.g. /usr/include/python3.11), run it and return
    its numbers, keyed by :class:`Layout` field name.

    Raises LayoutGenerationError when the headers are missing, the compiler
    fails or the program's output is not the expected fields."""
    inc = Path(include_dir)
    if not (inc / "Python.h").is_file():
        raise LayoutGenerationError(f"no Python.h in {inc}: not a CPython include directory")
    with tempfile.TemporaryDirectory(prefix="pylayouts-") as tmp:
        exe = Path(tmp) / "pylayouts"
        cmd = [cc, "-DPy_BUILD_CORE", f"-I{inc}", f"-I{inc / 'internal'}", str(SOURCE),
               "-o", str(exe)]
        try:
            built = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as e:
            raise LayoutGenerationError(f"cannot run the C compiler {cc!r}: {e}") from e
        if built.returncode != 0:
            raise LayoutGenerationError(
                f"compiling {SOURCE.name} against {inc} failed (exit {built.returncode}):\n"
                f"$ {' '.join(cmd)}\n{built.stderr.strip()}")
        ran = subprocess.run([str(exe)], capture_output=True, text=True, check=False)
        if ran.returncode != 0:
            raise LayoutGenerationError(
                f"{SOURCE.name} built against {inc} exited {ran.returncode}: {ran.stderr.strip()}")
    try:
        raw = json.loads(ran.stdout)
    except json.JSONDecodeError as e:
        raise LayoutGenerationError(f"{SOURCE.name} printed no JSON: {e}: {ran.stdout!r}") from e
    if not isinstance(raw, dict) or list(raw) != list(FIELDS) or not all(
            type(v) is int for v in raw.values()):
        raise LayoutGenerationError(
            f"{SOURCE.name} printed {raw!r}, not one int for each of {', '.join(FIELDS)}")
    return {str(k): int(v) for k, v in raw.items()}


def render(version: tuple[int, int], values: dict[str, int]) -> str:
    """One LAYOUTS entry as Python source, as it is written above."""
    lines = [f"    {version}: Layout("]
    line = "       "
    for name in FIELDS:
        item = f" {name}={values[name]},"
        if len(line) + len(item) > 99:
            lines.append(line)
            line = "       "
        line += item
    lines += [line, "    ),"]
    return "\n".join(lines)


def _version_of(include_dir: str) -> tuple[int, int]:
    """(major, minor) from the headers' patchlevel.h."""
    text = (Path(include_dir) / "patchlevel.h").read_text()
    found: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "#define" and parts[1] in (
                "PY_MAJOR_VERSION", "PY_MINOR_VERSION"):
            found[parts[1]] = int(parts[2])
    return found["PY_MAJOR_VERSION"], found["PY_MINOR_VERSION"]


def main(argv: list[str]) -> int:
    """``python -m ember.runtimes.pylayouts INCLUDE_DIR...``: print LAYOUTS entries."""
    if not argv:
        print("usage: python -m ember.runtimes.pylayouts INCLUDE_DIR...", file=sys.stderr)
        return 2
    for inc in argv:
        print(render(_version_of(inc), generate(inc)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
