"""Flame graphs as self-contained interactive SVG (no Perl, no network).

The stacks become a tree; each frame is a <g class="f"> with its value and
offset in ``data-v``/``data-o`` (in count units), a <title> for hover, a rect
and a label truncated to fit. The embedded script (``flamegraph.js``, shipped
as package data) handles hover details, click to zoom, "Reset zoom", and
regex search (button or Ctrl-F) with the matched share. Siblings too
narrow to draw are merged into one frame ("[N narrow frames]") so their
weight is never lost.

Colours are deterministic per function name (a hash picks the shade), so
two graphs can be compared by eye. Palettes: "hot" (on-CPU), "io" (off-CPU,
blue), and per-kind hints (kernel frames orange-brown, ember's markers
grey, JIT code green, Python frames teal). Differential graphs colour each
frame by its change: red grew, blue shrank, intensity by the size of the
change. Hot/cold graphs colour by the share of a frame's time spent off-CPU.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import html
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

from ..model import MAX_STACK_DEPTH, TRUNCATED, FrameKind, cap_depth

FRAME_H = 16
FONT = 12
CHAR_W = 0.59 * FONT  # average glyph width used for truncation
PAD_TOP = 56
PAD_BOTTOM = 34
PAD_X = 10
NARROW = "[{n} narrow frames]"
JIT = "jit"  # frame kind hint: code in anonymous executable memory
PYTHON = "python"  # frame kind hint: a Python function (runtimes/pycode.py)


class Node:
    """One frame of the tree (a plain slotted class: big profiles make
    millions of these)."""

    __slots__ = ("children", "kind", "name", "other", "value")

    def __init__(self, name: str, value: float = 0.0, other: float = 0.0, kind: str = ""):
        self.name = name
        self.value = value      # this profile's value (diff: AFTER; hot/cold: on + off)
        self.other = other      # diff: the baseline's value; hot/cold: the off-CPU part
        self.kind = kind
        self.children: dict[str, Node] = {}


def build_tree(stacks: Mapping[str, float], other: Mapping[str, float] | None = None,
               kinds: Mapping[str, str] | None = None) -> Node:
    """Folded stacks -> tree. ``other`` adds a second value per frame (the
    baseline of a diff, or the off-CPU share of hot/cold). Stacks deeper
    than ``MAX_STACK_DEPTH`` keep their leafmost frames under a root
    ``[truncated]`` frame, whoever made them."""
    with _no_gc():
        return _build_tree(stacks, other, kinds)


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Big trees are millions of small containers without cycles: the cyclic
    collector would walk them again and again for nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _build_tree(stacks: Mapping[str, float], other: Mapping[str, float] | None,
                kinds: Mapping[str, str] | None) -> Node:
    root = Node("all")
    kinds = kinds or {}

    def kind_of(name: str, after_delim: bool) -> str:
        kind = kinds.get(name, "")
        if not kind:
            if name.startswith("[") and name.endswith("]"):
                kind = FrameKind.SYNTHETIC
            elif after_delim:
                kind = FrameKind.KERNEL
        return kind

    for source, is_other in ((stacks, False), (other or {}, True)):
        for stack, v in source.items():
            if v <= 0:
                continue
            node = root
            after_delim = False
            if is_other:
                node.other += v
            else:
                node.value += v
            names: Sequence[str] = stack.split(";")
            if len(names) > MAX_STACK_DEPTH:
                names = cap_depth(names, TRUNCATED)
            for name in names:
                if name == "-":
                    after_delim = True
                    continue
                children = node.children
                child = children.get(name)
                if child is None:
                    child = children[name] = Node(name, 0.0, 0.0, kind_of(name, after_delim))
                node = child
                if is_other:
                    node.other += v
                else:
                    node.value += v
    return root


# --- colours ------------------------------------------------------------------

def _hash(name: str) -> float:
    """A stable number in [0, 1) per name (not Python's salted hash())."""
    data = name.encode("utf-8", "surrogatepass")  # any str: names are untrusted
    return int.from_bytes(hashlib.blake2s(data, digest_size=4).digest(), "big") / 2**32


def colour(name: str, kind: str, palette: str) -> str:
    h = _hash(name)
    if kind == FrameKind.SYNTHETIC:
        g = int(170 + 40 * h)
        return f"rgb({g},{g},{g})"
    if palette == "io":
        return f"rgb({int(80 + 60 * h)},{int(120 + 60 * h)},{int(200 + 55 * h)})"
    if kind == FrameKind.KERNEL:
        return f"rgb({int(200 + 30 * h)},{int(130 + 40 * h)},{int(60 + 30 * h)})"
    if kind == JIT:
        return f"rgb({int(60 + 50 * h)},{int(180 + 50 * h)},{int(60 + 50 * h)})"
    if kind == PYTHON:
        return f"rgb({int(40 + 50 * h)},{int(165 + 45 * h)},{int(175 + 50 * h)})"
    return f"rgb({int(205 + 50 * h)},{int(230 * h)},{int(55 * h)})"  # hot


def diff_colour(delta: float, max_abs: float) -> str:
    """Red for growth, blue for shrinkage, white-ish for no change; the
    intensity is |delta| relative to the largest change in the graph."""
    if max_abs <= 0 or delta == 0:
        return "rgb(250,250,250)"
    r = min(1.0, abs(delta) / max_abs)
    c = round(210 * (1 - r))
    return f"rgb(255,{c},{c})" if delta > 0 else f"rgb({c},{c},255)"


def hotcold_colour(name: str, cold_share: float) -> str:
    return colour(name, "", "io" if cold_share >= 0.5 else "hot")


# --- rendering ----------------------------------------------------------------

@dataclass(frozen=True)
class Options:
    title: str = "Flame Graph"
    countname: str = "samples"
    unit_scale: float = 1.0       # multiply values by this for display...
    unit: str = ""                # ...in this unit ("ms", "s"); "" means countname
    palette: str = "hot"          # hot, io
    mode: str = "plain"           # plain, diff, hotcold
    inverted: bool = False        # icicle: root at the top
    negate: bool = False          # diff drawn with BEFORE's shapes (value=before, other=after)
    width: int = 1200
    min_width: float = 0.25       # pixels; narrower siblings are merged


def _fmt(v: float, o: Options) -> str:
    if o.unit:
        x = v * o.unit_scale
        return f"{x:,.3f} {o.unit}" if x < 10 else f"{x:,.1f} {o.unit}"
    return f"{v:,.0f} {o.countname}"


def _label(name: str, width_px: float) -> str:
    fits = int((width_px - 6) / CHAR_W)
    if fits < 3:
        return ""
    return name if len(name) <= fits else name[: fits - 2] + ".."


def render(root: Node, o: Options) -> str:
    with _no_gc():
        return _render(root, o)


def _render(root: Node, o: Options) -> str:
    total = root.value
    plot_w = o.width - 2 * PAD_X
    scale = plot_w / total if total > 0 else 0.0
    min_v = o.min_width / scale if scale else 0.0
    frames: list[str] = []
    max_depth = 0
    max_abs = 0.0
    todo = [(root, 0)]
    while todo:
        n, dep = todo.pop()
        max_depth = max(max_depth, dep)
        if o.mode == "diff":
            max_abs = max(max_abs, abs(n.value - n.other))
        todo.extend((c, dep + 1) for c in n.children.values() if c.value >= min_v)

    def y_of(depth: int) -> int:
        return PAD_TOP + (depth if o.inverted else max_depth - depth) * FRAME_H

    def emit(node: Node, offset: float, depth: int, title_extra: str) -> None:
        pct = 100.0 * node.value / total if total else 0.0
        if o.mode == "diff":
            # red always means "grew from before to after"
            delta = (node.other - node.value) if o.negate else (node.value - node.other)
            fill = diff_colour(delta, max_abs)
            before = node.value if o.negate else node.other
            change = f"{'+' if delta >= 0 else ''}{_fmt(delta, o)}"
            rel = f" ({100 * delta / before:+.1f}%)" if before else " (new)"
            info = f"{_fmt(node.value, o)}, {pct:.2f}%; change {change}{rel}"
        elif o.mode == "hotcold":
            cold = node.other / node.value if node.value else 0.0
            fill = hotcold_colour(node.name, cold)
            info = f"{_fmt(node.value, o)}, {pct:.2f}%; {100 * cold:.0f}% off-CPU"
        else:
            fill = colour(node.name, node.kind, o.palette)
            info = f"{_fmt(node.value, o)}, {pct:.2f}%"
        x = PAD_X + offset * scale
        w = node.value * scale
        y = y_of(depth)
        esc = escape(node.name)
        label = _label(node.name, w)
        text = (f'<text x="{x + 3:.1f}" y="{y + FRAME_H // 2}">{escape(label)}</text>'
                if label else "")
        frames.append(
            f'<g class="f" data-n="{esc}" data-v="{_exact(node.value)}" data-o="{_exact(offset)}" '
            f'data-d="{depth}"><title>{esc} ({escape(info + title_extra)})</title>'
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{FRAME_H - 1}" '
            f'fill="{fill}"/>{text}</g>')

    def above(node: Node, offset: float, depth: int) -> list[_Drawn]:
        """What is drawn on top of node, left to right: its children wide
        enough to see, each run of narrower ones merged into one frame."""
        out: list[_Drawn] = []
        child_off = offset
        narrow: list[Node] = []
        for name in sorted(node.children):
            c = node.children[name]
            if c.value <= 0:
                continue  # only in the other profile of a diff: no width here
            if c.value < min_v:
                narrow.append(c)
                continue
            if narrow:
                child_off = merge(narrow, child_off, depth, out)
                narrow = []
            out.append((c, child_off, depth, ""))
            child_off += c.value
        if narrow:
            merge(narrow, child_off, depth, out)
        return out

    def merge(narrow: list[Node], offset: float, depth: int, out: list[_Drawn]) -> float:
        if len(narrow) == 1:
            out.append((narrow[0], offset, depth, ""))
            return offset + narrow[0].value
        merged = Node(NARROW.format(n=len(narrow)), sum(c.value for c in narrow),
                      sum(c.other for c in narrow), str(FrameKind.SYNTHETIC))
        names = ", ".join(c.name for c in narrow[:8]) + (", ..." if len(narrow) > 8 else "")
        out.append((merged, offset, depth, f"; {names}"))  # kept even if narrow: its weight counts
        return offset + merged.value

    # depth first, left to right, with a list for a stack: a recursion would
    # stop at Python's limit (about 1000 frames) on a deep stack
    drawing: list[_Drawn] = [(root, 0.0, 0, "")]
    while drawing:
        node, offset, depth, extra = drawing.pop()
        emit(node, offset, depth, extra)
        drawing.extend(reversed(above(node, offset, depth + 1)))
    height = PAD_TOP + (max_depth + 1) * FRAME_H + PAD_BOTTOM
    body = "\n".join(frames)
    return _SVG.format(
        width=o.width, height=height, title=escape(o.title),
        body=body, script=_script(), plot_w=plot_w, pad_x=PAD_X, frame_h=FRAME_H,
        pad_top=PAD_TOP, depth=max_depth, inverted="true" if o.inverted else "false",
        unit=escape(o.unit or o.countname), scale=o.unit_scale if o.unit else 1,
        total=_exact(total), details_y=height - 12, font=FONT, half=o.width // 2,
        search_x=o.width - 120)


#: A frame to draw: node, offset, depth, and what its title adds.
_Drawn = tuple[Node, float, int, str]

#: What XML 1.0 does not allow in a document, even escaped (C0 controls but
#: tab, newline and carriage return; lone surrogates; U+FFFE and U+FFFF),
#: and the whitespace a parser would turn into spaces or drop unless it is
#: written as a character reference.
_NOT_XML = re.compile("[\x00-\x1f\ud800-\udfff\ufffe\uffff]")
_KEPT = {"\t": "&#9;", "\n": "&#10;", "\r": "&#13;"}


def escape(text: str) -> str:
    """Text for an attribute or element of the SVG or of the HTML page
    around it: the one rule for every name, label, title, unit and hover
    text drawn, read back by a parser as it was. Names are untrusted (any
    byte a thread or symbol name holds): markup (``<>&"'``) becomes
    entities; tab, newline and CR character references (a parser would
    turn them into spaces); and a character XML 1.0 forbids even as a
    reference (``_NOT_XML``), which would make the whole graph unreadable,
    becomes U+FFFD, the stand-in the inputs already use for bytes that are
    not UTF-8, so a bad name shows one sign however it went bad. U+FFFD
    rather than a visible ``\\x01``: that text could be a name of its own,
    and one character for one keeps labels as long as their names. Other
    text comes out unchanged."""
    return _NOT_XML.sub(_replace, html.escape(text, quote=True))


def _replace(m: re.Match[str]) -> str:
    return _KEPT.get(m[0], "\ufffd")


def _exact(x: float) -> str:
    """A value or offset as the script must read it back: exactly. Six
    digits (``%g``) let a frame's offset plus its width pass its right
    neighbour's offset, and a zoom into the neighbour kept it in view."""
    x = float(x)
    return str(int(x)) if x.is_integer() else repr(x)


_SVG = """<?xml version="1.0" standalone="no"?>
<svg version="1.1" width="{width}" height="{height}" viewBox="0 0 {width} {height}" \
xmlns="http://www.w3.org/2000/svg" data-total="{total}" data-plot-w="{plot_w}" \
data-pad-x="{pad_x}" data-frame-h="{frame_h}" data-pad-top="{pad_top}" data-depth="{depth}" \
data-inverted="{inverted}" data-unit="{unit}" data-scale="{scale}">
<style>
text {{ font-family: Verdana, sans-serif; font-size: {font}px; fill: rgb(0,0,0); }}
#frames text {{ pointer-events: none; dominant-baseline: middle; }}
.f:hover rect {{ stroke: rgb(0,0,0); stroke-width: 0.5; cursor: pointer; }}
.hide {{ display: none; }}
.faded rect {{ opacity: 0.5; }}
#title {{ font-size: 17px; text-anchor: middle; }}
.button {{ cursor: pointer; fill: rgb(0,0,160); }}
.button.hidden {{ opacity: 0; }}
</style>
<rect x="0" y="0" width="{width}" height="{height}" fill="rgb(248,248,248)"/>
<text id="title" x="{half}" y="24">{title}</text>
<text id="reset" class="button hidden" x="10" y="24">Reset zoom</text>
<text id="search" class="button" x="{search_x}" y="24">Search</text>
<text id="matched" x="{search_x}" y="{details_y}"></text>
<text id="details" x="10" y="{details_y}"> </text>
<g id="frames">
{body}
</g>
<script type="text/ecmascript"><![CDATA[

{script}
]]></script>
</svg>
"""


@functools.cache
def _script() -> str:
    """The viewer's JavaScript, a real file in the package (package data) so
    it can be read, linted and diffed as JavaScript; read once, on first use."""
    return resources.files(__package__).joinpath("flamegraph.js").read_text(encoding="utf-8")


def to_html(svg: str, title: str) -> str:
    body = svg.split("?>", 1)[1] if svg.startswith("<?xml") else svg
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{escape(title)}"
            f"</title></head><body style=\"margin:0\">{body}</body></html>\n")


def merge_kinds(frames: Iterable[tuple[str, str]]) -> dict[str, str]:
    """name -> kind from (name, kind) pairs; the first kind seen wins."""
    out: dict[str, str] = {}
    for name, kind in frames:
        out.setdefault(name, kind)
    return out
