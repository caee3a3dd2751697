"""Flame graph SVG parsed back as XML and checked against the input."""

from __future__ import annotations

import itertools
from collections import Counter

from ember.flamegraph.svg import (
    FRAME_H,
    PAD_X,
    Options,
    build_tree,
    colour,
    diff_colour,
    render,
    to_html,
)
from tests.support.svg import frames


def test_widths_proportional_and_tree_shape() -> None:
    stacks = Counter({"app;main;work_a": 35, "app;main;work_b": 50, "app;main;work_c": 15})
    f = frames(render(build_tree(stacks), Options(width=1200)))
    assert [x["name"] for x in f] == ["all", "app", "main", "work_a", "work_b", "work_c"]
    plot = 1200 - 2 * PAD_X
    for x in f:
        assert abs(float(x["w"]) - plot * float(x["v"]) / 100) < 0.01  # type: ignore[arg-type]
    by = {x["name"]: x for x in f}
    assert by["work_b"]["x"] == by["work_a"]["x"] + by["work_a"]["w"]  # type: ignore[operator]
    assert by["main"]["y"] - by["work_a"]["y"] == FRAME_H  # type: ignore[operator]
    assert "35 samples, 35.00%" in str(by["work_a"]["title"])


def test_offsets_read_back_exactly() -> None:
    """The script zooms by data-o and data-v: a frame must end exactly where
    its right neighbour begins, or a zoom into the neighbour keeps it in
    view (six digits made 20100500 + 1432160000 pass 1452260000)."""
    stacks = Counter({"app;__libc;main;work_b": 20_100_503, "app;_start;main;work_a": 1_432_163_117,
                      "app;_start;main;work_b": 1_954_770_001, "app;_start;main;work_c": 3.3e-3})
    f = frames(render(build_tree(stacks), Options(width=1500)))
    by_depth: dict[int, list[dict[str, object]]] = {}
    for x in f:
        by_depth.setdefault(int(x["d"]), []).append(x)  # type: ignore[call-overload]
    for row in by_depth.values():
        row.sort(key=lambda x: float(x["o"]))  # type: ignore[arg-type]
        for left, right in itertools.pairwise(row):
            assert float(left["o"]) + float(left["v"]) <= float(right["o"]), (left, right)  # type: ignore[arg-type]
    v = {(x["name"], x["d"]): x["v"] for x in f}
    assert v[("work_a", 4)] == 1_432_163_117


def test_escaping_and_truncation() -> None:
    name = 'std::map<int, std::string>::operator[](int&&) "quoted"'
    stacks = Counter({f"app;{name}": 3, "app;" + "x" * 300: 97})
    svg_text = render(build_tree(stacks), Options(width=400))
    assert "<int," not in svg_text  # escaped, and the XML parses:
    by = {x["name"]: x for x in frames(svg_text)}
    assert name in by
    short = by[name]["label"]
    assert short == "" or (str(short).endswith("..") and len(str(short)) < len(name))
    long_label = str(by["x" * 300]["label"])
    assert long_label.endswith("..") and len(long_label) * 0.59 * 12 <= float(by["x" * 300]["w"])  # type: ignore[arg-type]


def test_narrow_frames_merged_not_lost() -> None:
    stacks = Counter({f"app;f{i}": 1 for i in range(2000)})
    stacks["app;big"] = 100_000
    f = frames(render(build_tree(stacks), Options(width=1200, min_width=0.5)))
    merged = [x for x in f if str(x["name"]).endswith("narrow frames]")]
    assert merged and sum(float(str(x["v"])) for x in merged) == 2000
    assert len(f) < 10  # 2000 invisible frames became one
    assert "f0" in str(merged[0]["title"])


def test_icicle_puts_the_root_on_top() -> None:
    tree = build_tree(Counter({"a;b": 1}))
    normal = {x["name"]: x["y"] for x in frames(render(tree, Options()))}
    icicle = {x["name"]: x["y"] for x in frames(render(tree, Options(inverted=True)))}
    assert normal["all"] > normal["b"] and icicle["all"] < icicle["b"]  # type: ignore[operator]


def test_colours_are_deterministic_and_kind_aware() -> None:
    assert colour("do_work", "", "hot") == colour("do_work", "", "hot")
    assert colour("do_work", "", "hot") != colour("other", "", "hot")
    f = frames(render(build_tree(Counter({"app;-;schedule": 1, "app;[sleeping]": 1})),
                      Options()))
    fills = {x["name"]: x["fill"] for x in f}
    assert fills["schedule"] == colour("schedule", "kernel", "hot")
    assert fills["[sleeping]"] == colour("[sleeping]", "synthetic", "hot")
    r, g, b = (int(c) for c in colour("Interpreter::jitted", "jit", "hot")[4:-1].split(","))
    assert g > r and g > b
    r, g, b = (int(c) for c in colour("Pipeline.stage (app.py:3)", "python", "hot")[4:-1]
               .split(","))
    assert min(g, b) > r + 80  # teal: apart from hot user code and from JIT green
    blue = colour("x", "", "io")
    r, g, b = (int(c) for c in blue[4:-1].split(","))
    assert b > r and b > g


def test_diff_colours_hand_computed() -> None:
    before = Counter({"a;b": 10, "a;c": 10})
    after = Counter({"a;b": 20, "a;c": 5})
    f = frames(render(build_tree(after, other=before), Options(mode="diff")))
    fills = {x["name"]: x["fill"] for x in f}
    # deltas: all +5, a +5, b +10 (the largest), c -5
    assert fills["b"] == "rgb(255,0,0)"
    assert fills["c"] == "rgb(105,105,255)"
    assert fills["a"] == "rgb(255,105,105)"
    assert diff_colour(0, 10) == "rgb(250,250,250)"
    by = {x["name"]: x for x in f}
    assert "change -5 samples (-50.0%)" in str(by["c"]["title"])
    assert "change +10 samples (+100.0%)" in str(by["b"]["title"])


def test_html_embedding() -> None:
    page = to_html(render(build_tree(Counter({"a": 1})), Options()), "T<1>")
    assert page.startswith("<!DOCTYPE html>") and "<title>T&lt;1&gt;</title>" in page
    assert "<?xml" not in page and "<svg" in page
