"""Perf maps: parsing (malformed input skipped, fuzzed), growth, namespaces."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from ember.symbols.perfmap import PerfMap, ns_pid, parse_perf_map


def test_parse_skips_bad_lines() -> None:
    starts, ends, names = parse_perf_map(
        "3ef414c0 398 LazyCompile:~handler /srv/app.js:10\n"
        "garbage\n"
        "zz 10 bad hex\n"
        "1000 0 zero size\n"
        "2000 10 JS:*hot path with spaces.js:1:17\n")
    assert starts == [0x2000, 0x3EF414C0]
    assert ends == [0x2010, 0x3EF414C0 + 0x398]
    assert names == ["JS:*hot path with spaces.js:1:17", "LazyCompile:~handler /srv/app.js:10"]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_fuzz_never_raises(text: str) -> None:
    starts, ends, names = parse_perf_map(text)
    assert len(starts) == len(ends) == len(names)
    assert all(s < e for s, e in zip(starts, ends, strict=True))


def fake_process(root: Path, pid: int, nspid: int) -> Path:
    d = root / str(pid)
    (d / "root" / "tmp").mkdir(parents=True)
    (d / "status").write_text(f"Name:\tnode\nNSpid:\t{pid}\t{nspid}\n")
    return d / "root" / "tmp" / f"perf-{nspid}.map"


def test_namespaced_pid_and_growth(tmp_path: Path) -> None:
    path = fake_process(tmp_path, 4242, 7)  # pid 7 inside its container
    assert ns_pid(4242, tmp_path) == 7
    path.write_text("1000 100 first\n")
    pm = PerfMap(4242, tmp_path)
    assert pm.lookup(0x1050) == "first" and pm.lookup(0x2000) is None
    with open(path, "a") as f:
        f.write("2000 100 compiled later\n")
    assert pm.lookup(0x2010) == "compiled later"  # re-read when the file grew
    path.unlink()
    assert pm.lookup(0x1050) == "first"  # the process exited: keep what was read
