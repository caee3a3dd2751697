"""The collector's HTTP side against misbehaving clients: idle connections
to its HTTPS port do not hold up the API or the web UI, and a query whose
client hung up stops merging."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ember.collector.query import profile_of
from ember.collector.server import Collector
from ember.collector.store import Aggregate, Store
from ember.collector.validate import DEFAULT_LIMITS, INT64_MAX, check_request
from ember.config import CollectorConfig
from ember.httpserve import Cancelled, Reply, Router, serve
from ember.proto import profilestore_pb2 as ps
from tests.support.collector import series
from tests.support.net import ask_and_leave
from tests.support.tls import self_signed
from tests.support.waits import wait_for


def get(port: int, path: str, client: ssl.SSLContext | None,
        token: str = "") -> tuple[bytes, float]:
    """(the whole answer, seconds it took) of one GET."""
    t0 = time.monotonic()
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as plain:
        sock = client.wrap_socket(plain, server_hostname="127.0.0.1") if client else plain
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
                     .encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer, time.monotonic() - t0


@pytest.mark.skipif(not Path("/usr/bin/openssl").exists(), reason="openssl not installed")
def test_idle_connections_hold_up_neither_api_nor_ui(tmp_path: Path) -> None:
    key, cert = self_signed(tmp_path)
    (tmp_path / "token").write_text("t0k")
    c = Collector(CollectorConfig(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0",
                                  storage=str(tmp_path / "db.sqlite"), tls_cert=str(cert),
                                  tls_key=str(key), token_file=str(tmp_path / "token")))
    c.start()
    # the start's own work is not what is timed here: its full collection
    # holds the GIL over the whole test process (0.1-0.4 s midway through
    # the suite, run alone) and runs what earlier tests left to finalize
    assert c.warmed.wait(60)
    client = ssl.create_default_context(cafile=str(cert))
    idle = [socket.create_connection(("127.0.0.1", c.http_port)) for _ in range(10)]
    try:
        api, api_seconds = get(c.http_port, "/api/v1/labels", client, "t0k")
        ui, ui_seconds = get(c.http_port, "/ui/app.js", client)
        assert api.startswith(b"HTTP/1.1 200") and api.endswith(b'{"labels": []}')
        assert ui.startswith(b"HTTP/1.1 200") and b"content-type: text/javascript" in ui.lower()
        assert api_seconds < 1 and ui_seconds < 1, (api_seconds, ui_seconds)
    finally:
        for sock in idle:
            sock.close()
        c.close()


def recording_cancel(work: Callable[[], None], stopped: Callable[[], object]) -> Router:
    """A route that does ``work`` and answers; ``stopped`` is called when
    the work ends with Cancelled (which the route passes on)."""
    def route(path: str, query: dict[str, list[str]], auth: str) -> Reply:
        try:
            work()
        except Cancelled:
            stopped()
            raise
        return 200, b"merged", "text/plain"
    return route


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[tuple[Store, Aggregate]]:
    store = Store(tmp_path / "db.duckdb")
    store.write(check_request(ps.WriteRawRequest(series=[series(10)]), DEFAULT_LIMITS,
                              time.time_ns()))
    agg = store.aggregate(0, INT64_MAX, {}, store.types()[0])
    assert agg is not None
    yield store, agg
    store.close()


def test_a_query_whose_client_left_stops_merging(stored: tuple[Store, Aggregate]) -> None:
    store, agg = stored
    merged = 0
    stopped = threading.Event()

    def merge() -> None:
        """Merges for 10 s, as a query over a long range would."""
        nonlocal merged
        give_up = time.monotonic() + 10
        while time.monotonic() < give_up:
            profile_of(store, agg, 0, INT64_MAX)
            merged += 1
            time.sleep(0.001)

    s = serve("127.0.0.1:0", recording_cancel(merge, stopped.set), "test")
    try:
        # the query was running when the client left
        assert ask_and_leave(s.server_address[1], "/api/v1/profile", lambda: merged >= 10)
        assert stopped.wait(5)
    finally:
        s.shutdown()


def test_a_merge_whose_client_left_is_stopped_in_the_store(
        stored: tuple[Store, Aggregate]) -> None:
    """The route never checks for its client itself: the store's merge stops
    it (DuckDB interrupted, or refused as it starts) with Cancelled."""
    store, _ = stored
    merged = 0
    stopped: list[str] = []

    def merge() -> None:
        nonlocal merged
        give_up = time.monotonic() + 20
        while time.monotonic() < give_up:
            store.aggregate(0, INT64_MAX, {}, store.types()[0], by_name=True)
            merged += 1

    s = serve("127.0.0.1:0", recording_cancel(merge, lambda: stopped.append("cancelled")),
              "test")
    try:
        assert ask_and_leave(s.server_address[1], "/api/v1/tree", lambda: merged >= 10)
        assert wait_for(lambda: stopped, 10, every=0.01)
        assert stopped == ["cancelled"]
    finally:
        s.shutdown()


def test_large_reads_run_one_at_a_time_and_a_waiter_whose_client_left_stops(
        stored: tuple[Store, Aggregate]) -> None:
    """Store.reading: merges never overlap (DuckDB's memory_limit holds one
    at a time), and a query waiting for another's to end stops waiting when
    its client leaves."""
    store, _ = stored
    inside, most, waited = [0], [0], []
    stopped = threading.Event()
    release = threading.Event()

    def hold() -> None:   # a long merge in another thread
        with store.reading():
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            release.wait(20)
            inside[0] -= 1

    holder = threading.Thread(target=hold)
    holder.start()
    assert wait_for(lambda: inside[0] == 1)

    def merge() -> None:
        waited.append(1)
        store.aggregate(0, INT64_MAX, {}, store.types()[0], by_name=True)

    s = serve("127.0.0.1:0", recording_cancel(merge, stopped.set), "test")
    try:
        assert ask_and_leave(s.server_address[1], "/api/v1/tree", lambda: bool(waited))
        assert stopped.wait(5)          # gave up waiting: the holder still reads
        assert inside[0] == 1 and not release.is_set()
    finally:
        release.set()
        holder.join(10)
        s.shutdown()
    threads = [threading.Thread(target=lambda: [
        store.aggregate(0, INT64_MAX, {}, store.types()[0], by_name=True) for _ in range(5)])
        for _ in range(4)]
    real = store._reading

    class Counting:
        def acquire(self, timeout: float = -1) -> bool:
            got = real.acquire(timeout=timeout)
            if got:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            return got

        def release(self) -> None:
            inside[0] -= 1
            real.release()

    store._reading = Counting()  # type: ignore[assignment]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert most[0] == 1 and inside[0] == 0
