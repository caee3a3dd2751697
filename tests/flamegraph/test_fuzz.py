"""Property-based tests of what ``ember flamegraph`` reads and draws from
untrusted input: any bytes as a folded file give stacks or a UsageError
that names the file (never another exception, never a hang),
and any frame names give an SVG that XML parsers read.

derandomize=True: the same inputs on every run, so CI stays reproducible;
the folded parser sees well over 10,000 inputs."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from ember.errors import UsageError
from ember.flamegraph.graphs import diff_graph, graph, hotcold_graph
from ember.flamegraph.inputs import Stacks, load_stream
from ember.model import MAX_STACK_DEPTH
from tests.support.bounds import no_hang
from tests.support.svg import NS

#: Any code point: controls, markup, lone surrogates, U+FFFE, astral planes.
ANY_CHAR = st.characters(codec=None, exclude_categories=())
NAME = st.one_of(st.text(ANY_CHAR, max_size=12),
                 st.sampled_from(["<", ">", "&", '"', "'", "]]>", "\x00", "\x1b[31m", "-",
                                  "[truncated]", "\ud800", "\uffff", "a\tb", "\r"]))


def _line(names: list[str], count: str, space: str) -> bytes:
    """A folded line, maybe broken: names as UTF-8 (lone surrogates become
    bytes that are not UTF-8)."""
    return f"{';'.join(names)}{space}{count}\n".encode("utf-8", "surrogatepass")


FOLDED_LINE = st.builds(_line, st.lists(NAME, max_size=6),
                        st.one_of(st.integers(0, 10**6).map(str), st.text(ANY_CHAR, max_size=4),
                                  st.sampled_from(["1" * 30, "²", "-1", "1.5", ""])),
                        st.sampled_from([" ", "  ", "\t", ""]))
#: Bytes as a folded file: pure noise, mostly-folded lines, gzip and pprof
#: magic at the start.
FOLDED_BYTES = st.one_of(
    st.binary(max_size=400),
    st.lists(FOLDED_LINE, max_size=8).map(b"".join),
    st.tuples(st.sampled_from([b"\x1f\x8b", b"\x0a\x04\x08\x01", b"\xef\xbb\xbf", b"\n\n"]),
              st.binary(max_size=200)).map(b"".join),
)


def _load(data: bytes) -> Stacks | UsageError:
    with no_hang(data[:200]):
        try:
            result: Stacks | UsageError = load_stream(io.BytesIO(data), "fuzz.folded",
                                                      max_size=1 << 20)
        except UsageError as exc:
            result = exc
    return result


@settings(max_examples=10_000, deadline=None, derandomize=True)
@given(FOLDED_BYTES)
def test_any_bytes_give_stacks_or_a_clear_error(data: bytes) -> None:
    result = _load(data)
    if isinstance(result, UsageError):
        message = str(result)
        assert message.startswith("fuzz.folded") and "\n" not in message.strip()
        return
    for stack, value in result.stacks.items():
        assert isinstance(value, int) and value >= 0
        assert len(stack.split(";")) <= MAX_STACK_DEPTH


@settings(max_examples=1_000, deadline=None, derandomize=True)
@given(st.lists(FOLDED_LINE, min_size=1, max_size=8).map(b"".join))
def test_folded_files_that_load_draw_as_xml(data: bytes) -> None:
    result = _load(data)
    if isinstance(result, Stacks):
        ET.fromstring(graph(result).encode())


STACKS = st.dictionaries(st.lists(NAME, min_size=1, max_size=5).map(";".join),
                         st.sampled_from([1, 2, 7, 1000, 10**6]), min_size=1, max_size=12)


@settings(max_examples=1_000, deadline=None, derandomize=True)
@given(STACKS, STACKS, st.text(ANY_CHAR, max_size=10))
def test_any_names_give_an_svg_xml_parses(after: dict[str, int], before: dict[str, int],
                                          title: str) -> None:
    """Values from 1 to a million: narrow siblings merge, and their names
    go into the merged frame's title too."""
    a = Stacks(Counter(after), "samples", {})
    b = Stacks(Counter(before), "samples", {})
    given_names = {NOT_XML.sub("\ufffd", n) for stacks in (after, before)
                   for stack in stacks for n in stack.split(";")}
    drawn: list[set[str | None]] = []
    for svg_text in (graph(a, title), diff_graph(b, a, title=title)[0],
                     hotcold_graph(Stacks(a.stacks, "ns", {}), Stacks(b.stacks, "ns", {}))):
        with no_hang(svg_text[:200]):
            root = ET.fromstring(svg_text.encode())
        drawn.append({g.get("data-n") for g in root.iterfind(".//s:g[@class='f']", NS)})
        # each name reads back as given, but for what XML cannot hold at all
        assert all(d in given_names or d == "all" or NARROW.match(d or "") for d in drawn[-1])
    # at least 1/12 of the total, the widest stack is wide enough to draw in full
    widest = max(after, key=after.__getitem__)
    assert {NOT_XML.sub("\ufffd", n) for n in widest.split(";") if n != "-"} <= drawn[0]


#: The characters XML 1.0 excludes (written out here, not taken from svg.py).
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
NARROW = re.compile(r"^\[\d+ narrow frames\]$")
