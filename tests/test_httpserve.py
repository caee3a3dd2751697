"""httpserve.fetch against httpserve.serve on loopback: the body, the bearer
token, the server's JSON error as the message, and one clear error for
what cannot be reached, is not a URL, or has an unusable CA file."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from ember.errors import ConfigError, EmberError, UsageError
from ember.httpserve import Reply, fetch, serve
from tests.support.net import free_port
from tests.support.tls import self_signed

SEEN: list[tuple[str, dict[str, list[str]], str]] = []


def router(path: str, query: dict[str, list[str]], auth: str) -> Reply:
    SEEN.append((path, query, auth))
    if path == "/ok":
        return 200, b"profile bytes", "text/plain"
    if path == "/json-error":
        return 400, json.dumps({"error": "bad --since"}).encode(), "application/json"
    if path == "/text-error":
        return 503, b"<html>busy</html>", "text/html"
    if path == "/list-error":
        return 500, b"[1, 2]", "application/json"
    raise RuntimeError("boom")  # the server answers 500 {"error": "boom"}


def url_of(server: ThreadingHTTPServer, path: str, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{server.server_address[1]}{path}"


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    SEEN.clear()
    s = serve("127.0.0.1:0", router, "test")
    yield s
    s.shutdown()
    s.server_close()


def test_body_and_token(server: ThreadingHTTPServer) -> None:
    assert fetch(url_of(server, "/ok?since=1h&match=a%3Db")) == b"profile bytes"
    assert SEEN[-1] == ("/ok", {"since": ["1h"], "match": ["a=b"]}, "")
    assert fetch(url_of(server, "/ok"), token="t0k") == b"profile bytes"
    assert SEEN[-1][2] == "Bearer t0k"


@pytest.mark.parametrize(("path", "message"), [
    ("/json-error", "collector answered 400: bad --since"),
    ("/text-error", "collector answered 503: Service Unavailable"),
    ("/list-error", "collector answered 500: Internal Server Error"),
    ("/raises", "collector answered 500: boom"),
])
def test_http_errors_carry_the_servers_reason(server: ThreadingHTTPServer, path: str,
                                              message: str) -> None:
    with pytest.raises(EmberError) as info:
        fetch(url_of(server, path))
    assert str(info.value) == message
    assert info.value.exit_status == 1


def test_unreachable_names_the_server() -> None:
    port = free_port()
    with pytest.raises(EmberError, match=rf"^cannot reach http://127.0.0.1:{port}: ") as info:
        fetch(f"http://127.0.0.1:{port}/api/v1/profile?since=1h", timeout=5)
    assert type(info.value) is EmberError


@pytest.mark.parametrize("url", ["127.0.0.1:7072/api", "ftp://127.0.0.1/x", "localhost",
                                 "http://127.0.0.1:port/x", "http://[::1/x"])
def test_not_an_http_url(url: str) -> None:
    with pytest.raises(UsageError, match="URL"):
        fetch(url)


def test_unusable_ca_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot use CA certificate"):
        fetch("https://127.0.0.1:1/", cafile=str(tmp_path / "missing.pem"))
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="cannot use CA certificate"):
        fetch("https://127.0.0.1:1/", cafile=str(tmp_path / "junk.pem"))


@pytest.mark.skipif(not Path("/usr/bin/openssl").exists(), reason="openssl not installed")
def test_https_checked_against_the_ca(tmp_path: Path) -> None:
    key, cert = self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    s = serve("127.0.0.1:0", router, "test", tls=tls)
    try:
        assert fetch(url_of(s, "/ok", "https"), token="t", cafile=str(cert)) == b"profile bytes"
        with pytest.raises(EmberError, match=r"^cannot reach https://.*CERTIFICATE_VERIFY"):
            fetch(url_of(s, "/ok", "https"))  # the system's CAs do not know it
    finally:
        s.shutdown()
        s.server_close()
