"""pprof output decoded back and checked field by field."""

from __future__ import annotations

import gzip

import pytest

from ember.encode.pprof import decode_pprof, encode_pprof
from tests.support.profiles import EXE, cpu_profile, offcpu_profile


def test_cpu_profile_fields() -> None:
    data = encode_pprof(cpu_profile())
    assert data[:2] == b"\x1f\x8b"
    p = decode_pprof(data)
    s = p.string_table
    assert s[0] == ""
    assert [(s[t.type], s[t.unit]) for t in p.sample_type] == [("samples", "count"),
                                                               ("cpu", "nanoseconds")]
    assert (s[p.period_type.type], s[p.period_type.unit], p.period) == ("cpu", "nanoseconds",
                                                                        10_000_000)
    assert s[p.default_sample_type] == "cpu"
    assert p.time_nanos == 1_700_000_000_000_000_000 and p.duration_nanos == 5_000_000_000
    for kind in (p.mapping, p.location, p.function):
        assert [x.id for x in kind] == list(range(1, len(kind) + 1))
    assert len(p.sample) == 4
    for sample in p.sample:
        assert len(sample.value) == len(p.sample_type)
        assert all(lid >= 1 for lid in sample.location_id)
        labels = {s[lb.key]: (s[lb.str] if lb.str else lb.num) for lb in sample.label}
        assert labels["pid"] == 10 and labels["thread_name"] == "app"
        assert labels["tid"] in (11, 12)
    # leaf first: the first sample's first location is the C++ frame
    first = p.sample[0]
    loc = p.location[first.location_id[0] - 1]
    fn = p.function[loc.line[0].function_id - 1]
    assert s[fn.name] == "ns::Box<int>::operator()(int) const"
    assert s[fn.system_name] == "_ZNK2ns3BoxIiEclEi"
    assert loc.address == 0x400200
    m = p.mapping[loc.mapping_id - 1]
    assert (m.memory_start, m.memory_limit, s[m.filename], s[m.build_id]) == (
        EXE.start, EXE.limit, "/usr/bin/app", "abcd")
    # a marker frame has a location without a mapping
    lost = p.location[p.sample[3].location_id[0] - 1]
    assert lost.mapping_id == 0 and s[p.function[lost.line[0].function_id - 1].name] == \
        "[lost kernel stack: collision]"
    # identical frames share one location and one function
    assert len(p.location) == 5 and len(p.function) == 5 and len(p.mapping) == 3


def test_offcpu_profile_fields() -> None:
    p = decode_pprof(encode_pprof(offcpu_profile()))
    s = p.string_table
    assert [(s[t.type], s[t.unit]) for t in p.sample_type] == [("blocks", "count"),
                                                               ("off_cpu", "nanoseconds")]
    assert [list(x.value) for x in p.sample] == [[4, 40_000_123], [1, 2_500]]
    states = [next(s[lb.str] for lb in x.label if s[lb.key] == "thread_state") for x in p.sample]
    assert states == ["sleeping", "runnable"]


def test_decode_accepts_plain_bytes() -> None:
    data = encode_pprof(cpu_profile())
    assert decode_pprof(gzip.decompress(data)) == decode_pprof(data)


def test_inlined_frames_share_one_location_with_lines() -> None:
    """Frames inlined into work (same address) become Line entries of its
    Location, innermost first; from_proto gives the same frames back."""
    from dataclasses import replace

    from ember.encode.pprof import from_proto, to_proto
    from ember.model import Profile, Sample, cpu_type
    from tests.support.profiles import MAIN

    src = "/src/app.c"
    work = replace(MAIN, name="work", address=0x400300, file=src, line=33)
    mix = replace(work, name="mix", line=26, inlined=True)
    scramble = replace(work, name="scramble", line=19, inlined=True)
    main = replace(MAIN, file=src, line=50)
    frames = (main, work, mix, scramble)  # root first
    profile = Profile(cpu_type(100), (Sample(frames, (5, 50_000_000), 1, 1, "app"),),
                      start_ns=0, duration_ns=1)
    p = to_proto(profile)
    s = p.string_table
    assert len(p.location) == 2 and len(p.sample[0].location_id) == 2
    leaf = next(loc for loc in p.location if loc.id == p.sample[0].location_id[0])
    fn = {f.id: (s[f.name], s[f.filename]) for f in p.function}
    assert [(*fn[ln.function_id], ln.line) for ln in leaf.line] == [
        ("scramble", src, 19), ("mix", src, 26), ("work", src, 33)]
    _, samples = from_proto(p)
    assert samples[0].frames == frames


def test_gunzip_bounds_the_total_of_every_member() -> None:
    from ember.encode.pprof import TooLarge, gunzip

    member = gzip.compress(b"x" * 1000)
    assert gunzip(member * 3 + b"\0\0", 3000) == b"x" * 3000  # zero padding is fine
    with pytest.raises(TooLarge, match="decompresses to more than 2999 bytes"):
        gunzip(member * 3, 2999)  # each member fits, the three do not
    with pytest.raises(ValueError, match="cut short"):
        gunzip(member[:-4], 3000)
    with pytest.raises(ValueError, match="garbage after"):
        gunzip(member + b"junk", 3000)
    with pytest.raises(TooLarge):
        decode_pprof(gzip.compress(b"\0" * (1 << 20)), max_size=1 << 16)
