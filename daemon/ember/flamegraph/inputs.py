"""What flame graphs are drawn from: folded stacks with their unit.

A source is a folded-stacks file, a pprof file (gzip or not), ``-`` for
standard input, or a collector query URL (http[s]://.../api/v1/profile?...,
fetched as pprof, with the collector's bearer token and CA when the caller
has them). pprof inputs carry their unit: a time profile (cpu or
off_cpu nanoseconds) is shown in ms/s; folded inputs are counts, or time
when ``--countname`` is a time unit (ns, us, ms, s). Kept apart from the
drawing (graphs.py) because the collector makes the same ``Stacks`` from
profiles it has merged, without reading any source.
"""

from __future__ import annotations

import re
import sys
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import abi
from ..encode.folded import fold, parse_folded
from ..encode.pprof import decode_pprof, from_proto
from ..errors import EmberError, UsageError
from ..httpserve import fetch
from ..model import Frame, FrameKind, Profile, ProfileType, Sample, merge_samples
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


def _read(source: str, token: str = "", cafile: str | None = None) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    if source.startswith(("http://", "https://")):
        url = urllib.parse.urlparse(source)
        q = urllib.parse.parse_qs(url.query)
        q["format"] = ["pprof"]
        full = url._replace(query=urllib.parse.urlencode(q, doseq=True)).geturl()
        try:
            return fetch(full, token=token, cafile=cafile)
        except EmberError as exc:
            raise UsageError(f"cannot fetch {source}: {exc}") from None
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {source}: {exc.strerror}") from None


def load(source: str, countname: str = "samples", *, token: str = "",
         cafile: str | None = None) -> Stacks:
    """Stacks from a source; token and cafile only matter for a collector URL
    (see ``httpserve.fetch``)."""
    data = _read(source, token, cafile)
    text: str | None = None
    if data[:2] != b"\x1f\x8b":
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
    if text is not None:
        try:
            stacks = parse_folded(text)
        except ValueError as exc:
            if text.strip() and "\0" not in text:
                raise UsageError(f"{source}: not folded stacks: {exc}") from None
        else:
            unit = "ns" if countname in TIME_UNITS else countname
            if countname in TIME_UNITS and countname != "ns":
                stacks = Counter({k: int(v * TIME_UNITS[countname]) for k, v in stacks.items()})
            # ember's off-CPU stacks end in a thread-state frame ([sleeping], ...)
            offcpu = any(k.rpartition(";")[2] in _STATE_FRAMES for k in stacks)
            return Stacks(stacks, unit, {}, offcpu=offcpu)
    try:
        ptype, samples = from_proto(decode_pprof(data))
    except Exception as exc:
        raise UsageError(f"{source}: neither folded stacks nor a pprof profile ({exc})") from None
    return stacks_of(ptype, samples)


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
