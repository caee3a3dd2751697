"""What flame graphs are drawn from: folded stacks with their unit.

A source is a folded-stacks file, a pprof file (gzip or not), ``-`` for
standard input, or a collector query URL (http[s]://.../api/v1/profile?...,
fetched as pprof, with the collector's bearer token and CA when the caller
has them). pprof inputs carry their unit: a time profile (cpu or
off_cpu nanoseconds) is shown in ms/s; folded inputs are counts, or time
when ``--countname`` is a time unit (ns, us, ms, s). Inputs are untrusted:
folded text is read and summed a chunk at a time, every input is bounded
(``MAX_INPUT_SIZE``, gzip included), and stacks deeper than
``MAX_STACK_DEPTH`` keep their leafmost frames. Names are any bytes (a
thread or symbol name is whatever the program holds): bytes that are not
UTF-8, in folded text or in a pprof's strings, become U+FFFD, the one
stand-in the SVG also shows for what XML cannot hold (``svg.escape``), and
their samples stay. Kept apart from the drawing (graphs.py) because the
collector makes the same ``Stacks`` from profiles it has merged, without
reading any source.
"""

from __future__ import annotations

import io
import re
import sys
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from google.protobuf.message import DecodeError

from .. import abi
from ..encode.folded import FoldedError, fold, read_folded
from ..encode.pprof import GZIP_MAGIC, TooLarge, decode_pprof, from_proto, gunzip, repaired
from ..errors import EmberError, UsageError
from ..httpserve import fetch
from ..model import Frame, FrameKind, Profile, ProfileType, Sample, merge_samples
from ..proto import profile_pb2 as pb
from ..runtimes.pycode import PYTHON_MAPPING
from . import svg

TIME_UNITS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_STATE_FRAMES = frozenset(f"[{n}]" for n in abi.STATE_NAMES.values())


@dataclass(frozen=True)
class Stacks:
    """Folded stacks with their unit: "ns" (time) or a count name."""

    stacks: Counter[str]
    unit: str
    kinds: dict[str, str]
    offcpu: bool = False

    @property
    def total(self) -> float:
        return float(sum(self.stacks.values()))


#: The default bound on an input: bytes of folded text, or what a gzip pprof
#: may inflate to (``--max-input-size``). A real profile of 200k distinct
#: stacks is a few tens of MB; past a GiB it is a mistake or an attack.
MAX_INPUT_SIZE = 1 << 30
_CHUNK = 1 << 20  # bytes read at a time
_PEEK = 64 << 10  # bytes looked at to tell text from binary


def load(source: str, countname: str = "samples", *, token: str = "",
         cafile: str | None = None, max_size: int = MAX_INPUT_SIZE) -> Stacks:
    """Stacks from a source; token and cafile only matter for a collector URL
    (see ``httpserve.fetch``). Files and standard input are read as a
    stream; max_size bounds the folded text read and what a gzip inflates
    to (UsageError past it)."""
    if source.startswith(("http://", "https://")):
        return load_stream(io.BytesIO(_fetch(source, token, cafile, max_size)), source, countname,
                           max_size)
    if source == "-":
        return load_stream(sys.stdin.buffer, source, countname, max_size)
    try:
        with open(source, "rb") as stream:
            return load_stream(stream, source, countname, max_size)
    except OSError as exc:
        raise UsageError(f"cannot read {source}: {exc.strerror}") from None


def _fetch(source: str, token: str, cafile: str | None, max_size: int) -> bytes:
    url = urllib.parse.urlparse(source)
    q = urllib.parse.parse_qs(url.query)
    q["format"] = ["pprof"]
    full = url._replace(query=urllib.parse.urlencode(q, doseq=True)).geturl()
    try:
        return fetch(full, token=token, cafile=cafile, max_bytes=max_size)
    except EmberError as exc:
        raise UsageError(f"cannot fetch {source}: {exc}") from None


def load_stream(stream: BinaryIO, source: str, countname: str = "samples",
                max_size: int = MAX_INPUT_SIZE) -> Stacks:
    """Stacks from an open binary stream that ``source`` names in messages.
    gzip is pprof; text is folded stacks, read a chunk at a time; binary
    that is not a pprof is still tried as folded text (a thread name may
    hold any byte). Every failure is a UsageError."""
    head = stream.read(_PEEK)
    if head[:2] == GZIP_MAGIC:
        return _pprof(source, _read_all(head, stream, source, max_size), max_size)
    if not _looks_binary(head):
        return _folded(source, _chunks(head, stream, source, max_size), countname)
    data = _read_all(head, stream, source, max_size)
    try:
        return _pprof(source, data, max_size)
    except UsageError as not_pprof:
        try:
            return _folded(source, [data], countname)
        except UsageError:
            raise not_pprof from None


def _looks_binary(head: bytes) -> bool:
    """Control bytes where text has none: every pprof has some in its first
    field tags (raw protobuf), folded text almost never."""
    return bool(head.translate(None, _TEXT_BYTES))


_TEXT_BYTES = bytes(range(0x20, 0x100)) + b"\t\n\r\f\v"


def _chunks(head: bytes, stream: BinaryIO, source: str, max_size: int) -> Iterator[bytes]:
    """The stream in chunks, head first; UsageError past max_size bytes."""
    total = len(head)
    chunk = head
    while chunk:
        if total > max_size:
            raise UsageError(f"{source}: larger than {max_size} bytes (see --max-input-size)")
        yield chunk
        try:
            chunk = stream.read(_CHUNK)
        except OSError as exc:
            raise UsageError(f"cannot read {source}: {exc.strerror}") from None
        total += len(chunk)


def _read_all(head: bytes, stream: BinaryIO, source: str, max_size: int) -> bytes:
    return b"".join(_chunks(head, stream, source, max_size))


def _folded(source: str, chunks: Iterable[bytes], countname: str) -> Stacks:
    """Folded text's stacks. ``read_folded`` decodes with errors="replace",
    not "surrogateescape": every name must be a str that encodes (the SVG,
    ``ember diff --folded`` and pprof all write UTF-8), a bad byte then
    shows as U+FFFD where it stood, as the collector repairs pprof strings,
    and a line's count is kept whatever its names hold."""
    try:
        stacks = read_folded(chunks)
    except FoldedError as exc:
        raise UsageError(f"{source}:{exc.lineno}: {exc.problem}") from None
    unit = "ns" if countname in TIME_UNITS else countname
    if countname in TIME_UNITS and countname != "ns":
        stacks = Counter({k: int(v * TIME_UNITS[countname]) for k, v in stacks.items()})
    # ember's off-CPU stacks end in a thread-state frame ([sleeping], ...)
    offcpu = any(k.rpartition(";")[2] in _STATE_FRAMES for k in stacks)
    return Stacks(stacks, unit, {}, offcpu=offcpu)


def _pprof(source: str, data: bytes, max_size: int) -> Stacks:
    """A pprof file's stacks. It is untrusted: one that decodes as protobuf
    may still index past its tables, so any failure is the input's."""
    try:
        return stacks_of(*from_proto(_decode(data, max_size)))
    except TooLarge as exc:
        raise UsageError(f"{source}: {exc}") from None
    except Exception as exc:
        raise UsageError(f"{source}: neither folded stacks nor a pprof profile ({exc})") from None


def _decode(data: bytes, max_size: int) -> pb.Profile:
    """``decode_pprof``, but strings that are not UTF-8 become U+FFFD
    (encode/pprof.py ``repaired``, as the collector does on write) instead
    of refusing the file."""
    try:
        return decode_pprof(data, max_size)
    except DecodeError as exc:
        refused = exc
    raw = gunzip(data, max_size) if data[:2] == GZIP_MAGIC else data  # again: a rare path
    try:
        profile = repaired(raw)
    except DecodeError:
        raise refused from None  # not protobuf at all: say what a Profile found
    if profile is None:
        raise refused  # not a string problem
    return profile


def stacks_of(ptype: ProfileType, samples: Sequence[Sample]) -> Stacks:
    """Folded stacks of the profile's main (last) value, with frame kinds."""
    last_type, last_unit = ptype.sample_types[-1]
    index = len(ptype.sample_types) - 1
    unit = "ns" if last_unit == "nanoseconds" else last_type
    t = ProfileType("", ptype.sample_types, ptype.period_type, ptype.period, folded_index=index)
    profile = Profile(t, merge_samples(samples), 0, 0)
    kinds = svg.merge_kinds((f.name, _kind(f)) for s in samples for f in s.frames)
    return Stacks(fold(profile), unit, kinds, offcpu=last_type == "off_cpu")


def _kind(f: Frame) -> str:
    """The frame's kind, with Python functions and code in anonymous
    executable memory (JIT compilers, perf-map names) told apart from user
    code in files."""
    if f.mapping is not None and f.mapping.path == PYTHON_MAPPING.path:
        return svg.PYTHON
    if f.kind == FrameKind.USER and f.mapping is not None and not f.mapping.path.startswith("/"):
        return svg.JIT
    return str(f.kind)


def strip_hex(stacks: Counter[str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for k, v in stacks.items():
        out[_HEX.sub("0x?", k)] += v
    return out


def as_time(s: Stacks, frequency: int | None, what: str) -> Stacks:
    """Counts -> nanoseconds (samples x period), for hot/cold."""
    if s.unit == "ns":
        return s
    if not frequency:
        raise UsageError(f"{what} is in {s.unit}: give --frequency to turn samples into time")
    period = 1e9 / frequency
    return Stacks(Counter({k: int(v * period) for k, v in s.stacks.items()}), "ns", s.kinds,
                  s.offcpu)
