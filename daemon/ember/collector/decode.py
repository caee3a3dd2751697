"""A pprof profile's tables read in bulk, as arrays.

The protobuf runtime gives one Python object per location, line, function
and label. A 1,000-stack profile holds about 5,000 locations and as many
functions, and reading them one object at a time took most of a write:
12 ms for the locations alone, against 1.2 ms to serialize them.

So the profile is parsed a second time as ``ProfileTables``
(proto/pprof_tables.proto), where each sample, location and function is
the bytes of its message, and each table is decoded at once:

- A Location (with its Lines) or a Function is nothing but (tag, varint)
  pairs, nested lines included: neither has a string, bytes or
  fixed-width field. The concatenation of all of them is therefore one
  run of varints, tags at even positions and values at odd ones, which
  numpy splits in one pass.
- A Sample is its packed location ids, its packed values, then its
  labels, and a Label is varints too: all the samples are one run of
  varints, in which each sample's two packed fields are found by their
  byte lengths. The labels are the bytes after them, so the distinct label
  sets of a profile (a handful: one per thread) are parsed once each.

Anything unexpected (a field this module does not know, an order the
runtime does not write, a varint past 10 bytes) makes ``read`` return
None: the caller then takes the one-object-at-a-time path, which stays the
reference for what is valid and for the messages that say why not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import numpy.typing as npt

from ..encode.pprof import ProfileMessage
from ..proto import pprof_tables_pb2 as pt
from ..proto import profile_pb2 as pb
from .scatter import ranges

_pprof: ModuleType | None
try:   # the same reading in C (_pprof.c), built by the install where it can be
    from . import _pprof
except ImportError:  # pragma: no cover (no compiler where it was installed)
    _pprof = None

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

# wire tags: field number << 3 | wire type (0: varint, 2: length-delimited)
LOC_ID, LOC_MAPPING, LOC_ADDRESS, LOC_LINE, LOC_FOLDED = 0x08, 0x10, 0x18, 0x22, 0x28
LINE_FUNCTION, LINE_LINE, LINE_COLUMN = 0x08, 0x10, 0x18
FN_ID, FN_NAME, FN_SYSTEM, FN_FILE, FN_START = 0x08, 0x10, 0x18, 0x20, 0x28
SAMPLE_LOCATIONS, SAMPLE_VALUES, SAMPLE_LABEL = 0x0A, 0x12, 0x1A


def _known(*tags: int) -> npt.NDArray[np.bool_]:
    out = np.zeros(256, np.bool_)
    out[list(tags)] = True
    return out


_LOC_TAGS = _known(LOC_ID, LOC_MAPPING, LOC_ADDRESS, LOC_LINE, LOC_FOLDED)
_LINE_TAGS = _known(LINE_FUNCTION, LINE_LINE, LINE_COLUMN)
_FN_TAGS = _known(FN_ID, FN_NAME, FN_SYSTEM, FN_FILE, FN_START)


def varints(buf: bytes) -> tuple[U64, I64] | None:
    """Every varint of ``buf`` in order (values, start offsets); None if
    ``buf`` is not a run of whole varints of at most 10 bytes. Built a byte
    position at a time over the varints still going (most end at their first
    or second byte): 4 times faster than shifting every byte at once."""
    b = np.frombuffer(buf, np.uint8)
    if not len(b):
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    last = b < 0x80
    ends = np.flatnonzero(last)
    if not len(ends) or ends[-1] != len(b) - 1:
        return None
    starts = np.empty(len(ends), np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    out = (b[starts] & 0x7F).astype(np.uint64)
    more = np.flatnonzero(~last[starts])   # (a varint's bytes end at its last)
    k = 1
    while len(more):
        if k == 10:
            return None
        at = starts[more] + k
        out[more] |= (b[at] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        more = more[~last[at]]
        k += 1
    return out, starts


def known(tags: U64, table: npt.NDArray[np.bool_]) -> bool:
    """Whether every tag is one ``table`` marks (all are one byte)."""
    return bool(len(tags) == 0 or (tags.max() < 256 and table[tags.astype(np.intp)].all()))


@dataclass(frozen=True)
class Pairs:
    """Messages made of (tag, varint) pairs only, decoded together."""

    tags: U64
    values: U64
    message: I64      # which message each pair is in
    start: I64        # byte offset of each pair's tag in the concatenation
    width: I64        # bytes of each pair
    count: int        # messages

    def field(self, where: npt.NDArray[np.bool_], default: int = 0) -> U64:
        """Per message, the value of the pair ``where`` selects (one at most
        per message), else ``default``."""
        out = np.full(self.count, default, np.uint64)
        out[self.message[where]] = self.values[where]
        return out


def pairs(messages: Sequence[bytes]) -> Pairs | None:
    buf = b"".join(messages)
    decoded = varints(buf)
    if decoded is None or len(decoded[0]) % 2:
        return None
    values, starts = decoded
    lens = np.fromiter(map(len, messages), np.int64, len(messages))
    offsets = np.cumsum(lens) - lens
    tag_at = starts[0::2]
    of_byte = np.repeat(np.arange(len(messages), dtype=np.int64), lens)
    message = of_byte[tag_at]
    # every message starts with a tag and no pair runs into the next message
    is_tag = np.zeros(len(buf), np.bool_)
    is_tag[tag_at] = True
    if (not np.array_equal(message, of_byte[starts[1::2]])
            or not is_tag[offsets[lens > 0]].all()):
        return None
    width = np.diff(np.append(tag_at, len(buf)))
    return Pairs(values[0::2], values[1::2], message.astype(np.int64), tag_at,
                 width, len(messages))


@dataclass(frozen=True)
class Locations:
    id: U64
    mapping: U64      # mapping id, 0: none
    address: U64
    lines: I64        # lines of each location
    line_location: I64  # per line (in order): its location's index
    line_function: U64  # per line: function id
    line_line: I64      # per line: line number

    @property
    def widest(self) -> int:
        return int(self.lines.max(initial=0))


def locations(messages: Sequence[bytes]) -> Locations | None:
    d = pairs(messages)
    if d is None:
        return None
    is_line = d.tags == LOC_LINE
    line_at = np.flatnonzero(is_line)
    # a line's pairs are the bytes after its length varint, for that length
    # a line's pairs start right after its length (the next pair's tag)
    content = np.append(d.start, d.start[-1] + d.width[-1] if len(d.start) else 0)[line_at + 1]
    content_end = content + d.values[line_at].astype(np.int64)
    k = np.cumsum(is_line) - 1  # each pair's latest line (its own, if it is in one)
    # (no lines at all, as in a profile of addresses only: no pair is in one)
    inside = (k >= 0) & ~is_line & (d.start < np.append(content_end, 0)[np.maximum(k, 0)])
    if not known(d.tags[inside], _LINE_TAGS) or not known(d.tags[~inside], _LOC_TAGS):
        return None
    filled = np.bincount(k[inside], weights=d.width[inside], minlength=len(line_at))
    if not np.array_equal(filled.astype(np.int64), content_end - content):
        return None
    outside = ~inside
    n_lines = np.bincount(d.message[is_line], minlength=d.count).astype(np.int64)
    function = np.zeros(len(line_at), np.uint64)
    line = np.zeros(len(line_at), np.uint64)
    sel = inside & (d.tags == LINE_FUNCTION)
    function[k[sel]] = d.values[sel]
    sel = inside & (d.tags == LINE_LINE)
    line[k[sel]] = d.values[sel]
    return Locations(d.field(outside & (d.tags == LOC_ID)),
                     d.field(outside & (d.tags == LOC_MAPPING)),
                     d.field(outside & (d.tags == LOC_ADDRESS)),
                     n_lines, d.message[is_line], function, line.view(np.int64))


@dataclass(frozen=True)
class Functions:
    id: U64
    name: U64
    system_name: U64
    filename: U64


def functions(messages: Sequence[bytes]) -> Functions | None:
    d = pairs(messages)
    if d is None or not known(d.tags, _FN_TAGS):
        return None
    return Functions(*(d.field(d.tags == t) for t in (FN_ID, FN_NAME, FN_SYSTEM, FN_FILE)))


@dataclass(frozen=True)
class Samples:
    locations: U64    # every sample's location ids, leaf first, one after another
    depth: I64        # location ids per sample
    values: I64       # every sample's values, one after another
    width: I64        # values per sample
    label_set: I64    # per sample: its index in ``label_sets``
    label_sets: list[pb.Sample]  # the distinct label lists (as samples without stacks)


def samples(messages: Sequence[bytes]) -> Samples | None:
    buf = b"".join(messages)
    decoded = varints(buf)
    if decoded is None:
        return None
    values, starts = decoded
    n = len(starts)
    lens = np.fromiter(map(len, messages), np.int64, len(messages))
    end = np.cumsum(lens)
    begin = end - lens
    # (one past the last varint: where an absent field would start)
    at_byte = np.append(starts, len(buf))
    after = np.append(starts[1:], len(buf))   # the byte after each varint
    first = np.searchsorted(starts, begin)
    if not np.array_equal(at_byte[first], begin):
        return None  # a varint runs into the next sample

    def packed(at: I64, tag: int) -> tuple[I64, I64] | None:
        """Where each sample's packed field ``tag`` is at varint ``at`` (its
        values' first and end varints; both ``at`` where it is absent)."""
        here = np.minimum(at, n - 1) if n else at
        has = (at_byte[at] < end) & (values[here] == tag) if n else np.zeros(len(at), bool)
        if not has.any():
            return at, at
        k = np.minimum(at + 1, n - 1)
        room = end - after[k]
        if not ((at + 1 < n) & (room >= 0) & (values[k] <= np.maximum(room, 0).astype(np.uint64))
                | ~has).all():
            return None  # no length, or one past the sample's end
        content_end = after[k] + np.where(has, values[k], 0).astype(np.int64)
        stop = np.searchsorted(starts, content_end)
        if not np.array_equal(at_byte[stop][has], content_end[has]):
            return None
        return np.where(has, k + 1, at), np.where(has, stop, at)

    got = packed(first, SAMPLE_LOCATIONS)
    if got is None:
        return None
    loc_first, loc_stop = got
    got = packed(loc_stop, SAMPLE_VALUES)
    if got is None:
        return None
    val_first, val_stop = got
    depth, width = loc_stop - loc_first, val_stop - val_first
    labels = label_sets(buf, at_byte[val_stop], end)
    if labels is None:
        return None
    return Samples(values[ranges(loc_first, depth)], depth,
                   values[ranges(val_first, width)].view(np.int64), width, *labels)


def label_sets(buf: bytes, begin: I64, end: I64) -> tuple[I64, list[pb.Sample]] | None:
    """Each sample's labels, ``buf[begin[i]:end[i]]`` (the rest of sample
    ``i`` after its two packed fields): which distinct set each is, and the
    sets; None unless every rest is labels only."""
    tails, which = _distinct(buf, begin, end)
    sets = []
    for tail in tails:
        if tail and tail[0] != SAMPLE_LABEL:
            return None
        try:
            s = pb.Sample.FromString(tail)
        except Exception:  # not labels after all: not the layout expected
            return None
        if s.location_id or s.value:
            return None
        sets.append(s)
    return which, sets


#: Longest label bytes of a sample compared as one row of a matrix (a
#: sample's labels are a few short messages; longer ones are compared one by one)
SHORT_TAIL = 128


def _distinct(buf: bytes, begin: I64, end: I64) -> tuple[list[bytes], I64]:
    """The distinct byte strings ``buf[begin[i]:end[i]]`` and which of them
    each ``i`` is. Short ones are rows of a matrix (their length first, then
    their bytes) found distinct at once: a loop over a 1,000-stack
    profile's samples took 1.5 ms."""
    length = end - begin
    widest = int(length.max(initial=0))
    if widest > SHORT_TAIL or not len(length):
        index: dict[bytes, int] = {}
        each = [index.setdefault(buf[a:b], len(index))
                for a, b in zip(begin.tolist(), end.tolist(), strict=True)]
        return list(index), np.array(each, np.int64)
    rows = np.zeros((len(length), widest + 1), np.uint8)
    rows[:, 0] = length
    col = np.arange(widest)
    inside = col < length[:, None]
    rows[:, 1:][inside] = np.frombuffer(buf, np.uint8)[(begin[:, None] + col)[inside]]
    keys = rows.view(np.dtype((np.void, widest + 1))).ravel()
    _, first, which = np.unique(keys, return_index=True, return_inverse=True)
    return ([buf[a:b] for a, b in zip(begin[first].tolist(), end[first].tolist(), strict=True)],
            which.astype(np.int64).ravel())


@dataclass(frozen=True)
class Tables:
    """A profile's locations, functions and samples as arrays."""

    source: ProfileMessage  # what they were read from (and say nothing of another)
    locations: Locations
    functions: Functions
    samples: Samples
    #: per string of the string table, ``hash`` of its bytes (the C reader's)
    string_hash: U64 | None = None


def read(p: ProfileMessage, raw: bytes | None = None) -> Tables | None:
    """``p``'s tables, or None when they are not laid out as expected (then
    read it message by message). ``raw``: the bytes ``p`` was parsed from
    (it is serialized again if not given)."""
    data = p.SerializeToString() if raw is None else raw
    return (in_c if _pprof is not None else in_numpy)(p, data)


def in_numpy(p: ProfileMessage, raw: bytes) -> Tables | None:
    """``read`` by the numpy reader above (where the C one was not built)."""
    t = pt.ProfileTables.FromString(raw)
    # (lists: each read of the message's list makes its bytes anew)
    loc = locations(list(t.location))
    fn = functions(list(t.function)) if loc is not None else None
    smp = samples(list(t.sample)) if fn is not None else None
    if loc is None or fn is None or smp is None:
        return None
    return Tables(p, loc, fn, smp)


def in_c(p: ProfileMessage, raw: bytes) -> Tables | None:
    """``read`` by the C reader (_pprof.c): one pass over ``raw``, the GIL
    released, 8-byte words out."""
    assert _pprof is not None
    got = _pprof.tables(raw)
    if got is None:
        return None
    u = [np.frombuffer(b, np.uint64) for b in got]
    i = [x.view(np.int64) for x in u]
    labels = label_sets(raw, i[15], i[16])
    if labels is None:
        return None
    return Tables(p, Locations(u[0], u[1], u[2], i[3], i[4], u[5], i[6]),
                  Functions(u[7], u[8], u[9], u[10]),
                  Samples(u[11], i[12], i[13], i[14], *labels), u[17])
