"""pprof: gzip-compressed perftools.profiles.Profile.

Ids of mappings, locations and functions are their list position + 1, and the
string table starts with "" (what `go tool pprof` and Parca's server expect).
Synthetic frames get a location without a mapping, so they show by name.
Stacks are capped at ``MAX_STACK_DEPTH`` frames (``encode.depth``); decoding
an untrusted file takes a bound on what its gzip may inflate to.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence
from typing import TypeAlias

from ..model import (
    KERNEL_MAPPING,
    Frame,
    FrameKind,
    Mapping,
    Profile,
    ProfileType,
    Sample,
    location_groups,
)
from ..proto import pprof_head_pb2 as ph
from ..proto import profile_pb2 as pb
from .depth import cap_frames

GZIP_MAGIC = b"\x1f\x8b"
#: A parsed pprof: the whole Profile, or its head (proto/pprof_head.proto:
#: samples, locations and functions as bytes), which has every other field.
ProfileMessage: TypeAlias = pb.Profile | ph.ProfileHead
_PIECE = 1 << 16  # compressed bytes handed to zlib at a time


class TooLarge(ValueError):
    """Compressed data that inflates past the caller's limit."""


class _Strings:
    def __init__(self) -> None:
        self.table: list[str] = [""]
        self.index: dict[str, int] = {"": 0}

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.table)
            self.table.append(s)
        return i


def to_proto(profile: Profile) -> pb.Profile:
    return to_proto_with_mappings(profile)[0]


def to_proto_with_mappings(profile: Profile) -> tuple[pb.Profile, list[Mapping]]:
    """The profile message and the model mappings in mapping-id order."""
    p = pb.Profile()
    st = _Strings()
    t = profile.type
    for typ, unit in t.sample_types:
        p.sample_type.add(type=st(typ), unit=st(unit))
    p.period_type.type = st(t.period_type[0])
    p.period_type.unit = st(t.period_type[1])
    p.period = t.period
    p.time_nanos = profile.start_ns
    p.duration_nanos = profile.duration_ns
    p.default_sample_type = st(t.sample_types[-1][0])
    for c in profile.comments:
        p.comment.append(st(c))

    mappings: dict[Mapping, int] = {}
    functions: dict[tuple[str, str, str], int] = {}
    locations: dict[tuple[Mapping | None, int, tuple[tuple[str, str, str, int], ...]], int] = {}

    def mapping_id(m: Mapping) -> int:
        mid = mappings.get(m)
        if mid is None:
            mid = mappings[m] = len(p.mapping) + 1
            p.mapping.add(id=mid, memory_start=m.start, memory_limit=m.limit,
                          file_offset=m.offset, filename=st(m.path), build_id=st(m.build_id),
                          has_functions=m.has_functions)
        return mid

    def function_id(f: Frame) -> int:
        key = (f.name, f.system_name, f.file)
        fid = functions.get(key)
        if fid is None:
            fid = functions[key] = len(p.function) + 1
            p.function.add(id=fid, name=st(f.name), system_name=st(f.system_name or f.name),
                           filename=st(f.file))
        return fid

    def location_id(group: list[Frame]) -> int:
        """One Location for a frame and the frames inlined into it (group
        is innermost first, as Location.line lists them)."""
        f = group[-1]
        key = (f.mapping, f.address, tuple((g.name, g.system_name, g.file, g.line)
                                           for g in group))
        lid = locations.get(key)
        if lid is None:
            loc = pb.Location(id=len(p.location) + 1, address=f.address,
                              mapping_id=mapping_id(f.mapping) if f.mapping else 0)
            for g in group:
                loc.line.add(function_id=function_id(g), line=g.line)
            lid = locations[key] = loc.id
            p.location.append(loc)
        return lid

    for s in profile.samples:
        sample = p.sample.add(value=list(s.values), location_id=[
            location_id(group) for group in location_groups(cap_frames(s.frames))])
        sample.label.add(key=st("pid"), num=s.pid)
        sample.label.add(key=st("tid"), num=s.tid)
        sample.label.add(key=st("thread_name"), str=st(s.thread_name))
        for k, v in s.labels:
            sample.label.add(key=st(k), str=st(v))
    p.string_table.extend(st.table)
    return p, list(mappings)


def encode_pprof(profile: Profile) -> bytes:
    return gzip.compress(to_proto(profile).SerializeToString(), mtime=0)


def decode_pprof(data: bytes, max_size: int | None = None) -> pb.Profile:
    """The profile of a pprof file, gzip or not; with ``max_size``, one that
    inflates past it is refused (TooLarge) before it takes the memory."""
    raw: bytes | bytearray = data
    if data[:2] == GZIP_MAGIC:
        raw = gzip.decompress(data) if max_size is None else gunzip(data, max_size)
    p = pb.Profile()
    # any buffer parses; a bytes copy of an inflated file would double its memory
    p.ParseFromString(raw)  # type: ignore[arg-type]
    return p


def repaired(raw: bytes | bytearray, max_strings: int | None = None) -> pb.Profile | None:
    """The Profile in ``raw`` (not gzip) with each string that is not UTF-8
    made valid, bad byte sequences as U+FFFD: Go's pprof writes a symbol's
    bytes as they are, and the protobuf runtime refuses such a Profile.
    None when the strings are not what made it refuse; DecodeError when
    ``raw`` is no protobuf; ValueError past ``max_strings`` strings. The
    strings are read as bytes (``ProfileStrings``: every other field kept
    as an unknown field), repaired and the whole parsed again."""
    from ..proto.pprof_strings_pb2 import ProfileStrings

    strings = ProfileStrings()
    strings.ParseFromString(raw)  # type: ignore[arg-type]
    if max_strings is not None and len(strings.string_table) > max_strings:
        raise ValueError(f"{len(strings.string_table)} strings, at most {max_strings}")
    fixed = [s.decode("utf-8", "replace").encode() for s in strings.string_table]
    if fixed == list(strings.string_table):
        return None
    strings.string_table[:] = fixed
    return pb.Profile.FromString(strings.SerializeToString())


def gunzip(data: bytes, max_size: int) -> bytearray:
    """Every gzip member of data, inflated a bounded piece at a time: a
    15 MB file can inflate to gigabytes, and a file of many members to as
    much again, so the running total over all of them is what is checked.
    TooLarge past max_size; ValueError for data that is not gzip or is cut
    short. Zero bytes after the last member (padding) are ignored. Input goes
    in pieces so that a file of many small members is not copied once per
    member."""
    out = bytearray()
    view = memoryview(data)
    pos = 0
    while data[pos:pos + 2] == GZIP_MAGIC:
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not member.eof:
            if pos >= len(data):
                raise ValueError("gzip data cut short")
            piece = view[pos:pos + _PIECE]
            pos += len(piece)
            try:  # at most one byte past the limit: enough to know it is passed
                out += member.decompress(piece, max_size - len(out) + 1)
            except zlib.error as exc:
                raise ValueError(f"bad gzip data: {exc}") from None
            if len(out) > max_size:
                raise TooLarge(f"decompresses to more than {max_size} bytes")
        pos -= len(member.unused_data)
    if data[pos:].strip(b"\0"):
        raise ValueError("not gzip data" if pos == 0 else "garbage after the gzip data")
    return out


MappingKey = tuple[int, int, int, str, str, bool]
#: A pprof Line: (line number, (function name, system name, file) or None).
LineKey = tuple[int, "FunctionKey | None"]
#: A pprof Function: (name, system name, file).
FunctionKey = tuple[str, str, str]
_mapping_cache: dict[MappingKey, Mapping] = {}


def location_frames(address: int, mapping: MappingKey | None,
                    lines: Sequence[LineKey]) -> list[Frame]:
    """One pprof location as frames, root first (pprof lists the inlined
    functions of a location innermost first)."""
    m = None
    if mapping is not None:
        m = _mapping_cache.get(mapping)
        if m is None:
            m = _mapping_cache[mapping] = Mapping(*mapping)
    if m is None:
        kind = FrameKind.SYNTHETIC
    elif m.path == KERNEL_MAPPING.path:
        kind = FrameKind.KERNEL
    else:
        kind = FrameKind.USER
    out = []
    last = len(lines) - 1
    for i, (line, fn) in enumerate(lines):  # innermost (inlined) first
        name, system, file = fn or ("", "", "")
        out.append(Frame(name or f"{address:#x}", kind, m, address,
                         system if system != name else "", file, line, inlined=i < last))
    if not out:
        out.append(Frame(f"{address:#x}", kind, m, address))
    out.reverse()
    return out


def sample_context(s: Sequence[str], x: pb.Sample) -> tuple[int, int, str,
                                                             tuple[tuple[str, str], ...]]:
    """A sample's (pid, tid, thread name, other labels sorted) from its labels."""
    labels = {s[lb.key]: (s[lb.str] if lb.str else str(lb.num)) for lb in x.label}
    pid = int(labels.pop("pid", "0") or 0)
    tid = int(labels.pop("tid", "0") or 0)
    thread = labels.pop("thread_name", "")
    return pid, tid, thread, tuple(sorted(labels.items()))


def profile_shape(p: ProfileMessage) -> ProfileType:
    s = p.string_table
    types = tuple((s[t.type], s[t.unit]) for t in p.sample_type)
    return ProfileType(name="", sample_types=types,
                       period_type=(s[p.period_type.type], s[p.period_type.unit]),
                       period=p.period, folded_index=len(types) - 1)


def from_proto(p: pb.Profile) -> tuple[ProfileType, list[Sample]]:
    """A decoded pprof back into the model (validated input assumed)."""
    s = p.string_table
    mappings = {m.id: (m.memory_start, m.memory_limit, m.file_offset, s[m.filename],
                       s[m.build_id], m.has_functions) for m in p.mapping}
    functions = {f.id: (s[f.name], s[f.system_name], s[f.filename]) for f in p.function}
    frames: dict[int, list[Frame]] = {}
    for loc in p.location:
        lines = [(ln.line, functions.get(ln.function_id)) for ln in loc.line]
        frames[loc.id] = location_frames(loc.address, mappings.get(loc.mapping_id), lines)
    samples = []
    for x in p.sample:
        stack: list[Frame] = []
        for lid in reversed(x.location_id):  # root first
            stack.extend(frames.get(lid, []))
        pid, tid, thread, labels = sample_context(s, x)
        samples.append(Sample(tuple(stack), tuple(x.value), pid, tid, thread, labels))
    return profile_shape(p), samples
