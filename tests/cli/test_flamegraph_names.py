"""``ember flamegraph`` and ``ember diff``, run as a user runs them, on
names of hostile bytes: bytes that are not UTF-8, control characters,
markup, C++ templates merged into a ``[N narrow frames]`` group. Each run
exits 0, writes XML (or an HTML page around it) and keeps every sample."""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ember.encode.pprof import to_proto
from tests.support.profiles import cpu_profile
from tests.support.svg import NS

EMBER = [sys.executable, "-m", "ember.cli"]
NARROW = re.compile(r"^\[(\d+) narrow frames\]$")
#: Twenty C++ templates, one sample each: too narrow to draw beside BIG.
TEMPLATES = [b"std::map<K%d, V>::operator[](K%d const&) [with V = caf\xe9 & \"x\" 'y']" % (i, i)
             for i in range(20)]
BIG = 100_000
#: Lines with markup, bytes that are not UTF-8 and (in the second file)
#: control bytes, which send the file down the "binary, not pprof" path.
TEXT_LINES = [b"app;main;big<&> %d" % BIG, b"app;main;caf\xe9;\xff\xfe\xc3 700",
              b"app;main;a<b>&\"' 500", *(b"app;main;" + t + b" 1" for t in TEMPLATES)]
CONTROL_LINES = [*TEXT_LINES, b"app;main;\x01ctl\x1b[31m\x7f 300"]


def run(*args: str | bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*EMBER, *args], capture_output=True, timeout=60)


def folded(tmp_path: Path, name: str, lines: list[bytes]) -> tuple[Path, int]:
    """A folded file of these lines, and its sample total."""
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path, sum(int(line.rpartition(b" ")[2]) for line in lines)


def frames(svg: bytes) -> list[tuple[str, float, str]]:
    """(data-n, data-v, hover title) of every frame; the SVG must be XML."""
    root = ET.fromstring(svg)
    out = []
    for g in root.iterfind(".//s:g[@class='f']", NS):
        title = g.find("s:title", NS)
        assert title is not None
        out.append((g.get("data-n", ""), float(g.get("data-v", "0")), title.text or ""))
    return out


def check(svg: bytes, total: int) -> list[tuple[str, float, str]]:
    """The frames of an SVG that holds every sample: the root's and the sum
    of main's children (the narrow group among them)."""
    f = frames(svg)
    assert f[0][:2] == ("all", total)
    by = {name: v for name, v, _ in f}
    assert by["main"] == total
    drawn = ("big<&>", "caf\ufffd", "a<b>&\"'", "\ufffdctl\ufffd[31m\x7f")
    children = [v for name, v, _ in f if NARROW.match(name) or name in drawn]
    assert sum(children) == total
    return f


@pytest.mark.parametrize("lines", [TEXT_LINES, CONTROL_LINES], ids=["text", "control-bytes"])
def test_flamegraph_draws_bad_bytes_and_keeps_every_sample(tmp_path: Path,
                                                           lines: list[bytes]) -> None:
    path, total = folded(tmp_path, "odd.folded", lines)
    r = run("flamegraph", str(path), "--title", b"odd \xff<&>\x01 names")
    assert r.returncode == 0, r.stderr
    f = check(r.stdout, total)
    group = [(v, hover) for name, v, hover in f if NARROW.match(name)]
    assert [v for v, _ in group] == [len(TEMPLATES)]
    shown = sorted(t.decode("utf-8", "replace") for t in TEMPLATES)
    assert ", ".join(shown[:8]) + ", ..." in group[0][1]
    title = ET.fromstring(r.stdout).find("s:text[@id='title']", NS)
    assert title is not None and title.text == "odd \ufffd<&>\ufffd names"


def test_flamegraph_html_page(tmp_path: Path) -> None:
    path, total = folded(tmp_path, "odd.folded", CONTROL_LINES)
    out = tmp_path / "odd.html"
    r = run("flamegraph", str(path), "-o", str(out), "--title", b"t\xff<&>\x01")
    assert r.returncode == 0, r.stderr
    page = out.read_text(encoding="utf-8")
    assert "<title>t\ufffd&lt;&amp;&gt;\ufffd</title>" in page
    body = re.search(r"<body[^>]*>(.*)</body>", page, re.S)
    assert body is not None
    check(body[1].encode(), total)


def test_diff_draws_bad_bytes_and_keeps_every_sample(tmp_path: Path) -> None:
    before, _ = folded(tmp_path, "before.folded", TEXT_LINES)
    after, total = folded(tmp_path, "after.folded", CONTROL_LINES)
    two = tmp_path / "two.folded"
    r = run("diff", str(before), str(after), "--folded", str(two), "--title", b"\x01\xff")
    assert r.returncode == 0, r.stderr
    check(r.stdout, total)
    columns = [line.rsplit(" ", 2) for line in two.read_text(encoding="utf-8").splitlines()]
    assert sum(int(c[2]) for c in columns) == total
    assert sum(int(c[1]) for c in columns) == total - 300


def test_flamegraph_of_a_pprof_whose_strings_are_not_utf8(tmp_path: Path) -> None:
    """Go's pprof writes a symbol's bytes as they are: drawn, not refused."""
    data = to_proto(cpu_profile()).SerializeToString().replace(b"\x04main", b"\x04m\xffin")
    path = tmp_path / "go.pb.gz"
    path.write_bytes(gzip.compress(data))
    r = run("flamegraph", str(path))
    assert r.returncode == 0, r.stderr
    f = frames(r.stdout)
    assert f[0][:2] == ("all", sum(s.values[-1] for s in cpu_profile().samples))
    assert "m\ufffdin" in {name for name, _, _ in f}
