"""What the collector accepts is what it stores and can serve: gzip members,
value and time rules, count limits, strings that are not UTF-8, deep
stacks."""

from __future__ import annotations

import contextlib
import gzip
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable

import pytest
from google.protobuf.message import DecodeError

from ember.collector import validate
from ember.collector.intern import Interner, Rows
from ember.collector.store import StoredProfile
from ember.collector.validate import (
    DEFAULT_LIMITS,
    InvalidRequest,
    Limits,
    check_request,
    decompress,
)
from ember.encode.pprof import decode_pprof
from ember.model import MAX_STACK_DEPTH, TRUNCATED
from ember.proto import pprof_head_pb2 as ph
from ember.proto import profile_pb2 as pb
from ember.proto import profilestore_pb2 as ps
from tests.support.collector import series
from tests.support.store import served as through_store

NOW = time.time_ns()
SECOND = 10**9


def request(raw: bytes) -> ps.WriteRawRequest:
    s = series()
    s.samples[0].raw_profile = raw
    del s.samples[0].executable_info[:]
    return ps.WriteRawRequest(series=[s])


def good_proto() -> pb.Profile:
    return decode_pprof(series().samples[0].raw_profile)


def mutated(change: Callable[[pb.Profile], object]) -> ps.WriteRawRequest:
    p = good_proto()
    change(p)
    return request(gzip.compress(p.SerializeToString()))


def accept(req: ps.WriteRawRequest, repairs: Counter[str] | None = None) -> StoredProfile:
    (stored,) = check_request(req, Limits(), NOW, repairs)
    return stored


def refuse(req: ps.WriteRawRequest, message: str, limits: Limits = DEFAULT_LIMITS) -> None:
    with pytest.raises(InvalidRequest, match=message):
        check_request(req, limits, NOW)


def served(stored: StoredProfile) -> dict[str, bytes]:
    """Every rendering of the stored profile, as a query makes them."""
    out, api = through_store([stored])
    api.store.close()
    return out


def test_a_single_member_is_stored_as_sent() -> None:
    req = request(series().samples[0].raw_profile)
    assert accept(req).data == req.series[0].samples[0].raw_profile


def test_raw_pprof_is_stored_compressed() -> None:
    p = good_proto()
    stored = accept(request(p.SerializeToString()))
    assert decode_pprof(stored.data) == p and stored.data[:2] == b"\x1f\x8b"


def test_a_multi_member_bomb_is_refused_in_bounded_memory() -> None:
    """1 MB: a profile, then 128 members of 8 MiB of zeros each. Only the
    first member was bounded before: every later query inflated 1 GiB."""
    bomb = series().samples[0].raw_profile + gzip.compress(b"\0" * (8 << 20)) * 128
    assert len(bomb) < 1_100_000
    tracemalloc.start()
    try:
        refuse(request(bomb), "decompresses to more than 67108864 bytes")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 << 20  # the 64 MiB limit and a little


def test_members_are_one_stream_and_stored_as_one() -> None:
    """Go's gzip reader (and so pprof) reads concatenated members as one
    stream: a profile split across members is that profile, stored as one
    member."""
    data = good_proto().SerializeToString()
    cut = len(data) // 3
    stored = accept(request(gzip.compress(data[:cut]) + gzip.compress(data[cut:])))
    assert gzip.decompress(stored.data) == data
    assert decompress(stored.data, 1 << 20)[1] == 1
    assert b"main" in served(stored)["folded"]


@pytest.mark.parametrize(("tail", "message"), ids=["garbage", "bad sample", "empty", "zeros",
                                                  "cut"], argvalues=[
    (gzip.compress(b"not a profile at all"), "not a pprof profile"),
    (gzip.compress(pb.Profile(sample=[pb.Sample(location_id=[999], value=[1, 1])])
                   .SerializeToString()), "location id 999 out of range"),
    (gzip.compress(b""), None),
    (b"\0" * 8, "data after the gzip stream"),
    (b"\x1f\x8b\x08\x00", "truncated gzip data|bad gzip data"),
])
def test_trailing_members_are_checked_with_the_profile(tail: bytes, message: str | None) -> None:
    """What follows the first member is part of the profile: a member that
    is not valid protobuf, or one that adds a sample pointing nowhere, is
    refused with the request; only an empty member changes nothing."""
    raw = series().samples[0].raw_profile
    req = request(raw + tail)
    if message is None:
        assert decode_pprof(accept(req).data) == decode_pprof(raw)
    else:
        refuse(req, message)


def test_too_many_members() -> None:
    data = good_proto().SerializeToString()
    step = len(data) // 17 + 1
    members = [gzip.compress(data[i:i + step]) for i in range(0, len(data), step)]
    assert len(members) == 17
    refuse(request(b"".join(members)), "more than 16 gzip members")
    assert accept(request(b"".join(members[:15]) + gzip.compress(data[15 * step:])))


def _label(p: pb.Profile, key: str, value: str) -> None:
    p.string_table.append(value)
    p.sample[0].label.add(key=list(p.string_table).index(key), str=len(p.string_table) - 1)


@pytest.mark.parametrize(("change", "message"), [
    (lambda p: p.sample[0].value.__setitem__(1, -5), "sample 0: negative value -5"),
    (lambda p: setattr(p, "period", -1), "negative period -1"),
    (lambda p: setattr(p, "time_nanos", -1), "time_nanos -1 is before 1970"),
    (lambda p: setattr(p, "time_nanos", NOW + 2 * 3600 * SECOND), "s ahead of the collector"),
    (lambda p: setattr(p, "duration_nanos", -1), "duration_nanos -1 is not between"),
    (lambda p: setattr(p, "duration_nanos", 86_401 * SECOND), "is not between 0 and 86400 s"),
    (lambda p: p.sample[0].value.append(1), "sample 0 has 3 values for 2 sample types"),
    (lambda p: _label(p, "pid", "app"), "label pid value 'app' is not a number"),
    (lambda p: _label(p, "tid", "9" * 30), "label tid value '9{30}' is not a number"),
    (lambda p: p.location[0].line.extend([pb.Line(function_id=1)] * 300),
     "301 lines in location 1, at most 256"),
])
def test_values_times_and_labels(change: Callable[[pb.Profile], object], message: str) -> None:
    refuse(mutated(change), message)


def test_times_within_the_rules_are_accepted() -> None:
    assert accept(mutated(lambda p: setattr(p, "time_nanos", 0))).time_ns == NOW
    stored = accept(mutated(lambda p: (setattr(p, "time_nanos", NOW + 3000 * SECOND),
                                       setattr(p, "duration_nanos", 86_400 * SECOND))))
    assert (stored.time_ns, stored.duration_ns) == (NOW + 3000 * SECOND, 86_400 * SECOND)


@pytest.mark.parametrize(("limit", "message"), [
    ("max_samples", "samples, at most 3"), ("max_locations", "locations, at most 3"),
    ("max_functions", "functions, at most 3"), ("max_strings", "strings, at most 3"),
    ("max_mappings", "mappings, at most 1"), ("max_stack_entries", "stack entries, at most 3"),
])
def test_count_limits(limit: str, message: str) -> None:
    req = request(series().samples[0].raw_profile)
    refuse(req, message, Limits(**{limit: 1 if limit == "max_mappings" else 3}))


def test_sample_counts_saturate_at_int64() -> None:
    def huge(p: pb.Profile) -> None:
        for s in p.sample:
            s.value[0] = (1 << 63) - 1
    stored = accept(mutated(huge))
    assert stored.samples == (1 << 63) - 1
    out, api = through_store([stored], copies=3)
    api.store.close()
    p = decode_pprof(out["pprof"])
    assert max(s.value[0] for s in p.sample) == (1 << 63) - 1


def test_strings_not_utf8_are_repaired_not_refused() -> None:
    data = good_proto().SerializeToString()
    assert data.count(b"\x04main") == 1
    bad = data.replace(b"\x04main", b"\x04m\xffin")
    with pytest.raises(DecodeError, match="UTF-8"):
        pb.Profile.FromString(bad)
    repairs: Counter[str] = Counter()
    stored = accept(request(gzip.compress(bad)), repairs)
    assert repairs == {"utf8": 1}
    assert "m\ufffdin" in decode_pprof(stored.data).string_table
    assert "m\ufffdin;" in served(stored)["folded"].decode()


def test_strings_not_utf8_in_a_broken_profile_are_still_refused() -> None:
    bad = good_proto().SerializeToString().replace(b"\x04main", b"\x04m\xffin")
    refuse(request(gzip.compress(bad + b"\x08")), "not a pprof profile")


def deep(p: pb.Profile, ids: list[int]) -> None:
    p.sample[0].location_id[:] = ids


def frames_of(p: pb.Profile, i: int) -> int:
    return sum(max(1, len(p.location[lid - 1].line)) for lid in p.sample[i].location_id)


def test_deep_stacks_are_capped_leaf_kept() -> None:
    """A 5,000-frame sample keeps its 2,047 leafmost frames under
    [truncated]: its time stays with its leaf rather than the request being
    refused."""
    p = good_proto()
    ids = [1 + i % len(p.location) for i in range(5000)]
    repairs: Counter[str] = Counter()
    stored = accept(mutated(lambda q: deep(q, ids)), repairs)
    assert repairs == {"depth": 1}
    got = decode_pprof(stored.data)
    assert frames_of(got, 0) == MAX_STACK_DEPTH
    assert list(got.sample[0].location_id[:-1]) == ids[:MAX_STACK_DEPTH - 1]
    marker = got.location[got.sample[0].location_id[-1] - 1]
    assert got.string_table[got.function[marker.line[0].function_id - 1].name] == TRUNCATED
    assert list(got.sample[1].location_id) == list(p.sample[1].location_id)
    out = served(stored)
    assert f";{TRUNCATED};".encode() in out["folded"]


def test_deep_stacks_count_inlined_frames() -> None:
    def inline(p: pb.Profile) -> None:
        p.location[0].line.extend([pb.Line(function_id=1), pb.Line(function_id=1)])
        deep(p, [1] * 1000)  # 3,000 frames
    got = decode_pprof(accept(mutated(inline)).data)
    assert MAX_STACK_DEPTH - 2 <= frames_of(got, 0) <= MAX_STACK_DEPTH


def test_stacks_at_the_limit_are_stored_as_sent() -> None:
    p = good_proto()
    req = mutated(lambda q: deep(q, [1] * MAX_STACK_DEPTH))
    stored = accept(req)
    assert stored.data == req.series[0].samples[0].raw_profile
    assert frames_of(decode_pprof(stored.data), 0) == MAX_STACK_DEPTH
    assert len(p.location) == len(decode_pprof(stored.data).location)


def rows_of_one(stored: StoredProfile) -> Rows:
    assert stored.proto is not None
    rows = Rows()
    Interner().add(rows, stored.proto, stored.series_labels, stored.type, stored.time_ns,
                   stored.time_ns + stored.duration_ns, stored.tables)
    return rows


def test_a_profile_read_as_its_head_is_what_the_whole_profile_gives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The common profile is read without a message per sample, location and
    function (pprof_head.proto); what is stored of it is what reading the
    whole Profile stores: the same record, the same rows, frames and stacks."""
    req = request(series().samples[0].raw_profile)
    head = accept(req)
    assert isinstance(head.proto, ph.ProfileHead)
    monkeypatch.setattr(validate, "_read_head", lambda *_: None)
    whole = accept(req)
    assert isinstance(whole.proto, pb.Profile)
    assert head == whole   # (id, labels, type, times, sum of values, bytes)
    a, b = rows_of_one(head), rows_of_one(whole)
    assert a.new_frames == b.new_frames and a.new_stacks == b.new_stacks
    assert a.new_threads == b.new_threads and a.new_series == b.new_series
    ca, cb = a.columns(), b.columns()
    assert ca.keys() == cb.keys() and len(a) > 0
    assert all((ca[k] == cb[k]).all() for k in ca)


@pytest.mark.parametrize("change", [
    lambda p: deep(p, [1] * (MAX_STACK_DEPTH + 1)),       # capped
    lambda p: p.location[0].line.add(function_id=99),     # refused, by the whole's loops
    lambda p: p.sample[0].value.__setitem__(0, -1),       # refused, by the whole's loops
])
def test_what_the_head_cannot_take_is_read_whole(change: Callable[[pb.Profile], object]) -> None:
    seen: list[object] = []
    real = validate.parse

    def parse(raw: bytes, limits: Limits) -> tuple[pb.Profile, bool]:
        seen.append(raw)
        return real(raw, limits)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(validate, "parse", parse)
        with contextlib.suppress(InvalidRequest):
            accept(mutated(change))
    assert seen, "the profile was not read as a whole Profile"
