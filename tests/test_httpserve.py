"""httpserve.fetch against httpserve.serve on loopback: the body, the bearer
token, the server's JSON error as the message, and one clear error for
what cannot be reached, is not a URL, or has an unusable CA file.

And the server's defences: idle connections to the HTTPS port block no one,
a client dribbling its headers is cut off, a full worker pool answers 503,
and a router learns that its client left."""

from __future__ import annotations

import json
import logging
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest

from ember.errors import ConfigError, EmberError, UsageError
from ember.httpserve import (
    HANDSHAKE_TIMEOUT,
    IDLE_TIMEOUT,
    Cancelled,
    Reply,
    Server,
    check_cancelled,
    fetch,
    on_cancel,
    serve,
)
from tests.support.net import ask_and_leave, free_port
from tests.support.tls import self_signed
from tests.support.waits import wait_for

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


def url_of(server: Server, path: str, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{server.server_address[1]}{path}"


@pytest.fixture
def server() -> Iterator[Server]:
    SEEN.clear()
    s = serve("127.0.0.1:0", router, "test")
    yield s
    s.shutdown()
    s.server_close()


def test_body_and_token(server: Server) -> None:
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
def test_http_errors_carry_the_servers_reason(server: Server, path: str,
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


def test_an_answer_over_the_limit_is_refused(server: Server) -> None:
    assert fetch(url_of(server, "/ok"), max_bytes=13) == b"profile bytes"
    with pytest.raises(EmberError, match="the answer is larger than 12 bytes"):
        fetch(url_of(server, "/ok"), max_bytes=12)


def test_a_grpc_port_is_one_line(tmp_path: Path) -> None:
    """ember query pointed at the collector's gRPC port: not HTTP/1.1."""
    from ember.collector.server import Collector
    from ember.config import CollectorConfig

    c = Collector(CollectorConfig(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0",
                                  storage=str(tmp_path / "db.sqlite")))
    c.start()
    try:
        with pytest.raises(EmberError, match=rf"^cannot reach http://127.0.0.1:{c.grpc_port}: "
                                             "it does not answer HTTP"):
            fetch(f"http://127.0.0.1:{c.grpc_port}/api/v1/profile", timeout=10)
    finally:
        c.close()


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


def tls_server(tmp_path: Path, route: Callable[[str, dict[str, list[str]], str], Reply]
               ) -> tuple[Server, ssl.SSLContext]:
    """(server over TLS, a client context trusting it)."""
    key, cert = self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    return serve("127.0.0.1:0", route, "test", tls=tls), ssl.create_default_context(
        cafile=str(cert))


def raw_get(port: int, path: str = "/ok", client: ssl.SSLContext | None = None,
            timeout: float = 5) -> tuple[bytes, float]:
    """(the whole answer to one GET, seconds it took)."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as plain:
        sock = client.wrap_socket(plain, server_hostname="127.0.0.1") if client else plain
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer, time.monotonic() - t0


@pytest.mark.skipif(not Path("/usr/bin/openssl").exists(), reason="openssl not installed")
def test_idle_connections_to_the_https_port_block_no_one(tmp_path: Path) -> None:
    # they send no TLS hello: a server shaking hands on its accept thread
    # would wait on the first of them and answer nobody
    s, client = tls_server(tmp_path, router)
    idle = [socket.create_connection(("127.0.0.1", s.server_address[1])) for _ in range(10)]
    try:
        answer, seconds = raw_get(s.server_address[1], client=client)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"profile bytes")
        assert seconds < 1
        # and the handshake has a deadline: the idle connections get closed
        idle[0].settimeout(HANDSHAKE_TIMEOUT + 5)
        assert idle[0].recv(1) == b""
    finally:
        for sock in idle:
            sock.close()
        s.shutdown()


def test_headers_sent_one_byte_a_second_are_cut_off(server: Server) -> None:
    request = b"GET /ok HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: y\r\n" * 10
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.server_address[1])) as sock:
        sock.settimeout(1)
        for byte in request:
            try:
                sock.send(bytes([byte]))
                if sock.recv(1) == b"":  # closed by the server
                    break
            except TimeoutError:
                continue
            except ConnectionError:
                break
        else:
            pytest.fail("the server waited for all the headers")
    assert IDLE_TIMEOUT - 1 <= time.monotonic() - t0 <= IDLE_TIMEOUT + 2
    assert SEEN == []


@pytest.fixture
def blocking() -> Iterator[tuple[threading.Event, threading.Event, list[bool]]]:
    """(entered, release, cancelled): a router blocks on release, noting
    whether check_cancelled told it its client left."""
    entered, release, cancelled = threading.Event(), threading.Event(), []
    yield entered, release, cancelled
    release.set()


def blocking_router(entered: threading.Event, release: threading.Event,
                    cancelled: list[bool]) -> Callable[[str, dict[str, list[str]], str], Reply]:
    def route(path: str, query: dict[str, list[str]], auth: str) -> Reply:
        entered.set()
        while not release.wait(0.01):
            try:
                check_cancelled()
            except Cancelled:
                cancelled.append(True)
                raise
        return 200, b"done", "text/plain"
    return route


def test_a_full_pool_answers_503_with_retry_after(
        blocking: tuple[threading.Event, threading.Event, list[bool]]) -> None:
    entered, release, cancelled = blocking
    s = serve("127.0.0.1:0", blocking_router(entered, release, cancelled), "test", workers=1)
    port = s.server_address[1]
    answers: list[bytes] = []
    # one runs, one waits in the queue: the third, whichever it is, is refused
    clients = [threading.Thread(target=lambda: answers.append(raw_get(port, timeout=30)[0]))
               for _ in range(3)]
    try:
        for t in clients:
            t.start()
        deadline = time.monotonic() + 10
        while not answers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert entered.is_set() and len(answers) == 1
        assert answers[0].startswith(b"HTTP/1.1 503")
        assert b"\r\nretry-after: 1\r\n" in answers[0].lower()
        assert answers[0].endswith(b'{"error": "busy, try again"}')
        release.set()
        for t in clients:
            t.join(10)
        assert [a.split(b"\r\n")[0] for a in answers[1:]] == [b"HTTP/1.1 200 "] * 2
        assert raw_get(port)[0].endswith(b"done")  # and the pool serves again
    finally:
        release.set()
        s.shutdown()


def test_requests_one_at_a_time_are_answered_by_one_worker() -> None:
    """The worker that went idle last takes the next request (its heap
    still holds what its last answer freed); requests at once each get a
    worker of their own."""
    threads: list[str] = []
    gate = threading.Barrier(3, timeout=10)

    def route(path: str, query: dict[str, list[str]], auth: str) -> Reply:
        threads.append(threading.current_thread().name)
        if path == "/together":
            gate.wait()
        return 200, b"ok", "text/plain"

    s = serve("127.0.0.1:0", route, "test", workers=4)
    try:
        for _ in range(6):
            assert fetch(url_of(s, "/one")) == b"ok"
        assert len(set(threads)) == 1, threads
        threads.clear()
        clients = [threading.Thread(target=fetch, args=(url_of(s, "/together"),))
                   for _ in range(3)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(10)
        assert len(set(threads)) == 3, threads
        threads.clear()
        for _ in range(3):
            fetch(url_of(s, "/one"))
        assert len(set(threads)) == 1, threads
    finally:
        s.shutdown()
    assert wait_for(lambda: not any(t.name.startswith("ember-http-test")
                                    for t in threading.enumerate()), 5, every=0.01)


def test_the_router_learns_its_client_left(
        blocking: tuple[threading.Event, threading.Event, list[bool]],
        caplog: pytest.LogCaptureFixture) -> None:
    entered, release, cancelled = blocking
    s = serve("127.0.0.1:0", blocking_router(entered, release, cancelled), "test")
    try:
        assert ask_and_leave(s.server_address[1], "/slow", entered.is_set)
        assert wait_for(lambda: cancelled, 5, every=0.01)
        assert cancelled == [True]
    finally:
        s.shutdown()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_check_cancelled_outside_a_request_does_nothing() -> None:
    check_cancelled()
    with on_cancel(lambda: pytest.fail("no request, no client to leave")):
        pass


def test_a_query_in_the_database_stops_when_its_client_leaves() -> None:
    """on_cancel's hook interrupts DuckDB mid-query: a query that would run
    for minutes ends within seconds of the client leaving."""
    entered, ended = threading.Event(), []

    def route(path: str, query: dict[str, list[str]], auth: str) -> Reply:
        cur = duckdb.connect(":memory:")
        began = time.monotonic()
        try:
            with on_cancel(cur.interrupt):
                entered.set()
                cur.execute("SELECT count(*) FROM range(100000000) a, range(100000000) b "
                            "WHERE a.range * 7 + b.range = 3").fetchall()
        except duckdb.InterruptException:
            ended.append(time.monotonic() - began)
            check_cancelled()   # Cancelled: the client left
        return 200, b"finished", "text/plain"

    s = serve("127.0.0.1:0", route, "test")
    try:
        # the client leaves 0.2 s into the query
        began = time.monotonic()
        assert ask_and_leave(s.server_address[1], "/slow",
                             lambda: entered.is_set() and time.monotonic() > began + 0.2)
        assert wait_for(lambda: ended, 10, every=0.01)
        assert ended[0] < 10
    finally:
        s.shutdown()


def test_a_hook_registered_after_the_client_left_cancels_at_once() -> None:
    left, ran, outcome = threading.Event(), [], []

    def route(path: str, query: dict[str, list[str]], auth: str) -> Reply:
        assert left.wait(10)
        while True:   # until the server has noticed
            try:
                check_cancelled()
            except Cancelled:
                break
            time.sleep(0.01)
        try:
            with on_cancel(lambda: ran.append(True)):
                outcome.append("entered")
        except Cancelled:
            outcome.append("cancelled")
            raise
        return 200, b"", "text/plain"

    s = serve("127.0.0.1:0", route, "test")
    try:
        began = time.monotonic()
        ask_and_leave(s.server_address[1], "/slow", lambda: time.monotonic() > began + 0.1)
        left.set()
        assert wait_for(lambda: outcome, 10, every=0.01)
        assert outcome == ["cancelled"] and ran == []
    finally:
        s.shutdown()


def test_a_port_in_use_names_the_setting() -> None:
    s = serve("127.0.0.1:0", router, "test")
    try:
        listen = f"127.0.0.1:{s.server_address[1]}"
        with pytest.raises(ConfigError, match=rf"^collector.http_listen {listen}: "
                                              "Address already in use$"):
            serve(listen, router, "collector.http_listen")
    finally:
        s.shutdown()


def test_installs_no_signal_handler() -> None:
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = [signal.getsignal(n) for n in signals]
    s = serve("127.0.0.1:0", router, "test")
    try:
        assert fetch(url_of(s, "/ok")) == b"profile bytes"
        assert [signal.getsignal(n) for n in signals] == before
    finally:
        s.shutdown()
        s.server_close()  # a second stop is harmless
