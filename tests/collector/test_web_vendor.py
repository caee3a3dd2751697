"""The web UI's vendored chart library (uPlot): built at set-up from
deploy/web's lockfile into the package (deploy/web/build.sh), served by the
collector as /vendor/NAME by a fixed list of names, and a plain 404 that says
how to build it where set-up has not; the page loads nothing from another
origin."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import pytest

from ember.collector import web
from ember.collector.server import Collector
from ember.config import CollectorConfig
from tests.support import ROOT

DEPLOY_WEB = ROOT / "deploy" / "web"
SERVED = {"/vendor/uPlot.iife.min.js": "application/javascript; charset=utf-8",
          "/vendor/uPlot.min.css": "text/css; charset=utf-8"}
TOKEN = "t0k-v3nd0r"


def locked_version() -> str:
    """uplot's version in deploy/web/package-lock.json."""
    lock = json.loads((DEPLOY_WEB / "package-lock.json").read_text())
    return str(lock["packages"]["node_modules/uplot"]["version"])


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    """A collector with a token, over HTTP on loopback."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    c = Collector(CollectorConfig(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0",
                                  storage=str(tmp_path / "db.sqlite"), token_file=str(token)))
    c.start()
    yield c
    c.close()


def http(c: Collector, path: str) -> tuple[int, bytes, str]:
    """(status, body, content type) of a GET without a token."""
    url = f"http://127.0.0.1:{c.http_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read(), r.headers["Content-Type"]
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers["Content-Type"]


def test_the_lockfile_pins_one_exact_version() -> None:
    package = json.loads((DEPLOY_WEB / "package.json").read_text())
    assert package["private"] is True
    assert package["dependencies"] == {"uplot": locked_version()}  # exact: no ^ or ~


def test_set_up_installed_the_locked_version_into_the_package() -> None:
    vendor = resources.files("ember.collector.web") / "vendor"
    for name in ("uPlot.iife.min.js", "uPlot.min.css", "LICENSE", "VERSION"):
        assert (vendor / name).is_file(), f"{name}: run `make web` (deploy/web/build.sh)"
    version = locked_version()
    assert (vendor / "VERSION").read_text().strip() == f"uplot {version}"
    # what was copied is that version, not only stamped with it
    banner = (vendor / "uPlot.iife.min.js").read_text().splitlines()[0]
    assert f"(v{version})" in banner, banner
    assert "MIT License" in (vendor / "LICENSE").read_text()


def test_served_with_their_content_types_and_without_a_token(collector: Collector) -> None:
    for path, ctype in SERVED.items():
        code, body, got = http(collector, path)
        assert (code, got) == (200, ctype), path
        assert body == (web.VENDOR / path.removeprefix("/vendor/")).read_bytes()
        assert collector.handle(path, {}, "") == (200, body, ctype)


@pytest.mark.parametrize("path", [
    "/vendor/", "/vendor/LICENSE", "/vendor/VERSION", "/vendor/uPlot.iife.js",
    "/vendor/../app.js", "/vendor/../__init__.py", "/vendor/%2e%2e/server.py",
    "/vendor//etc/passwd", "/vendor/uPlot.min.css/", "/vendor/UPLOT.MIN.CSS",
    "/ui/vendor/uPlot.min.css"])
def test_only_the_known_names_are_served(collector: Collector, path: str) -> None:
    assert collector.handle(path, {}, "") == (404, b'{"error": "not found"}',
                                              "application/json")


def test_not_built_is_a_404_that_says_how_to_build_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(web, "VENDOR", tmp_path / "vendor")  # set-up not run
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    c = Collector(CollectorConfig(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0",
                                  storage=str(tmp_path / "db.sqlite"), token_file=str(token)))
    c.start()  # starts all the same
    try:
        assert http(c, "/")[0] == 200 and http(c, "/ui/app.js")[0] == 200
        for path in SERVED:
            code, body, ctype = http(c, path)
            assert (code, ctype) == (404, "text/plain; charset=utf-8"), path
            text = body.decode()
            assert text.endswith("\n") and text.count("\n") == 1, text
            assert text.startswith(path) and "make web" in text, text
            assert "deploy/web/build.sh" in text, text
        assert http(c, "/healthz")[0] == 200
    finally:
        c.close()


class _Loads(HTMLParser):
    """The URLs of a page's script and link tags."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "link"):
            self.urls += [v or "" for k, v in attrs if k in ("src", "href")]


def test_the_page_loads_nothing_from_another_origin(collector: Collector) -> None:
    parser = _Loads()
    parser.feed((resources.files("ember.collector.web") / "index.html").read_text())
    parser.close()
    assert parser.urls  # the page's own script and stylesheet at least
    for url in parser.urls:
        lowered = url.strip().lower()
        assert "//" not in lowered and "http:" not in lowered and "https:" not in lowered, url
        assert not lowered.startswith(("data:", "javascript:")), url
        # and the collector serves each of them (resolved against the page's
        # address, as the browser does), without a token
        assert collector.handle(urllib.parse.urljoin("/", url), {}, "")[0] == 200, url
