"""Stacks far deeper than Python's recursion limit (5,000 frames) through
every view: ``ember flamegraph`` of folded and pprof files, ``ember diff``,
and the graphs the collector draws from merged profiles. Each keeps the
leafmost MAX_STACK_DEPTH frames under a root [truncated] frame."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

from ember.cli import main
from ember.flamegraph.graphs import diff_graph, graph, hotcold_graph, top_functions
from ember.flamegraph.inputs import Stacks, stacks_of
from ember.model import MAX_STACK_DEPTH, TRUNCATED, Frame, FrameKind, Sample, cpu_type
from ember.proto import profile_pb2 as pb
from tests.support.svg import frames

DEPTH = 5000
NAMES = [f"f{i}" for i in range(DEPTH)]


def deep_folded(path: Path, count: int = 3) -> Path:
    path.write_text(f"app;{';'.join(NAMES)} {count}\napp;main {count}\n")
    return path


def deep_pprof(path: Path) -> Path:
    """A pprof file of one 5,000-location sample, written field by field (ember's
    own encoder would cap it)."""
    p = pb.Profile()
    p.string_table.extend(["", "samples", "count", "cpu", "nanoseconds", *NAMES])
    p.sample_type.add(type=1, unit=2)
    p.sample_type.add(type=3, unit=4)
    for i in range(DEPTH):
        p.function.add(id=i + 1, name=5 + i)
        p.location.add(id=i + 1).line.add(function_id=i + 1)
    p.sample.add(location_id=range(DEPTH, 0, -1), value=[1, 10_000_000])  # leaf first
    path.write_bytes(gzip.compress(p.SerializeToString()))
    return path


def assert_capped(svg_text: str) -> None:
    drawn = frames(svg_text)
    deepest = max(f["d"] for f in drawn)  # type: ignore[type-var]
    assert deepest == MAX_STACK_DEPTH  # the "all" root is depth 0
    by_depth = {f["d"]: f["name"] for f in drawn}
    assert TRUNCATED in {f["name"] for f in drawn}
    assert by_depth[deepest] == NAMES[-1]  # the leaf is kept


def test_flamegraph_cli_of_deep_folded_and_pprof(tmp_path: Path) -> None:
    for src in (deep_folded(tmp_path / "deep.folded"), deep_pprof(tmp_path / "deep.pb.gz")):
        out = tmp_path / f"{src.name}.svg"
        assert main(["flamegraph", str(src), "-o", str(out)]) == 0
        assert_capped(out.read_text())


def test_diff_cli_of_deep_folded(tmp_path: Path) -> None:
    before = deep_folded(tmp_path / "before.folded", 3)
    after = deep_folded(tmp_path / "after.folded", 5)
    out, two = tmp_path / "diff.svg", tmp_path / "diff.txt"
    assert main(["diff", str(before), str(after), "-o", str(out), "--folded", str(two)]) == 0
    assert_capped(out.read_text())
    deep = max(two.read_text().splitlines(), key=len)
    assert deep.endswith(" 3 5") and deep.split(";")[0] == TRUNCATED


def test_collector_views_of_a_deep_profile() -> None:
    """What /api/v1/flamegraph, /diff and /top draw, from merged samples."""
    deep = tuple(Frame(n, FrameKind.USER) for n in NAMES)
    s = stacks_of(cpu_type(99), [Sample(deep, (1, 10), 1, 1, "app")])
    assert_capped(graph(s))
    assert_capped(hotcold_graph(s, s))
    assert_capped(diff_graph(s, s)[0])
    top = top_functions(s)
    assert top[0] == {"name": NAMES[-1], "self": 10, "total": 10}


def test_views_cap_stacks_they_are_given() -> None:
    """A Stacks made by anyone (not read by ember's parser) is capped too."""
    s = Stacks(Counter({";".join(NAMES): 7}), "samples", {})
    assert_capped(graph(s))
