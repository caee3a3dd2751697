"""ember flamegraph and ember diff from files, as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ember.encode.pprof import encode_pprof
from ember.flamegraph.graphs import diff, flamegraph
from ember.flamegraph.inputs import load
from tests.support.profiles import offcpu_profile
from tests.support.svg import frames


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], capture_output=True,
                          text=True, timeout=60)


def test_folded_and_pprof_inputs(tmp_path: Path) -> None:
    folded = tmp_path / "cpu.folded"
    folded.write_text("app;main;a 30\napp;main;b 70\n")
    f = frames(flamegraph(str(folded)))
    assert {x["name"] for x in f} >= {"a", "b", "main"}
    pprof = tmp_path / "off.pb.gz"
    pprof.write_bytes(encode_pprof(offcpu_profile()))
    s = load(str(pprof))
    assert s.unit == "ns" and s.offcpu
    svg_text = flamegraph(str(pprof))
    assert "Off-CPU Time Flame Graph" in svg_text
    f = frames(svg_text)
    by = {x["name"]: x for x in f}
    assert "ms" in str(by["[sleeping]"]["title"])  # time shown in ms, not raw ns
    assert by["schedule"]["fill"] != by["main"]["fill"]


def test_cli_outputs_and_errors(tmp_path: Path) -> None:
    folded = tmp_path / "x.folded"
    folded.write_text("app;main;a 30\n")
    r = run("flamegraph", str(folded), "-o", str(tmp_path / "x.html"), "--title", "Mine")
    assert r.returncode == 0, r.stderr
    assert "<title>Mine</title>" in (tmp_path / "x.html").read_text()
    r = run("flamegraph", str(folded))
    assert r.returncode == 0 and r.stdout.startswith("<?xml")
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x00\x01garbage\xff")
    r = run("flamegraph", str(bad))
    assert r.returncode == 2 and "neither folded stacks nor a pprof profile" in r.stderr
    r = run("flamegraph", str(tmp_path / "missing"))
    assert r.returncode == 2 and "cannot read" in r.stderr


def test_diff_normalize_strip_negate_and_two_column(tmp_path: Path) -> None:
    before = tmp_path / "before.folded"
    after = tmp_path / "after.folded"
    before.write_text("app;main;old 10\napp;main;0x1234 10\n")
    after.write_text("app;main;new 40\napp;main;0x5678 40\n")
    svg_text, two = diff(str(before), str(after), normalize=True, strip=True)
    assert "app;main;0x? 40 40" in two and "app;main;new 0 40" in two
    assert "app;main;old 40 0" in two
    names = {x["name"]: x for x in frames(svg_text)}
    assert "old" not in names and names["new"]["fill"] == "rgb(255,0,0)"
    assert names["0x?"]["fill"] == "rgb(250,250,250)"  # unchanged once normalized
    neg, _ = diff(str(before), str(after), normalize=True, strip=True, negate=True)
    names = {x["name"]: x for x in frames(neg)}
    assert "new" not in names and names["old"]["fill"] == "rgb(0,0,255)"
    r = run("diff", str(before), str(after), "--folded", str(tmp_path / "d.folded"),
            "-o", str(tmp_path / "d.svg"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "d.folded").read_text().count("\n") == 4


def test_hot_cold(tmp_path: Path) -> None:
    on = tmp_path / "on.folded"
    off = tmp_path / "off.folded"
    on.write_text("app;main;compute 100\n")           # 100 samples at 100 Hz = 1 s
    off.write_text("app;main;wait;[sleeping] 3000000\n")  # 3 s in microseconds
    svg_text = flamegraph(str(on), cold=str(off), frequency=100)
    by = {x["name"]: x for x in frames(svg_text)}
    assert abs(float(by["wait"]["w"]) / float(by["main"]["w"]) - 0.75) < 0.01  # type: ignore[arg-type]
    assert "100% off-CPU" in str(by["wait"]["title"]) and "0% off-CPU" in \
        str(by["compute"]["title"])
    assert by["wait"]["fill"] != by["compute"]["fill"]
    r = run("flamegraph", str(on), "--cold", str(off))
    assert r.returncode == 2 and "--frequency" in r.stderr
