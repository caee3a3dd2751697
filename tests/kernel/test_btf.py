"""Struct offsets from the running kernel's BTF, checked against pahole
(dwarves) reading the same file: two independent readers agree."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from ember.kernel.btf import VMLINUX, Btf, BtfError, task_fsbase_offset


def pahole_offset(struct: str, member: str) -> int:
    out = subprocess.run(["pahole", "-C", struct, str(VMLINUX)], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        m = re.search(rf"\b{member};\s+/\*\s+(\d+)\s", line)
        if m and line.startswith("\t") and not line.startswith("\t\t"):
            return int(m.group(1))
    raise AssertionError(f"pahole: no {struct}.{member}")


@pytest.mark.skipif(not VMLINUX.exists(), reason="the kernel has no BTF")
def test_offsets_agree_with_pahole() -> None:
    if shutil.which("pahole") is None:
        pytest.skip("pahole (dwarves) is not installed")
    btf = Btf(VMLINUX.read_bytes())
    for struct, member in (("task_struct", "pid"), ("task_struct", "tgid"),
                           ("task_struct", "thread"), ("thread_struct", "fsbase"),
                           ("task_struct", "stack"), ("task_struct", "mm")):
        assert btf.offset(struct, member) == pahole_offset(struct, member), (struct, member)
    assert task_fsbase_offset() == (pahole_offset("task_struct", "thread")
                                    + pahole_offset("thread_struct", "fsbase"))


@pytest.mark.skipif(not VMLINUX.exists(), reason="the kernel has no BTF")
def test_unknown_names_and_bad_data_are_clear_errors() -> None:
    btf = Btf(VMLINUX.read_bytes())
    with pytest.raises(BtfError, match="no struct nonesuch"):
        btf.offset("nonesuch", "x")
    with pytest.raises(BtfError, match="has no member nonesuch"):
        btf.offset("task_struct", "nonesuch")
    with pytest.raises(BtfError, match="bad magic"):
        Btf(b"\0" * 64)
    with pytest.raises(BtfError, match="too short"):
        Btf(b"\x9f\xeb")
