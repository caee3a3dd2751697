"""Checks on everything a WriteRaw request carries. The collector stores
nothing it has not checked, and nothing it could not serve: label names, the
pprof structure (as Parca's server checks it), sizes and counts, with
decompression bounded so a gzip bomb is rejected rather than inflated.

What is stored is exactly what was checked: the bytes as sent when they are
one gzip member holding the checked profile (the common case, so the write
path compresses nothing), else the checked profile compressed anew. A query
reads stored rows back through the same checks (``read_profile``)."""

from __future__ import annotations

import gzip
import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

import numpy as np
from google.protobuf.message import DecodeError
from isal import isal_zlib

from ..encode.pprof import ProfileMessage, repaired
from ..encode.writeraw import LABEL_NAME, PROFILE_ID_PREFIX
from ..model import MAX_STACK_DEPTH, TRUNCATED
from ..proto import pprof_head_pb2 as ph
from ..proto import profile_pb2 as pb
from ..proto import profilestore_pb2 as ps
from . import decode
from .rows import StoredProfile

#: What a bad deflate stream raises (isal's stubs type it as an instance).
INFLATE_ERROR = cast(type[Exception], isal_zlib.error)

METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
MAX_LABELS = 64
MAX_LABEL_VALUE = 2048
MAX_SERIES = 20_000
GZIP_MAGIC = b"\x1f\x8b"
INT64_MAX = (1 << 63) - 1
#: Sample labels the query side reads as integers (encode.pprof.from_proto).
NUMERIC_LABELS = ("pid", "tid")
SECOND = 1_000_000_000


class InvalidRequest(ValueError):
    """The request is malformed; the message says where and why."""


@dataclass(frozen=True)
class Limits:
    """Bounds on one profile. The byte limit bounds decompression; the counts
    bound what a query builds from a stored profile (a Python object per
    sample, location and frame), which bytes alone do not: a sample is a few
    bytes on the wire and hundreds in memory. Real profiles stay far below
    them (ember's: a few thousand samples; Go heap profiles: tens of
    thousands)."""

    max_profile_size: int = 64 << 20
    #: Go's gzip reader (and so pprof tools) reads concatenated members as
    #: one stream; more than a few is no profiler's output.
    max_gzip_members: int = 16
    max_samples: int = 500_000
    max_locations: int = 500_000
    max_functions: int = 500_000
    max_mappings: int = 65_536
    max_strings: int = 1_000_000
    #: the store keeps this many values per sample (intern.MAX_VALUES);
    #: profilers send one to three (count, time, bytes)
    max_sample_types: int = 4
    max_lines_per_location: int = 256
    max_labels_per_sample: int = 64
    #: location ids over all samples: the frames a query materializes
    max_stack_entries: int = 8_000_000
    #: how far ahead of the collector's clock a profile may start: agents'
    #: clocks drift, but a profile from the far future would outlive retention
    max_clock_skew_ns: int = 3600 * SECOND
    #: a longer profile would match every query of its span
    max_duration_ns: int = 86_400 * SECOND


DEFAULT_LIMITS = Limits()


def decompress(raw: bytes, limit: int, max_members: int = Limits.max_gzip_members,
               ) -> tuple[bytes, int]:
    """The pprof bytes in ``raw`` and how many gzip members held them (0: raw
    was not gzip). Concatenated members are one stream, as Go reads them;
    all of them together count against ``limit``, each step's output is
    bounded, and anything after the last member (padding, garbage) is
    refused."""
    if raw[:2] != GZIP_MAGIC:
        if len(raw) > limit:
            raise InvalidRequest(f"profile of {len(raw)} bytes is over the {limit} byte limit")
        return raw, 0
    view = memoryview(raw)
    chunks: list[bytes] = []
    size = pos = 0
    while pos < len(raw):
        if len(chunks) == max_members:
            raise InvalidRequest(f"more than {max_members} gzip members")
        if raw[pos:pos + 2] != GZIP_MAGIC:
            raise InvalidRequest("data after the gzip stream")
        d = isal_zlib.decompressobj(wbits=16 + isal_zlib.MAX_WBITS)
        try:
            out = d.decompress(view[pos:], limit - size + 1)
        except INFLATE_ERROR as exc:
            raise InvalidRequest(f"bad gzip data: {exc}") from None
        size += len(out)
        if size > limit:
            raise InvalidRequest(f"profile decompresses to more than {limit} bytes")
        if not d.eof:
            raise InvalidRequest("truncated gzip data")
        chunks.append(out)
        pos = len(raw) - len(d.unused_data)
    return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), len(chunks)


def check_labels(labels: ps.LabelSet) -> tuple[tuple[str, str], ...]:
    seen: dict[str, str] = {}
    if len(labels.labels) > MAX_LABELS:
        raise InvalidRequest(f"{len(labels.labels)} labels, at most {MAX_LABELS}")
    for lb in labels.labels:
        if not LABEL_NAME.match(lb.name):
            raise InvalidRequest(f"invalid label name {lb.name[:64]!r}")
        if lb.name in seen:
            raise InvalidRequest(f"duplicate label {lb.name!r}")
        if len(lb.value) > MAX_LABEL_VALUE:
            raise InvalidRequest(f"label {lb.name} value longer than {MAX_LABEL_VALUE}")
        seen[lb.name] = lb.value
    name = seen.get("__name__")
    if not name:
        raise InvalidRequest("series has no __name__ label")
    if not METRIC_NAME.match(name):
        raise InvalidRequest(f"__name__ {name[:64]!r} is not a valid metric name")
    return tuple(sorted(seen.items()))


def parse(data: bytes, limits: Limits) -> tuple[pb.Profile, bool]:
    """The Profile in ``data``, and whether its strings had to be repaired.
    The protobuf runtime refuses strings that are not UTF-8, which Go's pprof
    can write: rather than refusing the profile (and with it the request),
    each bad byte sequence becomes U+FFFD."""
    try:
        return pb.Profile.FromString(data), False
    except DecodeError as exc:
        error = exc
    try:
        profile = repaired(data, limits.max_strings)
    except DecodeError:
        raise InvalidRequest(f"not a pprof profile: {error}") from None
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    if profile is None:
        raise InvalidRequest(f"not a pprof profile: {error}")  # not a string problem
    return profile, True


def _at_most(n: int, limit: int, what: str) -> None:
    if n > limit:
        raise InvalidRequest(f"{n} {what}, at most {limit}")


def _in_strings(i: int, n_str: int, what: str) -> None:
    if not 0 <= i < n_str:
        raise InvalidRequest(f"{what}: string index {i} out of range")


def _check_head(p: ProfileMessage, limits: Limits) -> None:
    """``check_profile``'s checks of what is not in the three tables: the
    counts, the string table, the value types and the profile's strings."""
    st = p.string_table
    n_str = len(st)
    _at_most(n_str, limits.max_strings, "strings")
    _at_most(len(p.sample), limits.max_samples, "samples")
    _at_most(len(p.location), limits.max_locations, "locations")
    _at_most(len(p.function), limits.max_functions, "functions")
    _at_most(len(p.mapping), limits.max_mappings, "mappings")
    _at_most(len(p.sample_type), limits.max_sample_types, "sample types")
    if n_str == 0 or st[0] != "":
        raise InvalidRequest("string table must start with the empty string")

    if not p.sample_type:
        raise InvalidRequest("no sample types")
    for vt in [*p.sample_type, p.period_type]:
        _in_strings(vt.type, n_str, "value type")
        _in_strings(vt.unit, n_str, "value type unit")
    for i in (*p.comment, p.drop_frames, p.keep_frames, p.default_sample_type, p.doc_url):
        _in_strings(i, n_str, "profile string")
    if p.period < 0:
        raise InvalidRequest(f"negative period {p.period}")


def check_profile(p: pb.Profile, n_exec_info: int, limits: Limits = DEFAULT_LIMITS,
                  tables: decode.Tables | None = None) -> tuple[int, bool]:
    """Everything a query relies on: indices and ids in range, counts within
    ``limits``, values not negative, numeric labels numbers. Returns the sum
    of the samples' first values and whether a sample may be deeper than
    ``MAX_STACK_DEPTH`` frames (for ``cap_stacks``). This runs for every
    profile written: given the profile's ``tables`` (collector/decode.py),
    the per-location, per-function and per-sample checks run on arrays, and
    the plain loops run only to say what is wrong."""
    _check_head(p, limits)
    st = p.string_table
    n_str = len(st)

    if tables is not None:
        fast = _check_tables(p, tables, n_exec_info, limits)
        if fast is not None:
            return fast
        # something is wrong: the loops below say what
    for kind, ids in (("mapping", [m.id for m in p.mapping]),
                      ("location", [loc.id for loc in p.location]),
                      ("function", [f.id for f in p.function])):
        for pos, id_ in enumerate(ids):
            if id_ != pos + 1:
                raise InvalidRequest(f"{kind} {pos} has id {id_}, expected {pos + 1}")
    for m in p.mapping:
        _in_strings(m.filename, n_str, "mapping filename")
        _in_strings(m.build_id, n_str, "mapping build id")
    for f in p.function:
        for i in (f.name, f.system_name, f.filename):
            _in_strings(i, n_str, "function name")
    n_map, n_loc, n_fn = len(p.mapping), len(p.location), len(p.function)
    widest = 1  # frames of one location: one per line
    for loc in p.location:
        if loc.mapping_id > n_map:
            raise InvalidRequest(f"location {loc.id}: mapping id {loc.mapping_id} out of range")
        if len(loc.line) > widest:
            widest = len(loc.line)
            _at_most(widest, limits.max_lines_per_location, f"lines in location {loc.id}")
        for line in loc.line:
            if not 0 < line.function_id <= n_fn:
                raise InvalidRequest(
                    f"location {loc.id}: function id {line.function_id} out of range")
    numeric = {i for i, x in enumerate(st) if x in NUMERIC_LABELS} if p.sample else set()
    n_types = len(p.sample_type)
    max_labels = limits.max_labels_per_sample
    entries = longest = total = 0
    for i, sample in enumerate(p.sample):
        values = sample.value
        if len(values) != n_types:
            raise InvalidRequest(f"sample {i} has {len(values)} values for "
                                 f"{n_types} sample types")
        for v in values:
            if v < 0:
                raise InvalidRequest(f"sample {i}: negative value {v}")
        total += values[0]
        lids = sample.location_id
        for lid in lids:
            if not 0 < lid <= n_loc:
                raise InvalidRequest(f"sample {i}: location id {lid} out of range")
        entries += len(lids)
        longest = max(longest, len(lids))
        if len(sample.label) > max_labels:
            _at_most(len(sample.label), max_labels, f"labels in sample {i}")
        for lb in sample.label:
            key, value = lb.key, lb.str
            if not (0 < key < n_str and 0 <= value < n_str and 0 <= lb.num_unit < n_str):
                if key == 0:
                    raise InvalidRequest(f"sample {i}: label key 0")
                for j in (key, value, lb.num_unit):
                    _in_strings(j, n_str, f"sample {i} label")
            if value and key in numeric:
                _check_number(st[key], st[value])
    _at_most(entries, limits.max_stack_entries, "stack entries")
    if n_exec_info and n_exec_info != n_map:
        raise InvalidRequest(f"{n_exec_info} executable_info entries for {n_map} mappings")
    return total, longest * widest > MAX_STACK_DEPTH


def _check_tables(p: ProfileMessage, t: decode.Tables, n_exec_info: int,
                  limits: Limits) -> tuple[int, bool] | None:
    """``check_profile``'s per-item checks on arrays: its result if all hold,
    else None (a label's number that is not one raises, as there)."""
    n_str, n_map = len(p.string_table), len(p.mapping)
    loc, fn, smp = t.locations, t.functions, t.samples
    n_loc, n_fn, n_types = len(loc.id), len(fn.id), len(p.sample_type)
    if (any(m.id != i + 1 for i, m in enumerate(p.mapping))
            or not np.array_equal(loc.id, np.arange(1, n_loc + 1, dtype=np.uint64))
            or not np.array_equal(fn.id, np.arange(1, n_fn + 1, dtype=np.uint64))
            or any(m.filename >= n_str or m.build_id >= n_str or m.filename < 0
                   or m.build_id < 0 for m in p.mapping)):
        return None
    if n_fn and max(int(fn.name.max()), int(fn.system_name.max()),
                    int(fn.filename.max())) >= n_str:
        return None
    widest = max(1, loc.widest)
    if (widest > limits.max_lines_per_location
            or (n_loc and int(loc.mapping.max()) > n_map)
            or (len(loc.line_function) and (int(loc.line_function.min()) < 1
                                            or int(loc.line_function.max()) > n_fn))):
        return None
    entries = len(smp.locations)
    if ((len(smp.width) and (smp.width != n_types).any())
            or (len(smp.values) and int(smp.values.min()) < 0)
            or (entries and (int(smp.locations.min()) < 1
                             or int(smp.locations.max()) > n_loc))
            or entries > limits.max_stack_entries
            or (n_exec_info and n_exec_info != n_map)):
        return None
    st = p.string_table
    for labels in t.samples.label_sets:
        if len(labels.label) > limits.max_labels_per_sample:
            return None
        for lb in labels.label:
            if not (0 < lb.key < n_str and 0 <= lb.str < n_str and 0 <= lb.num_unit < n_str):
                return None
            if lb.str and st[lb.key] in NUMERIC_LABELS:
                try:
                    _check_number(st[lb.key], st[lb.str])
                except InvalidRequest:
                    return None
    total = sum(smp.values[::n_types].tolist()) if n_types else 0
    longest = int(smp.depth.max(initial=0))
    return total, longest * widest > MAX_STACK_DEPTH


def _check_number(key: str, value: str) -> None:
    """A pid or tid label given as a string must read as an int64, as the
    query side reads it."""
    try:
        n = int(value)
    except ValueError:
        n = None
    if n is None or not -INT64_MAX - 1 <= n <= INT64_MAX:
        raise InvalidRequest(f"label {key} value {value[:32]!r} is not a number")


def cap_stacks(p: pb.Profile) -> bool:
    """Cap every sample at ``MAX_STACK_DEPTH`` frames (a location is as many
    frames as it has lines) as ``model.cap_depth`` does: the leafmost frames
    stay, under a ``[truncated]`` location added for that. Returns whether
    anything was cut. Capping keeps a deep sample's time where it belongs
    rather than refusing a whole request for one runaway recursion."""
    widths = [0, *(max(1, len(loc.line)) for loc in p.location)]
    marker = 0
    for sample in p.sample:
        ids = sample.location_id
        if sum(widths[i] for i in ids) <= MAX_STACK_DEPTH:
            continue
        if not marker:
            marker = _add_marker(p)
        keep, depth = [], 0
        for lid in ids:  # leaf first
            depth += widths[lid]
            if depth > MAX_STACK_DEPTH - 1:
                break
            keep.append(lid)
        sample.location_id[:] = [*keep, marker]
    return bool(marker)


def _add_marker(p: pb.Profile) -> int:
    """The id of a new location without mapping (a synthetic frame) named
    ``[truncated]``."""
    p.string_table.append(TRUNCATED)
    fn = p.function.add(id=len(p.function) + 1, name=len(p.string_table) - 1,
                        system_name=len(p.string_table) - 1)
    loc = p.location.add(id=len(p.location) + 1)
    loc.line.add(function_id=fn.id)
    return loc.id


class Checked(NamedTuple):
    profile: ProfileMessage
    data: bytes         # what to store: gzip pprof of exactly ``profile``
    samples: int        # sum of the samples' first values, at most INT64_MAX
    tables: decode.Tables | None  # ``profile``'s tables, if read in bulk


def read_profile(data: bytes, limits: Limits = DEFAULT_LIMITS, n_exec_info: int = 0,
                 repairs: Counter[str] | None = None) -> Checked:
    """The checked profile in gzip or raw pprof ``data`` (InvalidRequest if
    there is none), repaired and capped as needed. What to store is ``data``
    itself when that is one gzip member holding exactly the checked profile
    (no compression on the common path), else the checked profile compressed
    anew. ``repairs`` counts by what was changed ("utf8", "depth")."""
    raw, members = decompress(data, limits.max_profile_size, limits.max_gzip_members)
    if members == 1:
        fast = _read_head(raw, limits, n_exec_info)
        if fast is not None:
            return Checked(fast[0], data, min(fast[1], INT64_MAX), fast[2])
    p, repaired = parse(raw, limits)
    _at_most(len(p.location), limits.max_locations, "locations")  # before reading them
    _at_most(len(p.function), limits.max_functions, "functions")
    _at_most(len(p.sample), limits.max_samples, "samples")
    tables = decode.read(p, None if repaired else raw)
    total, deep = check_profile(p, n_exec_info, limits, tables)
    capped = deep and cap_stacks(p)
    if repairs is not None and repaired:
        repairs["utf8"] += 1
    if repairs is not None and capped:
        repairs["depth"] += 1
    if members != 1 or repaired or capped:
        data = gzip.compress(p.SerializeToString(), compresslevel=6, mtime=0)
    return Checked(p, data, min(total, INT64_MAX), None if capped else tables)


def _read_head(raw: bytes, limits: Limits, n_exec_info: int
               ) -> tuple[ph.ProfileHead, int, decode.Tables] | None:
    """``read_profile`` of a profile that needs no repair, read as a
    ``ProfileHead`` (proto/pprof_head.proto): its head and tables checked,
    the sum of its first values. None for anything else (bytes the head or
    the bulk reader does not take, a check that fails, a sample to cap):
    reading it as a whole Profile then says what is wrong, or repairs it.
    Parsing the whole Profile took 1.7 ms of a 1,000-stack profile's 8 ms
    in a decode worker, the head 0.4."""
    try:
        head = ph.ProfileHead.FromString(raw)
        _check_head(head, limits)
    except (DecodeError, InvalidRequest):
        return None
    tables = decode.read(head, raw)
    checked = None if tables is None else _check_tables(head, tables, n_exec_info, limits)
    if tables is None or checked is None or checked[1]:
        return None
    return head, checked[0], tables


def check_times(p: ProfileMessage, limits: Limits, now_ns: int) -> None:
    """A profile starts at a time not negative and not far ahead of ours
    (0: unknown, stored as received now) and lasts from 0 to a day."""
    if p.time_nanos < 0 or p.time_nanos > now_ns + limits.max_clock_skew_ns:
        raise InvalidRequest(f"time_nanos {p.time_nanos} is before 1970 or more than "
                             f"{limits.max_clock_skew_ns // SECOND} s ahead of the collector")
    if not 0 <= p.duration_nanos <= limits.max_duration_ns:
        raise InvalidRequest(f"duration_nanos {p.duration_nanos} is not between 0 and "
                             f"{limits.max_duration_ns // SECOND} s")


def profile_type(name: str, p: ProfileMessage) -> str:
    """Parca's profile type notation, name:type:unit:period_type:period_unit."""
    st = p.string_table
    main = p.sample_type[-1]
    return ":".join([name, st[main.type], st[main.unit], st[p.period_type.type],
                     st[p.period_type.unit]])


def profile_id(data: bytes, p: ProfileMessage) -> str:
    """The id the agent wrote into a comment, else a hash of the stored
    bytes (a retry sends the same bytes, so it is stored once)."""
    for i in p.comment:
        c = p.string_table[i]
        if c.startswith(PROFILE_ID_PREFIX):
            pid = c[len(PROFILE_ID_PREFIX):]
            if 0 < len(pid) <= 128 and pid.isalnum():
                return pid
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_series_count(req: ps.WriteRawRequest) -> None:
    """InvalidRequest for a request of more than ``MAX_SERIES`` series."""
    if len(req.series) > MAX_SERIES:
        raise InvalidRequest(f"{len(req.series)} series, at most {MAX_SERIES}")


def check_request(req: ps.WriteRawRequest, limits: Limits, now_ns: int,
                  repairs: Counter[str] | None = None,
                  numbers: Sequence[int] | None = None) -> list[StoredProfile]:
    """Everything to store for a valid request; InvalidRequest otherwise.
    ``repairs`` counts the profiles accepted after a repair, by kind;
    ``numbers``: each series' number in the request it was taken from (for
    the messages; its position here if not given)."""
    check_series_count(req)
    out: list[StoredProfile] = []
    fixes: Counter[str] = Counter()
    for si, series in zip(numbers or range(len(req.series)), req.series, strict=True):
        try:
            labels = check_labels(series.labels)
        except InvalidRequest as exc:
            raise InvalidRequest(f"series {si}: {exc}") from None
        name = dict(labels)["__name__"]
        for pi, sample in enumerate(series.samples):
            where = f"series {si} sample {pi}"
            if not sample.raw_profile:
                raise InvalidRequest(f"{where}: empty raw_profile")
            try:
                p, gz, total, tables = read_profile(sample.raw_profile, limits,
                                            len(sample.executable_info), fixes)
                check_times(p, limits, now_ns)
            except InvalidRequest as exc:
                raise InvalidRequest(f"{where}: {exc}") from None
            out.append(StoredProfile(
                profile_id=profile_id(gz, p), series_labels=labels,
                type=profile_type(name, p), time_ns=p.time_nanos or now_ns,
                duration_ns=p.duration_nanos,
                samples=total, data=gz, proto=p, tables=tables))
    if repairs is not None:
        repairs.update(fixes)  # only for a request accepted whole
    return out
