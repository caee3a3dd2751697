"""The collector's graphs of hostile names, as the web UI asks for them.

Names in a pprof are protobuf strings, so valid UTF-8 (the collector makes
bytes that are not U+FFFD on write), but they may hold markup, control
characters (a thread renamed with PR_SET_NAME holds any byte but NUL) and
noncharacters like U+FFFE. The flame graph, hot/cold and differential SVGs
must parse as XML with every such name read back (U+FFFD for what XML
cannot hold), and the JSON routes (tree with a search, top) must give the
names back exactly."""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import replace

import pytest

from ember.agent.labels import ProcessLabels, series_labels
from ember.collector.api import Api
from ember.collector.store import Store, StoredProfile
from ember.collector.validate import DEFAULT_LIMITS, INT64_MAX, check_request
from ember.encode.writeraw import make_series
from ember.model import Frame, FrameKind, Mapping, Profile, Sample
from ember.proto import profilestore_pb2 as ps
from tests.support.profiles import cpu_profile, offcpu_profile
from tests.support.svg import NS

NOW = time.time_ns()
EXE = Mapping(0x400000, 0x500000, 0, "/usr/bin/app", "feedface")
#: The characters XML 1.0 excludes (written out here, not taken from svg.py).
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
THREAD = "w<\x01>&\x1b[0m\"'"
NAMES = ["std::map<int, std::pair<char&&, T*>>::operator[](int const&)", "a&amp &#1 b", "\"q\" 'q'",
         "ctl\x01\x02\x1f\x7f", "tab\there", "non\ufffe\uffffchar", "]]><!--x-->", "caf\ufffd",
         "<script>alert(1)</script>", "\u2028line\u0085sep"]


def shown(name: str) -> str:
    return NOT_XML.sub("\ufffd", name)


def hostile(value: int) -> Profile:
    """One stack per name under a hostile thread name, ``value`` samples
    each."""
    main = Frame("main", FrameKind.USER, EXE, 0x400100)
    samples = tuple(Sample((main, Frame(n, FrameKind.USER, EXE, 0x400200 + 16 * i)),
                           (value, value * 10**7), 10, 11, THREAD)
                    for i, n in enumerate(NAMES))
    return replace(cpu_profile(), samples=samples)


def stored(prof: Profile, at: int) -> list[StoredProfile]:
    """What the collector stores of a profile an agent sent, ``at`` seconds
    ago, from a process whose comm is hostile too."""
    labels = series_labels(prof.type, ProcessLabels(pid=10, comm=THREAD), {"host": "h<&>"})
    sent = replace(prof, start_ns=NOW - (at + 1) * 10**9, duration_ns=10**9, labels=labels)
    return check_request(ps.WriteRawRequest(series=[make_series(sent)[0]]), DEFAULT_LIMITS, NOW)


@pytest.fixture
def api() -> Iterator[Api]:
    a = Api(Store(":memory:"))
    a.store.write(stored(hostile(3), at=100))  # the diff's "before"
    a.store.write(stored(hostile(5), at=10))   # ... and "after"
    a.store.write(stored(offcpu_profile(), at=10))
    yield a
    a.store.close()


def get(api: Api, path: str, **params: str) -> bytes:
    q = {"from": ["0"], "to": [str(INT64_MAX)], **{k: [v] for k, v in params.items()}}
    code, body, _ = api.handle(path, q)
    assert code == 200, body
    return body


def svg_frames(body: bytes) -> dict[str, tuple[float, str]]:
    """data-n -> (data-v, hover title) of a graph that must parse as XML."""
    root = ET.fromstring(body)
    out = {}
    for g in root.iterfind(".//s:g[@class='f']", NS):
        title = g.find("s:title", NS)
        assert title is not None and title.text is not None
        out[g.get("data-n", "")] = (float(g.get("data-v", "0")), title.text)
    return out


def check_names(frames: dict[str, tuple[float, str]]) -> None:
    """Every hostile name drawn as itself (U+FFFD for what XML cannot
    hold), its hover text starting with it."""
    for name in [THREAD, *NAMES]:
        assert shown(name) in frames, name
        assert frames[shown(name)][1].startswith(shown(name) + " (")


TITLE = "t<\x01>&\"'\ufffe"


def test_flamegraph_svg(api: Api) -> None:
    body = get(api, "/api/v1/flamegraph", type="cpu", title=TITLE, width="1200")
    frames = svg_frames(body)
    check_names(frames)
    assert frames["all"][0] == (3 + 5) * 10**7 * len(NAMES)  # cpu time, in ns
    title = ET.fromstring(body).find("s:text[@id='title']", NS)
    assert title is not None and title.text == shown(TITLE)


def test_hotcold_svg(api: Api) -> None:
    check_names(svg_frames(get(api, "/api/v1/flamegraph", type="hotcold", title=TITLE)))


def test_diff_svg(api: Api) -> None:
    """What the UI's "compare" asks for: before and after as two ranges."""
    old, new = str(NOW - 100 * 10**9), str(NOW - 50 * 10**9)
    body = get(api, "/api/v1/diff", type="cpu", title=TITLE, a_from="0", a_to=old,
               b_from=new, b_to=str(NOW))
    frames = svg_frames(body)
    check_names(frames)
    assert frames["all"][0] == 5 * 10**7 * len(NAMES)
    assert all("+" in frames[shown(n)][1] for n in NAMES)  # each grew from 3 to 5


def test_tree_search_and_top_give_names_back_exactly(api: Api) -> None:
    """JSON holds any of these names: the tree under a hostile focus, a
    search for a hostile name and its share, the top table."""
    for name in NAMES:
        body = json.loads(get(api, "/api/v1/tree", type="cpu", focus=f"{THREAD};main",
                              search=re.escape(name)))
        assert body["matched"]["search"] == re.escape(name)
        assert body["matched"]["share"] == pytest.approx(1 / len(NAMES))
        assert body["focus"] == [THREAD, "main"]
        assert name in {c["name"] for c in body["tree"]["children"]}
    rows = json.loads(get(api, "/api/v1/top", type="cpu", limit="50"))["rows"]
    assert set(NAMES) <= {r["name"] for r in rows}
