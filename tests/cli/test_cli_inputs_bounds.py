"""``ember flamegraph`` and ``ember diff`` on hostile inputs, as a user runs
them: a gzip bomb is refused with one line and little memory, a big folded
file is read as a stream, --max-input-size bounds both, and a folded file
with bad bytes or a bad line is drawn or named by line."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ember.cli import main
from ember.cli._common import MAX_INPUT_SIZE, size_arg
from ember.config.units import render_size
from ember.flamegraph import inputs

#: Runs ember in a child of its own and reports that child's peak RSS, so no
#: other child of the test session counts.
MEASURE = """
import json, resource, subprocess, sys
r = subprocess.run([sys.executable, "-m", "ember.cli", *sys.argv[1:]], capture_output=True,
                   text=True)
print(json.dumps({"rc": r.returncode, "stderr": r.stderr,
                  "peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def run_measured(*args: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", MEASURE, *args], capture_output=True,
                         text=True, timeout=120, check=True)
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_gzip_bomb_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    """6.4 GB of zeros in 100 gzip members of 64 MiB: a 6.5 MB file."""
    member = gzip.compress(b"\0" * (64 << 20))
    bomb = tmp_path / "bomb.pb.gz"
    bomb.write_bytes(member * 100)
    r = run_measured("flamegraph", str(bomb), "--max-input-size", "100M", "-o",
                     str(tmp_path / "x.svg"))
    assert r["rc"] == 2
    assert r["stderr"] == (f"ember flamegraph: {bomb}: decompresses to more than "
                           f"{100 << 20} bytes\n")
    assert r["peak_mb"] < 300  # type: ignore[operator]
    # members that fit one by one are counted together
    two = tmp_path / "two.pb.gz"
    two.write_bytes(gzip.compress(b"\0" * 600) * 2)
    assert main(["diff", str(two), str(two), "--max-input-size", "1000"]) == 2


def test_big_folded_file_is_streamed(tmp_path: Path) -> None:
    """200 MB of repeated lines: memory grows with distinct stacks only."""
    big = tmp_path / "big.folded"
    block = b"app;main;parse;read 1\napp;main;render;draw;text 2\n" * (1 << 14)
    with big.open("wb") as f:
        for _ in range((200 << 20) // len(block) + 1):
            f.write(block)
    out = tmp_path / "big.svg"
    r = run_measured("flamegraph", str(big), "-o", str(out))
    assert r["rc"] == 0, r["stderr"]
    assert r["peak_mb"] < 200  # type: ignore[operator]
    assert 'data-n="draw"' in out.read_text()
    r = run_measured("diff", str(big), str(big), "--max-input-size", "150MiB")
    assert r["rc"] == 2
    assert r["stderr"] == f"ember diff: {big}: larger than {150 << 20} bytes " \
                          "(see --max-input-size)\n"


def test_standard_input_is_bounded_too() -> None:
    r = subprocess.run([sys.executable, "-m", "ember.cli", "flamegraph", "-",
                        "--max-input-size", "1K"], input=b"a;b 1\n" * 1000,
                       capture_output=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr == b"ember flamegraph: -: larger than 1024 bytes (see --max-input-size)\n"


def test_max_input_size_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert size_arg("512M") == 512 << 20
    assert size_arg("2GiB") == 2 << 30
    assert size_arg("4096") == 4096
    # the help, built without the flame graph code, shows the real default
    assert MAX_INPUT_SIZE == inputs.MAX_INPUT_SIZE and render_size(MAX_INPUT_SIZE) == "1GiB"
    with pytest.raises(SystemExit):
        main(["flamegraph", "--help"])
    assert "default 1GiB" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as exc:
        main(["flamegraph", "x", "--max-input-size", "lots"])
    assert exc.value.code == 2
    assert "--max-input-size: not a size: 'lots'" in capsys.readouterr().err


def test_bad_bytes_are_drawn_and_bad_lines_named(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    odd = tmp_path / "odd.folded"
    odd.write_bytes(b"app;caf\xe9;<b>&\x1b[0m 5\napp;main 2\n")
    out = tmp_path / "odd.svg"
    assert main(["flamegraph", str(odd), "-o", str(out)]) == 0
    names = {g.get("data-n") for g in ET.parse(out).getroot().iter()
             if g.get("class") == "f"}
    assert {"caf\ufffd", "<b>&\ufffd[0m", "main"} <= names
    bad = tmp_path / "bad.folded"
    bad.write_text("app;main 2\napp;main 3\n\napp;oops\n")
    assert main(["flamegraph", str(bad)]) == 2
    assert capsys.readouterr().err == (f"ember flamegraph: {bad}:4: expected 'stack count', "
                                       "got 'app;oops'\n")
