"""The WriteRaw validator on hostile profiles: anything either passes or is
one InvalidRequest, quickly; and whatever passes, a query can serve (merged
and rendered folded, pprof and JSON). Arbitrary bytes, then ember's own
profiles with random field mutations (ids and indices out of range,
negative and huge values, deep stacks, strings not UTF-8) and byte-level
damage (flips, truncation, extra gzip members): over 10,000 inputs,
derandomized so CI is reproducible."""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.collector.validate import InvalidRequest, Limits, check_request
from ember.encode.pprof import to_proto
from ember.proto import profile_pb2 as pb
from ember.proto import profilestore_pb2 as ps
from tests.support.bounds import no_hang
from tests.support.collector import series
from tests.support.profiles import cpu_profile, offcpu_profile
from tests.support.store import served

NOW = 1_800_000_000 * 10**9
LIMITS = Limits()
SERIES = series()
BASES = [to_proto(p).SerializeToString() for p in (cpu_profile(), offcpu_profile())]
#: Values that have broken parsers: around zero, the edges of each integer
#: type, and sizes near the limits.
INTS = st.one_of(st.integers(-3, 12), st.sampled_from([
    2047, 2048, 2049, 5000, 2**31 - 1, 2**31, 2**32, 2**53, 2**63 - 1, -(2**63), 2**64 - 1]))


def fuzz(examples: int) -> Any:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check(raw: bytes) -> None:
    """The property: profiles or InvalidRequest, never a hang; and what is
    accepted merges and renders in every format."""
    s = ps.RawProfileSeries()
    s.CopyFrom(SERIES)
    del s.samples[0].executable_info[:]
    s.samples[0].raw_profile = raw
    with no_hang(raw[:200]):
        try:
            stored = check_request(ps.WriteRawRequest(series=[s]), LIMITS, NOW)
        except InvalidRequest:
            stored = []
    for p in stored:  # no exception: no profile without samples is refused
        _, api = served([p], copies=2)
        api.store.close()


def _at(field: Any, i: int) -> Any:
    """Entry i (modulo the length) of a repeated message field, added if empty."""
    return field[i % len(field)] if len(field) else field.add()


def _delete(field: Any, i: int) -> None:
    if len(field):
        del field[i % len(field)]


#: Field mutations: (profile, which, value), indices taken modulo the length.
MUTATIONS: list[Callable[[pb.Profile, int, int], object]] = [
    lambda p, i, v: _at(p.sample, i).location_id.append(v),
    lambda p, i, v: _at(p.sample, i).location_id.__setitem__(slice(None), [1 + i % 3] * (v % 6000)),
    lambda p, i, v: _at(p.sample, i).location_id.extend([1 + i % 3] * (2040 + v % 3000)),
    lambda p, i, v: _at(p.sample, i).value.append(v),
    lambda p, i, v: _at(p.sample, i).value.__setitem__(i % 2, v),
    lambda p, i, v: _at(p.sample, i).label.add(key=i, str=v),
    lambda p, i, v: _at(p.sample, i).label.add(key=i, num=v),
    lambda p, i, v: p.sample.add(location_id=[i, v], value=[v, v]),
    lambda p, i, v: setattr(_at(p.location, i), "id", v),
    lambda p, i, v: setattr(_at(p.location, i), "mapping_id", v),
    lambda p, i, v: _at(p.location, i).line.add(function_id=v, line=v),
    lambda p, i, v: _at(p.location, i).line.extend([pb.Line(function_id=1)] * (v % 300)),
    lambda p, i, v: setattr(_at(p.function, i), "name", v),
    lambda p, i, v: setattr(_at(p.function, i), "id", v),
    lambda p, i, v: setattr(_at(p.mapping, i), "filename", v),
    lambda p, i, v: setattr(_at(p.mapping, i), "id", v),
    lambda p, i, v: setattr(_at(p.sample_type, i), "unit", v),
    lambda p, i, v: p.sample_type.add(type=i, unit=v),
    lambda p, i, v: setattr(p.period_type, "type", v),
    lambda p, i, v: setattr(p, "time_nanos", v),
    lambda p, i, v: setattr(p, "duration_nanos", v),
    lambda p, i, v: setattr(p, "period", v),
    lambda p, i, v: setattr(p, "default_sample_type", v),
    lambda p, i, v: p.comment.append(v),
    lambda p, i, v: p.string_table.append(str(v)),
    lambda p, i, v: p.string_table.__setitem__(i % max(1, len(p.string_table)), "pid"),
    lambda p, i, v: _delete(p.string_table, i),
    lambda p, i, v: _delete(p.location, i),
    lambda p, i, v: _delete(p.function, i),
    lambda p, i, v: _delete(p.mapping, i),
    lambda p, i, v: _delete(p.sample, i),
]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    p = pb.Profile.FromString(draw(st.sampled_from(BASES)))
    for op, i, v in draw(st.lists(st.tuples(st.sampled_from(MUTATIONS), st.integers(0, 40),
                                            INTS), max_size=4)):
        with contextlib.suppress(ValueError, TypeError, IndexError):  # not a valid field value
            op(p, i, v)
    data = p.SerializeToString()
    if draw(st.booleans()):  # a string table entry that is not UTF-8
        data = data.replace(b"main", b"m\xffin")
    damage = draw(st.sampled_from(["none"] * 6 + ["cut", "flip"]))
    if damage == "cut" and data:
        data = data[:draw(st.integers(0, len(data) - 1))]
    if damage == "flip" and data:
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]
    raw = gzip.compress(data, mtime=0) if draw(st.booleans()) else data
    tail = draw(st.sampled_from(["none"] * 6 + ["zero", "empty", "bytes", "profile"]))
    if tail == "zero":
        raw += b"\0"
    elif tail != "none":  # another gzip member: nothing, garbage, or a whole profile
        raw += gzip.compress({"empty": b"", "bytes": draw(st.binary(max_size=64)),
                              "profile": draw(st.sampled_from(BASES))}[tail], mtime=0)
    return raw


@fuzz(4000)
@given(st.one_of(st.binary(min_size=1, max_size=512),
                 st.binary(min_size=1, max_size=512).map(lambda b: gzip.compress(b, mtime=0))))
def test_arbitrary_bytes(raw: bytes) -> None:
    check(raw)


@fuzz(7000)
@given(mutated())
def test_mutated_profiles(raw: bytes) -> None:
    check(raw)


def test_mutations_reach_both_outcomes() -> None:
    """The mutated inputs are not all refused (nor all accepted): the
    property above is about both sides."""
    outcomes = {True: 0, False: 0}

    @fuzz(300)
    @given(mutated())
    def count(raw: bytes) -> None:
        s = ps.RawProfileSeries()
        s.CopyFrom(SERIES)
        del s.samples[0].executable_info[:]
        s.samples[0].raw_profile = raw
        try:
            check_request(ps.WriteRawRequest(series=[s]), LIMITS, NOW)
            outcomes[True] += 1
        except InvalidRequest:
            outcomes[False] += 1

    count()
    assert outcomes[True] > 30 and outcomes[False] > 30, outcomes
