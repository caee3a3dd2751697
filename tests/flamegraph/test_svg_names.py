"""Names of any bytes through the SVG writer, read back by an XML parser.

A thread or symbol name is whatever bytes the program holds: markup
(``<>&"'``), control characters, bytes that are not UTF-8 (as U+FFFD,
lone surrogates or C1 controls, depending on how they were decoded),
U+FFFE. Whatever they hold, the graph must parse as XML and each frame's
name, hover title and label must read back as the name, but for the
characters XML cannot hold at all, which read back as U+FFFD (the rule of
``svg.escape``). The expected text is computed here, not by svg.py.

derandomize=True: the same inputs on every run, so CI stays reproducible."""

from __future__ import annotations

import html
import io
import re
import xml.etree.ElementTree as ET
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from ember.flamegraph.graphs import diff_graph, graph, hotcold_graph
from ember.flamegraph.inputs import Stacks, load_stream
from ember.flamegraph.svg import escape, to_html
from tests.support.svg import NS

#: The characters XML 1.0 excludes even as references (written out here).
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
NARROW = re.compile(r"^\[(\d+) narrow frames\]$")

#: Bytes a name may hold, the hostile ones often.
RAW = st.one_of(
    st.binary(max_size=12),
    st.lists(st.sampled_from([b"<", b">", b"&", b'"', b"'", b"]]>", b"\x00", b"\x01", b"\x1b[31m",
                              b"\x7f", b"\xc2\x85", b"\xff", b"\xc3", b"\xed\xa0\x80",
                              b"\xef\xbf\xbe", b"\xef\xbf\xbf", b"caf\xe9", b"a\tb", b"\r",
                              b"\n", b"std::map<K, V>::operator[]", b"x"]),
             min_size=1, max_size=5).map(b"".join))
#: How bytes become a str: the folded reader's U+FFFD, the surrogates
#: ``surrogateescape`` makes (argv, file names), Latin-1's C1 controls,
#: and lone surrogates kept as such.
DECODINGS = ("replace", "surrogateescape", "latin-1", "surrogatepass")
#: Any code point too: controls, lone surrogates, U+FFFE, astral planes.
ANY_CHAR = st.characters(codec=None, exclude_categories=())


def _decode(raw: bytes, how: str) -> str:
    if how == "latin-1":
        return raw.decode("latin-1")
    try:
        return raw.decode("utf-8", how)
    except UnicodeDecodeError:  # surrogatepass only lets surrogates through
        return raw.decode("utf-8", "surrogateescape")


TEXT = st.one_of(st.builds(_decode, RAW, st.sampled_from(DECODINGS)),
                 st.text(ANY_CHAR, max_size=12))
#: A graph title (an empty one means the default title).
TITLE = TEXT.filter(bool)
#: A frame name: the folded separator, ember's kernel delimiter and the
#: names of the frames the tests put under them left out.
NAME = TEXT.map(lambda s: s.replace(";", ":")).filter(lambda s: s not in ("-", "all", "t",
                                                                          "thread"))


def shown(text: str) -> str:
    """What a parser must read back of a name: itself, but U+FFFD for each
    character XML cannot hold."""
    return NOT_XML.sub("\ufffd", text)


def parse(svg_text: str) -> ET.Element:
    """The SVG as XML; it must encode as UTF-8 (no surrogate left)."""
    return ET.fromstring(svg_text.encode("utf-8"))


def drawn(root: ET.Element) -> list[tuple[str, float, str, str]]:
    """(data-n, data-v, hover title, label) of every frame."""
    out = []
    for g in root.iterfind(".//s:g[@class='f']", NS):
        title = g.find("s:title", NS)
        label = g.find("s:text", NS)
        assert title is not None
        out.append((g.get("data-n", ""), float(g.get("data-v", "0")), title.text or "",
                    (label.text or "") if label is not None else ""))
    return out


def graph_title(root: ET.Element) -> str:
    title = root.find("s:text[@id='title']", NS)
    assert title is not None
    return title.text or ""


def check_frame(name: str, title: str, label: str, want: str) -> None:
    """A frame reads back as ``want``: its name, its hover text starts with
    it (then the values), its label is it or a prefix of it with "..".
    Markup shows as the characters it is, never as markup."""
    assert name == want
    assert title.startswith(f"{want} (")
    if label and label != want:
        assert label.endswith("..") and want.startswith(label[:-2]), (label, want)


@settings(max_examples=600, deadline=None, derandomize=True)
@given(st.lists(NAME, min_size=1, max_size=8, unique=True), TITLE)
def test_every_name_and_title_reads_back(names: list[str], title: str) -> None:
    """Equal weights: every frame wide enough to draw, none merged."""
    stacks = Counter({f"thread;{n}": 1000 for n in names})
    root = parse(graph(Stacks(stacks, "samples", {}), title, width=1200))
    assert graph_title(root) == shown(title)
    frames = drawn(root)
    assert frames[0][:2] == ("all", 1000 * len(names))
    leaves = [f for f in frames if f[0] not in ("all", "thread")]
    # one frame per name, even for names that read back the same
    assert Counter(f[0] for f in leaves) == Counter(shown(n) for n in names)
    for name, value, hover, label in leaves:
        check_frame(name, hover, label, name)
        assert value == 1000
    for n in names:
        if not NOT_XML.search(n):
            assert any(f[0] == n for f in leaves)  # exactly itself


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(NAME, min_size=1, max_size=6, unique=True),
       st.lists(NAME, min_size=1, max_size=6, unique=True), TITLE)
def test_diff_and_hotcold_read_back(after: list[str], before: list[str], title: str) -> None:
    a = Stacks(Counter({f"t;{n}": 100 for n in after}), "samples", {})
    b = Stacks(Counter({f"t;{n}": 70 for n in before}), "samples", {})
    for svg_text in (diff_graph(b, a, title=title)[0],
                     diff_graph(b, a, negate=True, title=title)[0],
                     hotcold_graph(Stacks(a.stacks, "ns", {}), Stacks(b.stacks, "ns", {}),
                                   title)):
        root = parse(svg_text)
        assert graph_title(root) == shown(title)
        leaves = [f for f in drawn(root) if f[0] not in ("all", "t")]
        assert {f[0] for f in leaves} <= {shown(n) for n in after + before}
        for name, _, hover, label in leaves:
            check_frame(name, hover, label, name)


def test_narrow_template_names_merge_into_a_readable_group() -> None:
    """C++ templates too narrow to draw, with markup, controls and a byte
    that is not UTF-8, merge into one frame whose hover lists them."""
    names = sorted(f"std::map<K{i}, V>::operator[](K{i} const&) [\x01 = \"caf\udce9\" & '']"
                   for i in range(20))
    stacks = Counter({f"app;{n}": 1 for n in names})
    stacks["app;big<&>"] = 100_000
    root = parse(graph(Stacks(stacks, "samples", {}), width=1200))
    frames = drawn(root)
    group = [f for f in frames if NARROW.match(f[0])]
    assert len(group) == 1 and group[0][1] == 20 and NARROW.match(group[0][0])
    assert ", ".join(shown(n) for n in names[:8]) + ", ..." in group[0][2]
    assert "std::map<K0, V>::operator[](K0 const&) [\ufffd = \"caf\ufffd\" & '']" in group[0][2]
    assert sum(f[1] for f in frames if f[0] not in ("all", "app")) == 100_020


LINE_NAME = RAW.map(lambda b: b.replace(b";", b":").replace(b"\n", b" ").replace(b"\r", b" "))


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.lists(LINE_NAME, min_size=1, max_size=4),
                          st.integers(1, 10**6)), min_size=1, max_size=6))
def test_folded_bytes_keep_their_samples_and_read_back(
        lines: list[tuple[list[bytes], int]]) -> None:
    """Folded text of any bytes (a thread name first, so no line starts with
    whitespace the reader strips): every count is kept, and each name
    reads back as its bytes decoded with U+FFFD for what is not UTF-8."""
    data = b"".join(b";".join([b"t", *names]) + b" %d\n" % n for names, n in lines)
    s = load_stream(io.BytesIO(data), "names.folded")
    assert s.total == sum(n for _, n in lines)
    want = {shown(name.decode("utf-8", "replace")) for names, _ in lines for name in names}
    root = parse(graph(s, width=1200))
    for name, _, hover, label in drawn(root):
        if name in ("all", "t") or NARROW.match(name):
            continue
        assert name in want
        check_frame(name, hover, label, name)


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(TEXT)
def test_escape_is_markup_and_one_stand_in(text: str) -> None:
    """Names XML can hold come out byte-identical to html.escape (the
    pinned graphs stay as they were); each character it cannot hold is
    one U+FFFD (labels keep their length); tab, newline and CR survive."""
    assert html.unescape(escape(text)) == shown(text)
    if not NOT_XML.search(text) and not re.search("[\t\n\r]", text):
        assert escape(text) == html.escape(text, quote=True)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(NAME, min_size=1, max_size=4, unique=True), TITLE)
def test_html_page_holds_the_same_svg(names: list[str], title: str) -> None:
    """The HTML page: its <title> escaped by the same rule, and the SVG in
    its body still XML."""
    svg_text = graph(Stacks(Counter({f"t;{n}": 5 for n in names}), "samples", {}), title)
    page = to_html(svg_text, title)
    page.encode("utf-8")
    head = re.search(r"<title>(.*?)</title>", page, re.S)
    assert head is not None and html.unescape(head[1]) == shown(title)
    body = re.search(r"<body[^>]*>(.*)</body>", page, re.S)
    assert body is not None
    assert graph_title(parse(body[1])) == shown(title)
