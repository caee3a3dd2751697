"""The web UI of a collector with a token, through ``Collector.handle``: its
static files for anyone (so a person can load the page and sign in), every
API route still only with the token, and a page whose markup cannot put the
token in a URL or hand it to a graph's script. The browser side is
tests/bpf/test_web_ui.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ember.collector.server import Collector
from ember.collector.validate import check_request
from ember.config import CollectorConfig
from ember.proto import profilestore_pb2 as ps
from tests.support.collector import series

TOKEN = "t0k-3c1d"
UI_FILES = {"/": "text/html; charset=utf-8", "/ui/app.js": "text/javascript; charset=utf-8",
            "/ui/style.css": "text/css; charset=utf-8"}
API_PATHS = ["/api/v1/profile", "/api/v1/flamegraph", "/api/v1/diff", "/api/v1/top",
             "/api/v1/timeline", "/api/v1/labels", "/api/v1/labels/comm/values",
             "/api/v1/types", "/api/v1/tree", "/api/v1/sandwich"]
WRONG = ["", "Bearer", "Bearer wrong", TOKEN, f"Bearer {TOKEN}x", f"bearer {TOKEN}",
         f"Basic {TOKEN}"]


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    c = Collector(CollectorConfig(storage=str(tmp_path / "db.sqlite"), token_file=str(token)))
    req = ps.WriteRawRequest(series=[series(10), series(10, "offcpu")])
    c.store.write(check_request(req, c.limits, time.time_ns()))
    yield c
    c.close()


@pytest.mark.parametrize("auth", ["", "Bearer wrong", f"Bearer {TOKEN}"])
def test_ui_files_are_served_with_or_without_a_token(collector: Collector, auth: str) -> None:
    for path, ctype in UI_FILES.items():
        code, body, got = collector.handle(path, {}, auth)
        assert (code, got) == (200, ctype), path
        assert TOKEN.encode() not in body
    for path in ("/ui/nope.js", "/ui/../server.py", "/ui/__init__.py", "/ui/"):
        assert collector.handle(path, {}, auth)[0] == 404, path


def test_every_api_route_still_needs_the_token(collector: Collector) -> None:
    assert set(collector.api.routes) <= set(API_PATHS)  # a new route is checked here too
    for path in [*API_PATHS, "/nope"]:
        for auth in WRONG:
            code, body, ctype = collector.handle(path, {}, auth)
            assert (code, body, ctype) == (
                401, b'{"error": "missing or wrong bearer token"}', "application/json"), \
                (path, auth)
    for path in API_PATHS:  # past the token; the sandwich needs a function's name
        code = collector.handle(path, {}, f"Bearer {TOKEN}")[0]
        assert code == (400 if path == "/api/v1/sandwich" else 200), path
    assert collector.handle("/nope", {}, f"Bearer {TOKEN}")[0] == 404


def test_health_and_metrics_stay_open(collector: Collector) -> None:
    assert collector.handle("/healthz", {}, "")[0] == 200
    code, body, _ = collector.handle("/metrics", {}, "")
    assert code == 200 and b"ember_collector_queries_total" in body
    assert TOKEN.encode() not in body


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_page_markup_keeps_the_token_out_of_urls_and_graphs(collector: Collector) -> None:
    parser = _Tags()
    parser.feed(collector.handle("/", {}, "")[1].decode())
    of = {tag: [a for t, a in parser.tags if t == tag]
          for tag in ("form", "input", "iframe", "script", "link")}
    assert len(of["form"]) == 1
    password = [a for a in of["input"] if a.get("type") == "password"]
    # no name: a form submission, even without the script, serializes no token
    assert len(password) == 1 and "name" not in password[0]
    # the graphs' own scripts run in an opaque origin: no access to sessionStorage
    assert len(of["iframe"]) == 2
    for frame in of["iframe"]:
        assert "allow-scripts" in (frame.get("sandbox") or "")
        assert "allow-same-origin" not in (frame.get("sandbox") or "allow-same-origin")
    # everything from the collector itself: no CDN
    assert [a.get("src") for a in of["script"]] == ["/vendor/uPlot.iife.min.js", "/ui/app.js"]
    assert [a.get("href") for a in of["link"]] == ["/vendor/uPlot.min.css", "/ui/style.css"]
