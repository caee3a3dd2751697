"""The HTTP query API through ``Collector.handle``, as the web UI calls it:
every route's status, content type and JSON shape, without sockets."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ember.collector.api import Api
from ember.collector.query import TYPE_ALIASES
from ember.collector.server import Collector
from ember.collector.store import Store
from ember.collector.validate import check_request
from ember.config import CollectorConfig
from ember.model import PROFILE_KINDS
from ember.proto import profilestore_pb2 as ps
from tests.support.collector import series
from tests.support.svg import frames

Query = dict[str, list[str]]


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    c = Collector(CollectorConfig(storage=str(tmp_path / "db.sqlite")))
    req = ps.WriteRawRequest(series=[series(10), series(11), series(10, "offcpu")])
    c.store.write(check_request(req, c.limits, time.time_ns()))
    yield c
    c.close()


def get(c: Collector, path: str, auth: str = "", **q: str | list[str]) -> tuple[int, bytes, str]:
    query: Query = {k: v if isinstance(v, list) else [v] for k, v in q.items()}
    return c.handle(path, query, auth)


def get_json(c: Collector, path: str, **q: str | list[str]) -> tuple[int, object]:
    code, body, ctype = get(c, path, "", **q)
    assert ctype == "application/json"
    return code, json.loads(body)


def test_aliases_name_every_profile_kind(collector: Collector) -> None:
    assert TYPE_ALIASES == {
        "cpu": "ember_cpu:cpu:nanoseconds:cpu:nanoseconds",
        "offcpu": "ember_offcpu:off_cpu:nanoseconds:off_cpu:nanoseconds",
        "runqlat": "ember_runqlat:runqueue:nanoseconds:runqueue:nanoseconds",
        "wakeup": "ember_wakeup:blocked:nanoseconds:blocked:nanoseconds",
        "offwake": "ember_offwake:off_cpu:nanoseconds:off_cpu:nanoseconds"}
    assert list(TYPE_ALIASES) == [k.name for k in PROFILE_KINDS]
    code, body = get_json(collector, "/api/v1/types")
    assert code == 200 and body == {"types": [TYPE_ALIASES["cpu"], TYPE_ALIASES["offcpu"]],
                                    "aliases": TYPE_ALIASES}


def test_health_metrics_and_ui_need_no_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    c = Collector(CollectorConfig(storage=str(tmp_path / "db.sqlite"), token_file=str(token)))
    try:
        assert get(c, "/healthz") == (200, b"ok\n", "text/plain")
        assert get(c, "/metrics")[0] == 200
        code, body, ctype = get(c, "/api/v1/types")
        assert (code, json.loads(body), ctype) == (
            401, {"error": "missing or wrong bearer token"}, "application/json")
        assert get(c, "/api/v1/types", auth="Bearer t")[0] == 200
        assert get(c, "/", auth="Bearer t")[2] == "text/html; charset=utf-8"
        assert get(c, "/ui/app.js", auth="Bearer t")[2] == "text/javascript; charset=utf-8"
        assert get(c, "/ui/../server.py", auth="Bearer t")[0] == 404
    finally:
        c.close()


def test_profile_defaults_to_cpu_folded(collector: Collector) -> None:
    code, body, ctype = get(collector, "/api/v1/profile")
    assert (code, ctype) == (200, "text/plain; charset=utf-8")
    assert get(collector, "/api/v1/profile", type="cpu", format="folded")[1] == body
    code, tree = get_json(collector, "/api/v1/profile", type="offcpu", format="json")
    assert code == 200 and isinstance(tree, dict)
    assert sorted(tree) == ["focus", "profiles", "sample_types", "total", "tree", "unit"]
    assert tree["unit"] == "microseconds" and tree["profiles"] == 1
    code, tree = get_json(collector, "/api/v1/profile", format="json")
    assert isinstance(tree, dict) and tree["unit"] == "count"  # on-CPU: samples, unscaled
    assert get(collector, "/api/v1/profile", format="pprof")[2] == "application/octet-stream"


def test_flamegraph_plain_and_hotcold(collector: Collector) -> None:
    code, body, ctype = get(collector, "/api/v1/flamegraph", width="10")
    assert (code, ctype) == (200, "image/svg+xml")
    assert b'width="300"' in body  # clamped to 300..8000
    assert b">Flame Graph</text>" in body
    names = {f["name"] for f in frames(body.decode())}
    assert "main" in names and "[sleeping]" not in names
    code, body, _ = get(collector, "/api/v1/flamegraph", type="hotcold", title="HC")
    assert code == 200 and b">HC</text>" in body
    names = {f["name"] for f in frames(body.decode())}
    assert {"main", "[sleeping]"} <= names
    code, body, _ = get(collector, "/api/v1/flamegraph", type="offcpu")
    assert b"Off-CPU Time Flame Graph" in body


def test_diff_sides_and_missing_data(collector: Collector) -> None:
    code, body, ctype = get(collector, "/api/v1/diff", a_match="pid=10", b_match="pid=11")
    assert (code, ctype) == (200, "image/svg+xml") and b"Differential Flame Graph" in body
    code, body, _ = get(collector, "/api/v1/diff", a_match="pid=99", b_match="pid=11")
    assert code == 200  # no baseline: everything is new
    assert get_json(collector, "/api/v1/diff", a_match="pid=98", b_match="pid=99") == (
        404, {"error": "no profiles match either side"})


def test_top_and_timeline(collector: Collector) -> None:
    code, top = get_json(collector, "/api/v1/top", limit="2")
    assert code == 200 and isinstance(top, dict)
    assert top["unit"] == "ns" and len(top["rows"]) == 2
    assert sorted(top["rows"][0]) == ["name", "self", "total"]
    code, tl = get_json(collector, "/api/v1/timeline", buckets="5", since="10m")
    assert code == 200 and isinstance(tl, dict)
    assert sorted(tl) == ["bucket_ns", "end", "start", "values"]
    assert len(tl["values"]) == 5 and sum(tl["values"]) == 26  # 13 samples x 2 processes


@pytest.mark.parametrize(("path", "q", "code", "error"), [
    ("/api/v1/profile", {"format": "svg"}, 400, "format must be one of folded, pprof, json"),
    ("/api/v1/profile", {"since": "never"}, 400, None),
    ("/api/v1/profile", {"from": "x"}, 400,
     "from must be a Unix time in nanoseconds from 0 to 9223372036854775807, not 'x'"),
    ("/api/v1/profile", {"from": "99999999999999999999999"}, 400,
     "from must be a Unix time in nanoseconds from 0 to 9223372036854775807, "
     "not '99999999999999999999999'"),
    ("/api/v1/profile", {"to": "-1"}, 400,
     "to must be a Unix time in nanoseconds from 0 to 9223372036854775807, not '-1'"),
    ("/api/v1/diff", {"b_from": "9" * 5000}, 400, None),  # past int()'s digit limit
    ("/api/v1/profile", {"from": "5", "to": "5"}, 400, "the time range is empty"),
    ("/api/v1/profile", {"since": "1e300h"}, 400,
     "since must be a duration up to 400d (e.g. 15m, 1h, 7d), not '1e300h'"),
    ("/api/v1/profile", {"since": "1" + "0" * 300 + "h"}, 400, None),  # finite, but not in ns
    ("/api/v1/diff", {"a_since": "401d"}, 400,
     "a_since must be a duration up to 400d (e.g. 15m, 1h, 7d), not '401d'"),
    ("/api/v1/profile", {"since": "0s"}, 400, None),
    ("/api/v1/profile", {"match": "pid"}, 400,
     "match must be LABEL=VALUE, LABEL!=VALUE, LABEL=~REGEX or LABEL!~REGEX, not 'pid'"),
    ("/api/v1/profile", {"match": "comm=~(ap"}, 400,
     "match comm=~'(ap': missing ), unterminated subpattern at position 0"),
    ("/api/v1/profile", {"match": "comm!~" + "a" * 257}, 400,
     "match comm!~: a regular expression of at most 256 characters, not 257"),
    ("/api/v1/profile", {"match": "pid=99"}, 404, "no profiles match"),
    ("/api/v1/profile", {"type": "runqlat"}, 404, "no profiles match"),
    ("/api/v1/flamegraph", {"width": "wide"}, 400,
     "width must be a number of pixels from 0 to 100000, not 'wide'"),
    ("/api/v1/diff", {"width": "-1"}, 400,
     "width must be a number of pixels from 0 to 100000, not '-1'"),
    ("/api/v1/top", {"limit": "x"}, 400, "limit must be a number of rows from 1 to 10000, not 'x'"),
    ("/api/v1/top", {"limit": "0"}, 400, None),
    ("/api/v1/timeline", {"buckets": "x"}, 400, None),
    ("/api/v1/timeline", {"buckets": "-5"}, 400,
     "buckets must be a number of buckets from 1 to 500, not '-5'"),
    ("/api/v1/timeline", {"buckets": "501"}, 400, None),
    ("/api/v1/nope", {}, 404, "no such endpoint: /api/v1/nope"),
])
def test_errors(collector: Collector, path: str, q: dict[str, str], code: int,
                error: str | None) -> None:
    got_code, body = get_json(collector, path, **q)
    assert got_code == code and isinstance(body, dict)
    assert error is None or body == {"error": error}


def test_labels(collector: Collector) -> None:
    assert get_json(collector, "/api/v1/labels/comm/values") == (
        200, {"label": "comm", "values": ["app"]})
    assert get_json(collector, "/api/v1/labels/a%2Fb/values") == (
        200, {"label": "a/b", "values": []})
    assert get_json(collector, "/api/v1/labels/values") == (
        200, {"label": "", "values": []})


def test_routes_answer_without_a_collector(tmp_path: Path) -> None:
    api = Api(Store(tmp_path / "db.sqlite"))
    try:
        assert sorted(api.routes) == [f"/api/v1/{r}" for r in (
            "diff", "flamegraph", "labels", "profile", "sandwich", "timeline", "top", "tree",
            "types")]
        assert api.handle("/api/v1/labels", {}) == (200, b'{"labels": []}', "application/json")
        code, body, _ = api.handle("/api/v1/top", {})
        assert (code, json.loads(body)) == (404, {"error": "no profiles match"})
        assert api.handle("/healthz", {})[0] == 404  # the Collector's, not the API's
    finally:
        api.store.close()


@pytest.mark.parametrize("big", [False, True])
def test_the_timeline_puts_each_profile_in_its_bucket_and_series(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, big: bool) -> None:
    """The timeline against a loop over the profiles: profiles starting
    before the range go to the first bucket, sums past int64 stay exact."""
    rng = np.random.default_rng(5)
    n, start, end = 3000, 10**12, 10**12 + 3600 * 10**9
    times = rng.integers(start - 60 * 10**9, end, n)
    sids = rng.integers(0, 40, n)
    samples = rng.integers(0, 1 << 62 if big else 1000, n)
    hosts = {s: {"host": f"h{s % 7}"} if s % 5 else {} for s in range(40)}
    api = Api(Store(tmp_path / "db.duckdb"))
    monkeypatch.setattr(api.store, "timeline", lambda *a: (times, sids, samples))
    monkeypatch.setattr(api.store, "series_labels", lambda num: hosts[num])
    code, body, _ = api.handle("/api/v1/timeline", {"from": [str(start)], "to": [str(end)],
                                                    "buckets": ["37"], "by": ["host"]})
    assert code == 200
    got = json.loads(body)
    width = (end - start) / 37
    want: dict[str, list[int]] = {}
    for t, s, v in zip(times.tolist(), sids.tolist(), samples.tolist(), strict=True):
        row = want.setdefault(hosts[s].get("host", ""), [0] * 37)
        row[min(36, max(0, int((t - start) / width)))] += v
    assert got["series"] == [{"value": k, "values": v} for k, v in sorted(want.items())]
    assert got["values"] == [sum(c) for c in zip(*want.values(), strict=True)]
    assert (max(got["values"]) >= 1 << 63) == big
    api.store.close()
