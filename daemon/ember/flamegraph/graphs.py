"""``ember flamegraph`` and ``ember diff``: inputs -> trees -> SVG/HTML.

An input is a folded-stacks file, a pprof file (gzip or not), ``-`` for
standard input, or a collector query URL (http[s]://.../api/v1/profile?...,
fetched as pprof). pprof inputs carry their unit: a time profile (cpu or
off_cpu nanoseconds) is shown in ms/s; folded inputs are counts, or time
when ``--countname`` is a time unit (ns, us, ms, s).
"""

from __future__ import annotations

import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import abi
from ..encode.folded import fold, parse_folded
from ..encode.pprof import decode_pprof, from_proto
from ..errors import UsageError
from ..model import Frame, FrameKind, Profile, ProfileType, Sample, merge_samples
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


def _read(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    if source.startswith(("http://", "https://")):
        url = urllib.parse.urlparse(source)
        q = urllib.parse.parse_qs(url.query)
        q["format"] = ["pprof"]
        full = url._replace(query=urllib.parse.urlencode(q, doseq=True)).geturl()
        try:
            with urllib.request.urlopen(full, timeout=60) as r:
                return bytes(r.read())
        except (urllib.error.URLError, OSError) as exc:
            raise UsageError(f"cannot fetch {source}: {getattr(exc, 'reason', exc)}") from None
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {source}: {exc.strerror}") from None


def load(source: str, countname: str = "samples") -> Stacks:
    data = _read(source)
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
    """The frame's kind, with code in anonymous executable memory (JIT
    compilers, perf-map names) told apart from user code in files."""
    if f.kind == FrameKind.USER and f.mapping is not None and not f.mapping.path.startswith("/"):
        return svg.JIT
    return str(f.kind)


def top_functions(s: Stacks, limit: int = 100) -> list[dict[str, object]]:
    """Self and total value per function name (total counts a name once per
    stack, however often it recurs)."""
    self_: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for stack, v in s.stacks.items():
        names = [n for n in stack.split(";")[1:] if n != "-"]  # without the thread name
        if not names:
            continue
        self_[names[-1]] += v
        for n in set(names):
            total[n] += v
    rows = sorted(total, key=lambda n: (-self_[n], -total[n], n))[:limit]
    return [{"name": n, "self": self_[n], "total": total[n]} for n in rows]


def as_time(s: Stacks, frequency: int | None, what: str) -> Stacks:
    """Counts -> nanoseconds (samples x period), for hot/cold."""
    if s.unit == "ns":
        return s
    if not frequency:
        raise UsageError(f"{what} is in {s.unit}: give --frequency to turn samples into time")
    period = 1e9 / frequency
    return Stacks(Counter({k: int(v * period) for k, v in s.stacks.items()}), "ns", s.kinds,
                  s.offcpu)


def _time_display(total_ns: float) -> tuple[str, float]:
    return ("s", 1e-9) if total_ns >= 10e9 else ("ms", 1e-6)


def options(s: Stacks, title: str | None, countname: str, palette: str, inverted: bool,
            width: int, mode: str = "plain") -> svg.Options:
    unit, scale = _time_display(s.total) if s.unit == "ns" else ("", 1.0)
    if palette == "auto":
        palette = "io" if s.offcpu else "hot"
    default_title = {"plain": "Off-CPU Time Flame Graph" if s.offcpu else "Flame Graph",
                     "diff": "Differential Flame Graph", "hotcold": "Hot/Cold Flame Graph"}[mode]
    return svg.Options(title=title or default_title,
                       countname=countname if s.unit != "ns" else "ns",
                       unit=unit, unit_scale=scale, palette=palette, mode=mode,
                       inverted=inverted, width=width)


def graph(s: Stacks, title: str | None = None, countname: str = "samples",
          palette: str = "auto", inverted: bool = False, width: int = 1200) -> str:
    tree = svg.build_tree(s.stacks, kinds=s.kinds)
    return svg.render(tree, options(s, title, countname, palette, inverted, width))


def hotcold_graph(on: Stacks, off: Stacks, title: str | None = None,
                  countname: str = "samples", palette: str = "auto", inverted: bool = False,
                  width: int = 1200) -> str:
    both = Counter(on.stacks)
    both.update(off.stacks)
    tree = svg.build_tree(both, other=off.stacks, kinds={**off.kinds, **on.kinds})
    return svg.render(tree, options(Stacks(both, "ns", {}), title, countname, palette,
                                    inverted, width, mode="hotcold"))


def flamegraph(source: str, title: str | None = None, countname: str = "samples",
               palette: str = "auto", inverted: bool = False, width: int = 1200,
               cold: str | None = None, frequency: int | None = None) -> str:
    hot = load(source, countname)
    if cold is None:
        return graph(hot, title, countname, palette, inverted, width)
    on = as_time(hot, frequency, source)
    off = as_time(load(cold, "us"), frequency, cold)
    return hotcold_graph(on, off, title, countname, palette, inverted, width)


def strip_hex(stacks: Counter[str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for k, v in stacks.items():
        out[_HEX.sub("0x?", k)] += v
    return out


def diff(before_src: str, after_src: str, normalize: bool = False, strip: bool = False,
         negate: bool = False, title: str | None = None, countname: str = "samples",
         width: int = 1200) -> tuple[str, str]:
    """(SVG, two-column folded diff "stack before after")."""
    return diff_graph(load(before_src, countname), load(after_src, countname), normalize,
                      strip, negate, title, countname, width)


def diff_graph(before: Stacks, after: Stacks, normalize: bool = False, strip: bool = False,
               negate: bool = False, title: str | None = None, countname: str = "samples",
               width: int = 1200) -> tuple[str, str]:
    if before.unit != after.unit:
        raise UsageError(f"cannot compare {before.unit} with {after.unit}")
    b, a = before.stacks, after.stacks
    if strip:
        b, a = strip_hex(b), strip_hex(a)
    total_before = float(sum(b.values()))
    if normalize and total_before:
        factor = sum(a.values()) / total_before
        b = Counter({k: round(v * factor) for k, v in b.items()})
    two_column = "".join(f"{k} {b.get(k, 0)} {a.get(k, 0)}\n" for k in sorted(set(a) | set(b)))
    kinds = {**before.kinds, **after.kinds}
    if negate:  # shapes from BEFORE: what vanished shows, in blue
        tree = svg.build_tree(b, other=a, kinds=kinds)
    else:
        tree = svg.build_tree(a, other=b, kinds=kinds)
    shown = Stacks(b if negate else a, after.unit, kinds)
    o = options(shown, title, countname, "hot", False, width, mode="diff")
    if negate:
        o = svg.Options(**{**o.__dict__, "negate": True})
    return svg.render(tree, o), two_column
