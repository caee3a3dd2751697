"""Drained records -> samples: what a cut or missing stack looks like."""

from __future__ import annotations

from pathlib import Path

from ember import abi
from ember.kernel.drain import Record, Stack
from ember.model import CPU, FrameKind
from ember.stacks import SampleBuilder
from ember.symbols.procmaps import ProcessTable, ProcFS
from ember.symbols.symbolizer import Symbolizer
from tests.support.procfs import write_proc

MAPS = "00400000-00401000 r-xp 00000000 08:01 42 /nonexistent/app\n"


def sample_of(tmp_path: Path, user: Stack):  # type: ignore[no-untyped-def]
    write_proc(tmp_path, 7, MAPS)
    builder = SampleBuilder(Symbolizer(ProcessTable(ProcFS(tmp_path))), CPU, 99)
    rec = Record(pid=7, tid=7, comm="app", state=0, user=user,
                 kernel=Stack(problem="not-requested"), count=1, total_ns=0)
    (sample,) = builder.build([rec])
    return builder, [f for f in sample.frames if f.kind == FrameKind.USER]


def test_a_walk_cut_short_says_why_at_its_root(tmp_path: Path) -> None:
    builder, user = sample_of(tmp_path, Stack((0x400100, 0x400200), cut="unsupported rule"))
    assert user[0].name == "[unwind stopped: unsupported rule]"
    assert len(user) == 3 and builder.cut == 1 and builder.truncated == 0


def test_a_walk_at_the_depth_limit_is_truncated(tmp_path: Path) -> None:
    ips = tuple(0x400100 + i for i in range(abi.MAX_STACK_DEPTH))
    builder, user = sample_of(tmp_path, Stack(ips, cut="truncated"))
    assert user[0].name == "[truncated]" and builder.truncated == 1 and builder.cut == 0


def test_a_whole_stack_has_no_marker(tmp_path: Path) -> None:
    builder, user = sample_of(tmp_path, Stack((0x400100, 0x400200)))
    assert len(user) == 2 and not user[0].name.startswith("[")
    assert builder.cut == builder.truncated == 0
