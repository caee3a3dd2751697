"""bpf/ember.h and ember.abi agree on every struct layout and constant, and
neither has a name the other lacks."""

from __future__ import annotations

import ctypes as ct
import json
import re
import subprocess
from pathlib import Path

from ember import abi
from ember.kernel.programs import bpf_source_dir


def c_layout(tmp_path: Path) -> dict[str, object]:
    lines = ['#include <linux/types.h>', '#include <stdio.h>', '#include <stddef.h>',
             '#include "ember.h"', "int main(void) {", 'printf("{");']
    for cname, struct in abi.STRUCTS.items():
        lines.append(f'printf("\\"{cname}\\": {{\\"size\\": %zu", sizeof(struct {cname}));')
        for fname, _ in struct._fields_:
            lines.append(f'printf(", \\"{fname}\\": %zu", offsetof(struct {cname}, {fname}));')
        lines.append('printf("}, ");')
    for name in abi.CONSTANTS:
        lines.append(f'printf("\\"{name}\\": %lld, ", (long long)({name}));')
    lines += ['printf("\\"end\\": 0}\\n");', "return 0; }"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-Wall", "-Werror", f"-I{bpf_source_dir()}", "-o", str(exe), str(src)],
                   check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return json.loads(out)  # type: ignore[no-any-return]


def test_structs_and_constants_match(tmp_path: Path) -> None:
    c = c_layout(tmp_path)
    for cname, struct in abi.STRUCTS.items():
        layout = c[cname]
        assert isinstance(layout, dict)
        assert layout["size"] == ct.sizeof(struct), cname
        for fname, _ in struct._fields_:
            assert layout[fname] == getattr(struct, fname).offset, f"{cname}.{fname}"
    for name, value in abi.CONSTANTS.items():
        assert int(c[name]) % 2**64 == value % 2**64, name  # type: ignore[call-overload]


def test_stat_names_are_complete() -> None:
    assert abi.STAT_MAX == len(abi.Stat) == max(abi.Stat) + 1


def test_state_names() -> None:
    assert abi.state_name(abi.STATE_RUNNABLE) == "runnable"
    assert abi.state_name(abi.STATE_UNINTERRUPTIBLE) == "disk-sleep"
    assert abi.state_name(0x3) == "sleeping+disk-sleep"
    assert abi.state_name(0x800) == "state-0x800"
    # a block found in progress at the start: named by its state alone
    assert abi.state_name(abi.STATE_INTERRUPTIBLE | abi.STATE_BEFORE_START) == "sleeping"


def header() -> str:
    return (bpf_source_dir() / "ember.h").read_text()


def test_every_name_of_the_header_is_mirrored() -> None:
    """A #define, an enum ember_stat entry or a struct added to ember.h
    without its Python mirror fails here (the layout test only checks what
    abi.py already lists)."""
    text = header()
    defines = set(re.findall(r"^#define (EMBER_\w+) ", text, re.M))
    stats = {f"EMBER_STAT_{s.name}" for s in abi.Stat} | {"EMBER_STAT_MAX"}
    enum = set(re.findall(r"^\s+(EMBER_STAT_\w+)", text, re.M))
    assert enum == stats
    assert defines - {"EMBER_H"} <= set(abi.CONSTANTS), defines - set(abi.CONSTANTS)
    structs = set(re.findall(r"^struct (ember_\w+) \{", text, re.M))
    assert structs == set(abi.STRUCTS)


def test_struct_fields_in_the_same_order() -> None:
    text = header()
    for cname, struct in abi.STRUCTS.items():
        body = re.search(rf"^struct {cname} \{{(.*?)^\}};", text, re.M | re.S)
        assert body is not None, cname
        fields = re.findall(r"^\s+(?:__[us]\d+|char|struct ember_\w+)\s+(\w+)",
                            body.group(1), re.M)
        assert fields == [f for f, _ in struct._fields_], cname


def test_build_time_defaults_are_the_headers() -> None:
    """abi.DEFAULT_DEFINES is the one Python copy of the #ifndef defaults."""
    text = header()
    defaults = dict(re.findall(r"#ifndef (EMBER_\w+)\n#define \1 (\d+)", text))
    assert {k: int(v) for k, v in defaults.items()} == abi.DEFAULT_DEFINES


def test_unwind_rows_are_packed_as_the_kernel_reads_them() -> None:
    """unwind/cfa.py packs rows with struct; the BPF walker reads ember_unwind_row."""
    from ember.unwind.cfa import ROW

    assert ROW.size == ct.sizeof(abi.UnwindRow)
    row = abi.UnwindRow.from_buffer_copy(ROW.pack(0x1234, -8, -16, abi.CFA_RBP, abi.RBP_SAVED))
    assert (row.pc, row.cfa_offset, row.rbp_offset, row.cfa_type, row.rbp_type) == (
        0x1234, -8, -16, abi.CFA_RBP, abi.RBP_SAVED)
