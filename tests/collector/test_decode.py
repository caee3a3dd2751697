"""Profiles read in bulk (collector/decode.py) say exactly what reading them
message by message says: the same tables, the same verdict on what is
valid, the same rows stored; and what the bulk reader does not know is left
to the message-by-message path."""

from __future__ import annotations

import random
from collections.abc import Callable
from unittest import mock

import numpy as np
import pytest

from ember.collector import decode, memo
from ember.collector.intern import Interner, Rows
from ember.collector.locations import LocationMemo
from ember.collector.validate import DEFAULT_LIMITS, InvalidRequest, Limits, check_profile
from ember.proto import pprof_tables_pb2 as pt
from ember.proto import profile_pb2 as pb

SERIES = [("__name__", "process_cpu")]


@pytest.fixture(autouse=True, params=["c", "numpy"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: ``decode.read`` by the C reader and the interner's
    memos in C (the installed ones), then by their numpy twins (the
    fallbacks where they were not built)."""
    if request.param == "numpy":
        monkeypatch.setattr(decode, "_pprof", None)
        monkeypatch.setattr(memo, "_memo", None)
    return str(request.param)


def test_the_c_reader_was_built() -> None:
    """The set-up installs a compiler and Python's headers, and the build
    makes the reader from them (optional there: a failure is silent)."""
    import ember.collector._pprof  # noqa: F401  (not the fixture's patched name)


def test_a_profile_of_addresses_only_is_read_in_bulk() -> None:
    """Locations without lines (nothing symbolized, as a pprof of raw
    addresses has): read in bulk, the same as message by message (the numpy
    reader failed on a profile with no line at all)."""
    p = pb.Profile(string_table=["", "samples", "count"])
    p.sample_type.add(type=1, unit=2)
    for i in range(3):
        p.location.add(id=i + 1, address=0x1000 + i, mapping_id=0)
    p.sample.add(location_id=[1, 2], value=[3])
    p.sample.add(location_id=[3, 2, 1], value=[4])
    t = decode.read(p)
    assert t is not None
    assert in_bulk(t) == one_by_one(p)


def varied(rng: random.Random, names: tuple[str, ...] = ("main", "worker")) -> pb.Profile:
    """A profile using what pprof allows: inlined lines, columns, folded
    locations, addresses past 2^63, no mapping, negative and large line
    numbers, samples without locations, string and numeric labels, the same
    stack under two label sets and twice under one."""
    st = ["", "samples", "count", "cpu", "nanoseconds", "/bin/app", "b1d", "pid", "tid",
          "thread_name", "pool", *names, *(f"fn_{i}" for i in range(40)), "a.c"]
    p = pb.Profile(string_table=st, period=10)
    p.sample_type.add(type=1, unit=2)
    p.sample_type.add(type=3, unit=4)
    p.mapping.add(id=1, memory_start=0x1000, memory_limit=0x90000, filename=5, build_id=6,
                  has_functions=True)
    p.mapping.add(id=2, memory_start=1 << 62, memory_limit=(1 << 64) - 1, filename=5)
    first_fn = len(st) - 41
    for i in range(40):
        p.function.add(id=i + 1, name=first_fn + i, system_name=first_fn + (i * 7) % 40,
                       filename=len(st) - 1 if i % 3 else 0, start_line=i * 1000)
    for i in range(60):
        loc = p.location.add(id=i + 1, mapping_id=[0, 1, 2][i % 3],
                             address=[0, 0x1234 + i, (1 << 63) + i][i % 3], is_folded=i % 5 == 0)
        for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
            loc.line.add(function_id=rng.randint(1, 40),
                         line=rng.choice([0, 7, -3, 1 << 40]), column=rng.randint(0, 300))
    threads = [(7, 100, 0, 11), (7, 101, 0, 12), (7, 102, 0, 0)]
    for i in range(200):
        x = p.sample.add(location_id=[rng.randint(1, 60) for _ in range(rng.randint(0, 12))],
                         value=[rng.choice([0, 1, 5, 1 << 50]), rng.randint(0, 10**9)])
        pid_key, tid, _, name = rng.choice(threads)
        x.label.add(key=pid_key, num=4242)
        x.label.add(key=8, num=tid)
        if name:
            x.label.add(key=9, str=name)
        if i % 4 == 0:
            x.label.add(key=10, str=11, num_unit=0)
    dup = p.sample.add()
    dup.CopyFrom(p.sample[3])
    return p


def one_by_one(p: pb.Profile) -> dict[str, list[object]]:
    return {
        "loc_id": [loc.id for loc in p.location],
        "loc_mapping": [loc.mapping_id for loc in p.location],
        "loc_address": [loc.address for loc in p.location],
        "lines": [len(loc.line) for loc in p.location],
        "line_function": [ln.function_id for loc in p.location for ln in loc.line],
        "line_line": [ln.line for loc in p.location for ln in loc.line],
        "fn": [(f.id, f.name, f.system_name, f.filename) for f in p.function],
        "sample_locations": [i for x in p.sample for i in x.location_id],
        "depth": [len(x.location_id) for x in p.sample],
        "values": [v for x in p.sample for v in x.value],
        "labels": [[(lb.key, lb.str, lb.num, lb.num_unit) for lb in x.label] for x in p.sample]}


def in_bulk(t: decode.Tables) -> dict[str, list[object]]:
    loc, fn, smp = t.locations, t.functions, t.samples
    return {
        "loc_id": loc.id.tolist(), "loc_mapping": loc.mapping.tolist(),
        "loc_address": loc.address.tolist(), "lines": loc.lines.tolist(),
        "line_function": loc.line_function.tolist(), "line_line": loc.line_line.tolist(),
        "fn": list(zip(fn.id.tolist(), fn.name.tolist(), fn.system_name.tolist(),
                       fn.filename.tolist(), strict=True)),
        "sample_locations": smp.locations.tolist(), "depth": smp.depth.tolist(),
        "values": smp.values.tolist(),
        "labels": [[(lb.key, lb.str, lb.num, lb.num_unit) for lb in smp.label_sets[i].label]
                   for i in smp.label_set.tolist()]}


@pytest.mark.parametrize("seed", range(6))
def test_tables_read_in_bulk_are_the_messages(seed: int, reader: str) -> None:
    p = varied(random.Random(seed))
    p.string_table.append("naïve ✓")   # (hashed as its UTF-8 bytes)
    t = decode.read(p)
    assert t is not None
    assert in_bulk(t) == one_by_one(p)
    if reader == "c":  # each string's hash: Python's of its bytes (keyed per process)
        assert t.string_hash is not None
        assert t.string_hash.view(np.int64).tolist() == [hash(s.encode())
                                                          for s in p.string_table]


def with_samples(raw_samples: list[bytes]) -> tuple[pb.Profile, bytes]:
    """``varied``'s profile with these sample messages, as bytes, as parsed."""
    p = varied(random.Random(4))
    del p.sample[:]
    raw = p.SerializeToString() + pt.ProfileTables(sample=raw_samples).SerializeToString()
    return pb.Profile.FromString(raw), raw


PLAIN = pb.Sample(location_id=[3, 1, 60], value=[5, 1 << 62],
                  label=[pb.Label(key=7, num=1), pb.Label(key=9, str=11)]).SerializeToString()
LABEL = pb.Label(key=8, num=300).SerializeToString()
#: samples laid out as pprof allows, each among plain ones: (bytes, read in bulk)
LAYOUTS = {
    "plain": (PLAIN, True),
    "no labels": (b"\x0a\x02\x01\x02\x12\x02\x01\x02", True),
    "no locations": (b"\x12\x02\x01\x02\x1a" + bytes([len(LABEL)]) + LABEL, True),
    "empty": (b"", True),
    "empty packed field": (b"\x0a\x00\x12\x02\x01\x02", True),
    "negative value": (b"\x0a\x01\x02\x12\x0b\x01" + b"\xff" * 9 + b"\x01", True),
    "unpacked ids": (b"\x08\x01\x08\x02\x12\x02\x01\x02", False),
    "values first": (b"\x12\x02\x01\x02\x0a\x02\x01\x02", False),
    "label first": (b"\x1a" + bytes([len(LABEL)]) + LABEL + b"\x0a\x01\x01\x12\x02\x01\x02",
                    False),
    "ids in two runs": (b"\x0a\x01\x01\x0a\x01\x02\x12\x02\x01\x02", False),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_samples_in_any_layout_are_read_as_the_messages_say_or_left_to_them(
        layout: str) -> None:
    odd, bulk = LAYOUTS[layout]
    for at in (0, 1, 3):  # first, between and last
        samples = [PLAIN, PLAIN]
        samples.insert(at, odd)
        p, raw = with_samples(samples)
        t = decode.read(p, raw)
        assert (t is not None) == bulk
        if t is not None:
            assert in_bulk(t) == one_by_one(p)
            assert in_bulk(decode.read(p)) == one_by_one(p)  # type: ignore[arg-type]


def test_damaged_samples_are_never_misread() -> None:
    """Any byte of the samples changed: the tables read in bulk are the
    messages' own, or there are none (never other numbers)."""
    rng = random.Random(7)
    read = 0
    for _ in range(400):
        samples = [bytearray(PLAIN) for _ in range(3)]
        hit = rng.choice(samples)
        hit[rng.randrange(len(hit))] = rng.randrange(256)
        try:
            p, raw = with_samples([bytes(x) for x in samples])
        except Exception:  # (the runtime refuses it: nothing to read)
            continue
        t = decode.read(p, raw)
        if t is not None:
            read += 1
            assert in_bulk(t) == one_by_one(p)
    assert read > 50


def test_samples_the_runtime_refuses_are_not_read() -> None:
    """Sample bytes as they could arrive without the runtime's parse first:
    what it refuses, ``samples`` refuses; what it reads, ``samples`` reads
    alike or leaves to it."""
    rng = random.Random(8)
    refused = 0
    for _ in range(1500):
        messages = [bytearray(PLAIN) for _ in range(3)]
        for _ in range(rng.randint(1, 2)):
            hit = rng.choice(messages)
            hit[rng.randrange(len(hit))] = rng.choice([0x01, 0x0A, 0x12, 0x1A, 0x80, 0xFF,
                                                        rng.randrange(256)])
        raw = [bytes(m) for m in messages]
        got = decode.samples(raw)
        try:
            parsed = [pb.Sample.FromString(m) for m in raw]
        except Exception:
            refused += 1
            assert got is None, raw
            continue
        if got is not None:
            assert got.locations.tolist() == [i for x in parsed for i in x.location_id]
            assert got.values.tolist() == [v for x in parsed for v in x.value]
            assert [list(got.label_sets[i].label) for i in got.label_set.tolist()] == \
                [list(x.label) for x in parsed]
    assert refused > 100


def test_what_the_bulk_reader_does_not_know_goes_message_by_message() -> None:
    p = varied(random.Random(1))
    # a field number Location does not have (15, a varint), as a newer
    # writer could send: kept by the runtime, unknown to the bulk reader
    odd = pb.Location.FromString(p.location[4].SerializeToString() + b"\x78\x01")
    p.location[4].CopyFrom(odd)
    assert decode.read(p) is None
    q = varied(random.Random(1))
    rows_slow, rows_fast = Rows(), Rows()
    Interner().add(rows_slow, p, SERIES, "t", 1, 2)  # reads one by one
    Interner().add(rows_fast, q, SERIES, "t", 1, 2)
    assert same_rows(rows_slow, rows_fast)


def same_rows(a: Rows, b: Rows) -> bool:
    ca, cb = a.columns(), b.columns()
    oa, ob = np.lexsort((ca["stack"], ca["thread"])), np.lexsort((cb["stack"], cb["thread"]))
    return (all(np.array_equal(ca[k][oa], cb[k][ob]) for k in ca)
            and (a.new_frames, a.new_stacks, a.new_threads, a.new_series)
            == (b.new_frames, b.new_stacks, b.new_threads, b.new_series))


@pytest.mark.parametrize("merge_at", [1, 1 << 12])   # locations memo: sorted, or in its dict
def test_rows_from_tables_are_the_rows_read_message_by_message(
        monkeypatch: pytest.MonkeyPatch, merge_at: int) -> None:
    monkeypatch.setattr(LocationMemo, "MERGE_AT", merge_at)
    profiles = [varied(random.Random(s)) for s in range(5)]
    profiles += [renumbered(p, random.Random(9)) for p in profiles[:2]]
    profiles.append(strings_changed(profiles[0]))
    slow, fast = Interner(), Interner()
    for p in profiles:  # the later ones find what the earlier ones interned
        a, b = Rows(), Rows()
        with mock.patch.object(decode, "read", lambda _: None):
            slow.add(a, p, SERIES, "cpu", 10, 20)
        fast.add(b, p, SERIES, "cpu", 10, 20)
        assert len(b) < len(p.sample)  # the copied sample was summed into its first
        assert same_rows(a, b)
        slow.commit(a)
        fast.commit(b)


def renumbered(p: pb.Profile, rng: random.Random) -> pb.Profile:
    """``p`` with its functions and locations in another order (other ids,
    the same content)."""
    q = pb.Profile()
    q.CopyFrom(p)
    fn_order = list(range(len(p.function)))
    loc_order = list(range(len(p.location)))
    rng.shuffle(fn_order)
    rng.shuffle(loc_order)
    fn_id = {p.function[old].id: new + 1 for new, old in enumerate(fn_order)}
    loc_id = {p.location[old].id: new + 1 for new, old in enumerate(loc_order)}
    del q.function[:], q.location[:]
    for new, old in enumerate(fn_order):
        q.function.add().CopyFrom(p.function[old])
        q.function[new].id = new + 1
    for new, old in enumerate(loc_order):
        loc = q.location.add()
        loc.CopyFrom(p.location[old])
        loc.id = new + 1
        for ln in loc.line:
            ln.function_id = fn_id[ln.function_id]
    for x in q.sample:
        x.location_id[:] = [loc_id[i] for i in x.location_id]
    return q


def strings_changed(p: pb.Profile) -> pb.Profile:
    """``p`` with each function's system name and file changed: the same
    numbers everywhere, other frames."""
    q = pb.Profile()
    q.CopyFrom(p)
    q.string_table.extend(["other_system_name", "other.c"])
    for i, f in enumerate(q.function):
        if i % 2:
            f.system_name = len(q.string_table) - 2
        else:
            f.filename = len(q.string_table) - 1
    return q


@pytest.mark.parametrize("bulk", [False, True])
def test_thread_names_are_read_from_each_profiles_own_strings(bulk: bool) -> None:
    """Two profiles whose thread names sit at the same string index: each
    sample keeps its own profile's name (the label's indices are not
    content; a cache keyed by them gave the second profile the first's)."""
    it = Interner()
    got = []
    for names in (("alpha", "beta"), ("gamma", "delta")):
        rows = Rows()
        with mock.patch.object(decode, "read", decode.read if bulk else lambda _: None):
            it.add(rows, varied(random.Random(3), names), SERIES, "cpu", 1, 2)
        it.commit(rows)
        got.append({it.threads[t][2] for t in rows.columns()["thread"].tolist()})
    assert got == [{"alpha", "beta", ""}, {"gamma", "delta", ""}]


def verdict(p: pb.Profile, bulk: bool, limits: Limits) -> object:
    try:
        return check_profile(p, 0, limits, decode.read(p) if bulk else None)
    except InvalidRequest as exc:
        return str(exc)


BREAKS: list[Callable[[pb.Profile, random.Random], object]] = [
    lambda p, r: setattr(p.location[r.randrange(60)], "mapping_id", 3),
    lambda p, r: p.location[r.randrange(60)].line.add(function_id=41),
    lambda p, r: p.location[r.randrange(60)].line.add(function_id=0),
    lambda p, r: setattr(p.location[r.randrange(60)], "id", 99),
    lambda p, r: setattr(p.function[r.randrange(40)], "id", 0),
    lambda p, r: setattr(p.function[r.randrange(40)], "name", 10**6),
    lambda p, r: setattr(p.function[r.randrange(40)], "filename", -1),
    lambda p, r: setattr(p.mapping[1], "build_id", 999),
    lambda p, r: p.sample[r.randrange(200)].location_id.append(61),
    lambda p, r: p.sample[r.randrange(200)].location_id.append(0),
    lambda p, r: p.sample[r.randrange(200)].value.append(1),
    lambda p, r: p.sample[r.randrange(200)].value.__setitem__(1, -5),
    lambda p, r: p.sample[r.randrange(200)].label.add(key=0, num=1),
    lambda p, r: p.sample[r.randrange(200)].label.add(key=9, str=10**5),
    lambda p, r: p.sample[r.randrange(200)].label.add(key=7, str=11),  # pid "alpha"
    lambda p, r: p.sample[r.randrange(200)].label.extend(
        [pb.Label(key=10, num=i) for i in range(70)]),
]


@pytest.mark.parametrize("k", range(len(BREAKS)))
def test_bulk_checks_refuse_what_the_loops_refuse_with_their_message(k: int) -> None:
    for seed in range(4):
        rng = random.Random(seed)
        p = varied(rng)
        assert verdict(p, True, DEFAULT_LIMITS) == verdict(p, False, DEFAULT_LIMITS)
        BREAKS[k](p, rng)
        slow = verdict(p, False, DEFAULT_LIMITS)
        assert isinstance(slow, str), "the change must make the profile invalid"
        assert verdict(p, True, DEFAULT_LIMITS) == slow


def test_bulk_checks_hold_the_limits() -> None:
    p = varied(random.Random(2))
    for limits in (Limits(max_lines_per_location=2), Limits(max_stack_entries=100),
                   Limits(max_labels_per_sample=2)):
        slow = verdict(p, False, limits)
        assert isinstance(slow, str)
        assert verdict(p, True, limits) == slow


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


@pytest.mark.parametrize("seed", range(4))
def test_varints_are_the_values_written_of_every_width(seed: int) -> None:
    rng = random.Random(seed)
    # every width from 1 to 10 bytes, most short as in a profile
    values = [rng.choice([rng.randrange(1 << 7), rng.randrange(1 << 14),
                          rng.randrange(1 << 7 * rng.randint(1, 9)), rng.randrange(1 << 64)])
              for _ in range(rng.randint(0, 3000))]
    values += [0, (1 << 64) - 1, 1 << 63, 127, 128]
    rng.shuffle(values)
    encoded = [_varint(v) for v in values]
    got = decode.varints(b"".join(encoded))
    assert got is not None
    assert got[0].tolist() == values
    assert got[1].tolist() == np.cumsum([0, *map(len, encoded[:-1])]).tolist()


def test_varints_refuse_what_is_not_whole_varints() -> None:
    assert decode.varints(b"") is not None
    assert decode.varints(_varint(300)[:1]) is None            # cut in its middle
    assert decode.varints(b"\x01" + b"\xff" * 10 + b"\x01") is None   # 11 bytes
    assert decode.varints(b"\x01" + b"\xff" * 9 + b"\x01") is not None  # 10 bytes


@pytest.mark.parametrize("longest", [decode.SHORT_TAIL, decode.SHORT_TAIL + 1])
def test_label_bytes_are_told_apart_by_every_byte_and_their_length(longest: int) -> None:
    rng = random.Random(longest)
    # few distinct, some ending in zero bytes (a shorter one padded must not match)
    kinds = [b"", b"\x00", b"\x00\x00", b"\x1a\x02\x08\x00", b"\x1a\x02\x08",
             bytes(rng.randrange(256) for _ in range(longest)),
             bytes(longest - 1) + b"\x01"]
    parts = [rng.choice(kinds) for _ in range(500)]
    buf = b"".join(parts)
    end = np.cumsum([len(x) for x in parts])
    tails, which = decode._distinct(buf, end - [len(x) for x in parts], end)
    assert [tails[i] for i in which.tolist()] == parts
    assert len(set(tails)) == len(tails)


def test_every_damaged_profile_is_read_as_the_runtime_reads_it_or_left_to_it(
        reader: str) -> None:
    """Whole profiles with bytes changed, cut short or run together: the
    readers never fail (the C one reads whatever bytes it is given), and
    what they read of a profile the runtime parses is what the runtime
    read; both readers read the same profiles."""
    rng = random.Random(11)
    whole = [varied(random.Random(s)).SerializeToString() for s in range(3)]
    read = parsed = 0
    for k in range(600):
        raw = bytearray(rng.choice(whole))
        if k % 10 == 0:
            del raw[rng.randrange(len(raw)):]
        for _ in range(rng.randint(1, 3)):
            raw[rng.randrange(len(raw))] = rng.choice(
                [0x00, 0x08, 0x0A, 0x12, 0x1A, 0x22, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        data = bytes(raw)
        if decode._pprof is not None:
            decode._pprof.tables(data)   # (any bytes: no failure, no crash)
        try:
            p = pb.Profile.FromString(data)
        except Exception:
            continue
        parsed += 1
        t = decode.read(p, data)
        if t is not None:
            read += 1
            assert in_bulk(t) == one_by_one(p)
        if reader == "c":
            assert (decode.in_numpy(p, data) is None) == (t is None)
    assert parsed > 100 and read > 50
