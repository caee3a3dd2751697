"""A plain (non-editable) install ships the BPF sources and finds them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import ROOT


def test_wheel_install_finds_bpf_sources(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation",
                    "--target", str(target), str(ROOT)], check=True, cwd=tmp_path)
    shipped = {p.name for p in (target / "ember" / "bpf").iterdir()}
    assert {"ember.h", "common.h", "unwind_fp.h", "oncpu.c", "offcpu.c"} <= shipped
    code = ("import ember.kernel.build as t; d = t.bpf_source_dir(); print(d); "
            "assert 'ember_sched_switch' in t.flatten_source('offcpu.c')")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={"PYTHONPATH": str(target)}, cwd=tmp_path).stdout
    assert out.strip() == str(target / "ember" / "bpf")
