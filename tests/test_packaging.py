"""A plain (non-editable) install ships its non-Python files (the BPF
sources, the flame graph viewer's script, the web UI's vendored chart
library) and finds them, and builds the collector's C pprof reader."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package pip-installed into its own directory (once: installing is
    the slow part), built from a clean copy of what the build reads: a
    ``build/`` or ``*.egg-info`` an earlier build left in the tree would ship
    files pyproject.toml no longer (or never) declared."""
    base = tmp_path_factory.mktemp("install")
    src = base / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("daemon", "bpf"):
        shutil.copytree(ROOT / name, src / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so"))
    target = base / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation",
                    "--target", str(target), str(src)], check=True, cwd=base)
    return target


def run_installed(target: Path, code: str, cwd: Path) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, env={"PYTHONPATH": str(target)}, cwd=cwd).stdout


def test_wheel_install_finds_bpf_sources(installed: Path, tmp_path: Path) -> None:
    target = installed
    shipped = {p.name for p in (target / "ember" / "bpf").iterdir()}
    assert {"ember.h", "common.h", "unwind_fp.h", "oncpu.c", "offcpu.c"} <= shipped
    code = ("import ember.kernel.build as t; d = t.bpf_source_dir(); print(d); "
            "assert 'ember_sched_switch' in t.flatten_source('offcpu.c')")
    out = run_installed(target, code, tmp_path)
    assert out.strip() == str(target / "ember" / "bpf")


def test_wheel_install_ships_the_flamegraph_script(installed: Path, tmp_path: Path) -> None:
    shipped = installed / "ember" / "flamegraph" / "flamegraph.js"
    source = ROOT / "daemon" / "ember" / "flamegraph" / "flamegraph.js"
    assert shipped.read_bytes() == source.read_bytes()
    code = ("from collections import Counter; import ember.flamegraph.svg as s; "
            "print(s.__file__); "
            "out = s.render(s.build_tree(Counter({'a;b': 1})), s.Options()); "
            "assert 'svg.emberZoom = zoom' in out, out")
    out = run_installed(installed, code, tmp_path)
    assert out.strip() == str(installed / "ember" / "flamegraph" / "svg.py")


def test_wheel_install_ships_the_vendored_chart_library(installed: Path, tmp_path: Path) -> None:
    """pyproject's package-data takes web/vendor/ (built by deploy/web/build.sh
    at set-up, before the install) into the wheel, and the installed package
    serves it from there."""
    source = ROOT / "daemon" / "ember" / "collector" / "web" / "vendor"
    shipped = installed / "ember" / "collector" / "web" / "vendor"
    for name in ("uPlot.iife.min.js", "uPlot.min.css", "LICENSE", "VERSION"):
        assert (shipped / name).read_bytes() == (source / name).read_bytes(), name
    code = ("import ember.collector.web as w; print(w.__file__); "
            "code, body, ctype = w.asset('/vendor/uPlot.iife.min.js'); "
            "assert (code, ctype) == (200, 'application/javascript; charset=utf-8'), code; "
            "assert body.startswith(b'/*! https://github.com/leeoniya/uPlot'), body[:80]")
    out = run_installed(installed, code, tmp_path)
    assert out.strip() == str(installed / "ember" / "collector" / "web" / "__init__.py")


def test_wheel_install_builds_the_c_extensions(installed: Path, tmp_path: Path) -> None:
    """The extensions are optional to the build (a host without a compiler
    still installs); the set-up installs gcc and Python's headers, so here
    they must be built, and the installed decode.py and memo.py must use
    them."""
    code = ("import ember.collector.decode as d; print(d._pprof.__file__); "
            "from ember.proto import profile_pb2 as pb; "
            "p = pb.Profile(string_table=['']); p.location.add(id=1, address=5); "
            "t = d.read(p); assert t.locations.address.tolist() == [5], t; "
            "import ember.collector.memo as m; print(m._memo.__file__); "
            "assert isinstance(m.rows_memo(3, 1, len), m.HashMemo)")
    out = run_installed(installed, code, tmp_path).split()
    assert out[0].startswith(str(installed / "ember" / "collector" / "_pprof")), out
    assert out[1].startswith(str(installed / "ember" / "collector" / "_memo")), out
