"""Small renders pinned byte for byte: moving code between modules (or the
embedded script into its own file) must not change a single output byte.

The expected files were made by the code before such moves; a deliberate
change to the output regenerates them (``EMBER_REGEN_GOLDEN=1``) and shows
up in review as a diff of the SVG."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from ember.flamegraph.graphs import diff_graph, graph, hotcold_graph
from ember.flamegraph.inputs import Stacks, stacks_of
from ember.model import KERNEL_MAPPING, Frame, FrameKind, Mapping, Sample, cpu_type
from tests.support.profiles import offcpu_profile

GOLDEN = Path(__file__).parent / "golden"


def _cpu() -> Stacks:
    exe = Mapping(0x400000, 0x401000, 0, "/usr/bin/app")
    main = Frame("main", FrameKind.USER, exe, 0x400100)
    work = Frame("std::vector<int>::push_back", FrameKind.USER, exe, 0x400200)
    jit = Frame("LazyCompile:*handler", FrameKind.USER, Mapping(1, 2, 0, "[anon]"), 1)
    sched = Frame("schedule", FrameKind.KERNEL, KERNEL_MAPPING, 0xFFFFFFFF81000100)
    return stacks_of(cpu_type(99), [
        Sample((main, work), (30, 300_000_000), 1, 1, "app"),
        Sample((main, jit), (12, 120_000_000), 1, 1, "app"),
        Sample((main, work, sched), (5, 50_000_000), 1, 2, "app"),
        Sample((Frame.marker("[lost stack: collision]"),), (1, 10_000_000), 1, 1, "app"),
    ])


def _plain() -> str:
    return graph(_cpu(), title="Pinned <plain>", width=600)


def _hotcold() -> str:
    off = offcpu_profile()
    return hotcold_graph(_cpu(), stacks_of(off.type, off.samples), width=700, inverted=True)


def _diff() -> str:
    before = Stacks(Counter({"app;main;a": 10, "app;main;0x1f": 10, "app;old": 3}), "samples",
                    {})
    after = Stacks(Counter({"app;main;a": 25, "app;main;0x2e": 5, "app;new": 4}), "samples",
                   {})
    svg_text, two_column = diff_graph(before, after, normalize=True, strip=True, negate=True,
                                      width=500)
    return svg_text + two_column


@pytest.mark.parametrize(("name", "make"), [("plain", _plain), ("hotcold", _hotcold),
                                            ("diff", _diff)])
def test_render_is_byte_for_byte_pinned(name: str, make: Callable[[], str]) -> None:
    expected = GOLDEN / f"{name}.svg"
    got = make()
    if os.environ.get("EMBER_REGEN_GOLDEN"):
        expected.write_text(got, encoding="utf-8")
    assert got == expected.read_text(encoding="utf-8")
