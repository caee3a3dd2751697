"""Stacks deeper than MAX_STACK_DEPTH: every encoder keeps the leafmost
frames under a root [truncated] frame, and what it writes reads back."""

from __future__ import annotations

from ember.encode.folded import encode_folded, fold, parse_folded, read_folded
from ember.encode.otlp import to_otlp
from ember.encode.pprof import decode_pprof, encode_pprof, from_proto
from ember.encode.writeraw import make_series
from ember.model import (
    KERNEL_MAPPING,
    MAX_STACK_DEPTH,
    TRUNCATED,
    Frame,
    FrameKind,
    Mapping,
    Profile,
    Sample,
    cpu_type,
)
from tests.support.otlp import stacks

EXE = Mapping(0x400000, 0x500000, 0, "/usr/bin/deep")
DEPTH = 5000


def deep_profile(depth: int = DEPTH) -> Profile:
    """A runaway recursion: ``depth`` user frames, then two kernel frames."""
    user = [Frame(f"f{i}", FrameKind.USER, EXE, 0x400000 + i) for i in range(depth)]
    kernel = [Frame(f"k{i}", FrameKind.KERNEL, KERNEL_MAPPING, 0xFFFFFFFF81000000 + i)
              for i in range(2)]
    return Profile(cpu_type(99), (Sample((*user, *kernel), (3, 30), 1, 1, "deep"),
                                  Sample((user[0], user[1]), (1, 10), 1, 1, "deep")),
                   start_ns=0, duration_ns=1)


def leafmost(n: int) -> list[str]:
    names = [f"f{i}" for i in range(DEPTH)] + ["k0", "k1"]
    return names[len(names) - n:]


def test_pprof_round_trip_keeps_the_leafmost_frames() -> None:
    _, samples = from_proto(decode_pprof(encode_pprof(deep_profile())))
    deep = max(samples, key=lambda s: len(s.frames))
    assert len(deep.frames) == MAX_STACK_DEPTH
    assert deep.frames[0].name == TRUNCATED
    assert [f.name for f in deep.frames[1:]] == leafmost(MAX_STACK_DEPTH - 1)
    shallow = min(samples, key=lambda s: len(s.frames))
    assert [f.name for f in shallow.frames] == ["f0", "f1"]  # short stacks untouched


def test_writeraw_series_is_capped() -> None:
    series, _ = make_series(deep_profile())
    p = decode_pprof(series.samples[0].raw_profile)
    assert max(len(s.location_id) for s in p.sample) == MAX_STACK_DEPTH


def test_folded_round_trip_counts_the_thread_name() -> None:
    text = encode_folded(deep_profile())
    back = parse_folded(text)
    assert back == read_folded([text.encode()])
    deep = max(back, key=len).split(";")
    assert len(deep) == MAX_STACK_DEPTH
    assert deep[:2] == ["deep", TRUNCATED]
    assert deep[2:] == leafmost(MAX_STACK_DEPTH - 2)


def test_folded_delimiter_stays_between_user_and_kernel() -> None:
    deep = max(fold(deep_profile(), delimiter=True), key=len).split(";")
    assert len(deep) == MAX_STACK_DEPTH
    assert deep[1] == TRUNCATED and deep[-3:] == ["-", "k0", "k1"]


def test_otlp_stack_is_capped() -> None:
    req = to_otlp([deep_profile()])
    profile = req.resource_profiles[0].scope_profiles[0].profiles[0]
    got = max(stacks(req, profile), key=lambda s: len(s[0]))[0]
    assert len(got) == MAX_STACK_DEPTH
    assert got[0] == TRUNCATED and got[1:] == leafmost(MAX_STACK_DEPTH - 1)


def test_parse_caps_deep_folded_lines() -> None:
    line = ";".join(f"f{i}" for i in range(DEPTH))
    (stack,) = parse_folded(f"{line} 7\n")
    names = stack.split(";")
    assert len(names) == MAX_STACK_DEPTH
    assert names[0] == TRUNCATED and names[-1] == f"f{DEPTH - 1}"
